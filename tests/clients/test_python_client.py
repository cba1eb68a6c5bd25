"""The Python client library (clients/python, `payonce_client`) against a real stack: `web` and `worker`
processes, the sandbox, and for webhooks a `webhooks` worker and a receiver (tests/clients/conftest.py).

What it must show is the library's one promise: a call that is tried again never pays twice. A lost
answer and a 503 are made by a real TCP proxy in front of `web` (tests/support/proxy.py); what was paid
is read from the sandbox's ledger, and what payonce holds from its database."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import time
from datetime import UTC, datetime
from decimal import Decimal

import httpx
import payonce_client
import pytest
from payonce_client import AsyncPayonce, Payonce, webhooks
from payonce_client.errors import (
    APIConnectionError,
    APIError,
    IdempotencyConflict,
    InvalidRequest,
    JobNotRetryable,
    JobTerminal,
    NotFound,
    Unauthenticated,
    WaitTimeout,
    WebhookVerificationError,
)
from standardwebhooks.webhooks import Webhook

from jobs.models import Job as JobRow
from jobs.models import ReportTemplate, ReportTemplateVersion
from jobs.services import client_create
from tests.support.books import assert_books_balance
from tests.support.procs import REPO_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

RENDER = {"kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": "a lighthouse at dusk", "render_s": 0}}
REPORT = {"kind": "report", "models": ["sandbox/llm"],
          "input": {"subject": {"name": "Ada", "born": "1990-04-12T06:30"}, "chapters": ["sun", "moon"],
                    "email": "x@example.com"}}


def client(account, url: str | None = None, **options) -> Payonce:
    return Payonce(base_url=url or account.url, api_key=account.api_key, **options)


def assert_paid_once(client_id: str, ledger, job_id: str, jobs_paid: int = 1) -> None:
    """payonce holds one job for the client, and the provider charged once for it, for the job's first
    attempt under its upstream key (`jobs_paid`: how many jobs the ledger holds in all, one charge each);
    and the books balance: every charge maps to one attempt row (tests/support/books.py)."""
    assert JobRow.objects.filter(client_id=client_id).count() == 1
    charges = assert_books_balance(ledger)
    assert len(charges) == jobs_paid, charges
    mine = [charge for charge in charges if charge["metadata"]["payonce_job"] == job_id]
    assert len(mine) == 1, charges
    assert mine[0]["request_id"] == mine[0]["metadata"]["upstream_key"] == f"payonce-{job_id}-1"


# --- the retry rule ---------------------------------------------------------------------------------------


def test_a_lost_answer_is_sent_again_under_the_same_key_and_paid_once(account, ledger, flaky_proxy):
    proxy = flaky_proxy("lose_answer")
    with client(account, proxy.url) as po:
        job = po.jobs.create(**RENDER)
        assert len(proxy.spoiled) == 1 and len(proxy.seen) == 2
        # The second try carried the first one's key and body: payonce answered 202, the same job.
        assert job.replayed is True and job.idempotency_key
        assert JobRow.objects.filter(client_id=account.client_id).count() == 1
        assert str(JobRow.objects.get(client_id=account.client_id).id) == job.id
        done = po.jobs.wait(job.id, timeout=30)
    assert done.status == "succeeded"
    assert_paid_once(account.client_id, ledger, job.id)


def test_a_503_is_waited_out_for_its_retry_after(account, ledger, flaky_proxy):
    proxy = flaky_proxy("answer_503")
    with client(account, proxy.url) as po:
        job = po.jobs.create(**RENDER)
        assert len(proxy.seen) == 2 and proxy.seen[1] - proxy.seen[0] >= 1.0  # Retry-After: 1
        assert job.replayed is False  # payonce never saw the first try
        assert po.jobs.wait(job.id, timeout=30).status == "succeeded"
    assert_paid_once(account.client_id, ledger, job.id)


def test_async_a_lost_answer_and_a_503_are_sent_again_and_paid_once(account, ledger, flaky_proxy):
    losing, busy = flaky_proxy("lose_answer"), flaky_proxy("answer_503")
    other = client_create(name="client-library-async")  # one client per proxy: one job each

    async def run():
        async with AsyncPayonce(base_url=losing.url, api_key=account.api_key) as po, \
                AsyncPayonce(base_url=busy.url, api_key=other["api_key"]) as po_busy:
            lost, waited = await asyncio.gather(po.jobs.create(**RENDER), po_busy.jobs.create(**RENDER))
            done = await asyncio.gather(po.jobs.wait(lost.id, timeout=30), po_busy.jobs.wait(waited.id, timeout=30))
            # The rest of the async surface, on the ended job (nothing more is paid).
            events = [event async for event in po.jobs.events(lost.id)]
            assert [e.event for e in events] == ["message", "end"] and events[0].data["status"] == "succeeded"
            assert [job.id async for job in po.jobs.list(limit=1)] == [lost.id]
            data = await po.jobs.output(lost.id)
            async with po.jobs.output(lost.id, stream=True) as output:
                assert b"".join([chunk async for chunk in output]) == data and len(data) == 4096
            return lost, waited, done

    lost, waited, done = asyncio.run(run())
    assert len(losing.seen) == 2 and lost.replayed is True
    assert len(busy.seen) == 2 and busy.seen[1] - busy.seen[0] >= 1.0 and waited.replayed is False
    assert [job.status for job in done] == ["succeeded", "succeeded"]
    assert_paid_once(account.client_id, ledger, lost.id, jobs_paid=2)
    assert_paid_once(other["client_id"], ledger, waited.id, jobs_paid=2)


def test_wait_polls_when_no_stream_is_left_and_a_cancel_whose_answer_was_lost_returns_the_job(
        account, ledger, flaky_proxy):
    answered: list[tuple[str, int]] = []
    http = httpx.Client(base_url=account.url, event_hooks={"response": [
        lambda response: answered.append((response.request.url.path, response.status_code))]})
    with client(account, http_client=http) as po:
        job = po.jobs.create(**{**RENDER, "input": {"prompt": "a long one", "render_s": 60}})

        # Every stream the client may hold (SSE_MAX_PER_CLIENT, 20) is taken: `wait` is refused one
        # (429 TOO_MANY_STREAMS) and polls instead, until its timeout.
        with httpx.Client(base_url=account.url, headers={"Authorization": f"Bearer {account.api_key}"}) as raw, \
                contextlib.ExitStack() as streams:
            for _ in range(20):
                assert streams.enter_context(raw.stream("GET", f"/v1/jobs/{job.id}/events")).status_code == 200
            with pytest.raises(WaitTimeout) as waited:
                po.jobs.wait(job.id, timeout=1.5, poll_interval=0.25)
        assert waited.value.job.id == job.id and waited.value.job.status in ("queued", "running")
        assert (f"/v1/jobs/{job.id}/events", 429) in answered
        assert answered.count((f"/v1/jobs/{job.id}", 200)) >= 3  # polled

        proxy = flaky_proxy("lose_answer", path=f"/v1/jobs/{job.id}/cancel")
        with client(account, proxy.url) as through_proxy:
            cancelled = through_proxy.jobs.cancel(job.id)
        assert len(proxy.seen) == 2  # the second try was told JOB_TERMINAL (cancelled): the first did it
        assert cancelled.status == "cancelled" and cancelled.error["code"] == "CANCELLED"
        with pytest.raises(JobTerminal) as ended:  # a cancel sent once to an ended job is an error
            po.jobs.cancel(job.id)
        assert ended.value.details["status"] == "cancelled" and ended.value.attempts == 1


def test_a_retry_is_sent_once_and_a_lost_answer_says_to_read_the_job(account, ledger, flaky_proxy):
    failing = {**RENDER, "input": {"prompt": "a storm", "render_s": 0, "fail_render": "the farm caught fire"}}
    with client(account) as po:
        job = po.jobs.wait(po.jobs.create(**failing).id, timeout=30)
        assert job.status == "failed" and job.error["code"] == "PAID_ATTEMPT_FAILED" and job.run == 1
        proxy = flaky_proxy("lose_answer", path=f"/v1/jobs/{job.id}/retry")
        with client(account, proxy.url) as through_proxy, pytest.raises(APIConnectionError) as lost:
            through_proxy.jobs.retry(job.id)
        assert lost.value.maybe_sent is True and "before deciding again" in str(lost.value)
        assert len(proxy.seen) == 1  # never sent again: a second retry could pay a third time
        # The retry was taken: the job is in its next run, and was paid for once more, not twice.
        assert po.jobs.get(job.id).run == 2
        assert po.jobs.wait(job.id, timeout=30).status == "failed"
    assert len(ledger.ledger()["charges"]) == 2


# --- following a job -------------------------------------------------------------------------------------


def test_wait_for_a_render_and_read_its_output(account, ledger):
    with client(account) as po:
        job = po.jobs.create(**{**RENDER, "input": {**RENDER["input"], "size_bytes": 10_000}})
        done = po.jobs.wait(job.id, timeout=30)
        assert done.status == "succeeded" and done.completed_at is not None
        assert done.cost.total_usd == Decimal("0.400000") and done.attempts[0].paid == "yes"
        data = po.jobs.output(job.id)
        assert len(data) == 10_000 == done.output["bytes"]
        with po.jobs.output(job.id, stream=True) as output:
            assert output.content_type == "video/mp4"
            assert b"".join(output) == data


def test_follow_a_report_through_its_event_stream(account, ledger):
    with client(account) as po:
        job = po.jobs.create(**REPORT)
        events = list(po.jobs.events(job.id))
        frames, end = events[:-1], events[-1]
        assert end.event == "end" and end.data == {"status": "succeeded"} and end.id is None
        ids = [int(frame.id) for frame in frames]
        assert frames and ids == sorted(set(ids))  # increasing, none twice
        assert frames[-1].data["status"] == "succeeded" and frames[-1].data["chapters"] == {"done": 2, "total": 2}
        # Resuming after the last frame: nothing the client has is sent again, only the end.
        assert [e.event for e in po.jobs.events(job.id, last_event_id=frames[-1].id)] == ["end"]

        done = po.jobs.wait(job.id, timeout=10)
        assert done.status == "succeeded" and [c.key for c in done.chapters] == ["sun", "moon"]
        markdown = po.jobs.report(job.id)
        assert "## Sun" in markdown and "## Moon" in markdown
        report = po.jobs.report(job.id, format="json")
        assert report.job_id == job.id and [c.key for c in report.chapters] == ["sun", "moon"]
        assert po.jobs.output(job.id).decode() == markdown  # a report's output is a 303 to its report


def test_events_survive_the_server_closing_and_the_connection_dropping(account, ledger, flaky_proxy):
    # SSE_MAX_S is 8 s in the test stack: a 9 s render outlives the first stream, whose first answer the
    # proxy also drops. The proxy spoils nothing else and counts the connections.
    with client(account) as po:
        job = po.jobs.create(**{**RENDER, "input": {"prompt": "a slow one", "render_s": 9}})
    proxy = flaky_proxy("lose_answer", method="GET", path=f"/v1/jobs/{job.id}/events")
    with client(account, proxy.url) as po:
        events = list(po.jobs.events(job.id))
    assert len(proxy.seen) >= 3  # dropped, then closed by the server after 8 s, then the end
    ids = [int(e.id) for e in events if e.event != "end"]
    assert ids == sorted(set(ids)) and events[-1].event == "end" and events[-1].data["status"] == "succeeded"
    statuses = [e.data["status"] for e in events[:-1]]
    assert statuses[-1] == "succeeded" and "running" in statuses


# --- reading, errors, money, orders -----------------------------------------------------------------------


def test_list_get_cancel_spend_and_errors(account, ledger):
    seen_requests: list[httpx.Request] = []
    http = httpx.Client(base_url=account.url, event_hooks={"request": [seen_requests.append]})
    with client(account, http_client=http) as po:
        made = [po.jobs.create(**{**RENDER, "metadata": {"n": n}}) for n in range(3)]
        listed = list(po.jobs.list(limit=2))
        assert [j.id for j in listed] == [j.id for j in reversed(made)]  # newest first, across two pages
        assert sum(1 for r in seen_requests if r.url.path == "/v1/jobs" and r.method == "GET") == 2
        assert po.jobs.get(made[0].id).metadata == {"n": 0}
        assert [j.status for j in (po.jobs.wait(j.id, timeout=30) for j in made)] == ["succeeded"] * 3
        assert {j.id for j in po.jobs.list(status="succeeded")} == {j.id for j in made}

        with pytest.raises(JobTerminal) as terminal:
            po.jobs.cancel(made[0].id)
        assert (terminal.value.status, terminal.value.code) == (409, "JOB_TERMINAL")
        assert terminal.value.details["status"] == "succeeded" and terminal.value.message
        with pytest.raises(JobNotRetryable):
            po.jobs.retry(made[0].id)

        with pytest.raises(IdempotencyConflict) as conflict:
            po.jobs.create(**RENDER, idempotency_key=made[0].idempotency_key)
        assert conflict.value.status == 409 and conflict.value.code == "IDEMPOTENCY_CONFLICT"
        assert conflict.value.body["error"]["job_id"] == made[0].id and conflict.value.message
        again = po.jobs.create(**{**RENDER, "metadata": {"n": 0}}, idempotency_key=made[0].idempotency_key)
        assert again.replayed and again.id == made[0].id

        spend = po.spend()
        assert spend.spent_usd == Decimal("1.200000") and isinstance(spend.cap_usd, Decimal)
        assert [(m.model, m.attempts) for m in spend.by_model] == [("sandbox/video-keyed", 3)]
        assert po.whoami().client_id == account.client_id
    assert len(ledger.ledger()["charges"]) == 3

    other = client_create(name="someone-else")
    with Payonce(base_url=account.url, api_key=other["api_key"]) as theirs:
        with pytest.raises(NotFound) as not_found:
            theirs.jobs.get(made[0].id)
        assert not_found.value.status == 404 and not_found.value.code == "NOT_FOUND" and not_found.value.body
    with Payonce(base_url=account.url, api_key="not-a-key") as nobody:
        with pytest.raises(Unauthenticated) as refused:
            nobody.whoami()
        assert refused.value.status == 401 and refused.value.code == "UNAUTHENTICATED"
        assert refused.value.body["error"]["message"] == refused.value.message


def test_a_failed_job_and_a_persons_retry(account, ledger):
    ledger.faults([{"model": "video-keyed", "action": "fail_render", "message": "the render farm caught fire"}])
    with client(account) as po:
        job = po.jobs.wait(po.jobs.create(**RENDER).id, timeout=30)
        assert job.status == "failed" and job.error["code"] == "PAID_ATTEMPT_FAILED"  # paid_retries 0: not paid again
        retried = po.jobs.retry(job.id)
        assert retried.run == 2 and retried.status in ("queued", "running", "succeeded")
        done = po.jobs.wait(job.id, timeout=30)
    assert done.status == "succeeded" and [a.upstream_key for a in done.attempts] == [
        f"payonce-{job.id}-1", f"payonce-{job.id}-2"]
    assert sorted(c["request_id"] for c in ledger.ledger()["charges"]) == [a.upstream_key for a in done.attempts]


def test_orders(account, ledger):
    order = {"payment_id": f"pi_{time.time_ns()}", "run_id": "run-1", "product": "natal-chart",
             "input": {"subject": {"name": "Ada"}, "chapters": ["sun"]}, "email": "buyer@example.com"}
    with client(account) as po:
        made = po.orders.create(**order)
        assert made.status == "paid" and made.job_id and not made.replayed
        again = po.orders.create(**order)  # the same payment again: the same order, no second report
        assert again.replayed and again.id == made.id and again.job_id == made.job_id
        assert po.orders.get(made.id).payment_id == order["payment_id"]
        assert po.jobs.wait(made.job_id, timeout=30).status == "succeeded"
        assert po.orders.get(made.id).job.status == "succeeded"
        with pytest.raises(IdempotencyConflict):
            po.orders.create(**{**order, "email": "someone@example.com"})
    assert JobRow.objects.filter(client_id=account.client_id).count() == 1


def test_an_order_naming_its_buyers_email_in_its_input_too_is_taken_and_is_one_order(account, ledger):
    # As a report job's input does (commit d4e8cc6: a release refused it with 422): the same order with
    # the email in its input or without it.
    report_input = {"subject": {"name": "Ada"}, "chapters": ["sun"]}
    order = {"payment_id": f"pi_{time.time_ns()}", "run_id": "run-email", "product": "natal-chart",
             "email": "buyer@example.com"}
    with client(account) as po:
        made = po.orders.create(**order, input={**report_input, "email": "buyer@example.com"})
        assert made.status == "paid" and made.job_id and not made.replayed
        without = po.orders.create(**order, input=report_input)
        assert without.replayed and without.id == made.id
        assert po.jobs.wait(made.job_id, timeout=30).status == "succeeded"
    assert JobRow.objects.get(client_id=account.client_id).input["email"] == "buyer@example.com"


# --- report templates -----------------------------------------------------------------------------------

GARDEN = {
    "name": "garden-plan",
    "system": "You are a garden designer writing for {{ subject.name }}.",
    "synthesis": "Sum up what a garden for this plot should be.",
    "chapters": [
        {"key": "soil", "title": "Your soil", "instruction": "Advise on a {{ subject.plot }} plot."},
        {"key": "plants", "title": "What to plant",
         "instruction": "Choose ten plants for {{ subject.climate }} weather."}],
    "max_output_tokens": 1200,
    "layout": {"title": "A garden for {{ subject.name }}", "chapter_heading": "{{ chapter.title }}",
               "closing": "_Planned for {{ subject.name }}._", "figures": False},
    "mail": {"subject": "Your plan is ready", "body": "Read it here: {{ link }}"},
    "page_title": "Your garden plan",
}
GARDEN_SUBJECT = {"name": "Ada", "plot": "clay", "climate": "maritime"}
REACHING = {"name": "garden-plan", "system": "{{ ''.__class__ }}",
            "chapters": [{"key": "a", "title": "A", "instruction": "B"}]}


def test_report_templates_written_read_versioned_and_a_report_pinned_to_one(account, ledger):
    seen_bodies: list[dict] = []
    http = httpx.Client(base_url=account.url, event_hooks={"request": [
        lambda request: seen_bodies.append(json.loads(request.content)) if request.method == "POST" else None]})
    with client(account, http_client=http) as po:
        made = po.report_templates.create(**GARDEN)
        assert isinstance(made, payonce_client.ReportTemplateVersionCreated)
        assert (made.name, made.version, made.live) == ("garden-plan", 1, True)
        listed = po.report_templates.list()
        assert [(t.name, t.live, t.versions) for t in listed] == [("garden-plan", 1, 1)]
        assert isinstance(listed[0], payonce_client.ReportTemplateSummary)

        v1 = po.report_templates.version("garden-plan", 1)
        assert (v1.name, v1.version, v1.live) == ("garden-plan", 1, True)
        assert v1.created_at is not None and v1.created_at.tzinfo is not None
        assert abs((datetime.now(UTC) - v1.created_at).total_seconds()) < 60
        assert (v1.system, v1.synthesis, v1.max_output_tokens, v1.page_title) == (
            GARDEN["system"], GARDEN["synthesis"], 1200, "Your garden plan")
        assert [(c.key, c.title, c.instruction) for c in v1.chapters] == [
            (c["key"], c["title"], c["instruction"]) for c in GARDEN["chapters"]]
        assert (v1.layout.title, v1.layout.chapter_heading, v1.layout.closing, v1.layout.figures) == (
            "A garden for {{ subject.name }}", "{{ chapter.title }}", "_Planned for {{ subject.name }}._", False)
        assert (v1.mail.subject, v1.mail.body) == ("Your plan is ready", "Read it here: {{ link }}")

        # Version 2 from version 1 as read back (its typed parts are taken as they are), not made live.
        two = po.report_templates.create(name="garden-plan", system=v1.system, chapters=v1.chapters,
                                         synthesis=v1.synthesis, max_output_tokens=1500, layout=v1.layout,
                                         mail=v1.mail, page_title=v1.page_title, live=False)
        assert (two.name, two.version, two.live) == ("garden-plan", 2, False)
        assert seen_bodies[-1] == {**GARDEN, "max_output_tokens": 1500, "live": False}
        assert [(t.name, t.live, t.versions) for t in po.report_templates.list()] == [("garden-plan", 1, 2)]
        v2 = po.report_templates.version("garden-plan", 2)
        assert (v2.version, v2.live, v2.max_output_tokens) == (2, False, 1500)
        assert po.report_templates.version("garden-plan", 1).live is True

        moved = po.report_templates.set_live("garden-plan", 2)
        assert isinstance(moved, payonce_client.ReportTemplateLive) and (moved.name, moved.live) == ("garden-plan", 2)
        assert [(t.name, t.live, t.versions) for t in po.report_templates.list()] == [("garden-plan", 2, 2)]
        assert po.report_templates.version("garden-plan", 2).live is True
        assert po.report_templates.version("garden-plan", 1).live is False

        # The optional fields left None are left out of the body, and read back as None.
        bare = po.report_templates.create(name="bare.one", system="Write plainly.",
                                          chapters=[{"key": "only", "title": "Only", "instruction": "Be brief."}])
        assert (bare.version, bare.live) == (1, True)
        assert seen_bodies[-1] == {"name": "bare.one", "system": "Write plainly.", "live": True,
                                   "chapters": [{"key": "only", "title": "Only", "instruction": "Be brief."}]}
        read = po.report_templates.version("bare.one", 1)
        assert (read.synthesis, read.max_output_tokens, read.layout, read.mail, read.page_title) == (None,) * 5
        assert [t.name for t in po.report_templates.list()] == ["bare.one", "garden-plan"]  # by name

        # A text reaching past its variables is refused naming the field, and nothing is stored.
        with pytest.raises(InvalidRequest) as refused:
            po.report_templates.create(**REACHING)
        assert (refused.value.status, refused.value.code) == (422, "INVALID_REQUEST")
        assert list(refused.value.fields) == ["system"] and "__class__" in refused.value.fields["system"][0]
        assert refused.value.fields == refused.value.details["fields"]
        with pytest.raises(NotFound):
            po.report_templates.version("garden-plan", 3)
        with pytest.raises(NotFound):
            po.report_templates.set_live("garden-plan", 3)
        with pytest.raises(InvalidRequest) as no_version:
            po.report_templates.set_live("garden-plan", 0)
        assert list(no_version.value.fields) == ["version"]
    stored = ReportTemplate.objects.get(client_id=account.client_id, name="garden-plan")
    assert stored.live == 2 and ReportTemplateVersion.objects.filter(template=stored).count() == 2

    # Another client's template name is no template of its own: the same 404 as none.
    other = client_create(name="client-library-templates-other")
    with Payonce(base_url=account.url, api_key=other["api_key"]) as theirs:
        with pytest.raises(NotFound) as not_theirs:
            theirs.report_templates.version("garden-plan", 1)
        assert (not_theirs.value.status, not_theirs.value.code) == (404, "NOT_FOUND")
        with pytest.raises(NotFound):
            theirs.report_templates.set_live("garden-plan", 1)
        assert theirs.report_templates.list() == []
        with pytest.raises(InvalidRequest) as no_template:
            theirs.jobs.create(kind="report", models=["sandbox/llm"],
                               input={"subject": GARDEN_SUBJECT, "template": {"name": "garden-plan"},
                                      "email": "ada@example.com"})
        assert "template" in no_template.value.fields["input"]
    assert ReportTemplate.objects.get(client_id=account.client_id, name="garden-plan").live == 2

    # A report job naming the template, without chapters: pinned to the version `live` points at.
    with client(account) as po:
        job = po.jobs.create(kind="report", models=["sandbox/llm"],
                             input={"subject": GARDEN_SUBJECT, "template": {"name": "garden-plan"},
                                    "email": "ada@example.com"})
        assert job.input["template"] == {"name": "garden-plan", "version": 2}
        assert job.input["chapters"] == ["soil", "plants"]
        # A version named outright, and a subset of its chapters.
        pinned = po.jobs.create(kind="report", models=["sandbox/llm"],
                                input={"subject": GARDEN_SUBJECT, "template": {"name": "garden-plan", "version": 1},
                                       "chapters": ["plants"], "email": "ada@example.com"})
        assert pinned.input["template"] == {"name": "garden-plan", "version": 1}
        # Moving `live` afterwards changes nothing of the job accepted.
        assert po.report_templates.set_live("garden-plan", 1).live == 1
        done = po.jobs.wait(job.id, timeout=60)
        assert done.status == "succeeded" and [c.key for c in done.chapters] == ["soil", "plants"]
        assert done.input["template"] == {"name": "garden-plan", "version": 2}
        headings = [line for line in po.jobs.report(job.id).splitlines() if line.startswith(("#", "_Planned"))]
        assert headings == ["# A garden for Ada", "## Your soil", "## What to plant", "_Planned for Ada._"]
        assert po.jobs.wait(pinned.id, timeout=60).status == "succeeded"
        assert [c.key for c in po.jobs.report(pinned.id, format="json").chapters] == ["plants"]
    assert set(JobRow.objects.get(id=job.id).input["template"]) == {"name", "version"}
    assert JobRow.objects.get(id=job.id).input["template"] == {"name": "garden-plan", "version": 2}
    assert JobRow.objects.get(id=pinned.id).input["template"] == {"name": "garden-plan", "version": 1}
    assert_books_balance(ledger)


def test_a_template_whose_answer_was_lost_is_not_written_twice(account, flaky_proxy):
    proxy = flaky_proxy("lose_answer", path="/v1/report-templates")
    with client(account, proxy.url) as through_proxy, pytest.raises(APIConnectionError) as lost:
        through_proxy.report_templates.create(**GARDEN)
    assert lost.value.maybe_sent is True and "report_templates.list" in str(lost.value)
    assert len(proxy.seen) == 1  # never sent again: a second try would write version 2
    with client(account) as po:
        assert [(t.name, t.live, t.versions) for t in po.report_templates.list()] == [("garden-plan", 1, 1)]


def test_async_report_templates(account):
    other = client_create(name="client-library-async-templates-other")

    async def run():
        async with AsyncPayonce(base_url=account.url, api_key=account.api_key) as po, \
                AsyncPayonce(base_url=account.url, api_key=other["api_key"]) as theirs:
            made = await po.report_templates.create(**GARDEN)
            assert (made.name, made.version, made.live) == ("garden-plan", 1, True)
            listed = await po.report_templates.list()
            assert [(t.name, t.live, t.versions) for t in listed] == [("garden-plan", 1, 1)]
            read = await po.report_templates.version("garden-plan", 1)
            assert (read.version, read.live, read.system, [c.key for c in read.chapters]) == (
                1, True, GARDEN["system"], ["soil", "plants"])
            assert read.layout is not None and read.layout.closing == GARDEN["layout"]["closing"]
            two = await po.report_templates.create(**{**GARDEN, "synthesis": None, "live": False})
            assert (two.version, two.live) == (2, False)
            assert (await po.report_templates.version("garden-plan", 2)).synthesis is None
            assert [(t.live, t.versions) for t in await po.report_templates.list()] == [(1, 2)]
            moved = await po.report_templates.set_live("garden-plan", 2)
            assert (moved.name, moved.live) == ("garden-plan", 2)
            assert (await po.report_templates.version("garden-plan", 2)).live is True
            with pytest.raises(InvalidRequest) as refused:
                await po.report_templates.create(**REACHING)
            assert refused.value.status == 422 and list(refused.value.fields) == ["system"]
            with pytest.raises(NotFound):
                await theirs.report_templates.version("garden-plan", 1)
            with pytest.raises(NotFound):
                await theirs.report_templates.set_live("garden-plan", 1)
            assert await theirs.report_templates.list() == []

    asyncio.run(run())
    stored = ReportTemplate.objects.get(client_id=account.client_id, name="garden-plan")
    assert stored.live == 2 and ReportTemplateVersion.objects.filter(template=stored).count() == 2


# --- webhooks --------------------------------------------------------------------------------------------


def test_webhooks_verify_and_dedupe(hooks, ledger):
    account, receiver = hooks.account, hooks.receiver
    with client(account) as po:
        job = po.jobs.wait(po.jobs.create(**RENDER).id, timeout=30)
    assert job.status == "succeeded"
    receiver.wait_for(lambda: any(r.verified for r in receiver.requests), message="a delivery")
    received = next(r for r in receiver.requests if r.verified)

    envelope = webhooks.verify(received.body, received.headers, account.webhook_secret)
    assert envelope["type"] == "generation.succeeded" and envelope["data"]["id"] == job.id
    upper = {name.upper(): value for name, value in received.headers.items()}
    assert webhooks.verify(received.body.decode(), upper, account.webhook_secret) == envelope

    with pytest.raises(WebhookVerificationError):
        webhooks.verify(received.body.replace(b"succeeded", b"cancelled"), received.headers, account.webhook_secret)
    wrong = "whsec_" + base64.b64encode(os.urandom(24)).decode()
    with pytest.raises(WebhookVerificationError):
        webhooks.verify(received.body, received.headers, wrong)
    # Signed properly (by another implementation of the standard), only an hour ago: a replay.
    an_hour_ago = datetime.fromtimestamp(time.time() - 3600, tz=UTC)
    old = {**received.headers, "webhook-timestamp": str(int(an_hour_ago.timestamp())),
           "webhook-signature": Webhook(account.webhook_secret).sign(received.webhook_id, an_hour_ago,
                                                                     received.body.decode())}
    with pytest.raises(WebhookVerificationError, match="too old"):
        webhooks.verify(received.body, old, account.webhook_secret)
    assert webhooks.verify(received.body, old, account.webhook_secret, tolerance_s=7200) == envelope

    dedup = webhooks.Deduplicator()
    assert [dedup.first_time(received.webhook_id) for _ in range(3)] == [True, False, False]
    assert dedup.first_time(f"{received.webhook_id}-other") is True


def test_offline_a_retry_that_never_connected_and_the_error_classes():
    with Payonce(base_url="http://127.0.0.1:9", api_key="any", max_retries=2) as po:  # nobody listens
        started = time.monotonic()
        with pytest.raises(APIConnectionError) as refused:
            po.jobs.retry("6386a69f-92b8-4f76-ab78-051c94883eed")
    assert refused.value.maybe_sent is False and refused.value.attempts == 3  # payonce cannot have seen it
    assert time.monotonic() - started >= 0.25 + 0.5  # backed off between tries

    # Every code of the OpenAPI document's ErrorCode enum that a client can be answered: not a provider's
    # callback codes, and not ERROR, the generic one (a plain APIError).
    document = json.loads((REPO_ROOT / "clients" / "openapi.json").read_text())
    codes = [code for code in document["components"]["schemas"]["ErrorCode"]["enum"]
             if not code.startswith("CALLBACK_") and code != "ERROR"]
    assert "DATABASE_UNAVAILABLE" in codes and "JOB_TERMINAL" in codes
    for code in codes:
        cls = payonce_client.ERROR_CLASSES[code]
        assert issubclass(cls, APIError) and cls.code_name == code and cls is not APIError
    assert payonce_client.errors.error_for_code("SOMETHING_NEW") is APIError


def test_the_api_key_is_not_in_the_repr_of_a_client_or_of_its_parts():
    key = "Ab3dE5gH." + "sEcReT" * 5 + "xy"
    for client in (Payonce(base_url="http://127.0.0.1:8000/p", api_key=key),
                   AsyncPayonce(base_url="http://127.0.0.1:8000/p", api_key=key)):
        shown = [repr(client), str(client), repr(client._http), repr(client.jobs), repr(vars(client)), f"{client!r}"]
        assert not [text for text in shown if "sEcReT" in text], shown
        assert repr(client) == f"{type(client).__name__}(base_url='http://127.0.0.1:8000/p')"
