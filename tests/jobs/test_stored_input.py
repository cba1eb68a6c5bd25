"""What is validated is what is stored, and no input can make a job that never ends: a chapter key is a
slug exactly as sent (whitespace or a final newline is refused, never checked trimmed and stored raw),
the cleaned input is the row's while the Idempotency-Key's hash stays over the body as sent, and a
database error that will recur at step time ends the job INTERNAL_INPUT_ERROR instead of being swept
back into the same error for ever. Through the real `web` process where it is about HTTP."""

import json
from datetime import timedelta

import pytest
from django.db import DataError, IntegrityError, OperationalError, connection, transaction
from django.utils import timezone

from config.db import db_error_recurs
from jobs.engine import runner, sweeper
from jobs.models import Job, JobStatus, Step, StepStatus
from jobs.services import client_create
from orders.models import Order
from tests.support.http_api import HttpApi
from tests.support.reports import SUBJECT, report_body
from webhooks.models import Delivery

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def alice(web_stack):
    return HttpApi(web_stack.url, client_create(name="alice"))


def post_order(api: HttpApi, body: dict):
    return api.http.post(f"{api.base_url}/v1/orders", data=json.dumps(body), timeout=10,
                         headers=api.headers(**{"Content-Type": "application/json"}))


def order_body(chapters, payment="pi_stored_1", **overrides) -> dict:
    return {"payment_id": payment, "run_id": "run-1", "product": "natal-chart",
            "input": {"subject": SUBJECT, "chapters": chapters}, "email": "buyer@example.com", **overrides}


LEADING_SPACE_64 = " " + "a" * 64  # the finding's key: 64 letters once trimmed, 65 characters as stored


@pytest.mark.e2e
def test_the_findings_order_with_a_leading_space_chapter_key_is_422_and_pays_nothing(alice, ledger):
    answer = post_order(alice, order_body(["sun", LEADING_SPACE_64]))

    assert answer.status_code == 422, answer.text
    assert "chapters" in answer.json()["error"]["fields"]["input"]
    assert Order.objects.count() == 0 and Job.objects.count() == 0 and ledger.ledger()["charges"] == []


@pytest.mark.e2e
@pytest.mark.parametrize("chapters", [[LEADING_SPACE_64], ["sun ", " moon"], ["sun\n"], ["sun", "moon\n"],
                                      ["a" * 65], ["ｓｕｎ"]],
                         ids=["leading-space-64", "spaces-around", "final-newline", "second-final-newline",
                              "65-letters", "fullwidth"])
def test_a_chapter_key_that_is_not_exactly_a_slug_is_422_for_a_job(alice, chapters):
    answer = alice.create(report_body(chapters=chapters), key=f"k-{len(chapters)}")

    assert answer.status_code == 422, answer.text
    assert "chapters" in answer.json()["error"]["fields"]["input"]
    assert Job.objects.count() == 0


@pytest.mark.e2e
def test_a_report_email_with_spaces_is_stored_trimmed_and_its_replay_is_still_202(alice):
    body = report_body(chapters=["sun", "moon"])
    body["input"]["email"] = "  ada@example.com "

    first = alice.create(body, key="trimmed-email")
    replay = alice.create(body, key="trimmed-email")

    assert first.status_code == 201, first.text
    assert replay.status_code == 202 and replay.json()["id"] == first.json()["id"]
    stored = Job.objects.get(id=first.json()["id"])
    assert stored.input == {"subject": SUBJECT, "chapters": ["sun", "moon"], "email": "ada@example.com"}


@pytest.mark.e2e
def test_a_media_prompt_is_stored_as_it_was_checked(alice):
    body = {"kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": "  a lighthouse\n", "render_s": 1}}

    created = alice.create(body, key="trimmed-prompt")

    assert created.status_code == 201, created.text
    assert Job.objects.get(id=created.json()["id"]).input == {"prompt": "a lighthouse", "render_s": 1}
    assert alice.create(body, key="trimmed-prompt").status_code == 202


# --- a value that can only fail at step time ----------------------------------------------------------------


def _report_job_the_api_would_refuse(api_client_id) -> Job:
    """A report job inserted directly, as a row written before keys were checked as stored would be: a
    chapter key of 65 characters, which ReportChapter.key (64) cannot hold. Its enqueue lease ran out, so
    the sweeper takes it for stuck."""
    now = timezone.now()
    return Job.objects.create(
        client_id=api_client_id, idempotency_key="written-before-the-fix", request_hash="0" * 64, kind="report",
        status=JobStatus.QUEUED, run=1, model_chain=["sandbox/llm"],
        input={"subject": SUBJECT, "chapters": ["sun", " " + "a" * 64], "email": "ada@example.com"},
        policy={"attempts_per_model": 3, "fallback_on": ["exhausted", "unavailable"]},
        output_key="outputs/never", webhook_url="https://example.com/hooks", metadata={},
        created_at=now, updated_at=now, lease_until=now - timedelta(seconds=60))


def test_a_value_that_fails_at_step_time_ends_the_job_internal_input_error_and_is_never_swept_again(db):
    client = client_create(name="old-rows")
    job = _report_job_the_api_would_refuse(client["client_id"])
    assert [resumed[0] for resumed in sweeper.sweep()] == [str(job.id)]  # open and stuck: the sweeper resumes it

    outcome = runner.run_stage(job_id=job.id, run=1, stage="prepare", owner="task-1")

    job.refresh_from_db()
    assert job.status == JobStatus.FAILED, outcome
    assert job.error["code"] == "INTERNAL_INPUT_ERROR" and "too long" in job.error["message"]
    assert Delivery.objects.filter(job=job, event="generation.failed").count() == 1  # its event, like any failure
    assert Step.objects.get(job=job, run=1, name="load").status == StepStatus.FAILED
    # Ended: the sweeper never resumes it again, and a late delivery of the stage does nothing.
    Job.objects.filter(id=job.id).update(lease_until=timezone.now() - timedelta(seconds=60))
    assert sweeper.sweep() == []
    again = runner.run_stage(job_id=job.id, run=1, stage="prepare", owner="task-2")
    assert "failed" in again.reason
    assert Delivery.objects.filter(job=job).count() == 1


def _error_of(setup: str, sql: str, params=()):
    """The error `sql` raises after `setup`, in one transaction. Two statements, not one string: with
    server-side binding (the default) a statement with parameters is prepared, and PostgreSQL prepares one
    command at a time."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            if setup:
                cursor.execute(setup)
            cursor.execute(sql, params)
    except Exception as exc:  # noqa: BLE001 - the error is what the test looks at
        return exc
    raise AssertionError(f"{sql} did not fail")


def test_only_database_errors_that_will_recur_end_a_job(db):
    too_long = _error_of("CREATE TEMP TABLE t_long (s varchar(3))", "INSERT INTO t_long VALUES (%s)", ["x" * 10])
    check = _error_of("CREATE TEMP TABLE t_check (n int CHECK (n > 0))", "INSERT INTO t_check VALUES (-1)")
    unique = _error_of("CREATE TEMP TABLE t_unique (n int UNIQUE)", "INSERT INTO t_unique VALUES (1), (1)")
    cancelled = _error_of("SET LOCAL statement_timeout = 10", "SELECT pg_sleep(1)")

    assert isinstance(too_long, DataError) and db_error_recurs(too_long)
    assert isinstance(check, IntegrityError) and db_error_recurs(check)
    # A key another writer took first is a race a second try resolves; a cut or cancelled statement passes.
    assert isinstance(unique, IntegrityError) and not db_error_recurs(unique)
    assert isinstance(cancelled, OperationalError) and not db_error_recurs(cancelled)
    assert not db_error_recurs(OperationalError("the connection was cut"))
