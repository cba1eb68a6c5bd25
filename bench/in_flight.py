"""Benchmark: how many slow provider calls one worker can wait on at once.

200 `media` jobs whose render takes 10 s are POSTed at once to `web`, and run by ONE `worker` process,
both as the Procfile starts them, with the sandbox provider as its own process. Printed: the peak number
of jobs in flight together (submitted to the provider and not yet finished, from the sandbox's record of
each submit and each job's completion time) and the wall time from the first POST to the last job ended.
Targets: all 200 in flight together; wall time under 20 s. Waiting re-schedules a task instead of holding
a thread, so the worker's 16 threads are not the limit. Run: `.venv/bin/python bench/in_flight.py`.
"""

import argparse
import sys
import time
from datetime import datetime
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.e2e_throughput import post_jobs  # noqa: E402
from bench.stack import Stack  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--render-s", type=float, default=10.0)
    args = parser.parse_args()

    stack = Stack()
    credentials = stack.prepare()
    stack.configure_this_process()
    from jobs.models import Job

    jobs = Job.objects.filter(client_id=credentials["client_id"])
    try:
        stack.start("sandbox", ready="started server")
        stack.start("web")
        stack.start("worker", ready=" ready.")
        body = {"kind": "media", "models": ["sandbox/video-keyed"],
                "input": {"prompt": "slow render", "render_s": args.render_s}}
        started = time.time()
        post_jobs(stack.port, credentials["api_key"], args.jobs, body=body, threads=32)
        posted = time.time()
        while jobs.filter(status__in=["queued", "running", "waiting"]).exists():
            time.sleep(0.2)
        ended = max(jobs.values_list("completed_at", flat=True)).timestamp()
        statuses = sorted(set(jobs.values_list("status", flat=True)))
        calls = requests.get(f"{stack.env['SANDBOX_URL']}/control/calls", timeout=10).json()["calls"]
        charges = requests.get(f"{stack.env['SANDBOX_URL']}/ledger", timeout=10).json()["charges"]
    finally:
        stack.stop()

    # In flight: from the job's accepted submit (the sandbox's clock) to the job's end (PostgreSQL's).
    submitted = {c["metadata"]["payonce_job"]: datetime.fromisoformat(c["at"].replace("Z", "+00:00")).timestamp()
                 for c in calls if c["kind"] == "submit" and c["status"] == 202}
    done = {str(job_id): at.timestamp() for job_id, at in jobs.values_list("id", "completed_at")}
    events = sorted([(t, 1) for t in submitted.values()] + [(done[j], -1) for j in submitted if j in done])
    peak = current = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    jobs.delete()

    wall = ended - started
    print(f"one worker as the Procfile starts it; {args.jobs} jobs, render_s {args.render_s:g}")
    print(f"POSTs took {posted - started:.1f} s; every job ended {statuses} with {len(charges)} charges")
    print(f"peak in flight: {peak} of {args.jobs} (target: all)")
    print(f"wall time, first POST to last job ended: {wall:.1f} s (target < 20 s)")


if __name__ == "__main__":
    main()
