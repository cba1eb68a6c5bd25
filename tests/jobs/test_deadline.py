"""`policy.deadline_s` (docs/api.md, "Create a job: POST /v1/jobs"): a job whose first paid call has not gone out by its deadline
ends DEADLINE_EXCEEDED with nothing reserved or sent; a job already paid is never cut short by it. The job engine
runs in this process as a worker runs it (tests/support/engine.py), the sandbox's ledger the ground truth."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from accounts.models import Client
from billing.models import Reservation
from executor.models import Attempt
from jobs import dispatch
from jobs.engine import sweeper
from jobs.models import Job
from tests.conftest import media_body
from tests.support.books import assert_books_balance

pytestmark = pytest.mark.django_db


def test_a_queued_job_past_its_deadline_ends_unpaid(engine, api, ledger):
    created = api.create(media_body(policy={"deadline_s": 5}), key="late")
    assert created.status_code == 201 and created.json()["policy"]["deadline_s"] == 5
    # It waited in the queue past its deadline (a backlog, no worker): then a worker takes it.
    Job.objects.filter(id=created.json()["id"]).update(created_at=Job.objects.get(id=created.json()["id"]).created_at
                                                      - timedelta(seconds=6))
    job = engine.run_job(created.json()["id"])
    assert job.status == "failed" and job.error["code"] == "DEADLINE_EXCEEDED", job.error
    assert not Attempt.objects.filter(job=job).exists() and not Reservation.objects.filter(job_id=job.id).exists()
    assert assert_books_balance(ledger) == []


def test_a_paid_job_is_never_cut_short_by_its_deadline(engine, api, ledger):
    created = api.create(media_body(input={"prompt": "slow", "render_s": 1}, policy={"deadline_s": 60}), key="paid")
    job_id = created.json()["id"]
    engine.start(Job.objects.get(id=job_id))
    # The render is accepted (paid) well inside its deadline; then the deadline passes while it renders.
    engine.run(until=lambda: Attempt.objects.filter(job_id=job_id, accepted_at__isnull=False).exists(), job=job_id)
    Job.objects.filter(id=job_id).update(created_at=Job.objects.get(id=job_id).created_at - timedelta(seconds=120))
    job = engine.run_job(job_id)
    assert job.status == "succeeded", job.error
    [attempt] = Attempt.objects.filter(job=job)
    assert attempt.accepted_at is not None
    assert len(assert_books_balance(ledger)) == 1


def test_a_deadline_is_a_number_of_seconds_within_bounds(api):
    for bad in ("soon", True, 0, 30 * 86400 + 1):
        answer = api.create(media_body(policy={"deadline_s": bad}), key=f"bad-{bad}")
        assert answer.status_code == 422 and "deadline_s" in answer.json()["error"]["fields"]["policy"], answer.content


def test_an_absolute_deadline_ends_a_job_still_queued_when_it_passes_with_nothing_paid(api, ledger, settings):
    # A client at its running limit: its second job waits queued, and its deadline passes meanwhile. The
    # sweeper ends it then, not when its turn would come.
    Client.objects.filter(id=api.client_id).update(max_running=1)
    soon = (timezone.now() + timedelta(seconds=30)).isoformat()
    first = api.create(media_body(), key="first").json()
    late = api.create(media_body(policy={"deadline_at": soon}), key="late").json()
    assert late["policy"]["deadline_at"].endswith("Z")
    with transaction.atomic():  # started in its first transaction, as a worker's mark_running does
        dispatch.job_start_first(job_id=first["id"], client_id=api.client_id, only_choice=True)
    assert sweeper.end_queued_past_deadline() == 0  # not yet
    Job.objects.filter(id=late["id"]).update(policy={**late["policy"], "deadline_at": "2000-01-01T00:00:00Z"})
    assert sweeper.end_queued_past_deadline() == 1
    ended = api.job(late["id"])
    assert ended["status"] == "failed" and ended["error"]["code"] == "DEADLINE_EXCEEDED"
    assert api.job(first["id"])["status"] == "running"  # a started job is not the sweeper's to end
    Job.objects.filter(id=first["id"]).update(policy={"deadline_s": 1}, created_at=timezone.now() - timedelta(days=1))
    assert sweeper.end_queued_past_deadline() == 0
    assert not Attempt.objects.filter(job_id=late["id"]).exists() and assert_books_balance(ledger) == []


def test_a_deadline_that_has_passed_at_create_is_refused(api):
    past = (timezone.now() - timedelta(seconds=1)).isoformat()
    answer = api.create(media_body(policy={"deadline_at": past}), key="past")
    assert answer.status_code == 422 and "deadline_at" in answer.json()["error"]["fields"]["policy"], answer.content
    answer = api.create(media_body(policy={"deadline_at": "tomorrow"}), key="word")
    assert answer.status_code == 422 and "deadline_at" in answer.json()["error"]["fields"]["policy"], answer.content
