"""Benchmark: the executor's own overhead per attempt, outside the provider call, and its SQL statements.

N jobs go through the attempt runner (executor.render: submit until accepted, then wait until done)
in this process, against the sandbox provider as its own process over HTTP. Every provider call is
timed; the executor's overhead is the runner's time minus the time inside provider calls. SQL statements
are captured around the runner. Two cases: a clean submit (render_s 0, answered finished), and a submit
whose first send meets a 503 and goes out again under the same key (back-off skipped by the bench).
Run: `.venv/bin/python bench/executor_overhead.py [--jobs 300]`.
"""

import argparse
import statistics
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.figures import record  # noqa: E402
from bench.stack import Stack  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=300)
    args = parser.parse_args()

    stack = Stack()
    credentials = stack.prepare()
    stack.configure_this_process()
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from executor import render
    from executor.models import Attempt
    from executor.providers.sandbox.adapter import SandboxProvider
    from jobs.engine.outcomes import StepRetry
    from jobs.models import Job

    inside = [0.0]
    for name in ("submit", "poll", "fetch", "lookup", "upload_input"):
        original = getattr(SandboxProvider, name)

        def timed(self, *a, __original=original, **k):
            started = time.perf_counter()
            try:
                return __original(self, *a, **k)
            finally:
                inside[0] += time.perf_counter() - started

        setattr(SandboxProvider, name, timed)

    def new_job() -> Job:
        job_id = uuid.uuid4()
        return Job.objects.create(
            id=job_id, client_id=credentials["client_id"], idempotency_key=str(job_id), request_hash="0" * 64,
            kind="media", model_chain=["sandbox/video-keyed"], input={"prompt": "bench", "render_s": 0},
            policy={"attempts_per_model": 3, "fallback_on": []}, output_key=f"outputs/{job_id}/o.mp4",
            status="running", lease_until=timezone.now() + timedelta(hours=1),
        )

    def measure(fault: dict | None) -> dict:
        walls, overheads, cpus, statements = [], [], [], []
        for _ in range(args.jobs):
            job = new_job()
            if fault:
                requests.post(f"{stack.env['SANDBOX_URL']}/control/faults", json={"faults": [fault]}, timeout=5)
            inside[0] = 0.0
            wall, cpu = time.perf_counter(), time.process_time()
            with CaptureQueriesContext(connection) as captured:
                while True:
                    try:
                        accepted = render.submit(job)
                        break
                    except StepRetry:  # the bench skips the back-off: the next pass resends at once
                        Attempt.objects.filter(job=job).update(retry_at=None)
                assert render.wait(job, attempt=accepted)  # the render is finished in the submit's answer
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            walls.append(wall * 1000)
            overheads.append((wall - inside[0]) * 1000)
            cpus.append(cpu * 1000)
            statements.append(len(captured))
        return {"wall": statistics.median(walls), "overhead": statistics.median(overheads),
                "p99_overhead": sorted(overheads)[int(len(overheads) * 0.99) - 1],
                "cpu": statistics.median(cpus), "statements": statistics.mean(statements)}

    try:
        stack.start("sandbox")
        measure(None)  # warm up connections and caches
        clean = measure(None)
        resent = measure({"model": "video-keyed", "action": "status_503"})
    finally:
        stack.stop()
        Job.objects.filter(client_id=credentials["client_id"]).delete()

    print(f"{args.jobs} attempts per case, sandbox over HTTP on loopback (median per attempt)")
    print(f"{'case':38} {'wall ms':>8} {'overhead ms':>12} {'p99 ms':>8} {'CPU ms':>7} {'SQL':>5}")
    for name, row in (("clean submit, answered finished", clean), ("503, then the same key again", resent)):
        print(f"{name:38} {row['wall']:8.2f} {row['overhead']:12.2f} {row['p99_overhead']:8.2f} "
              f"{row['cpu']:7.2f} {row['statements']:5.1f}")
    print("overhead = time in the attempt runner outside provider calls (its SQL, decisions, bookkeeping)")
    for name, row in (("clean submit", clean), ("503, then the same key again", resent)):
        record(f"{name}: overhead per attempt, median", row["overhead"], "ms")
        record(f"{name}: overhead per attempt, p99", row["p99_overhead"], "ms")
        record(f"{name}: SQL statements per attempt", row["statements"], "statements")


if __name__ == "__main__":
    main()
