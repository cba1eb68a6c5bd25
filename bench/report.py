"""Benchmark: one 8-chapter report, end to end, with the sandbox's LLM answering every call in L seconds.

    wall     POST /v1/jobs to the report succeeded (sealed and delivered), on `web` and `worker` as the
             Procfile starts them, the sandbox holding every LLM call for L s (its `delay` fault)
    ideal    the recipe's critical path: the synthesis, then every chapter at once: 2 L
    frames   from a chapter being done (its row's done_at) to the GET /v1/jobs/{id}/events frame that
             shows it, read by a client of the same web process

Prints the median wall time over `--reports` runs, its ratio to the ideal (target <= 1.5), and the
frame latency p50 and p99 (target < 1.5 s). Its own database and Redis database (bench/stack.py).
Run: `.venv/bin/python bench/report.py [--reports 5] [--latency 1.0]`.
"""

import argparse
import json
import statistics
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.figures import record  # noqa: E402
from bench.stack import Stack  # noqa: E402

CHAPTERS = ["sun", "moon", "rising", "venus", "mars", "jupiter", "saturn", "nodes"]


def watch(url: str, api_key: str, seen: list, stop: threading.Event) -> None:
    """Read the job's event stream, noting when each frame arrived and how many chapters it shows done."""
    headers = {"Authorization": f"Bearer {api_key}"}
    while not stop.is_set():
        try:
            with requests.get(url, headers=headers, stream=True, timeout=60) as response:
                for line in response.iter_lines(decode_unicode=True):
                    if line.startswith("data: "):
                        data = json.loads(line[6:])
                        seen.append((time.time(), (data.get("chapters") or {}).get("done", 0), data["status"]))
                        if data["status"] in ("succeeded", "failed"):
                            return
        except requests.RequestException:
            time.sleep(0.05)


def one_report(stack: Stack, api_key: str, latency: float, n: int) -> tuple[float, list[float]]:
    from jobs.models import ReportChapter

    requests.post(f"{stack.env['SANDBOX_URL']}/control/faults", timeout=5,
                  json={"faults": [{"model": "llm", "action": "delay", "seconds": latency, "times": 9}]})
    body = {"kind": "report", "models": ["sandbox/llm"],
            "input": {"subject": {"name": f"Bench {n}", "born": "1990-01-01"}, "chapters": CHAPTERS,
                      "email": "bench@example.com"}}
    started = time.monotonic()
    created = requests.post(f"http://127.0.0.1:{stack.port}/v1/jobs", json=body, timeout=10,
                            headers={"Authorization": f"Bearer {api_key}", "Idempotency-Key": f"report-{time.time_ns()}"})
    job_id = created.json()["id"]
    seen, stop = [], threading.Event()
    watcher = threading.Thread(target=watch, args=(f"http://127.0.0.1:{stack.port}/v1/jobs/{job_id}/events",
                                                  api_key, seen, stop), daemon=True)
    watcher.start()
    while True:
        status = requests.get(f"http://127.0.0.1:{stack.port}/v1/jobs/{job_id}", timeout=10,
                              headers={"Authorization": f"Bearer {api_key}"}).json()["status"]
        if status in ("succeeded", "failed"):
            break
        time.sleep(0.02)
    wall = time.monotonic() - started
    watcher.join(timeout=10)
    stop.set()
    if status != "succeeded":
        raise SystemExit(f"report {job_id} {status}")
    done_at = sorted(ts.timestamp() for ts in ReportChapter.objects.filter(report_id=job_id)
                     .values_list("done_at", flat=True))
    lags = []
    for k, finished in enumerate(done_at, start=1):  # the first frame showing at least k chapters done
        arrived = next((t for t, done, _ in seen if done >= k), None)
        if arrived is not None:
            lags.append(max(arrived - finished, 0.0))
    return wall, lags


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reports", type=int, default=5)
    parser.add_argument("--latency", type=float, default=1.0, help="seconds the sandbox holds each LLM call")
    args = parser.parse_args()
    stack = Stack()
    credentials = stack.prepare()
    stack.configure_this_process()
    try:
        stack.start("sandbox")
        stack.start("web")
        stack.start("worker")
        walls, lags = [], []
        for n in range(args.reports):
            wall, report_lags = one_report(stack, credentials["api_key"], args.latency, n)
            walls.append(wall)
            lags += report_lags
    finally:
        stack.stop()
    ideal = 2 * args.latency
    wall = statistics.median(walls)
    lags.sort()
    p50 = statistics.median(lags)
    p99 = lags[min(len(lags) - 1, int(round(0.99 * (len(lags) - 1))))]
    print(f"{args.reports} reports of {len(CHAPTERS)} chapters, every LLM call held {args.latency:g} s; "
          f"worker as the Procfile starts it ({stack.env.get('WORKER_CONCURRENCY', '16')} threads)")
    print(f"wall     {wall:6.2f} s median (runs: {', '.join(f'{w:.2f}' for w in walls)})")
    print(f"ideal    {ideal:6.2f} s (synthesis, then every chapter at once)")
    print(f"ratio    {wall / ideal:6.2f} (target <= 1.5)")
    print(f"frames   chapter done -> its event frame: p50 {p50:.2f} s, p99 {p99:.2f} s over {len(lags)} chapters "
          f"(target < 1.5 s)")
    record("report wall time, POST to succeeded (median)", wall, "s", baseline=ideal,
           baseline_is="ideal: the critical path, 2 L (computed)", ratio=wall / ideal, target="ratio <= 1.5",
           met=wall / ideal <= 1.5)
    record("frame latency, chapter done -> its frame, p50", p50, "s", target="< 1.5 s", met=p50 < 1.5)
    record("frame latency, chapter done -> its frame, p99", p99, "s", target="< 1.5 s", met=p99 < 1.5)


if __name__ == "__main__":
    main()
