"""The crash suite: 30 paid renders while the worker is SIGKILLed and restarted again and again and the
broker loses every message once. All 30 must succeed, and the sandbox's ledger must show 30 charges:
one per job, under its first upstream key.

Everything is a real process: `web`, `worker` and `beat` as the Procfile starts them (beat runs the
sweeper every second here), the sandbox provider, PostgreSQL, and Redis or RabbitMQ.
"""

import os
import signal
import time

import pytest
import requests
from kombu import Connection

from executor.models import Attempt
from jobs.models import Job
from jobs.services import client_create
from tests.conftest import HOOK_URL
from tests.support.books import assert_books_balance
from tests.support.procs import Stack
from webhooks.models import Delivery

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

JOBS = 30
PREFORK_WORKER = ("celery -A config worker -Q jobs --pool prefork --concurrency 2 --hostname jobs@%h "
                  "--without-gossip --without-mingle --loglevel INFO")

SCENARIOS = {
    # broker URL, worker command (None: the Procfile's), how the broker loses its messages. Each stack has
# short leases so that recovery (sweep interval + lease) fits a test (tests.support.procs.Stack).
    "redis": ("redis://127.0.0.1:6379/12", None, "flushdb"),
    "redis-prefork-children": ("redis://127.0.0.1:6379/12", PREFORK_WORKER, "flushdb"),
    "rabbitmq": ("amqp://guest:guest@127.0.0.1:5672//", None, "purge"),
}


def lose_every_message(broker_url: str, how: str) -> None:
    with Connection(broker_url) as conn:
        if how == "flushdb":
            # Every queued and unacknowledged message of this stack's own Redis database; a developer's
            # `make run` stack on database 0 keeps its messages.
            conn.default_channel.client.flushdb()
        else:
            conn.default_channel.queue_purge("jobs")  # RabbitMQ: every ready message of the jobs queue


@pytest.fixture
def stack(request, transactional_db, ledger):  # stopped before the database is flushed
    broker_url, worker_command, how = SCENARIOS[request.param]
    processes = Stack(broker_url, worker_command)
    try:
        yield processes.start(), broker_url, how
    finally:
        processes.stop()


@pytest.mark.parametrize("stack", list(SCENARIOS), indirect=True)
def test_30_renders_survive_sigkills_and_a_lost_broker_and_pay_once_each(stack, ledger):
    processes, broker_url, how = stack
    worker = processes["worker"]
    credentials = client_create(name="crash", webhook_url=HOOK_URL)  # its events are rows (no webhooks process)
    url = f"{processes.url}/v1/jobs"
    headers = {"Authorization": f"Bearer {credentials['api_key']}"}
    # The first submits are held in flight by the provider, so the first kill lands mid-call: those
    # attempts must go out again after the restart (under the same key) and be paid once.
    ledger.faults([{"model": "video-keyed", "action": "delay", "seconds": 2, "times": 4}])
    job_ids = []
    for n in range(JOBS):
        body = {"kind": "media", "models": ["sandbox/video-keyed"],
                "input": {"prompt": f"render {n}", "render_s": 2 + (n % 11) / 10}}
        response = requests.post(url, json=body, headers={**headers, "Idempotency-Key": f"crash-{n}"}, timeout=10)
        assert response.status_code == 201, response.text
        job_ids.append(response.json()["id"])

    for round_ in range(4):
        time.sleep(1.0)
        if worker.children() and round_ % 2 == 0:
            for child in worker.children():  # a pool process dies under its task
                os.kill(child, signal.SIGKILL)
        else:
            worker.kill()  # the whole worker dies: no shutdown, no acknowledgements
            worker.start()
        if round_ == 1:
            lose_every_message(broker_url, how)

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        open_jobs = Job.objects.filter(id__in=job_ids, status__in=["queued", "running", "waiting"]).count()
        if open_jobs == 0:
            break
        time.sleep(0.5)
    statuses = dict(Job.objects.filter(id__in=job_ids).values_list("id", "status"))
    assert sorted(set(map(str, statuses.values()))) == ["succeeded"], statuses
    # The kills landed mid-call: a submit that was out when its worker died went out again.
    assert Attempt.objects.filter(job_id__in=job_ids, sends__gte=2).exists()
    if how == "flushdb":
        # Redis lost every message, queued and unacknowledged: the jobs finished because the sweeper
        # resumed them from PostgreSQL, not because the broker gave anything back.
        assert "sweeper: resuming" in worker.output()

    charges = assert_books_balance(ledger)  # every charge is one attempt row with its upstream key
    per_job = {job_id: [c for c in charges if c["metadata"].get("payonce_job") == job_id] for job_id in job_ids}
    assert len(charges) == JOBS, f"{len(charges)} charges for {JOBS} jobs"
    for job_id, job_charges in per_job.items():
        assert len(job_charges) == 1, (job_id, job_charges)
        assert job_charges[0]["request_id"] == f"payonce-{job_id}-1"
    # One terminal event per job, under its one webhook-id.
    events = sorted(Delivery.objects.filter(job_id__in=job_ids).values_list("id", flat=True))
    assert events == sorted(f"{job_id}:1:generation.succeeded" for job_id in job_ids)
