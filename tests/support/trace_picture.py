"""A picture of one trace as a trace viewer draws it (Jaeger's waterfall), for the documents: from the spans
file the OTLP receiver writes (tests/support/otlp_receiver.py), a page of HTML with inline CSS and nothing
fetched, screenshot to a PNG by the chromium the browser tests drive (tests/support/browser.py).

    python -m tests.support.trace_picture SPANS.jsonl --trace TRACE_ID|longest --out docs/trace.png [--width 1400]
        [--html PAGE.html]

One row per span, under its parent and indented by its depth, siblings in the order they started; a span
whose parent is not in the file stands at the top level, marked so. Each row has the span's name and
service.name at the left, with the key attributes of its kind (KEY_ATTRIBUTES: a provider call's model,
whether it was paid, its cost), and a bar from its start to its end on the trace's time axis, its duration
beside it; an event is a diamond at its time, a link a ring at the bar's start, an error a striped red bar.
`--trace longest` picks the trace that lasted longest; a trace id may be given by a prefix of it.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from tests.support.browser import chromium

# The attributes a row's label shows, by span name: what a reader of one job's trace looks for in it.
KEY_ATTRIBUTES = {
    "payonce.provider_call": ("payonce.model", "payonce.paid", "payonce.cost_usd"),
}
# Service colours, given in the order services first appear in the trace: Tableau's, without their red,
# which only an error is drawn in (striped, so that it does not rest on the colour alone).
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#bab0ac",
           "#86bcb6", "#8cd17d", "#d4a6c8")
ERROR_COLOUR = "#d7372f"
LABEL_SHARE = 0.36  # of the page's width, for the names at the left
INDENT_PX = 16


@dataclass(frozen=True)
class Row:
    span: dict
    depth: int
    orphan: bool  # its parent is not in the trace: it stands at the top level


def load(path: Path) -> list[dict]:
    """Every span of a spans file (one JSON object a line; blank lines skipped)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def choose(spans: list[dict], which: str) -> list[dict]:
    """The spans of one trace: `which` is a trace id, a prefix of exactly one, or "longest" (the trace whose
    first start and last end lie furthest apart; of two as long, the one with more spans)."""
    traces: dict[str, list[dict]] = {}
    for span in spans:
        traces.setdefault(span["trace_id"], []).append(span)
    if not traces:
        raise ValueError("no span in the file")
    if which == "longest":
        return max(traces.values(), key=lambda trace: (extent(trace)[1] - extent(trace)[0], len(trace)))
    matches = [trace_id for trace_id in traces if trace_id.startswith(which.lower())]
    if len(matches) != 1:
        known = ", ".join(f"{trace_id} ({len(members)} span{'s' if len(members) > 1 else ''})"
                          for trace_id, members in traces.items())
        raise ValueError(f"{which!r} names {'no' if not matches else 'more than one'} trace of: {known}")
    return traces[matches[0]]


def extent(spans: list[dict]) -> tuple[int, int]:
    """The trace's first start and last end, in ns."""
    return min(span["start_ns"] for span in spans), max(max(span["end_ns"], span["start_ns"]) for span in spans)


def rows(spans: list[dict]) -> list[Row]:
    """The waterfall's rows: depth first from each top-level span, siblings in the order they started."""
    ids = {span["span_id"] for span in spans}
    children: dict[str, list[dict]] = {}
    for span in spans:
        children.setdefault(span["parent_span_id"], []).append(span)
    def order(span: dict) -> tuple:
        return span["start_ns"], span["end_ns"], span["name"]

    tops = sorted((span for span in spans if span["parent_span_id"] not in ids), key=order)
    laid: list[Row] = []
    seen: set[str] = set()

    def lay(span: dict, depth: int, orphan: bool) -> None:
        seen.add(span["span_id"])
        laid.append(Row(span, depth, orphan))
        for child in sorted(children.get(span["span_id"], []), key=order):
            if child["span_id"] not in seen:  # a span given twice, or a parent cycle, is drawn once
                lay(child, depth + 1, False)

    for span in tops:
        lay(span, 0, bool(span["parent_span_id"]))
    # Spans in a cycle of parents (bad data) reach no top-level span: drawn at the top level all the same.
    for span in sorted(spans, key=order):
        if span["span_id"] not in seen:
            lay(span, 0, True)
    return laid


def duration(ns: float) -> str:
    """A span's length as a trace viewer writes it: 820 µs, 12.4 ms, 3.05 s, 2 min 5 s."""
    if ns >= 60e9:
        minutes, seconds = divmod(round(ns / 1e9), 60)
        return f"{minutes} min {seconds} s"
    for unit, size in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= size:
            value = ns / size
            digits = 0 if value >= 100 else 1 if value >= 10 else 2  # three significant digits
            return f"{value:.{digits}f} {unit}"
    return f"{ns:.0f} ns"


def tick_step(total_ns: int, most: int = 10) -> int:
    """A round step (1, 2 or 5 times a power of ten, in ns) that cuts `total_ns` into at most `most` ticks."""
    rough = max(total_ns / most, 1)
    power = 10 ** math.floor(math.log10(rough))
    return int(next(factor * power for factor in (1, 2, 5, 10) if factor * power >= rough))


def key_attributes(span: dict) -> str:
    shown = []
    for key in KEY_ATTRIBUTES.get(span["name"], ()):
        if key not in span["attributes"]:
            continue
        value = span["attributes"][key]
        short = key.removeprefix("payonce.")
        if isinstance(value, bool):
            shown.append(short if value else f"not {short}")
        elif key.endswith("_usd"):
            shown.append(f"${value}")
        else:
            shown.append(f"{short} {value}")
    return " · ".join(shown)


def page(spans: list[dict], width: int = 1400) -> str:
    """The waterfall of one trace's spans as a page of HTML, styled inline, fetching nothing."""
    start, end = extent(spans)
    axis = Axis(start, max(end - start, 1))
    laid = rows(spans)
    colours: dict[str, str] = {}
    for row in sorted(laid, key=lambda row: row.span["start_ns"]):
        colours.setdefault(service_name(row.span), PALETTE[len(colours) % len(PALETTE)])
    ticks = range(0, axis.total + 1, tick_step(axis.total))
    gridlines = "".join(f'<i class="tick" style="left:{axis.at(start + tick):.3f}%"></i>' for tick in ticks)
    tick_labels = "".join(f'<span class="tick-label" style="left:{axis.at(start + tick):.3f}%">'
                          f'{duration(tick) if tick else "0"}</span>' for tick in ticks)
    top = laid[0].span
    began = datetime.fromtimestamp(start / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    summary = (f'Trace <code>{esc(top["trace_id"])}</code> · started {began} · {duration(axis.total)} · '
               f'{len(laid)} spans · {", ".join(esc(service) for service in colours)}')
    return f"""<!doctype html>
<html><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<title>{esc(top["name"])}</title>
<style>{STYLE.replace("LABEL_PX", str(round(width * LABEL_SHARE)))}</style></head>
<body style="width:{width}px">
<header><h1>{service_tag(top, colours[service_name(top)])} {esc(top["name"])}</h1><p>{summary}</p></header>
<div class="waterfall">
<div class="row axis"><div class="label">Service &amp; operation</div><div class="track">{tick_labels}</div></div>
<div class="rows"><div class="grid">{gridlines}</div>{"".join(row_html(row, axis, colours) for row in laid)}</div>
</div>
<footer><i class="event"></i> event <i class="link"></i> link
<span class="swatch error" style="background-color:{ERROR_COLOUR}"></span> error</footer>
</body></html>"""


@dataclass(frozen=True)
class Axis:
    start: int  # ns, the trace's first start
    total: int  # ns, to its last end

    def at(self, ns: int) -> float:
        """Where `ns` falls on the axis, in percent of its width."""
        return 100 * (ns - self.start) / self.total


def row_html(row: Row, axis: Axis, colours: dict[str, str]) -> str:
    span = row.span
    left, right = axis.at(span["start_ns"]), axis.at(max(span["end_ns"], span["start_ns"]))
    error = span["status"]["code"] == "ERROR"
    colour = ERROR_COLOUR if error else colours[service_name(span)]
    notes = []
    if row.orphan:
        notes.append("parent not in trace")
    if error:
        notes.append("error" + (f': {span["status"]["message"]}' if span["status"]["message"] else ""))
    if span["links"]:
        notes.append(f'↗ {len(span["links"])} link{"s" if len(span["links"]) > 1 else ""}')
    keys = key_attributes(span)
    label = (f'<div class="name">{service_tag(span, colours[service_name(span)])} {esc(span["name"])}</div>'
             + (f'<div class="keys">{esc(keys)}</div>' if keys else "")
             + "".join(f'<span class="note{" error" if note.startswith("error") else ""}">{esc(note)}</span>'
                       for note in notes))
    marks = "".join(f'<i class="event" style="left:{axis.at(event["time_ns"]):.3f}%" title="{esc(event["name"])}"></i>'
                    for event in span["events"])
    if span["links"]:
        marks += f'<i class="link" style="left:{left:.3f}%"></i>'
    # The duration stands after the bar; before it when the bar ends near the right edge; inside its end
    # when the bar runs from edge to edge.
    if right < 85:
        place = f'class="duration" style="left:calc({right:.3f}% + 8px)"'
    elif left > 15:
        place = f'class="duration" style="right:calc({100 - left:.3f}% + 8px)"'
    else:
        place = f'class="duration inside" style="right:calc({100 - right:.3f}% + 4px)"'
    bar = f'bar{" error" if error else ""}'
    return (f'<div class="row" data-span-id="{esc(span["span_id"])}" data-depth="{row.depth}"'
            f' title="{esc(span["kind"])} {esc(span["name"])}">'
            f'<div class="label" style="padding-left:{8 + row.depth * INDENT_PX}px">{label}</div>'
            f'<div class="track"><div class="{bar}" style="left:{left:.3f}%;width:{right - left:.3f}%;'
            f'background-color:{colour}"></div>{marks}'
            f'<span {place}>{duration(span["end_ns"] - span["start_ns"])}</span></div></div>')


def service_tag(span: dict, colour: str) -> str:
    return f'<span class="service" style="border-color:{colour}">{esc(service_name(span))}</span>'


def esc(text) -> str:
    return html.escape(str(text))


def service_name(span: dict) -> str:
    """The service, and the process of it where the resource names one (payonce's `payonce.process`)."""
    name = str(span["resource"].get("service.name", "unknown service"))
    process = span["resource"].get("payonce.process")
    return f"{name} {process}" if process else name


STYLE = """
* { box-sizing: border-box; }
body { margin: 0; padding: 20px 24px; background: #fff; color: #1f2328;
       font: 13px/1.35 system-ui, "DejaVu Sans", "Liberation Sans", "Segoe UI", Helvetica, Arial, sans-serif; }
h1 { font-size: 18px; margin: 0 0 4px; font-weight: 600; }
header p { margin: 0 0 14px; color: #59636e; }
code { font: 12px "DejaVu Sans Mono", "Liberation Mono", Menlo, monospace; }
.waterfall { border: 1px solid #d1d9e0; border-radius: 4px; }
.row { display: flex; min-height: 26px; border-top: 1px solid #eef1f4; }
.rows { position: relative; }
.rows .row { position: relative; z-index: 1; }
.rows .row:nth-child(even) { background: rgba(31, 35, 40, 0.025); }  /* the grid is the first child */
.label { flex: 0 0 LABEL_PXpx; padding: 4px 8px; border-right: 1px solid #d1d9e0; overflow: hidden; }
.name { white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.service { border-left: 4px solid; padding-left: 5px; color: #59636e; }
.keys { color: #0b5cad; font-size: 12px; padding-left: 9px; white-space: nowrap; }
.note { display: inline-block; font-size: 11px; color: #59636e; border: 1px solid #d1d9e0; border-radius: 3px;
        padding: 0 4px; margin: 1px 0 1px 9px; }
.note.error { color: #b42318; border-color: #f1aeb5; background: #fff5f5; }
.track { position: relative; flex: 1; margin: 0 70px 0 12px; }
.bar { position: absolute; top: 50%; height: 12px; margin-top: -6px; min-width: 2px; border-radius: 2px; }
.bar.error, .swatch.error {
  background-image: repeating-linear-gradient(135deg, transparent 0 4px, rgba(255, 255, 255, 0.35) 4px 7px); }
.duration { position: absolute; top: 50%; transform: translateY(-50%); font-size: 11px; color: #59636e;
            white-space: nowrap; }
.duration.inside { color: #1f2328; background: rgba(255, 255, 255, 0.85); padding: 0 3px; border-radius: 2px; }
i.event, i.link { position: absolute; top: 50%; width: 8px; height: 8px; margin: -4px 0 0 -4px; }
i.event { background: #1f2328; transform: rotate(45deg); border: 1px solid #fff; }
i.link { border: 2px solid #1f2328; border-radius: 50%; background: #fff; }
.axis { background: #f3f5f7; font-weight: 600; border-top: 0; }
.axis .label { padding: 6px 8px; }
.tick-label { position: absolute; top: 6px; transform: translateX(-50%); font-weight: 400; font-size: 11px;
              color: #59636e; white-space: nowrap; }
.grid { position: absolute; top: 0; bottom: 0; left: calc(LABEL_PXpx + 12px); right: 70px; }
i.tick { position: absolute; top: 0; bottom: 0; border-left: 1px solid #e4e8ec; }
footer { margin-top: 10px; color: #59636e; font-size: 12px; }
footer i.event, footer i.link { position: relative; display: inline-block; top: 0; margin: 0 4px 0 12px; }
.swatch { display: inline-block; width: 20px; height: 10px; border-radius: 2px; margin: 0 4px 0 12px; }
"""


def screenshot(document: str, out: Path, width: int = 1400) -> None:
    """The page, whole, as a PNG `width` pixels wide (the chromium tests/support/browser.py finds)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with chromium() as browser:
        tab = browser.new_page(viewport={"width": width, "height": 300})
        tab.set_content(document)
        tab.screenshot(path=str(out), full_page=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.trace_picture", description=__doc__.split("\n\n")[0])
    parser.add_argument("spans", type=Path, help="a spans file of the OTLP receiver (one JSON line a span)")
    parser.add_argument("--trace", default="longest", help='a trace id, a prefix of one, or "longest" (the default)')
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--width", type=int, default=1400, help="in pixels (the default 1400)")
    parser.add_argument("--html", type=Path, help="also write the page here")
    args = parser.parse_args(argv)
    try:
        trace = choose(load(args.spans), args.trace)
    except (OSError, ValueError) as error:  # a missing or unreadable file, no such trace
        print(f"trace_picture: {error}", file=sys.stderr)
        return 2
    document = page(trace, args.width)
    if args.html:
        args.html.write_text(document)
    screenshot(document, args.out, args.width)
    print(f"{args.out}: trace {trace[0]['trace_id']}, {len(trace)} spans")
    return 0


if __name__ == "__main__":
    sys.exit(main())
