"""Benchmark: the budget guard on one hot client month, from 8 processes at once.

    pairs    reserve (billing.services.reserve: one statement, its own transaction, as the intent's) and
             then settle (billing.services.settle, as the attempt's answer does), against one client's
             month: two commits per pair, the first on the month's row
    ceiling  a plain `UPDATE ... SET n = n + 1` of one row, one commit each: the most a hot row takes

Each phase runs `--seconds` from `--processes` processes started together, twice, interleaved (ceiling,
pairs, ceiling, pairs); the medians are printed with their ratio (target: pairs >= 0.5 x ceiling). It uses
the benchmark database (payonce_bench, bench/stack.py) and cleans up its rows afterwards.
Run: `.venv/bin/python bench/budget.py [--processes 8] [--seconds 5]`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.figures import record  # noqa: E402
from bench.stack import Stack  # noqa: E402

HOT_ROW_SQL = "CREATE TABLE IF NOT EXISTS bench_hot_row (id int PRIMARY KEY, n bigint NOT NULL)"


def child(phase: str, start_at: float, seconds: float, client_id: str, job_id: str) -> None:
    """One process of a phase: wait for the common start, then count operations for `seconds`."""
    from decimal import Decimal

    from django.db import connection

    from billing import services
    from jobs.models import Job

    amount = Decimal("0.000001")
    done = 0
    while time.time() < start_at:
        time.sleep(0.001)
    stop_at = start_at + seconds
    with connection.cursor() as cursor:
        while time.time() < stop_at:
            if phase == "ceiling":
                cursor.execute("UPDATE bench_hot_row SET n = n + 1 WHERE id = 1")
            else:
                key = f"bench-{os.getpid()}-{done}"
                if not services.reserve(client_id=client_id, job_id=job_id, key=key, model="sandbox/llm",
                                        amount=amount, guard=Job.NOT_CANCELLED_SQL):  # as an attempt's intent
                    raise SystemExit("refused: the bench cap is too small")
                services.settle(key=key, cost=amount)
            done += 1
    print(json.dumps({"done": done}))


def run_phase(stack: Stack, phase: str, processes: int, seconds: float, client_id: str, job_id: str) -> float:
    start_at = time.time() + 3.0  # every process has set Django up by then
    procs = [subprocess.Popen([sys.executable, __file__, "--child", phase, str(start_at), str(seconds), client_id,
                               job_id], env=stack.env, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    counts = [json.loads(proc.communicate(timeout=seconds + 60)[0].strip().splitlines()[-1])["done"] for proc in procs]
    return sum(counts) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--child", nargs=5, metavar=("PHASE", "START", "SECONDS", "CLIENT", "JOB"))
    args = parser.parse_args()
    stack = Stack()
    if args.child:
        stack.configure_this_process()
        phase, start_at, seconds, client_id, job_id = args.child
        child(phase, float(start_at), float(seconds), client_id, job_id)
        return

    stack.manage("migrate", "--noinput")
    stack.configure_this_process()
    from decimal import Decimal

    from django.db import connection
    from django.utils import timezone

    from billing.models import BudgetMonth, Reservation
    from accounts.models import Client
    from jobs.models import Job

    client = Client.objects.create(name=f"bench-budget-{int(time.time())}", monthly_cap_usd=Decimal("999999"))
    job = Job.objects.create(id=uuid.uuid4(), client=client, idempotency_key="bench", request_hash="0" * 64,
                             kind="media", model_chain=["sandbox/llm"], input={}, policy={},
                             output_key=f"bench/{uuid.uuid4()}", lease_until=timezone.now())
    with connection.cursor() as cursor:
        cursor.execute(HOT_ROW_SQL)
        cursor.execute("INSERT INTO bench_hot_row VALUES (1, 0) ON CONFLICT (id) DO NOTHING")
    try:
        results = {"ceiling": [], "pairs": []}
        for _ in range(2):
            for phase in ("ceiling", "pairs"):
                results[phase].append(run_phase(stack, phase, args.processes, args.seconds, str(client.id), str(job.id)))
        ceiling, pairs = statistics.median(results["ceiling"]), statistics.median(results["pairs"])
        from billing.selectors import month_totals

        spent, reserved = month_totals(BudgetMonth.objects.get(client=client))
        print(f"{args.processes} processes on one client month, {args.seconds:g} s per phase, 2 rounds, {os.cpu_count()} CPUs")
        print(f"ceiling  UPDATE n = n + 1 on one row        {ceiling:8.1f} commits/s   (rounds: "
              f"{', '.join(f'{r:.1f}' for r in results['ceiling'])})")
        print(f"pairs    reserve + settle, one client month {pairs:8.1f} pairs/s     (rounds: "
              f"{', '.join(f'{r:.1f}' for r in results['pairs'])})")
        print(f"ratio    {pairs / ceiling:.2f} (target >= 0.5); after: spent {spent}, reserved {reserved}")
        record("reserve + settle pairs/s, one client month", pairs, "pairs/s", baseline=ceiling,
               baseline_unit="commits/s", baseline_is="ceiling: single-row UPDATE commits", ratio=pairs / ceiling,
               target="ratio >= 0.50", met=pairs / ceiling >= 0.5)
    finally:
        Reservation.objects.filter(job=job).delete()
        BudgetMonth.objects.filter(client=client).delete()
        job.delete()
        client.api_keys.all().delete()
        client.delete()
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS bench_hot_row")


if __name__ == "__main__":
    main()
