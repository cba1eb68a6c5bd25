"""Benchmark: jobs per second end to end (POST to terminal) against its floor, in one run.

  floor    a bare Celery chain of 3 no-op tasks per job, on the same broker and the same worker command
           (the least a submit / wait / finish job can cost in messages)
  payonce  N `media` jobs with render_s 0 on sandbox/video-keyed, POSTed to `web` and run by `worker`,
           both as the Procfile starts them, with the sandbox provider as its own process

It also counts, not estimates, per job: Celery messages the worker received, write transactions
(PostgreSQL transaction ids assigned: every commit that wrote), SQL statements (every statement the
same code issues for one job, captured in this process, BEGIN and COMMIT included) and whole-machine CPU
(/proc/stat over the run, as ../shared/peers/lib/cpu.py counts it for the peers). Targets (issue 12):
<= 6 write commits and <= 16 statements per job; the throughput target is against DBOS, measured by
../shared/peers/compare.sh, which runs this script. Run: `.venv/bin/python bench/e2e_throughput.py [--jobs 2000]`.
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
from bench.figures import record  # noqa: E402
from bench.stack import Stack  # noqa: E402

BODY = {"kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": "bench", "render_s": 0}}


def next_xid() -> int:
    """The next transaction id PostgreSQL will assign: the difference over a run counts write transactions
    (read-only ones get no id). Cluster-wide: run the benchmark on an otherwise quiet database server."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
        return cursor.fetchone()[0]


def received(stack: Stack) -> int:
    """Celery messages the `jobs` workers have taken so far, by their own count (remote control's stats:
    each worker's total by task name); their "received" lines are not written at INFO."""
    from config.celery import app

    replies = app.control.inspect(timeout=2).stats() or {}
    return sum(sum(reply.get("total", {}).values()) for node, reply in replies.items() if node.startswith("jobs"))


def post_jobs(port: int, api_key: str, count: int, threads: int = 16, body: dict | None = None) -> None:
    body = json.dumps(body or BODY)
    run_id = time.time_ns()

    def post(offset: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for n in range(offset, count, threads):
            conn.request("POST", "/v1/jobs", body=body, headers={
                "Authorization": f"Bearer {api_key}", "Content-Type": "application/json",
                "Idempotency-Key": f"bench-{run_id}-{n}"})
            response = conn.getresponse()
            response.read()
            assert response.status == 201, response.status

    workers = [threading.Thread(target=post, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def floor(stack: Stack, jobs: int) -> tuple[float, float]:
    """Jobs per second of the no-op chain, and its whole-machine CPU ms per job."""
    from celery import chain
    from redis import Redis

    from config.celery import noop

    counter = f"bench:floor:{time.time_ns()}"
    redis = Redis.from_url(stack.env["BROKER_URL"])
    busy, started = busy_seconds(), time.perf_counter()
    for _ in range(jobs):
        chain(noop.si(), noop.si(), noop.si(counter)).apply_async()
    while int(redis.get(counter) or 0) < jobs:
        time.sleep(0.05)
    elapsed, cpu_ms = time.perf_counter() - started, (busy_seconds() - busy) * 1000 / jobs
    redis.delete(counter)
    return jobs / elapsed, cpu_ms


def payonce(stack: Stack, credentials: dict, jobs: int) -> tuple[float, dict]:
    from jobs.models import Job

    client_jobs = Job.objects.filter(client_id=credentials["client_id"])
    xid, messages, busy, processes = next_xid(), received(stack), busy_seconds(), process_cpu()
    started = time.perf_counter()
    post_jobs(stack.port, credentials["api_key"], jobs)
    while client_jobs.filter(status__in=["queued", "running", "waiting"]).exists():
        time.sleep(0.2)
    elapsed = time.perf_counter() - started
    counts = {
        "cpu_ms": (busy_seconds() - busy) * 1000 / jobs,
        "by_process": cpu_by_group(processes, process_cpu(), jobs),
        "succeeded": client_jobs.filter(status="succeeded").count(),
        "messages": (received(stack) - messages) / jobs,
        "commits": (next_xid() - xid) / jobs,
    }
    return jobs / elapsed, counts


def process_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds so far of every process on the machine, with the group it belongs to."""
    ticks, found = os.sysconf("SC_CLK_TCK"), {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found[int(entry)] = (_group(cmdline), (int(stat[11]) + int(stat[12])) / ticks)
    return found


def _group(cmdline: str) -> str:
    # uvicorn's --workers children are multiprocessing spawns (their command line does not say uvicorn).
    for needle, name in (("uvicorn", "web"), ("multiprocessing.spawn", "web"), ("celery", "worker"),
                         ("otlp_receiver", "otlp receiver"), ("sandbox", "sandbox"), ("postgres", "postgres"),
                         ("redis", "redis"), ("bench/", "load generator (this script)")):
        if needle in cmdline:
            return name
    return "other"


def cpu_by_group(before: dict, after: dict, jobs: int) -> dict[str, float]:
    """CPU ms per job of each group of processes between two process_cpu() snapshots."""
    spent: dict[str, float] = {}
    for pid, (group, seconds) in after.items():
        spent[group] = spent.get(group, 0.0) + seconds - (before.get(pid, (group, 0.0))[1])
    return {group: ms * 1000 / jobs for group, ms in sorted(spent.items(), key=lambda item: -item[1]) if ms > 0}


def busy_seconds() -> float:
    """Whole-machine CPU seconds not idle, all cores (the peers' lib/cpu.py, the same fields)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def statements_per_job(credentials: dict, sample: int = 50) -> tuple[float, float]:
    """Run `sample` jobs through the same code in this process (API create, then each stage as its task
    would), capturing every SQL statement and counting write transactions."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobs import services

    from jobs.engine import outcomes, runner
    from jobs.engine.steps import FirstStart
    from accounts.models import ClientAPIKey
    from jobs.api.serializers import JobCreateSerializer

    prefix = credentials["api_key"].partition(".")[0]
    serializer = JobCreateSerializer(data=BODY)
    serializer.is_valid(raise_exception=True)
    xid = next_xid()
    with CaptureQueriesContext(connection) as captured:
        for n in range(sample):
            # What POST /v1/jobs does: the API key with its client, then the insert.
            client = ClientAPIKey.objects.get_usable_keys().select_related("client").get(prefix=prefix).client
            job, _ = services.job_create(client=client, idempotency_key=f"stmt-{time.time_ns()}-{n}",
                                         data=dict(serializer.validated_data))
            # As the worker runs it: a stage, and the stages after it inline, until one has to wait.
            stages, index = ["prepare", "wait", "finish"], 0
            while True:
                # The first stage as its doorbell runs it: the job starts in its first transaction.
                first = FirstStart.ONLY_CHOICE if index == 0 else None
                outcome = runner.run_stage(job_id=job.id, run=1, stage=stages[index], owner="bench", start=first)
                if isinstance(outcome, outcomes.Later):
                    time.sleep(outcome.countdown)
                elif isinstance(outcome, outcomes.Continue):
                    time.sleep(outcome.countdown)
                    index += 1
                else:
                    break
    commits = (next_xid() - xid) / sample
    return len(captured) / sample, commits


def tracing_overhead(stack: Stack, credentials: dict, jobs: int, rounds: int) -> None:
    """Issue 43: the cost of tracing every job, in one run. `web` and `worker` are started again for each
    phase, without traces and then with every span exported (OTLP/HTTP, the SDK's defaults) to a receiver
    process standing in for a collector (tests/support/otlp_receiver.py: it decodes
    every span and writes it to a file, a collector's work); the phases alternate, `rounds` of each, and the
    medians are compared. CPU per job is the whole machine's, and payonce's own (web, worker, PostgreSQL,
    Redis, the sandbox: without the receiver, whose work a collector on another machine would do).
    Run: `.venv/bin/python bench/e2e_throughput.py --tracing [--jobs 2000 --rounds 2]`."""
    from tests.support.otlp_receiver import OtlpReceiver

    receiver = OtlpReceiver(out=stack.workdir / "spans.jsonl").start()
    traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_SERVICE_NAME": "payonce-bench",
              **{key: value for key, value in os.environ.items() if key.startswith("OTEL_PYTHON_")}}
    phases: dict[str, list[tuple[float, dict]]] = {"off": [], "on": []}
    try:
        for _ in range(rounds):
            for phase in ("off", "on"):
                env = traced if phase == "on" else {}
                for name in ("web", "worker"):
                    if name in stack.processes:
                        stack.processes[name].stop(timeout=30)
                    stack.start(name, **env)
                receiver.reset()
                rate, counts = payonce(stack, credentials, jobs)
                counts["spans"] = receiver.stats()["spans"] if phase == "on" else 0
                phases[phase].append((rate, counts))
                print(f"  tracing {phase:3}: {rate:6.1f} jobs/s, {counts['cpu_ms']:5.1f} ms whole-machine CPU per job "
                      f"({_cpu_line(counts)}), {counts['spans'] / jobs:.1f} spans per job exported", flush=True)
    finally:
        for name in ("web", "worker"):  # they send what they hold as they stop: the receiver still takes it
            if name in stack.processes:
                stack.processes[name].stop(timeout=30)
        receiver.stop()
        receiver.cleanup()

    def median(phase: str, value) -> float:
        return statistics.median(value(rate, counts) for rate, counts in phases[phase])

    def own_cpu(rate, counts) -> float:  # payonce's processes, without the stand-in collector
        return sum(ms for group, ms in counts["by_process"].items() if group not in ("otlp receiver", "other"))

    figures = {
        "jobs/s": (median("off", lambda rate, counts: rate), median("on", lambda rate, counts: rate)),
        "whole-machine CPU ms per job": (median("off", lambda rate, counts: counts["cpu_ms"]),
                                         median("on", lambda rate, counts: counts["cpu_ms"])),
        "payonce's CPU ms per job (no receiver)": (median("off", own_cpu), median("on", own_cpu)),
        "worker CPU ms per job": (median("off", lambda rate, counts: counts["by_process"].get("worker", 0)),
                                  median("on", lambda rate, counts: counts["by_process"].get("worker", 0))),
        "web CPU ms per job": (median("off", lambda rate, counts: counts["by_process"].get("web", 0)),
                               median("on", lambda rate, counts: counts["by_process"].get("web", 0))),
    }
    print(f"tracing overhead, medians of {rounds} rounds of {jobs} jobs each (off, then on, alternating):")
    for name, (off, on) in figures.items():
        change = (on - off) / off if off else 0.0
        print(f"  {name:42} off {off:7.2f}   on {on:7.2f}   {change:+.1%}")
    off, on = figures["jobs/s"]
    record("jobs/s with every job traced", on, "jobs/s", baseline=off, baseline_is="tracing off, same run",
           ratio=on / off, target=">= 0.90 of tracing off", met=on / off >= 0.90)
    off, on = figures["payonce's CPU ms per job (no receiver)"]
    record("payonce's CPU per job with every job traced", on, "ms", baseline=off, baseline_is="tracing off, same run",
           ratio=on / off, target="<= 1.10 of tracing off", met=on / off <= 1.10)


def _cpu_line(counts: dict) -> str:
    return ", ".join(f"{group} {ms:.1f}" for group, ms in counts["by_process"].items() if ms >= 0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--tracing", action="store_true",
                        help="issue 43: jobs/s and CPU per job with tracing off and on, alternating (only that)")
    parser.add_argument("--rounds", type=int, default=2, help="with --tracing: rounds of each phase")
    args = parser.parse_args()
    if args.tracing:
        stack = Stack()
        credentials = stack.prepare()
        stack.configure_this_process()
        try:
            stack.start("sandbox")
            tracing_overhead(stack, credentials, args.jobs, args.rounds)
        finally:
            from jobs.models import Job

            stack.stop()
            Job.objects.filter(client_id=credentials["client_id"]).delete()
        return

    stack = Stack()
    credentials = stack.prepare()
    stack.configure_this_process()
    try:
        stack.start("sandbox")
        stack.start("web")
        stack.start("worker")
        floor_rate, floor_cpu_ms = floor(stack, args.jobs)
        rate, counts = payonce(stack, credentials, args.jobs)
        # The in-process sample must not race the worker for its own jobs: they are never enqueued
        # (job_create enqueues on commit, which this process does, so stop the worker first).
        stack.processes["worker"].stop(timeout=30)
        statements, sample_commits = statements_per_job(credentials)
    finally:
        from jobs.models import Job

        stack.stop()
        Job.objects.filter(client_id=credentials["client_id"]).delete()

    print(f"worker as the Procfile starts it: {stack.env.get('WORKER_CONCURRENCY', '16')} threads; "
          f"{args.jobs} jobs per phase")
    print(f"floor   (3 no-op tasks per job)   {floor_rate:8.1f} jobs/s   {floor_cpu_ms:.1f} ms whole-machine CPU per job")
    print(f"payonce (media, render_s 0)       {rate:8.1f} jobs/s   ratio {rate / floor_rate:.2f}")
    print(f"        succeeded {counts['succeeded']}/{args.jobs}")
    print(f"per job: {counts['messages']:.2f} Celery messages received, {counts['commits']:.2f} write commits "
          f"(target <= 6), {statements:.1f} SQL statements (target <= 16; in-process sample: "
          f"{sample_commits:.2f} write commits), {counts['cpu_ms']:.1f} ms whole-machine CPU")
    print("CPU ms per job by process: " + ", ".join(f"{group} {ms:.1f}" for group, ms in counts["by_process"].items()))
    floor_is = "floor: bare Celery chain of 3 no-op tasks per job"
    record("payonce jobs/s, POST to terminal", rate, "jobs/s", baseline=floor_rate, baseline_is=floor_is,
           ratio=rate / floor_rate)
    record("whole-machine CPU per job", counts["cpu_ms"], "ms", baseline=floor_cpu_ms, baseline_is=floor_is,
           ratio=counts["cpu_ms"] / floor_cpu_ms)
    record("write commits per job", counts["commits"], "commits", target="<= 6", met=counts["commits"] <= 6)
    record("SQL statements per job", statements, "statements", target="<= 16", met=statements <= 16)
    record("Celery messages received per job", counts["messages"], "messages")


if __name__ == "__main__":
    main()
