"""The worker dies while an attempt is out (intent committed, the provider's answer not yet back: the
sandbox holds the submit with a `delay` fault), and is restarted. What recovery does is the provider's
capability: a keyed model gets the same key again and charges once; a lookup model is found by its
metadata and adopted, never sent again; a blind model waits for a person, with one charge and never a
silent second. Real processes: web, worker and beat as the Procfile starts them, on a broker of their
own, and the sandbox."""

import time
from decimal import Decimal

import pytest
import requests

from billing.models import Reservation
from billing.selectors import month_totals
from executor.models import Attempt
from jobs.models import Job, Step
from jobs.services import client_create
from tests.conftest import HOOK_URL
from tests.support.books import assert_books_balance
from tests.support.procs import Stack
from webhooks.models import Delivery

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def stack(transactional_db, ledger):  # stopped before the database is flushed
    # A send may take PROVIDER_CONNECT_TIMEOUT_S + PROVIDER_READ_TIMEOUT_S: how long a lookup must wait
    # before "not found" proves a send absent (kept short here).
    processes = Stack("redis://127.0.0.1:6379/10", PROVIDER_READ_TIMEOUT_S=6, PROVIDER_CONNECT_TIMEOUT_S=1)
    try:
        yield processes.start()
    finally:
        processes.stop()


def kill_while_submitting(stack, ledger, model: str, down_s: float = 0.0) -> str:
    """POST a job on `model` whose submit the sandbox holds for 3 s; SIGKILL the worker while it is out
    (the intent committed, the answer not back) and start it again `down_s` later. Returns the job id
    once it ended."""
    ledger.faults([{"model": model.split("/")[1], "action": "delay", "seconds": 3}])  # hold the submit out
    credentials = client_create(name="crash", webhook_url=HOOK_URL)  # its events are rows (no webhooks process)
    response = requests.post(
        f"{stack.url}/v1/jobs", timeout=10,
        json={"kind": "media", "models": [model], "input": {"prompt": "killed", "render_s": 1}},
        headers={"Authorization": f"Bearer {credentials['api_key']}", "Idempotency-Key": "kill-1"},
    )
    job_id = response.json()["id"]
    deadline = time.monotonic() + 15
    while not [c for c in ledger.calls() if c["kind"] == "submit"]:
        assert time.monotonic() < deadline, "the submit never reached the provider"
        time.sleep(0.02)
    assert Attempt.objects.get(job_id=job_id).state == "submitting"

    stack["worker"].kill()  # while the submit is out: the intent is committed, the answer is not back
    time.sleep(down_s)
    stack["worker"].start()

    deadline = time.monotonic() + 60
    while Job.objects.get(id=job_id).status not in ("succeeded", "failed", "waiting", "cancelled"):
        assert time.monotonic() < deadline, "the job did not end after the restart"
        time.sleep(0.2)
    # The restarted worker took the submit step over from the dead one.
    assert Step.objects.get(job_id=job_id, name="submit").attempts >= 2
    return job_id


def reservation_of(job_id) -> tuple:
    [reservation] = Reservation.objects.filter(job_id=job_id)
    spent, reserved = month_totals(reservation.budget)
    return reservation.state, reservation.spent, spent, reserved


def test_worker_killed_while_submitting_resends_the_same_key_and_pays_once(stack, ledger):
    job_id = kill_while_submitting(stack, ledger, "sandbox/video-keyed")
    assert Job.objects.get(id=job_id).status == "succeeded"
    # The dead worker's reservation was settled by the execution that resolved its attempt.
    assert reservation_of(job_id) == ("settled", Decimal("0.40"), Decimal("0.40"), Decimal("0"))
    sent = [c for c in ledger.calls() if c["kind"] == "submit"]
    assert len(sent) >= 2  # it went out again after the restart ...
    assert {c["request_id"] for c in sent} == {f"payonce-{job_id}-1"}  # ... under the same key
    charges = assert_books_balance(ledger)
    assert len(charges) == 1
    [attempt] = Attempt.objects.filter(job_id=job_id)
    assert (attempt.number, attempt.state) == (1, "succeeded") and attempt.sends >= 2


def test_a_lookup_model_killed_while_submitting_is_found_and_adopted_with_one_charge(stack, ledger):
    job_id = kill_while_submitting(stack, ledger, "sandbox/image-lookup")

    assert Job.objects.get(id=job_id).status == "succeeded"
    assert len([c for c in ledger.calls() if c["kind"] == "submit"]) == 1  # never sent again: found
    assert [c for c in ledger.calls() if c["kind"] == "lookup"]
    [attempt] = Attempt.objects.filter(job_id=job_id)
    assert (attempt.number, attempt.state, attempt.sends) == (1, "succeeded", 1)
    assert len(assert_books_balance(ledger)) == 1
    assert reservation_of(job_id) == ("settled", Decimal("0.04"), Decimal("0.04"), Decimal("0"))


def test_a_blind_model_killed_while_submitting_waits_for_a_person_with_one_charge(stack, ledger):
    job_id = kill_while_submitting(stack, ledger, "sandbox/image-blind")

    job = Job.objects.get(id=job_id)
    assert job.status == "waiting" and job.error["code"] == "UNCERTAIN_SUBMIT"
    deadline = time.monotonic() + 10
    while not ledger.ledger()["charges"]:  # the held submit lands after the kill: the provider charged it
        assert time.monotonic() < deadline, "the held submit never landed"
        time.sleep(0.1)
    assert len([c for c in ledger.calls() if c["kind"] == "submit"]) == 1  # never a silent second
    [attempt] = Attempt.objects.filter(job_id=job_id)
    assert attempt.state == "uncertain"
    assert list(Delivery.objects.filter(job_id=job_id).values_list("event", flat=True)) == ["generation.needs_review"]
    assert len(assert_books_balance(ledger)) == 1
    # Held while nobody knows; a person's decision (here: cancel) keeps it as spent. Nothing stays reserved.
    assert reservation_of(job_id) == ("held", None, Decimal("0"), Decimal("0.04"))
    from jobs.services import job_cancel

    assert job_cancel(job=Job.objects.get(id=job_id))
    assert reservation_of(job_id) == ("settled", Decimal("0.04"), Decimal("0.04"), Decimal("0"))


def keyed_worker_down_for(ledger, down_s: float, **env) -> str:
    """kill_while_submitting on a video-keyed job, its worker down for `down_s`, on a stack of its own
    (the `stack` fixture's settings, with `env`)."""
    stack = Stack("redis://127.0.0.1:6379/10", PROVIDER_READ_TIMEOUT_S=6, PROVIDER_CONNECT_TIMEOUT_S=1, **env)
    try:
        return kill_while_submitting(stack.start(), ledger, "sandbox/video-keyed", down_s=down_s)
    finally:
        stack.stop()


def test_a_keyed_submit_found_after_the_wait_deadline_is_resent_and_pays_once(transactional_db, ledger):
    # Issue 21, finding 3: found after WAIT_DEADLINE_S, the attempt went to a person without one resend,
    # though a resend of its key returns the render for free. The deadline bounds an accepted render's
    # wait, not a key's life: the sandbox remembers keys for ever.
    job_id = keyed_worker_down_for(ledger, 4.0, WAIT_DEADLINE_S=2)

    assert Job.objects.get(id=job_id).status == "succeeded"
    [attempt] = Attempt.objects.filter(job_id=job_id)
    assert (attempt.number, attempt.state, attempt.paid) == (1, "succeeded", "yes") and attempt.sends >= 2
    assert (attempt.finished_at - attempt.created_at).total_seconds() > 2  # resolved past the deadline
    sent = [c for c in ledger.calls() if c["kind"] == "submit"]
    assert len(sent) >= 2 and {c["request_id"] for c in sent} == {f"payonce-{job_id}-1"}
    assert len(assert_books_balance(ledger)) == 1
    assert reservation_of(job_id) == ("settled", Decimal("0.40"), Decimal("0.40"), Decimal("0"))


def test_a_keyed_submit_found_after_its_key_may_have_expired_is_uncertain_and_never_resent(transactional_db, ledger):
    # Past key_ttl_s the provider may have forgotten the key, and a resend could make (and bill) the render
    # again: the attempt is uncertain, the job waits for a person, and nothing is sent again.
    job_id = keyed_worker_down_for(ledger, 5.0, SANDBOX_KEY_TTL_S=4)

    job = Job.objects.get(id=job_id)
    assert (job.status, job.error["code"]) == ("waiting", "UNCERTAIN_SUBMIT")
    [attempt] = Attempt.objects.filter(job_id=job_id)
    assert (attempt.state, attempt.paid, attempt.sends) == ("uncertain", "unknown", 1)
    assert len([c for c in ledger.calls() if c["kind"] == "submit"]) == 1  # never resent
    assert len(assert_books_balance(ledger)) == 1  # the held submit landed: charged once, and held for a person
