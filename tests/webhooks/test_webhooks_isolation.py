"""A broken receiver never slows paid work: jobs finish at full speed while every webhook fails, because
deliveries have their own queue and their own worker process. The whole stack runs as the Procfile
starts it (web, worker, webhooks, beat) on a broker of its own."""

import time

import pytest
import requests

from jobs.models import Job
from jobs.services import client_create
from tests.conftest import WEBHOOK_TEST_ENV
from tests.support import redis_server
from tests.support.procs import Stack
from tests.support.webhook_receiver import Answer, WebhookReceiver
from webhooks.models import Delivery

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
JOBS = 20


@pytest.fixture
def stack(transactional_db, ledger):  # stopped before the database is flushed
    processes = Stack(redis_server.url(9), webhooks=True, **WEBHOOK_TEST_ENV)
    try:
        yield processes.start()
    finally:
        processes.stop()


def run_batch(stack, api_key: str, hook_url: str, tag: str) -> tuple[float, list[str]]:
    started = time.monotonic()
    ids = []
    for n in range(JOBS):
        response = requests.post(
            f"{stack.url}/v1/jobs", timeout=10,
            json={"kind": "media", "models": ["sandbox/video-keyed"], "webhook_url": hook_url,
                  "input": {"prompt": f"{tag} {n}", "render_s": 0.5}},
            headers={"Authorization": f"Bearer {api_key}", "Idempotency-Key": f"{tag}-{n}"},
        )
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    while Job.objects.filter(id__in=ids).exclude(status="succeeded").exists():
        assert time.monotonic() - started < 60, "jobs did not finish"
        time.sleep(0.05)
    return time.monotonic() - started, ids


def test_jobs_keep_finishing_at_full_speed_while_every_webhook_fails(stack, ledger):
    credentials = client_create(name="isolation")
    with WebhookReceiver(credentials["webhook_secret"]) as healthy:
        baseline, healthy_ids = run_batch(stack, credentials["api_key"], healthy.url, "healthy")
        healthy.wait_for(lambda: len(healthy.requests) >= JOBS, message="the healthy receiver got every event")

    # Every webhook now fails slowly: each try holds a dispatcher thread for 4 s, then gets a 500.
    with WebhookReceiver(credentials["webhook_secret"], default=Answer(500, delay_s=4)) as broken:
        degraded, broken_ids = run_batch(stack, credentials["api_key"], broken.url, "broken")
        assert degraded <= baseline * 1.5 + 1.0, (baseline, degraded)
        deliveries = Delivery.objects.filter(job_id__in=broken_ids)
        assert deliveries.count() == JOBS and not deliveries.filter(status="delivered").exists()
        assert len(broken.requests) >= 1  # the dispatcher was busy failing meanwhile
