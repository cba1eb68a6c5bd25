"""Benchmark: one 8-chapter report, end to end, with the sandbox's LLM answering every call in L seconds.

    wall     POST /v1/jobs to the report succeeded (sealed and delivered), on `web` and `worker` as the
             Procfile starts them, the sandbox holding every LLM call for L s (its `delay` fault)
    ideal    the recipe's critical path: the synthesis, then every chapter at once: 2 L (a subject this
             short is under any provider's cache minimum, so no chapter waits for a first one)
    frames   from a chapter being done (its row's done_at) to the GET /v1/jobs/{id}/events frame that
             shows it, read by a client of the same web process
    cache    one 8-chapter report whose subject and synthesis are about 3,000 tokens, twice on the same
             stack: with the prompt cache (REPORT_PROMPT_CACHE and REPORT_CACHE_WARMUP on, the worker's
             defaults) and without it (both off, the worker started again): the chapters' input cost (input,
             cache-write and cache-read tokens at the sandbox's prices, from each attempt's usage), the
             report's whole LLM cost (the sandbox's ledger), and each report's wall time

Prints the median wall time over `--reports` runs, its ratio to the ideal (target <= 1.5), the frame
latency p50 and p99 (target < 1.5 s), and the cache's figures: the chapters' input cost with the cache
over without it (target <= 0.4). Its own database and Redis database (bench/stack.py).
Run: `.venv/bin/python bench/report.py [--reports 5] [--latency 1.0]`.
"""

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.figures import record  # noqa: E402
from bench.stack import Stack  # noqa: E402

CHAPTERS = ["sun", "moon", "rising", "venus", "mars", "jupiter", "saturn", "nodes"]
# About 2,800 tokens of subject (the sandbox counts four characters a token); the synthesis adds 200.
LONG_NOTES = "She keeps a garden by the river, reads late into the night and writes letters to old friends. " * 118
INPUT, WRITE, READ = 3, 3.75, 0.30  # the sandbox's dollars per million input, cache-write, cache-read tokens


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


def one_report(stack: Stack, api_key: str, latency: float, n: int, subject: dict | None = None) -> tuple[
        str, float, list[float]]:
    from jobs.models import ReportChapter

    requests.post(f"{stack.env['SANDBOX_URL']}/control/faults", timeout=5,
                  json={"faults": [{"model": "llm", "action": "delay", "seconds": latency, "times": 9}]})
    body = {"kind": "report", "models": ["sandbox/llm"],
            "input": {"subject": subject or {"name": f"Bench {n}", "born": "1990-01-01"}, "chapters": CHAPTERS,
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
    return job_id, wall, lags


def report_costs(stack: Stack, job_id: str) -> dict:
    """The chapters' input cost (every input token at its price: plain, written to the cache, read from
    it), the prefix tokens written and read, and the report's whole LLM cost as the ledger charged it."""
    from executor.models import Attempt

    chapters = Attempt.objects.filter(job_id=job_id, step__startswith="chapter-")
    usage = [a.usage or {} for a in chapters]
    tokens = {kind: sum(u.get(kind, 0) for u in usage) for kind in ("input_tokens", "cache_write_tokens",
                                                                    "cache_read_tokens")}
    keys = {a.upstream_key for a in Attempt.objects.filter(job_id=job_id)}
    ledger = requests.get(f"{stack.env['SANDBOX_URL']}/ledger", timeout=10).json()["charges"]
    return {"chapters_input_usd": (tokens["input_tokens"] * INPUT + tokens["cache_write_tokens"] * WRITE
                                   + tokens["cache_read_tokens"] * READ) / 1e6,
            "writes": sum(1 for u in usage if u.get("cache_write_tokens")),
            "reads": sum(1 for u in usage if u.get("cache_read_tokens")),
            "prefix_tokens": max((u.get("cache_write_tokens", 0) or u.get("cache_read_tokens", 0) for u in usage),
                                 default=0),
            "ledger_usd": sum(float(c["amount_usd"]) for c in ledger
                              if (c.get("metadata") or {}).get("upstream_key") in keys),
            "calls": sum(1 for c in ledger if (c.get("metadata") or {}).get("upstream_key") in keys)}


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
            _, wall, report_lags = one_report(stack, credentials["api_key"], args.latency, n)
            walls.append(wall)
            lags += report_lags
        # The same long report with the prompt cache (the worker's defaults), then without it.
        subject = {"name": "Bench Cache", "born": "1990-01-01", "notes": LONG_NOTES}
        cached_job, cached_wall, _ = one_report(stack, credentials["api_key"], args.latency, 0, subject)
        cached = report_costs(stack, cached_job)
        stack.processes["worker"].stop()
        stack.env.update(REPORT_PROMPT_CACHE="0", REPORT_CACHE_WARMUP="0")
        stack.start("worker")
        plain_job, plain_wall, _ = one_report(stack, credentials["api_key"], args.latency, 1,
                                              {**subject, "name": "Bench No Cache"})
        plain = report_costs(stack, plain_job)
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
    ratio = cached["chapters_input_usd"] / plain["chapters_input_usd"]
    print(f"cache    a report of {len(CHAPTERS)} chapters whose shared prefix is {cached['prefix_tokens']:,} tokens: "
          f"{cached['writes']} cache write, {cached['reads']} reads")
    print(f"         chapters' input cost ${cached['chapters_input_usd']:.6f} with the cache, "
          f"${plain['chapters_input_usd']:.6f} without: ratio {ratio:.3f} (target <= 0.4)")
    print(f"         the report's LLM cost (ledger, {cached['calls']} calls) ${cached['ledger_usd']:.6f} with, "
          f"${plain['ledger_usd']:.6f} without ({cached['ledger_usd'] / plain['ledger_usd']:.3f})")
    print(f"         wall {cached_wall:.2f} s with (the warm-up: one chapter more on the critical path), "
          f"{plain_wall:.2f} s without: +{cached_wall - plain_wall:.2f} s, every call held {args.latency:g} s")
    record("report wall time, POST to succeeded (median)", wall, "s", baseline=ideal,
           baseline_is="ideal: the critical path, 2 L (computed)", ratio=wall / ideal,
           target="ratio <= 1.5", met=wall / ideal <= 1.5)
    record("report chapters' input cost with the prompt cache", cached["chapters_input_usd"], "USD",
           baseline=plain["chapters_input_usd"], baseline_is="the same report without the cache, same run",
           ratio=ratio, target="ratio <= 0.4", met=ratio <= 0.4)
    record("report wall time with the cache's warm-up", cached_wall, "s", baseline=plain_wall,
           baseline_is="the same report without the cache (every chapter at once), same run",
           ratio=cached_wall / plain_wall)
    record("frame latency, chapter done -> its frame, p50", p50, "s", target="< 1.5 s", met=p50 < 1.5)
    record("frame latency, chapter done -> its frame, p99", p99, "s", target="< 1.5 s", met=p99 < 1.5)


if __name__ == "__main__":
    main()
