"""/healthz and /readyz (operators.probes): through real `web` processes as the Procfile starts them (a
database turned read-only and back, a lock that holds the write, a broker closed or hanging, a database
that never answers), and in process where a test reaches inside (many probes at once, another broker).

A "hanging" server is a socket that listens and never accepts: the kernel completes every connection,
and nothing is ever answered, as a frozen PostgreSQL or Redis would."""

import asyncio
import json
import socket
import time
from contextlib import contextmanager

import psycopg
import pytest
import requests
from django.db import connection

from operators import probes
from operators.models import ReadinessMark
from tests.conftest import WEB_STACK_ENV
from tests.support.procs import ProcfileProcess, free_port

TIMEOUT_S = 1.0  # READYZ_TIMEOUT_S of the web processes started here
SLACK_S = 0.5  # what an answer past the deadline may take to reach the test (scheduling on a busy machine)
pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def hanging_server():
    """A loopback port whose connections are completed by the kernel and never answered."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield sock.getsockname()[1]


def _admin_connection():
    db = connection.settings_dict
    return psycopg.connect(dbname="postgres", user=db["USER"] or None, host=db["HOST"] or "localhost",
                           port=db["PORT"] or 5432, autocommit=True)


@contextmanager
def read_only_database():
    """The test database refuses writes in every new session (as a primary turned standby does), until
    the block ends."""
    name = connection.settings_dict["NAME"]
    with _admin_connection() as admin:
        admin.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        try:
            yield
        finally:
            admin.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')


def _web(django_db_blocker, **env) -> ProcfileProcess:
    with django_db_blocker.unblock():
        web = ProcfileProcess("web", {**WEB_STACK_ENV, "PORT": free_port(), "WEB_CONCURRENCY": 1,
                                      "READYZ_TIMEOUT_S": TIMEOUT_S, **env}).start()
    return web


@pytest.fixture(scope="module")
def web(django_db_setup, django_db_blocker):
    process = _web(django_db_blocker)
    yield process
    process.stop()


def probe(web, path="/readyz", **kwargs):
    """(status, body, seconds) of one probe, after the answer a probe may reuse has aged out."""
    time.sleep(probes.REUSE_S)
    started = time.monotonic()
    answer = requests.get(f"{web.url}{path}", timeout=10, **kwargs)
    return answer.status_code, answer.json(), time.monotonic() - started


@pytest.mark.e2e
def test_healthz_and_readyz_answer_without_a_key_and_readyz_has_written(web):
    before = time.time()
    assert probe(web, "/healthz")[:2] == (200, {"status": "ok"})
    status, body, _ = probe(web)
    assert (status, body) == (200, {"status": "ready"})
    # The write it made: this process's row, just now.
    marked = list(ReadinessMark.objects.values_list("marked_at", flat=True))
    assert len(marked) == 1 and marked[0].timestamp() >= before - 1
    assert ReadinessMark.objects.filter(slot__gte=probes.SLOTS).count() == 0

    head = requests.head(f"{web.url}/readyz", timeout=10)
    assert head.status_code == 200 and head.content == b"" and head.headers["Cache-Control"] == "no-store"
    assert head.headers["X-Content-Type-Options"] == "nosniff"
    for path in ("/healthz", "/readyz"):
        refused = requests.post(f"{web.url}{path}", timeout=10)
        assert refused.status_code == 405 and refused.headers["Allow"] == "GET, HEAD"
        assert refused.json()["error"]["code"] == "METHOD_NOT_ALLOWED"


@pytest.mark.e2e
def test_readyz_fails_within_one_probe_when_the_database_turns_read_only_and_recovers_on_its_own(web):
    assert probe(web)[0] == 200  # the web process's pool holds sessions from before the change
    offset = len(web.output())
    with read_only_database():
        status, body, took = probe(web)
        assert (status, body) == (503, {"status": "unavailable"}) and took < TIMEOUT_S
    # The reason is in the log line only, and once.
    log = web.output()[offset:]
    assert log.count("readyz: not ready") == 1 and "read-only transaction" in log
    assert probe(web)[:2] == (200, {"status": "ready"})
    assert "readyz: ready again" in web.output()[offset:]


@pytest.mark.e2e
def test_readyz_is_503_within_its_timeout_while_a_lock_holds_the_write_and_leaves_no_backend_waiting(web):
    table = ReadinessMark._meta.db_table
    db = connection.settings_dict
    name = db["NAME"]
    with psycopg.connect(dbname=db["NAME"], user=db["USER"] or None, host=db["HOST"] or "localhost",
                         port=db["PORT"] or 5432) as holder:
        holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")  # a migration's lock, held
        status, body, took = probe(web)
        assert (status, body) == (503, {"status": "unavailable"})
        assert TIMEOUT_S - 0.1 <= took < TIMEOUT_S + SLACK_S
        healthz = probe(web, "/healthz")
        assert healthz[0] == 200 and healthz[2] < 0.5  # liveness never waits on the database
        # The probe's statement gave up on the server too (statement_timeout): no backend stays queued
        # on the lock for every probe that was answered.
        with _admin_connection() as admin:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                waiting = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND "
                                        "wait_event_type = 'Lock'", [name]).fetchone()[0]
                if waiting == 0:
                    break
                time.sleep(0.2)
            assert waiting == 0
        holder.rollback()
    assert probe(web)[0] == 200


@pytest.mark.e2e
def test_a_probe_that_passes_writes_no_log_line_and_no_metric(web):
    assert probe(web)[0] == 200
    offset = len(web.output())
    for _ in range(20):
        assert requests.get(f"{web.url}/readyz", timeout=10).status_code == 200
        assert requests.get(f"{web.url}/healthz", timeout=10).status_code == 200
    assert web.output()[offset:] == ""
    metrics = requests.get(f"{web.url}/metrics", timeout=30)
    assert metrics.status_code == 200 and "healthz" not in metrics.text and "readyz" not in metrics.text


@pytest.mark.e2e
def test_the_probes_are_not_in_the_api_document(web):
    # Operational endpoints, like /metrics and /admin/: no client library calls them.
    document = requests.get(f"{web.url}/v1/schema", headers={"Accept": "application/vnd.oai.openapi+json"},
                            timeout=30).json()
    assert "/v1/jobs" in document["paths"]
    assert not {"/healthz", "/readyz"} & set(document["paths"])


@pytest.mark.e2e
def test_healthz_answers_and_readyz_is_503_in_time_when_the_database_hangs_and_the_broker_is_closed(
        django_db_setup, django_db_blocker):
    with hanging_server() as port:
        db = connection.settings_dict
        web = _web(django_db_blocker, DATABASE_URL=f"postgres://{db['USER'] or 'postgres'}@127.0.0.1:{port}/{db['NAME']}",
                   BROKER_URL=f"redis://127.0.0.1:{free_port()}/0")
        try:
            assert probe(web, "/healthz")[:2] == (200, {"status": "ok"})
            for _ in range(3):  # and again: a check that ran out is not waited for by the next probe
                status, body, took = probe(web)
                assert (status, body) == (503, {"status": "unavailable"}) and took < TIMEOUT_S + SLACK_S
            # One line for the one reason, not one per probe; and no error of a check given up on.
            log = web.output()
            assert log.count("readyz: not ready") == 1
            assert "database: no answer within" in log and "broker: " in log and "never retrieved" not in log
        finally:
            web.stop()


@pytest.mark.e2e
def test_readyz_is_503_in_time_when_the_broker_hangs(django_db_setup, django_db_blocker):
    with hanging_server() as port:
        web = _web(django_db_blocker, BROKER_URL=f"redis://127.0.0.1:{port}/0")
        try:
            status, body, took = probe(web)
            assert (status, body) == (503, {"status": "unavailable"})
            assert TIMEOUT_S - 0.1 <= took < TIMEOUT_S + SLACK_S
            assert "broker:" in web.output() and "database:" not in web.output()
        finally:
            web.stop()


# --- in process ------------------------------------------------------------------------------------


async def _get(app, path: str) -> tuple[int, bytes]:
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    await app({"type": "http", "method": "GET", "path": path, "headers": []}, receive, send)
    return sent[0]["status"], sent[1]["body"]


def test_many_probes_at_once_cost_one_check_and_other_paths_pass_through(monkeypatch):
    ran = []

    def counted(check):
        async def run(timeout_s):
            ran.append(check.__name__)
            await asyncio.sleep(0.2)  # long enough for every probe below to arrive while it runs
            await check(timeout_s)
        return run

    monkeypatch.setattr(probes, "CHECKS", {name: counted(check) for name, check in probes.CHECKS.items()})
    passed_on = []

    async def inner(scope, receive, send):
        passed_on.append(scope["path"])

    app = probes.ProbesMiddleware(inner)

    async def main():
        answers = await asyncio.gather(*(_get(app, "/readyz") for _ in range(50)))
        await _get(app, "/readyz")  # within REUSE_S: the same answer, no check
        await app({"type": "http", "method": "GET", "path": "/v1/jobs", "headers": []}, None, None)
        return answers

    answers = asyncio.run(main())
    assert {status for status, _ in answers} == {200}
    assert json.loads(answers[0][1]) == {"status": "ready"}
    assert sorted(ran) == ["broker_answers", "database_accepts_a_write"]
    assert passed_on == ["/v1/jobs"]


@pytest.mark.parametrize("broker", ["amqp://guest:guest@127.0.0.1:5672//", "closed", "hanging"])
def test_a_rabbitmq_broker_is_checked_by_a_connection(settings, broker):
    settings.READYZ_TIMEOUT_S = TIMEOUT_S
    with hanging_server() as port:
        settings.CELERY_BROKER_URL = {"closed": f"amqp://guest:guest@127.0.0.1:{free_port()}//",
                                      "hanging": f"amqp://guest:guest@127.0.0.1:{port}//"}.get(broker, broker)
        started = time.monotonic()
        ready = asyncio.run(probes.ProbesMiddleware(None).ready())
        took = time.monotonic() - started
    assert ready is (broker.startswith("amqp://")) and took < settings.READYZ_TIMEOUT_S + SLACK_S
