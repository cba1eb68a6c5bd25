"""The worker dies while an attempt is out (intent committed, the provider's answer not yet back): after
a restart the same upstream key goes out again and the provider charges once. Real processes: web,
worker and beat as the Procfile starts them, on a broker of their own, and the sandbox."""

import time

import pytest
import requests

from executor.models import Attempt
from jobs.models import Job
from jobs.services import client_create
from tests.support.books import assert_books_balance
from tests.support.procs import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def stack(transactional_db, ledger):  # stopped before the database is flushed
    processes = Stack("redis://127.0.0.1:6379/10")
    try:
        yield processes.start()
    finally:
        processes.stop()


def test_worker_killed_while_submitting_resends_the_same_key_and_pays_once(stack, ledger):
    ledger.faults([{"model": "video-keyed", "action": "delay", "seconds": 3}])  # hold the submit out
    credentials = client_create(name="crash")
    response = requests.post(
        f"{stack.url}/v1/jobs", timeout=10,
        json={"kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": "killed", "render_s": 1}},
        headers={"Authorization": f"Bearer {credentials['api_key']}", "Idempotency-Key": "kill-1"},
    )
    job_id = response.json()["id"]
    deadline = time.monotonic() + 15
    while not Attempt.objects.filter(job_id=job_id, state="submitting").exists():
        assert time.monotonic() < deadline, "the attempt never reached submitting"
        time.sleep(0.05)

    stack["worker"].kill()  # while the submit is out: the intent is committed, the answer is not back
    time.sleep(0.5)
    stack["worker"].start()

    deadline = time.monotonic() + 60
    while Job.objects.get(id=job_id).status not in ("succeeded", "failed", "waiting", "cancelled"):
        assert time.monotonic() < deadline, "the job did not end after the restart"
        time.sleep(0.2)
    assert Job.objects.get(id=job_id).status == "succeeded"
    sent = [c for c in ledger.calls() if c["kind"] == "submit"]
    assert len(sent) >= 2  # it went out again after the restart ...
    assert {c["request_id"] for c in sent} == {f"payonce-{job_id}-1"}  # ... under the same key
    charges = assert_books_balance(ledger)
    assert len(charges) == 1
    [attempt] = Attempt.objects.filter(job_id=job_id)
    assert (attempt.number, attempt.state) == (1, "succeeded") and attempt.sends >= 2
