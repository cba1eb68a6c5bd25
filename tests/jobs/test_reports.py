"""Reports and orders (docs/design.md, "Reports and orders"): the job engine run in this process as a worker runs it
(tests/support/engine.py), the sandbox's LLM endpoint, and a real SMTP server process; a worker killed during the
fan-out on real processes. Nothing paid for is paid again."""

import re
import time
import uuid
from decimal import Decimal

import pytest

from billing.models import Reservation
from executor.models import Attempt
from jobs.models import Job, Report, ReportChapter
from tests.support.books import assert_books_balance
from tests.support import redis_server
from tests.support.reports import CHAPTERS, llm_calls, report_body

# Under rollback: the engine runs in this connection, and no other has to see a commit (the worker killed
# during the fan-out commits, through its fixture's transactional_db).
pytestmark = pytest.mark.django_db


def link_in(mail: dict) -> str:
    return re.search(r"http://\S+/r/\S+", mail["body"]).group(0)


def test_an_eight_chapter_report_is_sealed_mailed_and_read_with_nine_calls_paid_once(engine, ledger, api, mailbox,
                                                                                     mail_to):
    mail_to(mailbox)
    created = api.create(report_body(), key="report-1")
    assert created.status_code == 201, created.content
    engine.run_job(created.json()["id"])
    job = api.job(created.json()["id"])

    assert job["status"] == "succeeded", job
    assert [c["key"] for c in job["chapters"]] == CHAPTERS
    assert all(c["status"] == "done" and len(c["attempts"]) == 1 for c in job["chapters"])
    # 9 calls: the synthesis and 8 chapters; every one an attempt with its upstream key and derived cost.
    charges = assert_books_balance(ledger)
    assert len(charges) == 9 and len(llm_calls(ledger)) == 9
    attempts = Attempt.objects.filter(job_id=job["id"])
    assert sorted(a.step for a in attempts) == sorted(["synthesis"] + [f"chapter-{k}" for k in CHAPTERS])
    assert all(a.cost_source == "derived" for a in attempts)
    total = sum(Decimal(c["amount_usd"]) for c in charges)
    assert Decimal(job["cost"]["total_usd"]) == total
    assert sum(Decimal(c["cost_usd"]) for c in job["chapters"]) + Decimal(
        attempts.get(step="synthesis").cost_usd) == total
    assert not Reservation.objects.filter(state="held").exists()

    [mail] = mailbox.wait_for(1)
    assert mail["to"] == ["ada@example.com"] and "/r/" in mail["body"]
    page = api.http.get("/r/" + link_in(mail).split("/r/", 1)[1])
    assert page.status_code == 200 and page["Content-Type"].startswith("text/html")
    html = page.content.decode()
    positions = [html.index(f'data-chapter="{key}"') for key in CHAPTERS]
    assert positions == sorted(positions)  # all 8, in order

    markdown = api.get(f"/v1/jobs/{job['id']}/report")
    assert markdown.status_code == 200 and markdown["Content-Type"].startswith("text/markdown")
    as_json = api.http.get(f"/v1/jobs/{job['id']}/report", headers={**api.headers(), "Accept": "application/json"})
    texts = {c["key"]: c["text"] for c in as_json.json()["chapters"]}
    assert list(texts) == CHAPTERS and all(texts.values())
    assert Report.objects.get(job_id=job["id"]).delivered_at is not None


# --- nothing paid for is paid again -------------------------------------------------------------------------


def report_job(api, chapters=CHAPTERS) -> Job:
    """A report job row as the API writes it, not enqueued: the test drives its stages itself."""
    from datetime import timedelta

    from django.utils import timezone

    body = report_body(chapters)
    job_id = uuid.uuid4()
    return Job.objects.create(
        id=job_id, client_id=api.client_id, idempotency_key=f"k-{job_id}", request_hash="0" * 64, kind="report",
        model_chain=body["models"], input=body["input"], policy={"attempts_per_model": 3, "fallback_on": []},
        output_key=f"reports/{job_id}", metadata={}, lease_until=timezone.now() + timedelta(minutes=10))


class ProviderThatRefusesRepeats:
    """The sandbox's LLM, except that being asked for the synthesis or a chapter that is done fails the
    test (the resume must not ask for them)."""

    def __init__(self, done_keys):
        from executor.providers.sandbox.adapter import SandboxProvider

        self.inner, self.done_keys, self.asked = SandboxProvider(), set(done_keys), []

    def complete(self, model, *, system, messages, max_tokens, upstream_key, metadata):
        content = messages[-1]["content"]
        text = content if isinstance(content, str) else "".join(block["text"] for block in content)
        if "Write the synthesis" in text:
            raise AssertionError("the synthesis was asked for again")
        key = re.search(r'Write the chapter "([a-z0-9-]+)"', text).group(1)
        if key in self.done_keys:
            raise AssertionError(f"chapter {key} was asked for again")
        self.asked.append(key)
        return self.inner.complete(model, system=system, messages=messages, max_tokens=max_tokens,
                                   upstream_key=upstream_key, metadata=metadata)


def test_a_resumed_report_asks_only_for_the_missing_chapters_and_keeps_the_rest_byte_identical(
        engine, api, ledger, monkeypatch, settings):
    from django.utils import timezone

    from executor import services as executor_services
    from jobs.kinds.report import reports

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    job = report_job(api)
    report = reports.report_load(job=job)
    Report.objects.filter(job_id=job.id).update(synthesis="The synthesis, written before the crash.")
    kept = {key: f"Chapter {key}, written before the crash. é ✓\n" for key in CHAPTERS[:5]}
    for key, text in kept.items():
        ReportChapter.objects.filter(report=report, key=key).update(status="done", text=text, run=1,
                                                                    done_at=timezone.now())
    port = ProviderThatRefusesRepeats(kept)
    monkeypatch.setattr(executor_services, "provider", lambda spec: port)

    engine.run_job(job)

    job.refresh_from_db()
    assert job.status == "succeeded", job.error
    assert sorted(port.asked) == sorted(CHAPTERS[5:])  # only the 3 missing ones
    chapters = {c.key: c.text for c in ReportChapter.objects.filter(report_id=job.id)}
    assert all(chapters[key] == text for key, text in kept.items())  # byte for byte
    assert Report.objects.get(job_id=job.id).synthesis == "The synthesis, written before the crash."
    assert len(assert_books_balance(ledger)) == 3


def test_a_persons_retry_of_a_report_that_failed_on_one_chapter_pays_only_for_that_chapter(
        engine, ledger, api, mailbox, mail_to):
    mail_to(mailbox)
    # The synthesis passes (a no-op fault takes the first call); the next call, a chapter, is refused.
    ledger.faults([{"model": "llm", "action": "delay", "seconds": 0},
                   {"model": "llm", "action": "status_400", "message": "that chapter is not allowed"}])
    job_id = api.create(report_body(), key="retry-me").json()["id"]
    engine.run_job(job_id)
    failed = api.job(job_id)
    assert failed["status"] == "failed" and failed["error"]["code"] == "CHAPTER_FAILED", failed
    [refused] = [c for c in failed["chapters"] if c["status"] != "done"]
    assert failed["error"]["chapters"] == [refused["key"]] and len(refused["attempts"]) == 1  # a 400: no retry
    calls_run_1 = len(llm_calls(ledger))
    assert calls_run_1 == 9 and len(ledger.ledger()["charges"]) == 8  # the refusal was not charged

    retried = api.http.post(f"/v1/jobs/{job_id}/retry", headers=api.headers())
    assert retried.status_code == 202
    engine.run_job(job_id)
    done = api.job(job_id)
    assert done["run"] == 2, done

    assert done["status"] == "succeeded", done
    assert len(llm_calls(ledger)) == calls_run_1 + 1  # run 2 called only for the missing chapter
    run2 = Attempt.objects.filter(job_id=job_id, run=2)
    assert [a.step for a in run2] == [f"chapter-{refused['key']}"]
    assert len(assert_books_balance(ledger)) == 9
    assert len(mailbox.wait_for(1)) == 1


def test_a_429_is_tried_again_and_a_400_is_not(engine, api, ledger, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    job = report_job(api, chapters=["one", "two"])
    # The engine runs the sub-steps in key order, each at once, and a back-off's retry when it is due.
    ledger.faults([{"model": "llm", "action": "delay", "seconds": 0},  # the synthesis
                   {"model": "llm", "action": "status_429", "seconds": 0.2},  # chapter one, first try
                   {"model": "llm", "action": "status_400"},  # chapter two: refused, not tried again
                   {"model": "llm", "action": "delay", "seconds": 0}])  # chapter one, second try
    engine.run_job(job)

    job.refresh_from_db()
    assert job.status == "failed" and job.error["code"] == "CHAPTER_FAILED" and job.error["chapters"] == ["two"]
    one = list(Attempt.objects.filter(job=job, step="chapter-one").values_list("state", "error_class"))
    two = list(Attempt.objects.filter(job=job, step="chapter-two").values_list("state", "error_class"))
    assert one == [("failed", "rate_limited"), ("succeeded", None)]
    assert two == [("failed", "invalid_input")]
    assert not Report.objects.get(job_id=job.id).sealed_at
    assert len(assert_books_balance(ledger)) == 2  # the synthesis and chapter one


def test_an_empty_answer_fails_its_chapter_and_the_report_is_not_sealed(engine, api, ledger, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    job = report_job(api, chapters=["one", "two"])
    ledger.faults([{"model": "llm", "action": "delay", "seconds": 0}, {"model": "llm", "action": "empty"}])
    engine.run_job(job)

    job.refresh_from_db()
    assert job.status == "failed" and job.error["code"] == "CHAPTER_FAILED"
    statuses = dict(ReportChapter.objects.filter(report_id=job.id).values_list("key", "status"))
    assert sorted(statuses.values()) == ["done", "failed"]
    assert Report.objects.get(job_id=job.id).sealed_at is None
    assert len(assert_books_balance(ledger)) == 3  # the empty answer was paid for, and is on the record


def test_a_budget_pre_flight_that_refuses_the_report_makes_no_chapter_call(engine, api, ledger, settings):
    from accounts.models import Client

    Client.objects.filter(id=api.client_id).update(monthly_cap_usd=Decimal("0.10"))
    job = report_job(api)
    engine.run_job(job)

    job.refresh_from_db()
    assert job.status == "failed" and job.error["code"] == "BUDGET_EXCEEDED", job.error
    assert len(llm_calls(ledger)) == 1  # the synthesis only: not one chapter
    assert not Attempt.objects.filter(job=job, step__startswith="chapter-").exists()
    assert len(assert_books_balance(ledger)) == 1


# --- outages and crashes ---------------------------------------------------------------------------------------


MAIL_STEP_LEASE_S = 30  # the default, said aloud: the test below tells a back-off from a lease running out


@pytest.fixture
def mail_outage(settings, mail_to):
    """A mail server that is not there yet (its port refuses), to start later; this process's mail goes
    to it, with a short timeout."""
    from tests.support.mail import SmtpProcess

    server = SmtpProcess()
    mail_to(server)
    settings.EMAIL_TIMEOUT, settings.STEP_LEASE_S = 2, MAIL_STEP_LEASE_S
    yield server
    server.stop()
    server.cleanup()


@pytest.mark.e2e  # starts an SMTP server of its own, down and then up
def test_a_mail_outage_after_the_seal_leaves_the_report_sealed_and_it_is_delivered_once_mail_is_back(
        engine, mail_outage, ledger, api, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):  # the API's enqueue, sent to the engine
        job_id = api.create(report_body(CHAPTERS[:2]), key="outage").json()["id"]
    engine.run(lambda: Report.objects.filter(job_id=job_id, sealed_at__isnull=False).exclude(delivery_error="").exists(),
               timeout=30)  # the report sealed, and delivery was tried
    assert api.job(job_id)["status"] == "running"  # sealed; delivery waits for the mail server
    assert api.get(f"/v1/jobs/{job_id}/report").status_code == 200  # and the report is readable

    mail_outage.start()  # mail comes back
    # The delivery's next try comes after its back-off (about a second), taken back by the task that backed
    # off; not after its lease ran out (STEP_LEASE_S), as when the pause was handed to another task that
    # found the step held (jobs.engine.runner._hand_over).
    engine.run_job(job_id, timeout=MAIL_STEP_LEASE_S / 2)
    job = api.job(job_id)

    assert job["status"] == "succeeded" and job["output"]["delivered"] is True
    time.sleep(1)
    assert len(mail_outage.messages()) == 1  # delivered once
    assert len(assert_books_balance(ledger)) == 3


@pytest.fixture
def report_stack(transactional_db, ledger, mailbox):
    from tests.support.procs import Stack

    processes = Stack(redis_server.url(13), EMAIL_URL=mailbox.url, WORKER_CONCURRENCY=16)
    try:
        yield processes.start()
    finally:
        processes.stop()


@pytest.mark.e2e
def test_a_worker_killed_during_the_fan_out_still_seals_and_every_call_is_on_the_record(report_stack, ledger, mailbox):
    import requests

    from jobs.services import client_create

    ledger.faults([{"model": "llm", "action": "delay", "seconds": 2, "times": 9}])  # every call held 2 s
    credentials = client_create(name="killed")
    created = requests.post(f"{report_stack.url}/v1/jobs", json=report_body(), timeout=10,
                            headers={"Authorization": f"Bearer {credentials['api_key']}", "Idempotency-Key": "kill"})
    job_id = created.json()["id"]
    deadline = time.monotonic() + 30
    while Attempt.objects.filter(job_id=job_id, step__startswith="chapter-", state="submitting").count() < 4:
        assert time.monotonic() < deadline, "the chapters never went out"
        time.sleep(0.05)

    report_stack["worker"].kill()  # chapter calls are out: intents committed, answers not back
    report_stack["worker"].start()

    deadline = time.monotonic() + 90
    while Job.objects.get(id=job_id).status not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, "the report did not end after the restart"
        time.sleep(0.2)
    job = Job.objects.get(id=job_id)
    assert job.status == "succeeded", job.error
    assert Report.objects.get(job_id=job_id).sealed_at is not None
    time.sleep(2.5)  # the calls the dead worker had out land at the provider (held 2 s): let them
    charges = assert_books_balance(ledger)  # every chapter call on the ledger is on the attempt record
    uncertain = Attempt.objects.filter(job_id=job_id, state="uncertain")
    # Extra calls are counted and explained: each one is an attempt the dead worker had out, on the
    # record as uncertain with its reservation kept as spent, and paid again under the next key.
    succeeded = Attempt.objects.filter(job_id=job_id, state="succeeded")
    assert succeeded.count() == 9  # the synthesis and 8 chapters, each paid once by the record
    by_key = {c["metadata"]["upstream_key"]: c for c in charges}
    extra = [key for key in by_key if key not in {a.upstream_key for a in succeeded}]
    assert set(extra) <= {a.upstream_key for a in uncertain}  # never a silent one
    assert len(charges) == 9 + len(extra) and len(extra) <= uncertain.count()
    assert uncertain.count() >= 1 and all("died" in a.error for a in uncertain)
    assert Reservation.objects.filter(key__in=[a.upstream_key for a in uncertain], unpriced=True).count() == uncertain.count()
