"""Each benchmark's headline figures as data: `record()` appends one JSON line per figure to the file named
by BENCH_RESULTS, which bench/all.py sets and renders into one table. Without BENCH_RESULTS it does
nothing, so a benchmark run on its own prints exactly what it printed before."""

import json
import os
import shlex
import sys
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def command() -> str:
    """The command that runs this benchmark, as a reader would type it: `python bench/x.py [args]`."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join(["python", str(shown), *sys.argv[1:]])


def record(figure: str, value: float, unit: str, *, baseline: float | None = None, baseline_is: str | None = None,
           baseline_unit: str | None = None, ratio: float | None = None, target: str | None = None,
           met: bool | None = None) -> None:
    """One headline figure. `baseline` is measured in the same run (`baseline_is` says what it is; its
    unit is the figure's unless `baseline_unit` says otherwise); `ratio` is the benchmark's own (value /
    baseline unless it says otherwise); `target` is text, as the benchmark states it ("ratio >= 0.70",
    "< 90 s"), and `met` says whether this run met it."""
    path = os.environ.get("BENCH_RESULTS")
    if not path:
        return
    line = {
        "bench": Path(sys.argv[0]).stem,
        "figure": figure,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "baseline_is": baseline_is,
        "baseline_unit": baseline_unit or unit,
        "ratio": ratio,
        "target": target,
        "met": met,
        "command": command(),
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    # One write of one line in append mode: a figure is either in the file whole or not at all.
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")
