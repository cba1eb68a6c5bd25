"""Benchmark: POST /v1/jobs against `web` exactly as the Procfile starts it.

Measures, in one run and against one server process tree:
  ceiling  GET /v1/whoami, a trivial authenticated view (auth + render, no job work)
  new      POST /v1/jobs with a fresh Idempotency-Key each time (INSERT + enqueue on the broker)
  replay   POST /v1/jobs repeating keys already used, same body (read back, no new row, no enqueue)
at a fixed concurrency, each for a fixed time, and prints requests/s, p50, p99 and the ratios to the
ceiling (targets: new >= 0.40, replay >= 0.60).

It uses its own database (payonce_bench, created if missing) and Redis database 14, and cleans both
afterwards, so it never leaves jobs for a development stack to run. Run: `make bench` or
`.venv/bin/python bench/api_create.py [--concurrency 16] [--seconds 10]`.
"""

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BODY = {"kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": "a lighthouse at dusk", "render_s": 2}}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def procfile_command(name: str) -> str:
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return line.split(":", 1)[1].strip()
    raise SystemExit(f"no {name!r} process in the Procfile")


def manage(env: dict, *args: str) -> str:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True, capture_output=True, text=True
    ).stdout


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
    stop_at[0] = time.perf_counter() + seconds
    started = time.perf_counter()
    barrier.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    every = sorted(x for per in latencies for x in per)
    return {
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
    parser.add_argument("--database-url", default="postgres://localhost:5432/payonce_bench")
    parser.add_argument("--broker-url", default="redis://127.0.0.1:6379/14")
    args = parser.parse_args()

    port = free_port()
    env = {**os.environ, "DATABASE_URL": args.database_url, "BROKER_URL": args.broker_url, "PORT": str(port),
           "DJANGO_SETTINGS_MODULE": "config.settings"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    manage(env, "migrate", "--noinput")
    client = json.loads(manage(env, "create_client", f"bench-{int(time.time())}"))
    auth = {"Authorization": f"Bearer {client['api_key']}"}
    command = procfile_command("web")
    web = subprocess.Popen(["bash", "-c", command], cwd=ROOT, env=env, start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/v1/whoami", headers=auth)
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or web.poll() is not None:
                raise SystemExit("web did not come up")
            time.sleep(0.2)

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

        load(port, args.concurrency, 2.0, ceiling)  # warm up: connections, pools, imports
        results = {
            "ceiling (GET /v1/whoami)": load(port, args.concurrency, args.seconds, ceiling),
            "new keys (POST /v1/jobs -> 201)": load(port, args.concurrency, args.seconds, new_key),
            "replays (POST /v1/jobs -> 202)": load(port, args.concurrency, args.seconds, replay),
        }
    finally:
        os.killpg(web.pid, signal.SIGTERM)
        web.wait(timeout=30)
        cleanup = (
            "from jobs.models import Job, Client; from config.celery import app;"
            f"Job.objects.filter(client_id='{client['client_id']}').delete();"
            "app.control.purge()"
        )
        subprocess.run([sys.executable, "manage.py", "shell", "-c", cleanup], cwd=ROOT, env=env, check=False,
                       capture_output=True)

    ceiling_rps = results["ceiling (GET /v1/whoami)"]["rps"]
    print(f"web as the Procfile starts it: {command}")
    print(f"concurrency {args.concurrency}, {args.seconds:.0f} s per phase, {os.cpu_count()} CPUs\n")
    print(f"{'phase':34} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'vs ceiling':>11}  statuses")
    for name, result in results.items():
        print(f"{name:34} {result['rps']:9.1f} {result['p50_ms']:8.2f} {result['p99_ms']:8.2f} "
              f"{result['rps'] / ceiling_rps:11.2f}  {result['statuses']}")
    new_ratio = results["new keys (POST /v1/jobs -> 201)"]["rps"] / ceiling_rps
    replay_ratio = results["replays (POST /v1/jobs -> 202)"]["rps"] / ceiling_rps
    print(f"\ntargets: new keys >= 0.40 of the ceiling: {new_ratio:.2f} {'ok' if new_ratio >= 0.4 else 'MISSED'}; "
          f"replays >= 0.60: {replay_ratio:.2f} {'ok' if replay_ratio >= 0.6 else 'MISSED'}")


if __name__ == "__main__":
    main()
