"""Benchmark: POST /v1/jobs against `web` exactly as the Procfile starts it.

Measures, in one run and against one server process tree:
  ceiling  GET /v1/whoami, a trivial authenticated view (auth + render, no job work)
  new      POST /v1/jobs with a fresh Idempotency-Key each time (INSERT + enqueue on the broker)
  replay   POST /v1/jobs repeating keys already used, same body (read back, no new row, no enqueue)
at a fixed concurrency, each for a fixed time, and prints requests/s, p50, p99 and the ratios to the
ceiling (targets, issue 12: new >= 0.70, replay >= 0.70).

It uses its own database (payonce_bench, created if missing) and Redis database 14 (bench/stack.py), and
cleans both afterwards, so it never leaves jobs for a development stack to run. Run: `make bench` or
`.venv/bin/python bench/api_create.py [--concurrency 16] [--seconds 10]`.
"""

import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.e2e_throughput import busy_seconds, cpu_by_group, process_cpu  # noqa: E402
from bench.figures import record  # noqa: E402
from bench.stack import Stack  # noqa: E402
from tests.support.procs import procfile_command  # noqa: E402

BODY = {"kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": "a lighthouse at dusk", "render_s": 2}}


def load(port: int, concurrency: int, seconds: float, make_request) -> dict:
    """Run `make_request(thread_index, n) -> (method, path, body, headers)` from `concurrency` threads, each
    on one keep-alive connection, for `seconds`. Returns requests/s and latency percentiles."""
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    statuses: dict[int, int] = {}
    lock = threading.Lock()
    barrier = threading.Barrier(concurrency + 1)
    stop_at = [0.0]

    def worker(index: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        barrier.wait()
        n = 0
        while time.perf_counter() < stop_at[0]:
            method, path, body, headers = make_request(index, n)
            started = time.perf_counter()
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            latencies[index].append(time.perf_counter() - started)
            with lock:
                statuses[response.status] = statuses.get(response.status, 0) + 1
            n += 1
        conn.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    processes, busy = process_cpu(), busy_seconds()
    stop_at[0] = time.perf_counter() + seconds
    started = time.perf_counter()
    barrier.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    every = sorted(x for per in latencies for x in per)
    return {
        "cpu_ms": (busy_seconds() - busy) * 1000 / max(1, len(every)),
        "by_process": cpu_by_group(processes, process_cpu(), max(1, len(every))),
        "requests": len(every),
        "rps": len(every) / elapsed,
        "p50_ms": statistics.median(every) * 1000,
        "p99_ms": every[min(len(every) - 1, int(len(every) * 0.99))] * 1000,
        "statuses": statuses,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()

    stack = Stack()
    client = stack.prepare()
    auth = {"Authorization": f"Bearer {client['api_key']}"}
    try:
        stack.start("web")
        body = json.dumps(BODY)
        post_headers = {**auth, "Content-Type": "application/json"}
        run_id = int(time.time() * 1000)
        created_keys: list[list[str]] = [[] for _ in range(args.concurrency)]

        def ceiling(index, n):
            return "GET", "/v1/whoami", None, auth

        def new_key(index, n):
            key = f"bench-{run_id}-{index}-{n}"
            created_keys[index].append(key)
            return "POST", "/v1/jobs", body, {**post_headers, "Idempotency-Key": key}

        def replay(index, n):
            keys = created_keys[index]
            return "POST", "/v1/jobs", body, {**post_headers, "Idempotency-Key": keys[n % len(keys)]}

        load(stack.port, args.concurrency, 2.0, ceiling)  # warm up: connections, pools, imports
        results = {
            "ceiling (GET /v1/whoami)": load(stack.port, args.concurrency, args.seconds, ceiling),
            "new keys (POST /v1/jobs -> 201)": load(stack.port, args.concurrency, args.seconds, new_key),
            "replays (POST /v1/jobs -> 202)": load(stack.port, args.concurrency, args.seconds, replay),
        }
    finally:
        stack.stop()  # stops web and empties the benchmark's broker: no worker ever runs these jobs
        stack.manage("shell", "-c", f"from jobs.models import Job; Job.objects.filter(client_id='{client['client_id']}').delete()")

    ceiling_rps = results["ceiling (GET /v1/whoami)"]["rps"]
    print(f"web as the Procfile starts it: {procfile_command('web')}")
    print(f"concurrency {args.concurrency}, {args.seconds:.0f} s per phase, {os.cpu_count()} CPUs\n")
    print(f"{'phase':34} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'vs ceiling':>11}  statuses")
    for name, result in results.items():
        print(f"{name:34} {result['rps']:9.1f} {result['p50_ms']:8.2f} {result['p99_ms']:8.2f} "
              f"{result['rps'] / ceiling_rps:11.2f}  {result['statuses']}")
    print("\nCPU ms per request, whole machine and by process (the load generator is this script):")
    for name, result in results.items():
        shown = ", ".join(f"{group} {ms:.2f}" for group, ms in result["by_process"].items() if ms >= 0.01)
        print(f"{name:34} {result['cpu_ms']:6.2f}   {shown}")
    new_ratio = results["new keys (POST /v1/jobs -> 201)"]["rps"] / ceiling_rps
    replay_ratio = results["replays (POST /v1/jobs -> 202)"]["rps"] / ceiling_rps
    print(f"\ntargets: new keys >= 0.70 of the ceiling: {new_ratio:.2f} {'ok' if new_ratio >= 0.7 else 'MISSED'}; "
          f"replays >= 0.70: {replay_ratio:.2f} {'ok' if replay_ratio >= 0.7 else 'MISSED'}")
    ceiling_result = results["ceiling (GET /v1/whoami)"]
    for name, ratio in (("new keys (POST /v1/jobs -> 201)", new_ratio), ("replays (POST /v1/jobs -> 202)", replay_ratio)):
        record(f"{name}: requests/s", results[name]["rps"], "req/s", baseline=ceiling_rps,
               baseline_is="ceiling: GET /v1/whoami", ratio=ratio, target="ratio >= 0.70", met=ratio >= 0.7)
        record(f"{name}: whole-machine CPU per request", results[name]["cpu_ms"], "ms",
               baseline=ceiling_result["cpu_ms"], baseline_is="ceiling: GET /v1/whoami",
               ratio=results[name]["cpu_ms"] / ceiling_result["cpu_ms"])


if __name__ == "__main__":
    main()
