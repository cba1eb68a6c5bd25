"""Two releases' workers on one queue, as in a rolling deploy or a rollback (docs/operating.md, "Upgrading with jobs in flight").

1. The previous release's worker (its own checkout: tests/support/previous_release.py) and this release's
   share the `jobs` queue, on this release's schema, behind this release's `web`: every job ends, each
   worker ran some of them, and the sandbox's ledger shows one charge per job, each an attempt row.
2. A message that a worker's release does not know is never lost:
   - this release's worker gives it back to the queue (config.celery.Consumer), and a worker that knows
     the task (a "newer release": tests/support/future_task.py) runs it when it comes;
   - the previous release's worker drops it, as Celery does; the job it rang is then rung again from its
     row by the sweep (the row is the truth), and ends, paid once.
"""

from __future__ import annotations

import time
import uuid

import pytest
import redis
import requests
from kombu import Connection

from config.celery import app
from jobs.models import Job
from jobs.services import client_create
from tests.conftest import HOOK_URL
from tests.support import previous_release, redis_server
from tests.support.books import assert_books_balance
from tests.support.future_task import NAME as FUTURE_TASK
from tests.support.procs import FAST_RECOVERY, REPO_ROOT, ProcfileProcess, free_port, procfile_command

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

BROKER = redis_server.url(7)
OPEN = ("queued", "running", "waiting")


def worker(name: str, env: dict, root=None, include: str = "") -> ProcfileProcess:
    # Each release's own line: the previous one's is the Celery command itself.
    command = procfile_command("worker", root or REPO_ROOT).replace("--hostname jobs@%h", f"--hostname {name}@%h") + include
    return ProcfileProcess("worker", env, command, root=root or REPO_ROOT,
                           ready=ProcfileProcess.READY["worker"])


@pytest.fixture
def env(transactional_db, ledger):
    with Connection(BROKER) as conn:  # this test's own broker database, empty
        conn.default_channel.client.flushdb()
    return {**FAST_RECOVERY, "BROKER_URL": BROKER, "PORT": free_port()}


@pytest.fixture
def running():
    started: list[ProcfileProcess] = []
    yield started
    for process in started:
        process.stop()


def post(web: ProcfileProcess, api_key: str, body: dict, key: str) -> str:
    answer = requests.post(f"{web.url}/v1/jobs", json=body, timeout=10,
                           headers={"Authorization": f"Bearer {api_key}", "Idempotency-Key": key})
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def wait_ended(job_ids: list[str], timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while Job.objects.filter(id__in=job_ids, status__in=OPEN).exists() and time.monotonic() < deadline:
        time.sleep(0.3)
    return {str(job_id): status for job_id, status in Job.objects.filter(id__in=job_ids).values_list("id", "status")}


def test_old_and_new_workers_on_one_queue_run_every_job_and_pay_once(env, running, ledger):
    old = previous_release.worktree()
    web = ProcfileProcess("web", env).start()
    running.append(web)
    for process in (worker("jobsnew", env), worker("jobsold", env, root=old), ProcfileProcess("beat", env)):
        running.append(process.start())
    credentials = client_create(name="rolling", webhook_url=HOOK_URL)
    models = ["sandbox/video-keyed", "sandbox/image-lookup", "sandbox/image-blind"]
    job_ids = [post(web, credentials["api_key"],
                    {"kind": "media", "models": [models[n % 3]], "input": {"prompt": f"frame {n}", "render_s": 0.5}},
                    f"rolling-{n}")
               for n in range(24)]

    statuses = wait_ended(job_ids)
    assert set(statuses.values()) == {"succeeded"}, statuses
    charges = assert_books_balance(ledger)  # every charge is one attempt row with its upstream key
    assert sorted(c["metadata"]["payonce_job"] for c in charges) == sorted(job_ids)
    new_log, old_log = running[1].output(), running[2].output()
    assert "jobs.run_stage" in new_log and "succeeded" in new_log
    assert "jobs.run_stage" in old_log and "succeeded" in old_log, "the previous release's worker ran nothing"
    assert "Traceback" not in old_log + new_log


def test_a_task_this_release_does_not_know_waits_for_a_worker_that_does(env, running):
    counter = f"future-{uuid.uuid4()}"
    ours = worker("jobsnow", env).start()
    running.append(ours)
    _send(FUTURE_TASK, counter)
    time.sleep(2 * 2.5)  # given back at least twice: config.celery.UNKNOWN_TASK_AGAIN_S (at most 2.5 s)
    store = redis.Redis.from_url(BROKER)
    assert store.get(counter) is None
    newer = worker("jobsnext", env, include=" --include tests.support.future_task").start()
    running.append(newer)
    # Each give-back is a coin toss between the two workers (config.celery.UNKNOWN_TASK_AGAIN_S): 60 s is
    # some 24 tosses.
    deadline = time.monotonic() + 60
    while store.get(counter) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert store.get(counter) == b"1", "the message a worker did not know was lost, not left for one that knows it"
    assert ours.output().count(f"task {FUTURE_TASK} is not known to this release") >= 2


def test_a_job_message_the_previous_release_does_not_know_is_rung_again_from_its_row(env, running, ledger):
    web = ProcfileProcess("web", env).start()
    running.append(web)
    credentials = client_create(name="rung-again", webhook_url=HOOK_URL)
    job_id = post(web, credentials["api_key"],
                  {"kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": "late", "render_s": 0}},
                  "rung-again")
    # No worker ran yet: the job's one message is in the queue. It is taken out, and the same doorbell sent
    # under a name the previous release does not know, as a newer release might send it.
    with Connection(BROKER) as conn:
        queue = app.amqp.queues["jobs"](conn.default_channel)
        message = queue.get(no_ack=True)
        assert message is not None and message.headers["task"] == "jobs.run_stage"
        args = message.decode()[0]
    _send("jobs.run_stage_next", *args)
    old = worker("jobsold", env, root=previous_release.worktree()).start()
    running.append(old)
    deadline = time.monotonic() + 10
    while "jobs.run_stage_next" not in old.output() and time.monotonic() < deadline:
        time.sleep(0.2)
    # Since 0.42.0 a worker gives a message it does not know back to its queue (config.celery.Consumer);
    # 0.41.0 dropped it. Either way no worker here runs it: the job stays queued until the sweep rings it.
    assert "jobs.run_stage_next is not known to this release" in old.output(), old.output()[-3000:]
    assert Job.objects.get(id=job_id).status == "queued"  # nothing ran it
    running.append(ProcfileProcess("beat", env).start())  # the sweep rings queued jobs from their rows

    assert wait_ended([job_id]) == {job_id: "succeeded"}
    charges = assert_books_balance(ledger)
    assert [c["metadata"]["payonce_job"] for c in charges] == [job_id]


def _send(name: str, *args) -> None:
    with app.connection_for_write(BROKER) as conn:
        app.send_task(name, args, queue="jobs", connection=conn)
