"""JSON logs (config.logs): the redaction filter on crafted records, and a real end-to-end run whose
`web`, `worker` and `webhooks` processes (as the Procfile starts them) write nothing but JSON lines, with
the ids of each event and none of the secrets they handled."""

import json
import logging
import secrets
import sys
import time
import uuid
from contextlib import contextmanager
from datetime import timedelta
from decimal import Decimal

import pytest
import requests
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from config import logs
from executor.models import Attempt, AttemptState
from jobs.models import Job, JobStatus, Step
from jobs.services import client_create
from sandbox.callbacks import DEFAULT_SECRET as SANDBOX_CALLBACK_SECRET
from tests.conftest import WEBHOOK_TEST_ENV, media_body, purge_queue
from tests.support.procs import ProcfileProcess, free_port
from tests.support.webhook_receiver import WebhookReceiver
from webhooks.models import Delivery

# --- the filter and the formatter, on crafted records ------------------------------------------------------

API_KEY = "Ab3dE5gH." + "x" * 10 + "Y7" * 11  # the shape of a djangorestframework-api-key key
WEBHOOK_SECRET = "whsec_" + "c2VjcmV0LWZvci10aGUtbG9ncy10ZXN0+/="
PROVIDER_KEY = "sk-live-" + "q" * 30
PASSWORD = "correct-horse-battery"
ENVIRON = {
    "OPENAI_API_KEY": PROVIDER_KEY,
    "DATABASE_URL": f"postgres://payonce:{PASSWORD}@db.internal:5432/payonce",
    "REPLICATE_API_TOKEN": "r8-is-not-the-shape-but-the-name-says-token",
    "SHORT_TOKEN": "abc",  # too short to look for in free text
    "UNRELATED": "not-a-secret-value",
}
ALL_SECRETS = [API_KEY, API_KEY.split(".")[1], WEBHOOK_SECRET, PROVIDER_KEY, PASSWORD, ENVIRON["REPLICATE_API_TOKEN"]]


def render(record: logging.LogRecord, environ=ENVIRON) -> dict:
    """The record as the handler of settings.LOGGING writes it: context, redaction, then JSON."""
    logs.ContextFilter().filter(record)
    assert logs.RedactFilter(environ=environ).filter(record)
    line = logs.JsonFormatter().format(record)
    assert "\n" not in line
    return json.loads(line)


def record(msg, args=(), exc_info=None, **extra) -> logging.LogRecord:
    made = logging.LogRecord("payonce.test", logging.WARNING, __file__, 1, msg, args, exc_info)
    for name, value in extra.items():
        setattr(made, name, value)
    return made


def assert_no_secret(text: str) -> None:
    for secret in ALL_SECRETS:
        assert secret not in text, secret


def test_secrets_in_the_message_are_redacted_and_the_ids_are_kept():
    upstream_key, delivery_id = f"payonce-{uuid.uuid4()}-1", f"{uuid.uuid4()}:1:generation.succeeded"
    line = render(record(
        f"Authorization: Bearer {API_KEY}; key {API_KEY} secret {WEBHOOK_SECRET} provider {PROVIDER_KEY} "
        f"{ENVIRON['DATABASE_URL']} {ENVIRON['REPLICATE_API_TOKEN']} {upstream_key} {delivery_id} abc"))

    assert_no_secret(json.dumps(line))
    assert line["event"].startswith("Authorization: Bearer [redacted]; key [redacted] secret [redacted]")
    assert "postgres://payonce:[redacted]@db.internal:5432/payonce" in line["event"]
    # What only looks like an id stays: upstream keys, delivery ids, a short value no secret shape matches.
    assert line["event"].endswith(f"{upstream_key} {delivery_id} abc")
    assert line["level"] == "WARNING" and line["logger"] == "payonce.test"
    assert line["ts"].endswith("Z") and "T" in line["ts"]


def test_secrets_passed_as_arguments_or_extra_fields_are_redacted():
    by_position = render(record("auth %s with %r", (f"Bearer {API_KEY}", {"x-api-key": PROVIDER_KEY})))
    by_name = render(record("secret %(secret)s", ({"secret": WEBHOOK_SECRET},)))
    extra = render(record("headers", job_id="j-1", headers={"authorization": f"Bearer {API_KEY}"},
                          tried=[PASSWORD, {"deep": WEBHOOK_SECRET}]))

    for line in (by_position, by_name, extra):
        assert_no_secret(json.dumps(line))
    assert by_position["event"] == "auth Bearer [redacted] with {'x-api-key': '[redacted]'}"
    assert by_name["event"] == "secret [redacted]"
    assert extra["job_id"] == "j-1"
    assert extra["headers"] == {"authorization": "Bearer [redacted]"}
    assert extra["tried"] == ["[redacted]", {"deep": "[redacted]"}]


def test_secrets_in_a_set_or_a_dicts_keys_are_redacted_too():
    line = render(record("seen", keys={API_KEY: 1, "plain": 2}, among={PASSWORD, "plain"},
                         frozen=frozenset({WEBHOOK_SECRET})))

    assert_no_secret(json.dumps(line))
    assert line["keys"] == {"[redacted]": 1, "plain": 2}
    assert line["among"] == ["[redacted]", "plain"] and line["frozen"] == ["[redacted]"]


def test_an_exception_is_one_field_of_one_line_with_its_secrets_redacted():
    try:
        raise ValueError(f"refused {API_KEY} at redis://:{PASSWORD}@cache:6379/0")
    except ValueError:
        line = render(record("the call failed", exc_info=sys.exc_info()))

    assert line["event"] == "the call failed"
    assert line["exc_type"] == "ValueError"
    assert line["exc"].startswith("Traceback (most recent call last):")
    assert "ValueError: refused [redacted] at redis://:[redacted]@cache:6379/0" in line["exc"]
    assert_no_secret(json.dumps(line))


def test_fields_come_from_the_context_and_extra_wins():
    with logs.log_context(job_id="j-ctx", step="submit", run=2):
        with logs.log_context(attempt=3):
            inner = render(record("inside", upstream_key="payonce-j-ctx-3", step="wait"))
        outer = render(record("outside the inner block"))
    after = render(record("after"))

    assert {k: inner[k] for k in logs.FIELDS if k in inner} == {
        "job_id": "j-ctx", "run": 2, "step": "wait", "attempt": 3, "upstream_key": "payonce-j-ctx-3"}
    assert list(inner)[:4] == ["ts", "level", "logger", "event"]
    assert "attempt" not in outer and outer["job_id"] == "j-ctx"
    assert not set(logs.FIELDS) & set(after)


def test_a_task_logs_with_its_arguments_named_like_fields():
    from jobs.engine.tasks import run_stage
    from webhooks.tasks import deliver

    logs.task_context_start(run_stage, ("j-task", 4, "prepare"), {"rung": True})
    assert logs.context_fields() == {"job_id": "j-task", "run": 4}
    logs.task_context_start(deliver, (), {"delivery_id": "d-1", "token": "t"})  # the next task replaces it
    assert logs.context_fields() == {"delivery_id": "d-1"}
    logs.task_context_end()
    assert logs.context_fields() == {}


def test_log_format_plain_and_a_wrong_one():
    plain = logs.formatter("plain").format(record("step %s done", ("submit",), job_id="j-2", run=1))
    assert plain.endswith("WARNING payonce.test step submit done job_id=j-2 run=1")
    assert isinstance(logs.formatter("json"), logs.JsonFormatter)
    with pytest.raises(ImproperlyConfigured):
        logs.formatter("xml")


def test_secret_values_are_read_from_the_names_and_urls_of_the_environment():
    found = logs.secrets_from_environ({
        **ENVIRON, "AWS_SECRET_ACCESS_KEY": "aws/secret/access/key", "EMAIL_URL": "smtp://me:mail-pass%2Fword@mx:25",
        "BROKER_URL": "redis://127.0.0.1:6379/3", "SANDBOX_CALLBACK_SECRET": "callback-secret-value",
        "PGPASSWORD": "pg-password-value",
    })
    assert found == {PROVIDER_KEY, PASSWORD, ENVIRON["REPLICATE_API_TOKEN"], "aws/secret/access/key",
                     "mail-pass%2Fword", "mail-pass/word", "callback-secret-value", "pg-password-value"}


def test_a_broker_url_without_a_password_is_shown_as_it_is_and_one_with_a_password_is_redacted():
    from kombu import Connection

    environ = {**ENVIRON, "BROKER_URL": "redis://127.0.0.1:6379/3", "CACHE_URL": f"redis://:{PASSWORD}@cache:6379/0"}
    # kombu renders `:**` for the password whether there is one or not (celery's "Connected to" line).
    plain, secured = (Connection(url).as_uri() for url in (environ["BROKER_URL"], environ["CACHE_URL"]))
    assert (plain, secured) == ("redis://:**@127.0.0.1:6379/3", "redis://:**@cache:6379/0")

    line = render(record("Connected to %s, cache %s, raw %s and %s", (plain, secured, environ["BROKER_URL"],
                                                                      environ["CACHE_URL"])), environ=environ)

    assert line["event"] == ("Connected to redis://127.0.0.1:6379/3, cache redis://:[redacted]@cache:6379/0, "
                             "raw redis://127.0.0.1:6379/3 and redis://:[redacted]@cache:6379/0")


# --- what is remembered between lines (the names of a record's fields, texts redacted) never lets a secret
# through nor moves a field -------------------------------------------------------------------------------


def test_records_with_the_same_names_are_each_redacted_and_keep_their_fields_order():
    job_id = uuid.uuid4()
    environ = {**ENVIRON}
    lines = [logs.JsonFormatter().format(made) for made in (
        _redacted(record("first", job_id=job_id, attempt=1, note="nothing", headers={"x-api-key": "k" * 12}), environ),
        _redacted(record("second", job_id=job_id, attempt=None, note=f"Bearer {API_KEY}",
                         headers={"x-api-key": PROVIDER_KEY}), environ),
        _redacted(record("third", job_id=job_id, attempt=2, note=PASSWORD, headers=[WEBHOOK_SECRET]), environ))]

    assert_no_secret("\n".join(lines))
    parsed = [json.loads(line) for line in lines]
    # The ids first in FIELDS' order; one that is None in its own place among the other fields.
    assert [_field_names(line) for line in parsed] == [["job_id", "attempt", "note", "headers"]] * 3
    unordered = json.loads(logs.JsonFormatter().format(record("x", note=1, attempt=None, job_id=job_id)))
    assert _field_names(unordered) == ["job_id", "note", "attempt"]
    assert parsed[1]["attempt"] is None and parsed[1]["note"] == "Bearer [redacted]"
    assert parsed[2]["note"] == "[redacted]" and parsed[2]["headers"] == ["[redacted]"]


def test_values_with_no_text_are_written_as_json_wrote_them_and_text_in_any_other_type_is_redacted():
    from django.utils.safestring import mark_safe

    job_id, when = uuid.uuid4(), timezone.now()
    made = _redacted(record("values", job_id=job_id, run=2, cost_usd=Decimal("0.400000"), ratio=0.5, done=True,
                            nothing=None, when=when, status=JobStatus.SUCCEEDED, html=mark_safe(f"<b>{API_KEY}</b>"),
                            nested=(1, {"deep": PASSWORD}), text="caf\u00e9 \U0001F600"))
    line = logs.JsonFormatter().format(made)

    assert line.isascii()
    assert line.split(',"job_id"')[1] == json.dumps(
        {"job_id": str(job_id), "run": 2, "cost_usd": "0.400000", "ratio": 0.5, "done": True, "nothing": None,
         "when": str(when), "status": "succeeded", "html": "<b>[redacted]</b>", "nested": [1, {"deep": "[redacted]"}],
         "text": "caf\u00e9 \U0001F600"}, separators=(",", ":")).split('"job_id"')[1]


def test_a_shape_registered_after_texts_were_remembered_redacts_them_from_then_on(monkeypatch):
    monkeypatch.setattr(logs, "_registered", {**logs._registered})  # this test's registration stays here
    redact, redactor = logs.RedactFilter(environ=ENVIRON), logs.Redactor()  # config.mail's kind: not rebuilt
    text = "key zq_live_0123456789abcdef in a line"
    assert _redacted(record(text), redact=redact).msg == redactor.text(text) == text  # remembered as it is

    logs.register_secrets(shapes=[("zq_", r"\bzq_live_[a-z0-9]{16}")])

    assert _redacted(record(text), redact=redact).msg == redactor.text(text) == "key [redacted] in a line"
    assert redactor.text(f"{text}!") == "key [redacted] in a line!"


def _field_names(line: dict) -> list[str]:
    return [name for name in line if name not in ("ts", "level", "logger", "event", "process", "pid")]


def _redacted(made: logging.LogRecord, environ=ENVIRON, redact=None) -> logging.LogRecord:
    logs.ContextFilter().filter(made)
    assert (redact or logs.RedactFilter(environ=environ)).filter(made)
    return made


# --- every other event, from the services themselves ---------------------------------------------------------


@contextmanager
def captured():
    """The lines the handler of settings.LOGGING would write while the block runs, parsed."""
    lines: list[dict] = []

    class Keep(logging.Handler):
        def emit(self, record):
            assert record.pathname != logs.__file__, record  # an event names the line that logged it
            lines.append(json.loads(self.format(record)))

    handler = Keep()
    handler.addFilter(logs.ContextFilter())
    handler.addFilter(logs.RedactFilter())
    handler.setFormatter(logs.JsonFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield lines
    finally:
        root.removeHandler(handler)


def make_job(client_id, status: str, **fields) -> Job:
    job_id, body = uuid.uuid4(), media_body()
    return Job.objects.create(id=job_id, client_id=client_id, idempotency_key=str(job_id), request_hash="0" * 64,
                              kind="media", model_chain=body["models"], input=body["input"], policy={},
                              output_key=f"o/{job_id}.mp4", status=status, **fields)


def make_attempt(job: Job, number: int, step: str = "submit", **fields) -> Attempt:
    return Attempt.objects.create(job=job, run=job.run, step=step, number=number, provider="sandbox",
                                  model="video-keyed", upstream_key=f"payonce-{job.id}-{number}",
                                  state=AttemptState.SUBMITTING, **fields)


@pytest.mark.django_db(transaction=True)
def test_each_state_change_logs_one_event_with_its_ids():
    from executor import cancel, record
    from executor.record import Money
    from jobs import services
    from jobs.engine import sweeper
    from jobs.engine.steps import Claim, StepContext, step_claim, step_reload
    from webhooks.services import delivery_replay

    # Deliveries are written (and purged below, never sent); a polling client's would not be.
    client_id = client_create(name="events", webhook_url="https://hooks.example.com/payonce")["client_id"]
    later, earlier = timezone.now() + timedelta(hours=1), timezone.now() - timedelta(minutes=1)
    held = make_job(client_id, JobStatus.RUNNING, lease_until=later)
    cancelled = make_job(client_id, JobStatus.RUNNING, lease_until=later)
    paying = make_job(client_id, JobStatus.RUNNING, lease_until=later)
    stuck = make_job(client_id, JobStatus.QUEUED, lease_until=earlier)
    Step.objects.create(job=paying, run=1, name="submit", status="running", attempts=1, lease_owner="dead#1",
                        lease_until=earlier)
    unknown = make_attempt(paying, 1, sends=1, submitted_at=timezone.now())
    make_attempt(cancelled, 1, sends=0)
    make_attempt(cancelled, 2, step="chapter", sends=1, submitted_at=timezone.now() - timedelta(days=1))
    needs_review = f"{held.id}:1:generation.needs_review"
    try:
        with captured() as lines:
            assert services.job_hold(job_id=held.id, run=1, error={"code": "UNCERTAIN_SUBMIT", "message": "?"})
            assert services.job_retry(job=held).run == 2
            assert services.job_cancel(job=cancelled)
            delivery_replay(delivery=Delivery.objects.get(id=needs_review))
            ctx = StepContext(job=paying, task_id="task-2", chain="chain-2")
            step_reload(ctx, "submit")
            assert step_claim(ctx, "submit", 30)[0] is Claim.CLAIMED  # the dead holder's lease ran out
            assert step_claim(ctx, "submit", 30)[0] is Claim.CLAIMED  # its own lease again: not an event
            assert record.end(unknown, AttemptState.UNCERTAIN, expect=AttemptState.SUBMITTING, money=Money.HOLD,
                                 error_class="network", error="no answer")
            assert cancel.sweep_cancelled() == 2
            assert [job[0] for job in sweeper.sweep()] == [str(stuck.id)]
    finally:  # what the services enqueued (a run, a cancel, a delivery) is for no worker of this test
        purge_queue(settings.CELERY_BROKER_URL, "jobs")
        purge_queue(settings.CELERY_BROKER_URL, "webhooks")

    def one(event, **fields):
        found = events(lines, event, **fields)
        assert len(found) == 1, (event, fields, [line for line in lines if line["event"] == event])
        return found[0]

    one("job.held", job_id=str(held.id), run=1, error_code="UNCERTAIN_SUBMIT")
    one("job.retried", job_id=str(held.id), run=2)
    one("job.cancelled", job_id=str(cancelled.id), run=1, status="cancelled", error_code="CANCELLED")
    one("delivery.replayed", delivery_id=needs_review, job_id=str(held.id), run=1)
    one("step.taken_over", job_id=str(paying.id), run=1, step="submit", claims=2, previous_owner="dead#1",
        lease_owner=ctx.owner)
    assert not events(lines, "step.claimed")
    one("attempt.uncertain", job_id=str(paying.id), attempt=1, upstream_key=unknown.upstream_key,
        model="sandbox/video-keyed", error_class="network")
    one("attempt.failed", job_id=str(cancelled.id), attempt=1, step="submit", error_class="cancelled")
    one("attempt.uncertain", job_id=str(cancelled.id), attempt=2, step="chapter")
    one("sweeper.recovered", job_id=str(stuck.id), run=1, stage_index=0)
    assert {line["event"] for line in lines if "." in line["event"] and " " not in line["event"]} == {
        "job.held", "job.retried", "job.cancelled", "delivery.replayed", "step.taken_over",
        "attempt.uncertain", "attempt.failed", "sweeper.recovered"}


# --- a real run --------------------------------------------------------------------------------------------

FAKE_PROVIDER_KEYS = {
    "OPENAI_API_KEY": f"sk-test-{secrets.token_hex(16)}",
    "ANTHROPIC_API_KEY": f"sk-ant-test-{secrets.token_hex(16)}",
    "REPLICATE_API_TOKEN": f"r8_test{secrets.token_hex(16)}",
    "AWS_SECRET_ACCESS_KEY": f"fake/{secrets.token_hex(16)}",
}
# Plain text a Celery process may write besides its JSON lines: its start-up text before its " ready." line
# (the banner; run as root, also Celery's superuser warning) and its shutdown notice. Nothing else.
CELERY_SHUTDOWN_NOTICE = "worker: Warm shutdown (MainProcess)"


def json_lines(name: str, output: str) -> list[dict]:
    """Every line of a process's output as JSON; fails on any other line but the exceptions above."""
    lines = output.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    celery = name in ("worker", "webhooks")
    ready = next(i for i, line in enumerate(lines) if " ready." in line) if celery else 0
    assert not celery or "[queues]" in "\n".join(lines[:ready])  # the banner is there, before readiness
    parsed = []
    for number, line in enumerate(lines):
        if not line.startswith("{"):
            assert celery and (number < ready or line in ("", CELERY_SHUTDOWN_NOTICE)), (name, number, line)
            continue
        entry = json.loads(line)
        assert {"ts", "level", "logger", "event"} <= set(entry), (name, number, line)
        assert entry["process"] == name, (name, number, line)
        parsed.append(entry)
    return parsed


def events(lines: list[dict], event: str, **fields) -> list[dict]:
    return [line for line in lines if line["event"] == event and all(line.get(k) == v for k, v in fields.items())]


def wait_until(check, timeout: float = 45.0, message: str = ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout}s: {message}")


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_run_logs_json_lines_with_each_events_ids_and_no_secret(ledger):
    broker = settings.CELERY_BROKER_URL
    purge_queue(broker, "jobs")
    purge_queue(broker, "webhooks")
    port = free_port()
    env = {**WEBHOOK_TEST_ENV, **FAKE_PROVIDER_KEYS, "BROKER_URL": broker, "PORT": port, "LOG_FORMAT": "json",
           "WORKER_CONCURRENCY": 8, "PROVIDER_CALLBACK_BASE_URL": f"http://127.0.0.1:{port}"}
    procs = {name: ProcfileProcess(name, env) for name in ("web", "worker", "webhooks")}
    other = client_create(name="someone else")
    with WebhookReceiver() as receiver:
        owner = client_create(name="logs", webhook_url=receiver.url)
        receiver.secrets = [owner["webhook_secret"]]
        try:
            for process in procs.values():
                process.start(timeout=60)
            url = f"http://127.0.0.1:{port}"
            auth = {"Authorization": f"Bearer {owner['api_key']}"}
            # Given: one media job made to fail by a refusal of its model, one that succeeds.
            ledger.faults([{"model": "image-lookup", "action": "status_422", "message": "size must be square"}])

            def create(key: str, body: dict) -> str:
                created = requests.post(f"{url}/v1/jobs", json=body, headers={**auth, "Idempotency-Key": key},
                                        timeout=10)
                assert created.status_code == 201, created.text
                return created.json()["id"]

            failing = create("fails", media_body(models=["sandbox/image-lookup"]))
            succeeding = create("succeeds", media_body(input={"prompt": "a lighthouse at dusk", "render_s": 1}))
            # Requests that must not put what they carry into a log: another client's real key on this
            # client's job (404), this client's key prefix with another's secret (401), a webhook secret (401).
            mixed = owner["api_key"].split(".")[0] + "." + other["api_key"].split(".")[1]
            for bearer, path, status in ((other["api_key"], f"/v1/jobs/{succeeding}", 404), (mixed, "/v1/jobs", 401),
                                         (owner["webhook_secret"], f"/v1/jobs/{failing}", 401)):
                answer = requests.get(f"{url}{path}", headers={"Authorization": f"Bearer {bearer}"}, timeout=10)
                assert answer.status_code == status, (path, answer.text)

            def ended(job_id):
                job = requests.get(f"{url}/v1/jobs/{job_id}", headers=auth, timeout=10).json()
                return job["status"] in ("succeeded", "failed", "cancelled") and job

            assert wait_until(lambda: ended(failing), message="the failing job ended")["status"] == "failed"
            assert wait_until(lambda: ended(succeeding), message="the job ended")["status"] == "succeeded"
            deliveries = {failing: f"{failing}:1:generation.failed", succeeding: f"{succeeding}:1:generation.succeeded"}
            wait_until(lambda: Delivery.objects.filter(id__in=deliveries.values(), status="delivered").count() == 2,
                       message="both deliveries delivered")
            assert {got.webhook_id for got in receiver.requests} == set(deliveries.values())
            assert all(got.verified for got in receiver.requests)
        finally:
            for process in procs.values():
                process.stop()  # warm: every line is written

    # Then: each process wrote JSON lines only (the tiny list of exceptions aside) ...
    output = {name: process.output() for name, process in procs.items()}
    lines = {name: json_lines(name, text) for name, text in output.items()}
    web, worker, webhooks = lines["web"], lines["worker"], lines["webhooks"]
    assert events(web, "Application startup complete.")  # uvicorn's own lines are JSON too
    assert [line["event"] for line in worker if line["event"].endswith(" ready.")] == [
        next(line["event"] for line in worker if " ready." in line["event"])]  # readiness is still seen
    # ... with the ids of each event, once per event.
    for job_id in (failing, succeeding):
        assert len(events(web, "job.created", job_id=job_id, run=1)) == 1
    key = f"payonce-{succeeding}-1"
    ids = {"job_id": succeeding, "run": 1, "step": "submit", "attempt": 1, "upstream_key": key,
           "model": "sandbox/video-keyed"}
    for event in ("attempt.intent", "attempt.sent", "attempt.accepted", "attempt.succeeded"):
        assert len(events(worker, event, **ids)) == 1, event
    assert events(worker, "attempt.succeeded", **ids)[0]["cost_usd"] == "0.400000"
    for step in ("check_output", "mark_running", "submit", "wait", "store_output", "finish"):
        assert len(events(worker, "step.done", job_id=succeeding, run=1, step=step)) == 1, step
    for step in ("submit", "wait"):  # a wait's polls under its own lease are not claims
        assert len(events(worker, "step.claimed", job_id=succeeding, step=step)) == 1, step
    assert not events(worker, "step.taken_over")
    assert len(events(worker, "job.finished", job_id=succeeding, status="succeeded")) == 1
    refused = events(worker, "attempt.failed", job_id=failing, attempt=1, upstream_key=f"payonce-{failing}-1")
    assert len(refused) == 1 and refused[0]["error_class"] == "invalid_input" and refused[0]["last_status"] == 422
    assert len(events(worker, "job.finished", job_id=failing, status="failed", error_code="INVALID_INPUT")) == 1
    for job_id, delivery_id in deliveries.items():
        tried = events(webhooks, "delivery.tried", delivery_id=delivery_id, job_id=job_id, run=1)
        delivered = events(webhooks, "delivery.delivered", delivery_id=delivery_id, job_id=job_id, run=1)
        assert len(tried) == 1 and tried[0]["status_code"] == 200 and tried[0]["try"] == 1
        assert len(delivered) == 1 and delivered[0]["status_code"] == 200
    # Celery's bookkeeping of each message ("received", "succeeded in") is not written at INFO: the step
    # lines above say it, with the job's ids.
    assert not [line for line in worker if line["logger"] in ("celery.app.trace", "celery.worker.strategy")]
    # And no secret the run handled appears anywhere in any output.
    handled = [owner["api_key"], owner["api_key"].split(".")[1], owner["webhook_secret"], other["api_key"],
               other["api_key"].split(".")[1], SANDBOX_CALLBACK_SECRET, *FAKE_PROVIDER_KEYS.values()]
    for name, text in output.items():
        for secret in handled:
            assert secret not in text, (name, secret[:6])


# --- routine lines ---------------------------------------------------------------------------------------


def test_celerys_bookkeeping_lines_of_each_message_are_not_built_below_debug():
    # Celery asks once, at a worker's start, whether these loggers take INFO ("received", "succeeded in"):
    # not under the settings' LOGGING, so no record is built; a failure (ERROR) still is.
    for name in ("celery.worker.strategy", "celery.app.trace"):
        assert not logging.getLogger(name).isEnabledFor(logging.INFO)
        assert logging.getLogger(name).isEnabledFor(logging.WARNING)


def test_celerys_lines_about_the_periodic_tasks_are_debug_and_everything_else_keeps_its_level():
    """The settings' filter, on Celery's own messages as Celery words them (beat, the worker's strategy and
    trace): shown only at DEBUG; a failure of the same task, and another task's lines, untouched."""
    built = logs.RoutineFilter(tasks=settings.LOGGING["filters"]["routine"]["tasks"])  # as LOGGING builds it

    def passes(name, level, message, *args, root=logging.INFO):
        record = logging.LogRecord(name, level, __file__, 1, message, args, None)
        previous = logging.getLogger().level
        logging.getLogger().setLevel(root)
        try:
            return built.filter(record), record.levelname
        finally:
            logging.getLogger().setLevel(previous)

    task_id = str(uuid.uuid4())
    beat = ("celery.beat", logging.INFO, "Scheduler: Sending due task %s (%s)", "drain-deliveries", "webhooks.drain")
    received = ("celery.worker.strategy", logging.INFO, "Task %s[%s] received", "jobs.sweep", task_id)
    succeeded = ("celery.app.trace", logging.INFO, "Task %s[%s] succeeded in %ss: %s", "billing.fold", task_id, 0.01, 0)
    for line in (beat, received, succeeded):
        assert passes(*line) == (False, "DEBUG")
        assert passes(*line, root=logging.DEBUG) == (True, "DEBUG")
    failed = ("celery.app.trace", logging.ERROR, "Task %s[%s] raised unexpected: %s", "jobs.sweep", task_id, "boom")
    assert passes(*failed) == (True, "ERROR")
    paid_work = ("celery.worker.strategy", logging.INFO, "Task %s[%s] received", "jobs.run_stage", task_id)
    assert passes(*paid_work) == (True, "INFO")
    a_sweeper_line = ("jobs.engine.sweeper", logging.INFO, "sweeper.recovered jobs.sweep[")
    assert passes(*a_sweeper_line) == (True, "INFO")
