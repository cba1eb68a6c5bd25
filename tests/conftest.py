"""Shared fixtures: the sandbox provider and Celery workers as real processes, API clients per test.

Everything talks to real PostgreSQL (the database pytest-django creates) and real Redis (db 15 of the
server tests/support/redis_server.py names: the machine's, or under pytest-xdist one per worker).
"""

import json
import os
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.core.servers import basehttp
from django.test import Client as DjangoClient

from jobs.services import client_create
from tests.support import redis_server
from tests.support.procs import ProcfileProcess, free_port
from tests.support.sandbox import SandboxPortTaken, SandboxProcess


def pytest_unconfigure(config):
    """After the last fixture's teardown: this xdist worker's private Redis, if it started one, is
    stopped by its PID (tests/support/redis_server.py)."""
    redis_server.stop()


# Fails a test that starts processes without the e2e mark (pytest.ini), so `make test-quick` can trust it.
pytest_plugins = ["tests.support.e2e_mark"]


# pytest-django's live_server listens with a backlog of 10; the race tests open 50 connections at once.
basehttp.WSGIServer.request_queue_size = 128


@pytest.fixture(scope="session")
def sandbox():
    """The session's sandbox on SANDBOX_URL's port; on another free port if a process took that one since
    tests/settings.py chose it (what this process and those it starts use follows)."""
    for tries_left in (2, 1, 0):
        process = SandboxProcess(port=urlsplit(settings.SANDBOX_URL).port)
        try:
            process.start()
            break
        except SandboxPortTaken:
            process.stop()
            process.cleanup()
            if not tries_left:
                raise
            settings.SANDBOX_URL = os.environ["SANDBOX_URL"] = f"http://127.0.0.1:{free_port()}"
    yield process
    process.stop()
    process.cleanup()


@pytest.fixture
def ledger(sandbox):
    """The sandbox, reset for this test: its ledger is the ground truth of what was paid."""
    sandbox.reset()
    return sandbox


def purge_queue(broker_url: str, name: str) -> None:
    """Drop the messages waiting in one queue (left by an earlier test, or an interrupted run)."""
    from kombu import Connection

    from config.celery import app

    with Connection(broker_url) as conn:
        queue = app.amqp.queues[name](conn.default_channel)
        queue.declare()  # exactly as the workers declare it
        queue.purge()


# Background workers belong to one test. A worker started for a test acts only on that test's rows (the
# queue is emptied first, so nothing another test enqueued reaches it), and it is stopped, warm (its
# running tasks finish), before pytest-django flushes the database: each worker fixture depends on
# `transactional_db`, so it is set up after it and torn down before it. No worker of the suite can touch
# a test's rows when that test does not ask for one, or hold a lock when the tables are truncated.


@pytest.fixture
def jobs_worker(transactional_db, sandbox):
    """One `worker` process as the Procfile starts it (threads pool), on the test database."""
    from django.conf import settings

    purge_queue(settings.CELERY_BROKER_URL, "jobs")
    worker = ProcfileProcess("worker", env={"WORKER_CONCURRENCY": 8}).start()
    yield worker
    worker.stop()


@pytest.fixture(scope="session")
def smtp_server():
    """A real SMTP server process (aiosmtpd) for the whole session; `mailbox` empties it for a test."""
    from tests.support.mail import SmtpProcess

    server = SmtpProcess().start()
    yield server
    server.stop()
    server.cleanup()


@pytest.fixture
def mailbox(smtp_server):
    smtp_server.clear()
    return smtp_server


@pytest.fixture(scope="session")
def otlp_receiver():
    """A real OTLP/HTTP traces receiver process for the whole session (tests/support/otlp_receiver.py);
    `otlp` empties it for a test. Unlike the sandbox and the SMTP server it is not a shared service of
    tests/support/e2e_mark.py, so a test that uses it is `e2e`: spans sent over HTTP are what a test of a
    process boundary checks, and a test of tracing within this process can read the SDK's
    InMemorySpanExporter and start nothing."""
    from tests.support.otlp_receiver import OtlpReceiver

    receiver = OtlpReceiver().start()
    yield receiver
    receiver.stop()
    receiver.cleanup()


@pytest.fixture
def otlp(otlp_receiver):
    """The session's OTLP receiver with no span and no request yet: give a process under test
    OTEL_EXPORTER_OTLP_ENDPOINT=otlp.endpoint, then read otlp.wait_for(...), otlp.traces(), otlp.requests()."""
    otlp_receiver.reset()
    return otlp_receiver


@pytest.fixture
def mail_to(settings):
    """Send this process's mail to an SMTP server of the suite's (`mail_to(mailbox)`), as a worker started
    with that server's EMAIL_URL does: for the engine run in process (tests/support/engine.py)."""
    from config.env import email_from_url

    def point(server) -> None:
        for name, value in email_from_url(server.url).items():
            setattr(settings, name, value)

    return point


@pytest.fixture
def report_worker(transactional_db, sandbox, mailbox):
    """A `worker` whose report mail goes to the suite's SMTP server (see the note on workers above)."""
    from django.conf import settings

    purge_queue(settings.CELERY_BROKER_URL, "jobs")
    worker = ProcfileProcess("worker", env={"WORKER_CONCURRENCY": 16, "EMAIL_URL": mailbox.url}).start()
    yield worker
    worker.stop()


@pytest.fixture(scope="session")
def web_stack(django_db_setup, django_db_blocker, sandbox, tmp_path_factory):
    """The `web` process as the Procfile starts it, for tests that talk HTTP to the real web process
    (hostile input, tenants), on a broker of its own. The web process acts only on requests, never in
    the background, so one serves the session; a test whose jobs must run asks for `web_worker`. Its
    temporary directory is its own, so a test can see that a refused body never reached the disk."""
    tmpdir = tmp_path_factory.mktemp("web-tmp")
    with django_db_blocker.unblock():
        web = ProcfileProcess("web", {**WEB_STACK_ENV, "PORT": free_port(), "TMPDIR": tmpdir}).start()
    web.tmpdir = tmpdir
    yield web
    web.stop()


# TEST_WEB_BROKER_URL: two suites run side by side (one per checkout) each need their own.
WEB_STACK_ENV = {"BROKER_URL": os.environ.get("TEST_WEB_BROKER_URL") or redis_server.url(11), "REQUEST_BODY_TIMEOUT_S": 1, "STORE_RETRY_WINDOW_S": 2,
                 "SSE_MAX_S": 8,
                 "WORKER_CONCURRENCY": 8}


@pytest.fixture
def web_worker(transactional_db, web_stack):
    """A `worker` for the jobs `web_stack` takes, belonging to this test (see above)."""
    purge_queue(WEB_STACK_ENV["BROKER_URL"], "jobs")
    # Providers that call back are asked to call this stack's web process (executor.callbacks).
    worker = ProcfileProcess("worker", {**WEB_STACK_ENV, "PROVIDER_CALLBACK_BASE_URL": web_stack.url}).start()
    yield worker
    worker.stop()


# Deliveries in tests: loopback receivers are allowed, and the retry schedule is seconds, not hours.
WEBHOOK_TEST_ENV = {"WEBHOOK_ALLOW_PRIVATE": 1, "WEBHOOK_RETRY_SCHEDULE": "1,1,1", "WEBHOOK_SEND_LEASE_S": 3,
                    "WEBHOOK_FIRST_TRY_GRACE_S": 1}


@pytest.fixture
def webhooks_worker(transactional_db):
    """One `webhooks` process as the Procfile starts it, on the test database and broker (see above)."""
    from django.conf import settings

    purge_queue(settings.CELERY_BROKER_URL, "webhooks")
    worker = ProcfileProcess("webhooks", env=WEBHOOK_TEST_ENV).start()
    yield worker
    worker.stop()


@pytest.fixture
def drainer(webhooks_worker, settings):
    """The drainer as beat runs it (webhooks.tasks.drain), every 0.2 s from a thread of this process."""
    import threading

    from django.db import connections

    from webhooks.tasks import drain

    for name, value in WEBHOOK_TEST_ENV.items():
        setattr(settings, name, [int(v) for v in value.split(",")] if name == "WEBHOOK_RETRY_SCHEDULE" else value)
    stop = threading.Event()

    def loop():
        try:
            while not stop.wait(0.2):
                drain()
        finally:
            connections.close_all()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join()


@pytest.fixture
def fresh_catalog(settings):
    """The catalog and the rate card read afresh before and after the test (each process keeps them a few
    seconds): what a test writes to the admin's Models page or a models file counts at once."""
    from billing import rates
    from executor import registry

    registry.forget_models()
    rates.forget_overrides()
    yield settings
    registry.forget_models()
    rates.forget_overrides()


class Api:
    """A client's view of the API through Django's test client (in process, real database)."""

    def __init__(self, credentials: dict):
        self.client_id = credentials["client_id"]
        self.api_key = credentials["api_key"]
        self.webhook_secret = credentials["webhook_secret"]
        self.http = DjangoClient()

    def headers(self, **extra) -> dict:
        return {"Authorization": f"Bearer {self.api_key}", **extra}

    def create(self, body, *, key: str | None = "key-1", raw: bytes | str | None = None, **headers):
        extra = self.headers(**headers)
        if key is not None:
            extra["Idempotency-Key"] = key
        data = raw if raw is not None else json.dumps(body)
        content_type = headers.pop("content_type", "application/json")
        return self.http.post("/v1/jobs", data=data, content_type=content_type, headers=extra)

    def get(self, path: str, **params):
        return self.http.get(path, params, headers=self.headers())

    def job(self, job_id) -> dict:
        response = self.get(f"/v1/jobs/{job_id}")
        assert response.status_code == 200, response.content
        return response.json()


# A webhook URL for clients whose jobs' events must be delivery rows (a polling client's make none),
# in tests where no webhooks process runs: the rows stay pending and nothing is sent.
HOOK_URL = "https://hooks.example.com/payonce"


@pytest.fixture
def make_api(db):
    def make(name: str = "acme", webhook_url: str = "") -> Api:
        return Api(client_create(name=name, webhook_url=webhook_url))

    return make


@pytest.fixture
def api(make_api) -> Api:
    return make_api("acme")


def media_body(**overrides) -> dict:
    body = {
        "kind": "media",
        "models": ["sandbox/video-keyed"],
        "input": {"prompt": "a lighthouse at dusk", "render_s": 1},
    }
    body.update(overrides)
    return body


def concurrently(*calls):
    """Run the callables at the same moment (a barrier releases them together), each in its own thread
    with its own database connection; return their results in order, re-raising the first error."""
    import threading

    from django.db import connections

    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)
    errors: list = []

    def run(index, call):
        try:
            barrier.wait()
            results[index] = call()
        except BaseException as exc:  # surfaced in the test's thread below
            errors.append(exc)
        finally:
            connections.close_all()  # give the pooled connection back

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


@pytest.fixture
def engine(db, sandbox):
    """The job engine in this process (tests/support/engine.py): the engine's messages go to a queue the
    test runs with the tasks' own bodies, instead of to a worker process."""
    from tests.support.engine import Engine

    with Engine().installed() as engine:
        yield engine
