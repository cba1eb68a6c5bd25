"""The crash tests: paid work goes on through processes killed, broker messages lost and database
connections cut, and pays once. Everything is a real process (`web`, `worker`, `webhooks` and `beat` as
the Procfile starts them, the sandbox provider, PostgreSQL, Redis or RabbitMQ), each stack on a broker of
its own, with short leases so that recovery (sweep interval + lease) fits a test (tests.support.procs.Stack).

1. Workers killed and the broker emptied: 30 paid renders while the worker is SIGKILLed and restarted
   again and again, and the broker loses every message once. All 30 must succeed, and the sandbox's
   ledger must show 30 charges: one per job, under its first upstream key.
2. A worker killed with an attempt out (the intent committed, the provider's answer not yet back: the
   sandbox holds the submit with a `delay` fault), then restarted. What recovery does is the provider's
   capability: a keyed model gets the same key again and charges once; a lookup model is found by its
   metadata and adopted, never sent again; a blind model waits for a person, with one charge and never a
   silent second.
3. Database connections cut (pg_terminate_backend) while a worker's tasks run: it keeps working. Found by
   the storm's connection cuts: a task that failed because its connection was cut had its error stored
   through the database result backend, over the same dead connection; that raised again outside the
   task, Celery's threads pool swallowed it, and the task was never completed or acknowledged. Eight such
   tasks (WORKER_CONCURRENCY) and the worker took no more messages, for good: webhooks stopped. A real
   `webhooks` worker and `beat`, the drain rung every 0.2 s, hundreds of cuts.
"""

import json
import os
import re
import signal
import time
import uuid
from decimal import Decimal

import psycopg
import pytest
import requests
from django.db import connection
from django.utils import timezone
from kombu import Connection

from billing.models import Reservation
from billing.selectors import month_totals
from executor.models import Attempt
from jobs.models import Job, Step
from jobs.services import client_create
from tests.conftest import HOOK_URL, purge_queue
from tests.support import redis_server
from tests.support.books import assert_books_balance
from tests.support.procs import ProcfileProcess, Stack
from tests.support.traces import assert_calls_are_the_ledger, traced, wait_for_the_ledger
from webhooks.models import Delivery

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


# --- 1. workers killed and the broker emptied ------------------------------------------------------------

JOBS = 30
PREFORK_WORKER = ("celery -A config worker -Q jobs --pool prefork --concurrency 2 --hostname jobs@%h "
                  "--without-gossip --without-mingle --loglevel INFO")

SCENARIOS = {
    # broker URL, worker command (None: the Procfile's), how the broker loses its messages
    "redis": (redis_server.url(12), None, "flushdb"),
    "redis-prefork-children": (redis_server.url(12), PREFORK_WORKER, "flushdb"),
    "rabbitmq": ("amqp://guest:guest@127.0.0.1:5672//", None, "purge"),
}


def lose_every_message(broker_url: str, how: str) -> None:
    with Connection(broker_url) as conn:
        if how == "flushdb":
            # Every queued and unacknowledged message of this stack's own Redis database; a developer's
            # `make run` stack on database 0 keeps its messages.
            conn.default_channel.client.flushdb()
        else:
            conn.default_channel.queue_purge("jobs")  # RabbitMQ: every ready message of the jobs queue


@pytest.fixture
def killed_stack(request, transactional_db, ledger, otlp):  # stopped before the database is flushed
    broker_url, worker_command, how = SCENARIOS[request.param]
    processes = Stack(broker_url, worker_command, **traced(otlp))
    try:
        yield processes.start(), broker_url, how
    finally:
        processes.stop()


@pytest.mark.parametrize("killed_stack", list(SCENARIOS), indirect=True)
def test_30_renders_survive_sigkills_and_a_lost_broker_and_pay_once_each(killed_stack, ledger, otlp):
    processes, broker_url, how = killed_stack
    worker = processes["worker"]
    credentials = client_create(name="crash", webhook_url=HOOK_URL)  # its events are rows (no webhooks process)
    url = f"{processes.url}/v1/jobs"
    headers = {"Authorization": f"Bearer {credentials['api_key']}"}
    # The first submits are held in flight by the provider, so the first kill lands mid-call: those
    # attempts must go out again after the restart (under the same key) and be paid once.
    ledger.faults([{"model": "video-keyed", "action": "delay", "seconds": 2, "times": 4}])
    job_ids = []
    for n in range(JOBS):
        body = {"kind": "media", "models": ["sandbox/video-keyed"],
                "input": {"prompt": f"render {n}", "render_s": 2 + (n % 11) / 10}}
        response = requests.post(url, json=body, headers={**headers, "Idempotency-Key": f"crash-{n}"}, timeout=10)
        assert response.status_code == 201, response.text
        job_ids.append(response.json()["id"])

    # The first kill waits for a submit the provider holds (on a loaded machine the worker may take longer
    # than the first second to send one, and a kill of an idle worker tests nothing).
    deadline = time.monotonic() + 30
    while not Attempt.objects.filter(job_id__in=job_ids, state="submitting").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    for round_ in range(4):
        time.sleep(1.0 if round_ else 0.2)
        if worker.children() and round_ % 2 == 0:
            for child in worker.children():  # a pool process dies under its task
                os.kill(child, signal.SIGKILL)
        else:
            worker.kill()  # the whole worker dies: no shutdown, no acknowledgements
            worker.start()
        if round_ == 1:
            lose_every_message(broker_url, how)
    last_kill = timezone.now()

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        open_jobs = Job.objects.filter(id__in=job_ids, status__in=["queued", "running", "waiting"]).count()
        if open_jobs == 0:
            break
        time.sleep(0.5)
    statuses = dict(Job.objects.filter(id__in=job_ids).values_list("id", "status"))
    assert sorted(set(map(str, statuses.values()))) == ["succeeded"], statuses
    # The kills landed mid-call: a submit that was out when its worker died went out again.
    assert Attempt.objects.filter(job_id__in=job_ids, sends__gte=2).exists()
    if how == "flushdb":
        # Redis lost every message, queued and unacknowledged: the jobs finished because the sweeper
        # resumed them from PostgreSQL, not because the broker gave anything back.
        assert "sweeper: resuming" in worker.output()

    charges = assert_books_balance(ledger)  # every charge is one attempt row with its upstream key
    per_job = {job_id: [c for c in charges if c["metadata"].get("payonce_job") == job_id] for job_id in job_ids}
    assert len(charges) == JOBS, f"{len(charges)} charges for {JOBS} jobs"
    for job_id, job_charges in per_job.items():
        assert len(job_charges) == 1, (job_id, job_charges)
        assert job_charges[0]["request_id"] == f"payonce-{job_id}-1"
    # One terminal event per job, under its one webhook-id.
    events = sorted(Delivery.objects.filter(job_id__in=job_ids).values_list("id", flat=True))
    assert events == sorted(f"{job_id}:1:generation.succeeded" for job_id in job_ids)
    assert_traced_through_the_kills(otlp, charges, job_ids, last_kill)


def assert_traced_through_the_kills(otlp, charges: list[dict], job_ids: list[str], last_kill=None) -> None:
    """The traces tell the same story as the ledger (docs/operating.md, "Traces"): every charge is one paid
    call's span, emitted by its sender or, for a call out when its worker died, by the execution that took
    it over (`payonce.recovered`), and none twice; the work after the kills is all there (the last step of
    each job that ended after `last_kill`, in its own trace: what a killed worker had batched is lost)."""
    spans = wait_for_the_ledger(otlp, charges)
    by_key = assert_calls_are_the_ledger(spans, charges)
    # Emitted again only where a worker died during the submit step: the step was taken over.
    taken_over = {str(job_id) for job_id in Step.objects.filter(job_id__in=job_ids, name="submit", attempts__gte=2)
                  .values_list("job_id", flat=True)}
    recovered = {s["attributes"]["payonce.job_id"] for key_spans in by_key.values() for s in key_spans
                 if s["attributes"].get("payonce.recovered")}
    assert recovered <= taken_over, (recovered, taken_over)
    jobs = Job.objects.filter(id__in=job_ids)
    traces = {job.id: job.trace_context[3:35] for job in jobs}
    assert all(traces.values()), traces
    after = {traces[job.id] for job in jobs if last_kill is None or job.completed_at > last_kill}
    otlp.wait_for(lambda spans: {s["trace_id"] for s in spans if s["name"] == "payonce.step store_output"} >= after,
                  message=f"the store step of each of the {len(after)} jobs that ended after the last kill")
    for key, key_spans in by_key.items():
        job_id = key_spans[0]["attributes"]["payonce.job_id"]
        assert {s["trace_id"] for s in key_spans} == {traces[uuid.UUID(job_id)]}, (key, key_spans)


# --- 2. a worker killed with an attempt out ----------------------------------------------------------


@pytest.fixture
def held_stack(transactional_db, ledger, otlp):  # stopped before the database is flushed
    # A send may take PROVIDER_CONNECT_TIMEOUT_S + PROVIDER_READ_TIMEOUT_S: how long a lookup must wait
    # before "not found" proves a send absent (kept short here).
    processes = Stack(redis_server.url(10), PROVIDER_READ_TIMEOUT_S=6, PROVIDER_CONNECT_TIMEOUT_S=1, **traced(otlp))
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
    stack.killed_at = timezone.now()
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


def test_worker_killed_while_submitting_resends_the_same_key_and_pays_once(held_stack, ledger, otlp):
    job_id = kill_while_submitting(held_stack, ledger, "sandbox/video-keyed")
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
    assert_traced_through_the_kills(otlp, charges, [job_id], held_stack.killed_at)
    # The call out at the kill, emitted by the execution that took it over; the resend is not a paid call.
    spans = otlp.spans()
    [call] = [s for s in spans if s["name"] == "payonce.provider_call"]
    assert call["attributes"]["payonce.recovered"] is True and call["attributes"]["payonce.paid"] == "unknown"
    resends = [s for s in spans if s["name"] == "payonce.provider_resend"]
    assert resends and all(s["links"][0]["span_id"] == call["span_id"] for s in resends), resends


def test_a_lookup_model_killed_while_submitting_is_found_and_adopted_with_one_charge(held_stack, ledger, otlp):
    job_id = kill_while_submitting(held_stack, ledger, "sandbox/image-lookup")

    assert Job.objects.get(id=job_id).status == "succeeded"
    assert len([c for c in ledger.calls() if c["kind"] == "submit"]) == 1  # never sent again: found
    assert [c for c in ledger.calls() if c["kind"] == "lookup"]
    [attempt] = Attempt.objects.filter(job_id=job_id)
    assert (attempt.number, attempt.state, attempt.sends) == (1, "succeeded", 1)
    charges = assert_books_balance(ledger)
    assert len(charges) == 1
    assert_traced_through_the_kills(otlp, charges, [job_id], held_stack.killed_at)
    assert reservation_of(job_id) == ("settled", Decimal("0.04"), Decimal("0.04"), Decimal("0"))


def test_a_blind_model_killed_while_submitting_waits_for_a_person_with_one_charge(held_stack, ledger, otlp):
    job_id = kill_while_submitting(held_stack, ledger, "sandbox/image-blind")

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
    charges = assert_books_balance(ledger)
    assert len(charges) == 1
    spans = wait_for_the_ledger(otlp, charges)  # the call out at the kill: its span, recovered, paid unknown
    [call] = assert_calls_are_the_ledger(spans, charges)[attempt.upstream_key]
    assert (call["attributes"]["payonce.recovered"], call["attributes"]["payonce.paid"]) == (True, "unknown")
    # Held while nobody knows; a person's decision (here: cancel) keeps it as spent. Nothing stays reserved.
    assert reservation_of(job_id) == ("held", None, Decimal("0"), Decimal("0.04"))
    from jobs.services import job_cancel

    assert job_cancel(job=Job.objects.get(id=job_id))
    assert reservation_of(job_id) == ("settled", Decimal("0.04"), Decimal("0.04"), Decimal("0"))


def keyed_worker_down_for(ledger, down_s: float, **env) -> str:
    """kill_while_submitting on a video-keyed job, its worker down for `down_s`, on a stack of its own
    (the `held_stack` fixture's settings, with `env`)."""
    processes = Stack(redis_server.url(10), PROVIDER_READ_TIMEOUT_S=6, PROVIDER_CONNECT_TIMEOUT_S=1, **env)
    try:
        return kill_while_submitting(processes.start(), ledger, "sandbox/video-keyed", down_s=down_s)
    finally:
        processes.stop()


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


# --- 3. database connections cut -------------------------------------------------------------------------


CUTS_BROKER = redis_server.url(8)
TASK_LINE = re.compile(r"Task (webhooks\.\w+)\[([0-9a-f-]+)\] (received|succeeded|raised|retry)")


def task_states(log: str) -> dict[str, set[str]]:
    """{task id: what the worker said of it}, from its JSON log lines."""
    states: dict[str, set[str]] = {}
    for line in log.splitlines():
        if not line.startswith("{"):
            continue
        found = TASK_LINE.search(json.loads(line).get("event", ""))
        if found:
            states.setdefault(found.group(2), set()).add(found.group(3))
    return states


# The processes under test connect under this application name (libpq reads PGAPPNAME), so only their
# connections are cut: the suite's own pooled connections to the same database are never touched.
APP_NAME = "payonce-db-cuts-test"


def cut_connections(dbname: str, seconds: float) -> int:
    """pg_terminate_backend on the processes' connections to `dbname` every 50 ms, for `seconds`."""
    cuts = 0
    with psycopg.connect(host="127.0.0.1", user="postgres", dbname="postgres", autocommit=True) as admin:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            cuts += admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = %s AND application_name = %s", [dbname, APP_NAME]).fetchone()[0]
            time.sleep(0.05)
    return cuts


def test_a_worker_whose_connections_are_cut_mid_task_completes_every_task_and_keeps_consuming(transactional_db):
    purge_queue(CUTS_BROKER, "webhooks")
    # LOG_LEVEL=DEBUG: the worker's "received" and "succeeded" lines of the drain, read below, are routine
    # lines kept at DEBUG (config.logs.RoutineFilter).
    env = {"BROKER_URL": CUTS_BROKER, "WEBHOOK_DRAIN_INTERVAL_S": 0.2, "PGAPPNAME": APP_NAME, "LOG_LEVEL": "DEBUG"}
    worker = ProcfileProcess("webhooks", env).start()
    beat = ProcfileProcess("beat", env).start()
    try:
        cuts = cut_connections(connection.settings_dict["NAME"], seconds=15)
        cut_over = len(worker.output())
        time.sleep(5)  # the last tasks cut end; the drain keeps ringing
    finally:
        beat.stop()
        worker.stop()

    log = worker.output()
    states = task_states(log)
    assert cuts >= 50, cuts  # the worker's connections were cut again and again
    assert any("raised" in said for said in states.values())  # tasks were hit mid-way
    # Every task received while the cuts went on ended (it had 5 s more), and the worker still takes
    # and completes new ones after them.
    stuck = [task for task in task_states(log[:cut_over]) if states[task] == {"received"}]
    assert stuck == [], f"{len(stuck)} tasks never completed nor were acknowledged: {stuck[:8]}"
    after = task_states(log[cut_over:])
    assert [task for task, said in after.items() if "succeeded" in said], "no task completed after the cuts"
