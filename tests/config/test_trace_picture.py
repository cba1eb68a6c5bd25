"""The picture of one trace for the documents (tests/support/trace_picture.py): the waterfall's rows laid out
from a spans file as the OTLP receiver writes it, and the command that draws one to a PNG in chromium."""

import json
import struct
import subprocess
import sys

import pytest

from tests.support.procs import REPO_ROOT
from tests.support.trace_picture import choose, duration, main, page, rows, tick_step

MS = 1_000_000
T0 = 1_760_000_000_000_000_000
JOB_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
OTHER_TRACE = "0af7651916cd43dd8448eb211c80319c"


def span(span_id: str, name: str, parent: str = "", start_ms: float = 0, end_ms: float = 1, *, trace: str = JOB_TRACE,
         service: str = "payonce-worker", attributes: dict | None = None, events=(), links=(), status="UNSET",
         message: str = "") -> dict:
    """A span as the receiver writes its line."""
    return {"trace_id": trace, "span_id": span_id, "parent_span_id": parent, "name": name, "kind": "INTERNAL",
            "start_ns": T0 + int(start_ms * MS), "end_ns": T0 + int(end_ms * MS), "attributes": attributes or {},
            "events": [{"name": event, "time_ns": T0 + int(at * MS), "attributes": {}} for event, at in events],
            "links": [{"trace_id": OTHER_TRACE, "span_id": linked, "attributes": {}} for linked in links],
            "status": {"code": status, "message": message}, "resource": {"service.name": service},
            "scope": "payonce"}


def a_jobs_trace() -> list[dict]:
    """One job's trace, its spans in the order a receiver may get them (children end, and are sent, first),
    a webhook delivery whose parent span was never sent, and a span of another, shorter trace."""
    return [
        span("00000000000000c1", "payonce.provider_call", "00000000000000b1", 20, 620, status="ERROR",
             message="rate_limited", attributes={"payonce.model": "sandbox/video-keyed", "payonce.paid": False,
                                                 "payonce.cost_usd": "0.000000"}, events=[("retry scheduled", 620)]),
        span("00000000000000c2", "payonce.provider_call", "00000000000000b1", 1600, 2800, links=["00000000000000c1"],
             attributes={"payonce.model": "sandbox/video-keyed", "payonce.paid": True, "payonce.cost_usd": "0.125000"}),
        span("00000000000000d1", "POST /v1/generations", "00000000000000c2", 1610, 2790, service="sandbox"),
        span("00000000000000b1", "payonce.step", "00000000000000a1", 10, 2900),
        span("00000000000000a1", "POST /v1/jobs <script>", "", 0, 3000, service="payonce-web"),
        span("00000000000000e1", "webhooks.deliver", "ffffffffffffffff", 2950, 3100, service="payonce-webhooks"),
        span("00000000000000f1", "a short trace", "", 0, 5, trace=OTHER_TRACE),
    ]


def test_rows_nest_each_span_under_its_parent_in_start_order_and_one_whose_parent_is_missing_at_the_top():
    laid = rows(choose(a_jobs_trace(), JOB_TRACE))

    assert [(row.span["span_id"], row.depth, row.orphan) for row in laid] == [
        ("00000000000000a1", 0, False),
        ("00000000000000b1", 1, False),
        ("00000000000000c1", 2, False),  # started first of the step's two calls
        ("00000000000000c2", 2, False),
        ("00000000000000d1", 3, False),
        ("00000000000000e1", 0, True),  # its parent was never sent
    ]


def test_longest_picks_the_trace_that_lasted_longest_and_a_prefix_names_a_trace():
    spans = a_jobs_trace()

    assert {span["trace_id"] for span in choose(spans, "longest")} == {JOB_TRACE}
    assert [span["span_id"] for span in choose(spans, OTHER_TRACE[:6])] == ["00000000000000f1"]
    with pytest.raises(ValueError, match="names no trace"):
        choose(spans, "deadbeef")
    with pytest.raises(ValueError, match="no span"):
        choose([], "longest")


def test_the_page_labels_a_provider_call_with_its_model_payment_and_cost_and_escapes_what_spans_say():
    document = page(choose(a_jobs_trace(), "longest"), width=1200)

    assert "model sandbox/video-keyed · not paid · $0.000000" in document
    assert "model sandbox/video-keyed · paid · $0.125000" in document
    assert "error: rate_limited" in document and "parent not in trace" in document and "↗ 1 link" in document
    assert document.count('class="event"') == 1 + 1  # the one event, and the legend's
    assert "&lt;script&gt;" in document and "<script" not in document  # a span's name is text, never markup
    assert "default-src 'none'" in document  # nothing is fetched: styles are inline, fonts the machine's
    assert 'data-depth="3"' in document and "3.10 s" in document  # the deepest row; the trace's whole length


def test_durations_and_ticks_read_as_a_trace_viewer_writes_them():
    assert [duration(ns) for ns in (640, 820_000, 12_400_000, 3_050_000_000, 125e9)] == [
        "640 ns", "820 µs", "12.4 ms", "3.05 s", "2 min 5 s"]
    assert tick_step(3_100 * MS) == 500 * MS  # at most ten ticks, on round numbers
    assert tick_step(42 * MS) == 5 * MS


@pytest.mark.e2e
@pytest.mark.browser
def test_the_command_draws_the_longest_trace_to_a_png_of_the_width_asked(tmp_path):
    spans_file = tmp_path / "spans.jsonl"
    spans_file.write_text("".join(json.dumps(line) + "\n" for line in a_jobs_trace()))
    out = tmp_path / "docs" / "trace.png"

    drawn = subprocess.run([sys.executable, "-m", "tests.support.trace_picture", str(spans_file), "--trace", "longest",
                            "--out", str(out), "--width", "1000", "--html", str(tmp_path / "trace.html")],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)

    assert drawn.returncode == 0, drawn.stderr
    assert drawn.stdout.strip() == f"{out}: trace {JOB_TRACE}, 6 spans"
    png = out.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    width, height = struct.unpack(">II", png[16:24])
    # The whole page: its header, the axis, six rows (two of three lines), the legend; not a viewport's 300.
    assert width == 1000 and 330 < height < 900, (width, height)
    assert len(png) > 20_000  # drawn, not blank
    assert "payonce.provider_call" in (tmp_path / "trace.html").read_text()


def test_the_command_says_which_traces_there_are_when_none_matches(tmp_path, capsys):
    spans_file = tmp_path / "spans.jsonl"
    spans_file.write_text("".join(json.dumps(line) + "\n" for line in a_jobs_trace()))

    assert main([str(spans_file), "--trace", "deadbeef", "--out", str(tmp_path / "trace.png")]) == 2

    assert not (tmp_path / "trace.png").exists()  # no browser started
    said = capsys.readouterr().err
    assert f"{JOB_TRACE} (6 spans)" in said and f"{OTHER_TRACE} (1 span)" in said
