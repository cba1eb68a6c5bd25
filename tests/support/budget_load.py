"""A process of the budget tests (tests/billing/test_budget_concurrency.py): separate processes, not threads of one.

    python tests/support/budget_load.py load PLAN INDEX RESULT      pay for this process's share of each trial
    python tests/support/budget_load.py sample RESULT STOP          sample every client month until STOP exists

`load` reads a JSON plan `{"processes": N, "barrier": "redis key", "trials": [[job id, ...], ...]}`; for each
trial it waits at a Redis barrier with the other processes, then sends every N-th job of the trial from
INDEX through the executor (intent with its reservation, the call, the settle), exactly as a worker does.
`sample` reads `spent + reserved - cap` of every client month, as often as it can, and records the worst.
Both run against the test database and the sandbox the suite started (DATABASE_URL, SANDBOX_URL).
"""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402


def barrier(client, key: str, parties: int, trial: int) -> None:
    name = f"{key}:{trial}"
    client.incr(name)
    client.expire(name, 600)
    deadline = time.monotonic() + 120
    while int(client.get(name) or 0) < parties:
        if time.monotonic() > deadline:
            raise SystemExit(f"barrier {name} not reached")
        time.sleep(0.001)


def load(plan_path: str, index: int, result_path: str) -> None:
    import redis

    from executor import render
    from jobs.engine.outcomes import JobFailure, NotYet
    from jobs.models import Job

    plan = json.loads(Path(plan_path).read_text())
    processes = plan["processes"]
    client = redis.Redis.from_url(plan["redis"])
    outcomes = []
    for trial, job_ids in enumerate(plan["trials"]):
        mine = job_ids[index::processes]
        jobs = list(Job.objects.filter(id__in=mine))
        barrier(client, plan["barrier"], processes, trial)
        paid = refused = 0
        for job in jobs:
            try:
                accepted = render.submit(job)
                while True:
                    try:
                        render.wait(job, attempt=accepted)
                        break
                    except NotYet:  # the render runs: look again (at the record)
                        accepted = None
                        time.sleep(0.01)
                paid += 1
            except JobFailure as failure:
                if failure.code != "BUDGET_EXCEEDED":
                    raise
                refused += 1
        outcomes.append({"paid": paid, "refused": refused})
    Path(result_path).write_text(json.dumps(outcomes))


_OVER_SQL = """
SELECT coalesce(max(b.spent + b.reserved - coalesce(c.monthly_cap_usd, %s)), 0), count(*)
  FROM billing_budgetmonth b JOIN jobs_client c ON c.id = b.client_id
"""


def sample(result_path: str, stop_path: str) -> None:
    worst, samples = None, 0
    while not os.path.exists(stop_path):
        with connection.cursor() as cursor:
            cursor.execute(_OVER_SQL, [settings.BUDGET_MONTHLY_CAP_USD])
            over, months = cursor.fetchone()
        if months:
            worst = over if worst is None else max(worst, over)
            samples += 1
    Path(result_path).write_text(json.dumps({"worst_over_cap_usd": str(worst), "samples": samples}))


if __name__ == "__main__":
    if sys.argv[1] == "load":
        load(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        sample(sys.argv[2], sys.argv[3])
