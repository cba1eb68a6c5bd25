"""What `make bench` runs: every benchmark, one after another, then one table of their headline figures,
printed and written into bench/README.md between its two marker comments.

The benchmarks never overlap: they share a database and a Redis database (bench/stack.py), so a second
one's worker would take the first one's jobs; a lock keeps two runs of this script apart too. Each
benchmark appends its figures to the results file (BENCH_RESULTS, bench/figures.py). A benchmark that
exits non-zero, or records no figure, is a failed row in the table, and this script exits 1 once the
others have run.

    --only NAME[,NAME]  run only these (e.g. `--only budget,executor_overhead`); the other benchmarks'
                        rows from the last run stay in the table, each with its own date
    --render            run nothing: render the table again from the results file
Run: `make bench [BENCH_ARGS="--only budget"]` or `.venv/bin/python bench/all.py [--only NAME] [--render]`.
"""

import argparse
import fcntl
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "bench"
# The order `make bench` runs them in; a new benchmark script goes here, a new helper in HELPERS.
BENCHMARKS = ["api_create", "e2e_throughput", "in_flight", "waiting", "executor_overhead", "webhooks", "budget",
              "report", "admin", "fairness"]
HELPERS = {"all", "figures", "receiver", "stack"}
RESULTS = ROOT / "var" / "bench" / "results.jsonl"
BEGIN, END = "<!-- bench:table -->", "<!-- /bench:table -->"
COLUMNS = ["figure", "value", "baseline (same run)", "ratio", "target", "met?", "command", "date"]


def check_scripts() -> None:
    """Every bench/*.py is a benchmark this script runs or a helper: a new benchmark is never left out."""
    unknown = sorted(p.stem for p in HERE.glob("*.py") if p.stem not in BENCHMARKS and p.stem not in HELPERS)
    if unknown:
        raise SystemExit(f"bench/all.py: add {', '.join(unknown)} to BENCHMARKS (or HELPERS) in bench/all.py")


def read_results(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run(names: list[str], results: Path) -> list[str]:
    """Run the benchmarks in order, each replacing its rows in the results file; returns the failed ones."""
    kept = [row for row in read_results(results) if row["bench"] not in names]
    results.write_text("".join(json.dumps(row) + "\n" for row in kept))
    failed, took = [], {}
    for name in names:
        command = f"python bench/{name}.py"
        print(f"\n=== {command}", flush=True)
        before = len(read_results(results))
        started = time.monotonic()
        status = subprocess.run([sys.executable, f"bench/{name}.py"], cwd=ROOT,
                                env={**os.environ, "BENCH_RESULTS": str(results)}).returncode
        took[name] = time.monotonic() - started
        recorded = len(read_results(results)) - before
        why = None
        if status != 0 or recorded == 0:
            why = f"exit status {status}" if status != 0 else "exited 0 but recorded no figure"
            failed.append(name)
            with open(results, "a") as f:
                f.write(json.dumps({"bench": name, "failed": why, "command": command,
                                    "date": datetime.now().astimezone().isoformat(timespec="seconds")}) + "\n")
        print(f"--- {command}: {'FAILED, ' + why if why else 'ok'}, {took[name]:.1f} s", flush=True)
    print("\n" + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in took.items()))
    return failed


def number(value) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    if abs(value) >= 100:
        return f"{value:,.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def row_cells(row: dict) -> list[str]:
    date = datetime.fromisoformat(row["date"]).strftime("%Y-%m-%d %H:%M")
    command = f"`{row['command']}`"
    if row.get("failed"):
        return ["**failed**", row["failed"], "", "", "", "**failed**", command, date]
    baseline = ""
    if row.get("baseline") is not None:
        baseline = f"{number(row['baseline'])} {row.get('baseline_unit') or row['unit']}"
        if row.get("baseline_is"):
            baseline += f" ({row['baseline_is']})"
    ratio = row.get("ratio")
    met = {True: "yes", False: "**no**", None: ""}[row.get("met")]
    return [row["figure"], f"{number(row['value'])} {row['unit']}", baseline,
            "" if ratio is None else (f"{ratio:.2f}" if abs(ratio) >= 0.1 else f"{ratio:.2g}"),
            row.get("target") or "", met, command, date]


def render(rows: list[dict]) -> str:
    order = {name: index for index, name in enumerate(BENCHMARKS)}
    rows = sorted((row for row in rows if row["bench"] in order), key=lambda row: order[row["bench"]])  # stable
    lines = ["| " + " | ".join(COLUMNS) + " |", "| --- | ---: | ---: | ---: | --- | :---: | --- | --- |"]
    lines += ["| " + " | ".join(cell(text) for text in row_cells(row)) + " |" for row in rows]
    return "\n".join(lines)


def splice(readme: Path, table: str) -> None:
    """Replace what is between the markers in the README, and nothing else."""
    text = readme.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{readme}: no {BEGIN} ... {END} markers to write the table between")
    block = (f"{BEGIN}\nFilled by `make bench` (bench/all.py): each ratio is against a baseline measured in the "
             f"same run.\n\n{table}\n")
    readme.write_text(text[:start] + block + text[end:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated benchmark names, e.g. budget,executor_overhead")
    parser.add_argument("--render", action="store_true", help="only re-render the table from the results file")
    parser.add_argument("--results", type=Path, default=RESULTS, help=f"results file (default {RESULTS})")
    parser.add_argument("--readme", type=Path, default=HERE / "README.md", help="the README to write the table into")
    args = parser.parse_args()
    check_scripts()
    results = args.results.resolve()
    failed = []
    if not args.render:
        names = BENCHMARKS
        if args.only:
            names = [name.strip().removeprefix("bench/").removesuffix(".py") for name in args.only.split(",")]
            if unknown := [name for name in names if name not in BENCHMARKS]:
                raise SystemExit(f"bench/all.py: no benchmark {', '.join(unknown)} (there are: {', '.join(BENCHMARKS)})")
            names = [name for name in BENCHMARKS if name in names]  # always in the usual order
        results.parent.mkdir(parents=True, exist_ok=True)
        with open(results.with_suffix(".lock"), "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise SystemExit("bench/all.py: another run holds the lock; benchmarks must not overlap") from None
            failed = run(names, results)
    elif not results.exists():
        raise SystemExit(f"bench/all.py --render: no results file {results}")
    table = render(read_results(results))
    print("\n" + table)
    splice(args.readme, table)
    print(f"\nwritten into {args.readme}")
    if failed:
        raise SystemExit(f"bench/all.py: failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
