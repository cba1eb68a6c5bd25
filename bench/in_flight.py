"""Benchmark: many long renders waited on at once, by one worker, at little cost
(docs/design.md, "Waiting costs little").

2,000 `media` jobs whose render takes 60 s are POSTed to `web` and run by `worker`, both as the Procfile
starts them (WORKER_PROCESSES workers: on a 2-core machine one; `--worker-processes N` sets it), with
the sandbox provider as its own process (calling back to `web`).
Printed: the peak number of jobs in flight together (from the sandbox's record of each accepted submit
and each job's completion time), how long after the last POST the last job ended, the worker's average
CPU while every job waits (from /proc, between the last POST and the first render's end; with more jobs
than one render's time can start, as 10,000 on a 2-core machine, there is no such window and it says so,
giving the worker's average CPU from the first submit to the last end instead), provider
polls and Celery messages per job, and whether the books balance (one charge per job, each tied to one
attempt row by its upstream key, each settled at the quoted cost).
Targets: every job succeeds within 90 s of the last POST; the worker under half a core while they wait.
Run: `.venv/bin/python bench/in_flight.py [--jobs 2000] [--render-s 60]`.
"""

import argparse
import os
import sys
import threading
import time
from collections import Counter
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.e2e_throughput import post_jobs, received  # noqa: E402
from bench.figures import record  # noqa: E402
from bench.stack import Stack  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) and of its children: the `worker` line with
    more than one process is their supervisor (config.workers)."""
    own = _own_cpu_s(pid)
    if own is None:
        raise FileNotFoundError(pid)  # the line itself is gone (CpuSampler stops on it)
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return own + sum(_own_cpu_s(int(child)) or 0.0 for child in children)


def _own_cpu_s(pid: int) -> float | None:
    """One process's user + system CPU seconds; None when it has ended."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS


def worker_pid(stack: Stack) -> int:
    return stack.processes["worker"].pid  # `exec` in the harness: the shell became the worker's line


def at(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


class CpuSampler(threading.Thread):
    """The worker's CPU seconds, read every `every` s: [(wall time, CPU s), ...]."""

    def __init__(self, pid: int, every: float = 1.0):
        super().__init__(daemon=True)
        self.pid, self.every, self.samples, self.stopping = pid, every, [], threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.samples.append((time.time(), cpu_s(self.pid)))
            except FileNotFoundError:  # the worker is gone: the run's counts will say what that cost
                return
            self.stopping.wait(self.every)

    def stop(self) -> list[tuple[float, float]]:
        self.stopping.set()
        self.join()
        return self.samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--render-s", type=float, default=60.0)
    parser.add_argument("--worker-processes", type=int, default=None,
                        help="WORKER_PROCESSES for the worker line (default: the Procfile's, from the cores)")
    args = parser.parse_args()

    stack = Stack(**({"WORKER_PROCESSES": args.worker_processes} if args.worker_processes else {}))
    stack.env["PROVIDER_CALLBACK_BASE_URL"] = f"http://127.0.0.1:{stack.port}"
    credentials = stack.prepare()
    stack.configure_this_process()
    from executor.models import Attempt
    from jobs.models import Job

    jobs = Job.objects.filter(client_id=credentials["client_id"])
    try:
        stack.start("sandbox")
        stack.start("web")
        stack.start("worker")
        pid = worker_pid(stack)
        time.sleep(3)  # every worker of the line up (the harness saw the first one's ready line)
        processes, messages = max(1, len(Path(f"/proc/{pid}/task/{pid}/children").read_text().split())), received(stack)
        body = {"kind": "media", "models": ["sandbox/video-keyed"],
                "input": {"prompt": "slow render", "render_s": args.render_s}}
        sampler = CpuSampler(pid)
        sampler.start()
        started = time.time()
        post_jobs(stack.port, credentials["api_key"], args.jobs, body=body, threads=32)
        posted = time.time()
        time.sleep(2)  # the last POSTs' submits
        cpu_from, waiting_from = cpu_s(pid), time.time()
        calls = requests.get(f"{stack.env['SANDBOX_URL']}/control/calls", timeout=30).json()["calls"]
        first_end = min(at(c["at"]) for c in calls if c["kind"] == "submit") + args.render_s
        # A window in which every job only waits exists when the POSTs and their submits took less than one
        # render; otherwise no such window exists, and the run says so (below).
        quiet = first_end - 1 > waiting_from + 1
        time.sleep(max(first_end - 1 - time.time(), 0))
        cpu_to, waiting_to = cpu_s(pid), time.time()
        # Long enough to see when the last job ends even when that misses the target by far.
        deadline = posted + args.render_s + max(120.0, args.jobs * 0.06)
        while jobs.filter(status__in=["queued", "running", "waiting"]).exists() and time.time() < deadline:
            time.sleep(0.5)
        time.sleep(3)  # late duplicates of a poll would show in the counts below
        ended = max(when for when in jobs.values_list("completed_at", flat=True) if when).timestamp()
        statuses = Counter(jobs.values_list("status", flat=True))
        messages = received(stack) - messages
        calls = requests.get(f"{stack.env['SANDBOX_URL']}/control/calls", timeout=30).json()["calls"]
        charges = requests.get(f"{stack.env['SANDBOX_URL']}/ledger", timeout=30).json()["charges"]
        callbacks = requests.get(f"{stack.env['SANDBOX_URL']}/control/callbacks", timeout=30).json()["callbacks"]
        attempts = {a.upstream_key: a for a in Attempt.objects.filter(job__client_id=credentials["client_id"])}
        samples = sampler.stop()
    finally:
        stack.stop()

    # In flight: from the job's accepted submit (the sandbox's clock) to the job's end (PostgreSQL's).
    submitted = {c["metadata"]["payonce_job"]: at(c["at"]) for c in calls if c["kind"] == "submit" and c["status"] == 202}
    done = {str(job_id): when.timestamp() for job_id, when in jobs.values_list("id", "completed_at")}
    events = sorted([(t, 1) for t in submitted.values()] + [(done[j], -1) for j in submitted if j in done])
    peak = current = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    polls = sum(1 for c in calls if c["kind"] == "poll")
    keys = Counter((c.get("metadata") or {}).get("upstream_key") for c in charges)
    balanced = (len(charges) == args.jobs and len(keys) == len(charges) and all(
        key in attempts and attempts[key].state == "succeeded" and attempts[key].cost_usd == Decimal(c["amount_usd"])
        for c in charges for key in [(c.get("metadata") or {}).get("upstream_key")]))
    jobs.delete()

    window = waiting_to - waiting_from
    waited = (cpu_to - cpu_from) / window if quiet else None
    busy = (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0])
    print(f"worker as the Procfile starts it: {processes} process{'es' if processes > 1 else ''}; {args.jobs} jobs, "
          f"render_s {args.render_s:g}")
    print(f"POSTs took {posted - started:.1f} s; jobs ended {dict(statuses)}")
    print(f"peak in flight: {peak} of {args.jobs} (target: all)")
    print(f"last job ended {ended - posted:.1f} s after the last POST (render {args.render_s:g} s; target < 90 s)")
    if quiet:
        print(f"worker CPU while all waited: {waited:.3f} cores over {window:.1f} s (target < 0.5)")
    else:
        print("worker CPU while all waited: not measurable in this run: the POSTs and their submits outlasted one "
              "render, so jobs were starting and ending at every moment")
    print(f"worker CPU from the first submit to the last end: {busy:.3f} cores on average")
    print(f"per job: {polls / args.jobs:.2f} provider polls, {messages / args.jobs:.2f} Celery messages received "
          f"by the worker, {len(callbacks) / args.jobs:.2f} callbacks sent")
    print(f"books: {len(charges)} charges for {args.jobs} jobs, each tied to one succeeded attempt at its "
          f"quoted cost: {'balanced' if balanced else 'NOT BALANCED'}")
    record("peak jobs in flight together", peak, "jobs", target=f"all ({args.jobs})", met=peak == args.jobs)
    record("last job ended, after the last POST", ended - posted, "s", baseline=args.render_s,
           baseline_is="the render's own length (--render-s, set)", ratio=(ended - posted) / args.render_s,
           target="< 90 s, every job succeeded", met=ended - posted < 90 and statuses["succeeded"] == args.jobs)
    if quiet:
        record("worker CPU while every job waited", waited, "cores", target="< 0.5", met=waited < 0.5)
    record("worker CPU, first submit to last end", busy, "cores")
    record("provider polls per job", polls / args.jobs, "polls")
    record("Celery messages received per job", messages / args.jobs, "messages")
    record("books: charges, each tied to one succeeded attempt at its quoted cost", len(charges), "charges",
           target=f"balanced ({args.jobs})", met=balanced)


if __name__ == "__main__":
    main()
