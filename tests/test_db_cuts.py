"""A worker whose database connections are cut (pg_terminate_backend) while its tasks run keeps working.

Found by the storm's connection cuts: a task that failed because its connection was cut had its error
stored through the database result backend, over the same dead connection; that raised again outside
the task, Celery's threads pool swallowed it, and the task never completed or was acknowledged. Eight
such tasks (WORKER_CONCURRENCY) and the worker took no more messages, for good: webhooks stopped. A real
`webhooks` worker and `beat`, the drain rung every 0.2 s, hundreds of cuts.
"""

import json
import re
import time

import psycopg
import pytest
from django.db import connection

from tests.conftest import purge_queue
from tests.support.procs import ProcfileProcess

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

BROKER = "redis://127.0.0.1:6379/8"
TASK_LINE = re.compile(r"Task (webhooks\.\w+)\[([0-9a-f-]+)\] (received|succeeded|raised|retry)")


def task_states(log: str) -> dict[str, set[str]]:
    """{task id: what the worker said of it}, from its JSON log lines."""
    states: dict[str, set[str]] = {}
    for line in log.splitlines():
        if not line.startswith("{"):
            continue
        found = TASK_LINE.search(json.loads(line).get("event", ""))
        if found:
            states.setdefault(found.group(2), set()).add(found.group(3))
    return states


# The processes under test connect under this application name (libpq reads PGAPPNAME), so only their
# connections are cut: the suite's own pooled connections to the same database are never touched.
APP_NAME = "payonce-db-cuts-test"


def cut_connections(dbname: str, seconds: float) -> int:
    """pg_terminate_backend on the processes' connections to `dbname` every 50 ms, for `seconds`."""
    cuts = 0
    with psycopg.connect(host="127.0.0.1", user="postgres", dbname="postgres", autocommit=True) as admin:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            cuts += admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = %s AND application_name = %s", [dbname, APP_NAME]).fetchone()[0]
            time.sleep(0.05)
    return cuts


def test_a_worker_whose_connections_are_cut_mid_task_completes_every_task_and_keeps_consuming(transactional_db):
    purge_queue(BROKER, "webhooks")
    # LOG_LEVEL=DEBUG: the worker's "received" and "succeeded" lines of the drain, read below, are routine
    # lines kept at DEBUG (config.logs.RoutineFilter).
    env = {"BROKER_URL": BROKER, "WEBHOOK_DRAIN_INTERVAL_S": 0.2, "PGAPPNAME": APP_NAME, "LOG_LEVEL": "DEBUG"}
    worker = ProcfileProcess("webhooks", env).start()
    beat = ProcfileProcess("beat", env).start()
    try:
        cuts = cut_connections(connection.settings_dict["NAME"], seconds=15)
        cut_over = len(worker.output())
        time.sleep(5)  # the last tasks cut end; the drain keeps ringing
    finally:
        beat.stop()
        worker.stop()

    log = worker.output()
    states = task_states(log)
    assert cuts >= 50, cuts  # the worker's connections were cut again and again
    assert any("raised" in said for said in states.values())  # tasks were hit mid-way
    # Every task received while the cuts went on ended (it had 5 s more), and the worker still takes
    # and completes new ones after them.
    stuck = [task for task in task_states(log[:cut_over]) if states[task] == {"received"}]
    assert stuck == [], f"{len(stuck)} tasks never completed nor were acknowledged: {stuck[:8]}"
    after = task_states(log[cut_over:])
    assert [task for task, said in after.items() if "succeeded" in said], "no task completed after the cuts"
