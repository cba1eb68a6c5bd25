"""WORKER_PROCESSES (config.workers): the Procfile's `worker` line starts one Celery worker per core that `web`
leaves, named apart, and stands between them and the process manager only to pass signals on and start
again one that died. The process tests run the Procfile's own line with the session's `web` and sandbox."""

import json
import os
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from config import workers
from executor.models import Attempt
from jobs.services import client_create
from tests.conftest import WEB_STACK_ENV, media_body, purge_queue
from tests.support.books import assert_books_balance
from tests.support.http_api import HttpApi
from tests.support.procs import ProcfileProcess


def test_the_default_is_the_cores_web_leaves_and_at_least_one(monkeypatch):
    monkeypatch.setattr(workers, "cores", lambda: 16)
    assert workers.processes({}) == 14  # web's two processes (WEB_CONCURRENCY's default) keep a core each
    assert workers.processes({"WEB_CONCURRENCY": "4"}) == 12
    assert workers.processes({"WORKER_PROCESSES": "3"}) == 3
    assert workers.processes({"WORKER_PROCESSES": " "}) == 14  # set but empty: the default, as an unset one
    monkeypatch.setattr(workers, "cores", lambda: 2)
    assert workers.processes({}) == 1


@pytest.mark.parametrize("environ", [{"WORKER_PROCESSES": "0"}, {"WORKER_PROCESSES": "two"},
                                     {"WORKER_PROCESSES": "257"}, {"WORKER_PROCESSES": "1.5"},
                                     {"WEB_CONCURRENCY": "x"}])
def test_a_count_that_cannot_be_read_is_refused(environ):
    with pytest.raises(workers.SettingError, match=next(iter(environ))):
        workers.processes(environ)


def test_each_worker_is_named_apart():
    assert workers.named(["celery", "worker", "--hostname", "jobs@%h", "-Q", "jobs"], 2) == [
        "celery", "worker", "--hostname", "jobs2@%h", "-Q", "jobs"]
    assert workers.named(["celery", "worker", "--hostname=jobs@%h"], 3) == ["celery", "worker", "--hostname=jobs3@%h"]
    assert workers.named(["celery", "worker", "-n", "a@b"], 1) == ["celery", "worker", "-n", "a1@b"]
    assert workers.named(["celery", "worker"], 4) == ["celery", "worker", "--hostname", "celery4@%h"]


@pytest.mark.e2e
def test_a_refused_count_stops_the_line_before_any_worker_starts():
    worker = ProcfileProcess("worker", {"WORKER_PROCESSES": "many"}).launch()
    assert worker.proc.wait(timeout=30) == 2
    assert "refusing to start: WORKER_PROCESSES='many'" in worker.output()
    assert " ready." not in worker.output()


def _pids_of(lines: str, event: str) -> set[int]:
    found = set()
    for line in lines.splitlines():
        if line.startswith("{") and f'"event":"{event}"' in line:
            found.add(json.loads(line)["pid"])
    return found


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_two_workers_share_the_jobs_one_that_dies_comes_back_and_a_sigterm_lets_calls_in_flight_finish(
        web_stack, ledger):
    purge_queue(WEB_STACK_ENV["BROKER_URL"], "jobs")
    env = {**WEB_STACK_ENV, "WORKER_PROCESSES": 2, "WORKER_CONCURRENCY": 4,
           "PROVIDER_CALLBACK_BASE_URL": web_stack.url}
    line = ProcfileProcess("worker", env)
    line.launch()
    launched = time.monotonic()
    try:
        _wait_for(lambda: line.output().count(" ready.") == 2, 60, "both workers ready")
        [first, second] = line.children()
        host = socket.gethostname()
        assert f"jobs1@{host} ready." in line.output() and f"jobs2@{host} ready." in line.output()

        api = HttpApi(web_stack.url, client_create(name="cores"))
        with ThreadPoolExecutor(8) as pool:
            created = list(pool.map(lambda n: api.create(media_body(input={"prompt": f"job {n}", "render_s": 0.2}),
                                                         key=f"k{n}"), range(24)))
        ended = [api.wait(answer.json()["id"], timeout=60) for answer in created]
        assert {job["status"] for job in ended} == {"succeeded"}
        assert _pids_of(line.output(), "attempt.sent") == {first, second}  # both took paid work
        assert "] received" not in line.output() and "] succeeded in" not in line.output()  # Celery's, below DEBUG

        # One dies under the OOM killer: the line starts it again under its name, the other goes on.
        # Past the uptime that tells a crash from a start that failed.
        time.sleep(max(0.0, launched + workers.MIN_UPTIME_S + 1 - time.monotonic()))
        os.kill(first, signal.SIGKILL)
        _wait_for(lambda: line.output().count(" ready.") == 3, 60, "the killed worker started again")
        assert "worker 1 (pid" in line.output() and "starting it again" in line.output()
        assert line.output().count(f"jobs1@{host} ready.") == 2
        assert second in line.children() and first not in line.children() and len(line.children()) == 2

        # A SIGTERM to the line is each worker's warm shutdown: a call the provider holds finishes, paid once.
        ledger.faults([{"model": "video-keyed", "action": "delay", "seconds": 2}])
        held = api.create(media_body(input={"prompt": "held", "render_s": 0.2}), key="held").json()["id"]
        _wait_for(lambda: Attempt.objects.filter(job_id=held, state="submitting").exists(), 30, "the held call out")
        os.kill(line.pid, signal.SIGTERM)  # to the line alone: it passes it on
        assert line.proc.wait(timeout=60) == 0
        assert not line.children()
        attempt = Attempt.objects.get(job_id=held)
        assert attempt.state != "submitting" and attempt.sends == 1, (attempt.state, attempt.sends)
    finally:
        line.kill()
    assert_books_balance(ledger)


@pytest.mark.e2e
def test_a_worker_that_cannot_start_stops_the_line_with_its_status():
    # Celery refuses the concurrency at once: every worker exits within its first seconds, and the line with it.
    worker = ProcfileProcess("worker", {**WEB_STACK_ENV, "WORKER_PROCESSES": 2, "WORKER_CONCURRENCY": "lots"}).launch()
    status = worker.proc.wait(timeout=60)
    assert status != 0
    assert f"within {workers.MIN_UPTIME_S:.0f} s of its start: stopping" in worker.output()
