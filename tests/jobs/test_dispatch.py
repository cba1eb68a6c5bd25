"""Fair dispatch (jobs.dispatch), its rules one by one on the real tables: which queued job starts next
across clients (weights, priorities, a client back from idle), the running limit and its doorbells, and
the sweeper's view of a job waiting for its client's slot. The process-wide proofs (two workers, the
ledger) are tests/jobs/test_fairness_e2e.py."""

import io
import json
import time
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction

from accounts.models import Client
from executor.models import Attempt
from jobs import dispatch, selectors, services
from jobs.api.serializers import JobCreateSerializer
from jobs.engine import chain, runner
from jobs.engine.outcomes import NotStarted, Stop
from jobs.engine.steps import FirstStart
from jobs.models import ClientTurn, Job, JobStatus, Step
from tests.conftest import concurrently, media_body


def _create(client, key, **body) -> Job:
    serializer = JobCreateSerializer(data=media_body(**body), client=client)
    serializer.is_valid(raise_exception=True)
    job, created = services.job_create(client=client, idempotency_key=key, data=serializer.validated_data)
    assert created
    return job


def _backlog(client, count, prefix=None, **body) -> list[Job]:
    return [_create(client, f"{prefix or client.name}-{n}", **body) for n in range(count)]


def _start_own(job_id) -> dispatch.Start:
    """What a worker does with a job's doorbell: the job starts in its first transaction when it is the only
    choice there is (mark_running's job_start_first); else fair dispatch starts the fairest job."""
    job = Job.objects.get(id=job_id)
    try:
        with transaction.atomic():
            dispatch.job_start_first(job_id=job.id, client_id=job.client_id, only_choice=True)
        return dispatch.Start(str(job.id), job.run, job.kind, claimed=True)
    except NotStarted:
        return dispatch.job_start(own=job_id)


def _starts(count) -> list[Job]:
    started = []
    for _ in range(count):
        start = dispatch.job_start()
        if start is None:
            break
        assert start.claimed
        started.append(Job.objects.get(id=start.job_id))
    return started


@pytest.mark.django_db
def test_a_second_client_waits_one_turn_behind_a_deep_backlog():
    a, b = Client.objects.create(name="a"), Client.objects.create(name="b")
    _backlog(a, 30)
    _starts(5)  # a's backlog is being worked through when b arrives
    mine = _backlog(b, 3)
    order = [job.client.name for job in _starts(8)]
    # b is new to the rotation: it goes first once, then the two take turns while both have work.
    assert order == ["b", "a", "b", "a", "b", "a", "a", "a"]
    assert {job.id for job in mine} == set(Job.objects.filter(client=b, status=JobStatus.RUNNING).values_list("id", flat=True))


@pytest.mark.django_db
def test_weights_share_the_starts_in_proportion():
    heavy, light = Client.objects.create(name="heavy", weight=3), Client.objects.create(name="light")
    _backlog(heavy, 40)
    _backlog(light, 40)
    order = "".join("h" if job.client.name == "heavy" else "l" for job in _starts(42))
    # Once both have had a turn, every round is heavy's three and light's one, interleaved, not in runs.
    steady = order[2:]
    assert steady.count("h") == 30 and steady.count("l") == 10, order
    assert "hhhh" not in steady and "ll" not in steady, order


@pytest.mark.django_db
def test_a_client_back_from_idle_takes_one_turn_not_a_run_of_them():
    a, b = Client.objects.create(name="a"), Client.objects.create(name="b")
    _backlog(b, 1, prefix="b-early")
    _starts(1)  # b had a start long ago: its pass is far behind a's after a's run below
    _backlog(a, 30)
    _starts(20)
    _backlog(b, 10)
    order = [job.client.name for job in _starts(10)]
    assert order[:6] == ["b", "a", "b", "a", "b", "a"]


@pytest.mark.django_db
def test_priority_goes_first_and_within_a_priority_clients_take_turns():
    a, b = Client.objects.create(name="a"), Client.objects.create(name="b")
    low = _backlog(a, 5, prefix="a-low", priority=1)
    normal = _backlog(a, 3, prefix="a-normal")
    urgent_a = _backlog(a, 2, prefix="a-urgent", priority=5)
    urgent_b = _backlog(b, 2, prefix="b-urgent", priority=5)
    started = _starts(12)
    ids = [job.id for job in started]
    urgent = {job.id for job in urgent_a + urgent_b}
    assert set(ids[:4]) == urgent
    assert [job.client.name for job in started[:4]] in (["a", "b", "a", "b"], ["b", "a", "b", "a"])
    assert set(ids[4:7]) == {job.id for job in normal}
    assert ids[7:] == [job.id for job in low]  # within one client and priority: oldest first


@pytest.mark.django_db
def test_the_message_starts_its_own_job_when_that_job_has_the_turn():
    a = Client.objects.create(name="a")
    first, second, third = _backlog(a, 3)
    b = Client.objects.create(name="b")
    _backlog(b, 1)  # another client waits too: the rotation is read, and the start is the message's own
    ClientTurn.objects.create(client=b, pass_value=100.0)  # a's turn: b has had many
    start = dispatch.job_start(own=third.id)
    assert (start.job_id, start.claimed) == (str(third.id), True)
    # Started already: a doorbell rung for it starts the next one; a stage sent again runs it as named.
    # (a's start lifted its pass to b's, one round: b's turn now, then a's oldest.)
    assert dispatch.job_start(own=third.id, doorbell=True).job_id == str(b.jobs.get().id)
    assert dispatch.job_start(own=third.id, doorbell=True).job_id == str(first.id)
    again = dispatch.job_start(own=third.id, doorbell=False)
    assert (again.job_id, again.claimed) == (str(third.id), False)
    assert Job.objects.get(id=second.id).status == JobStatus.QUEUED


@pytest.mark.django_db
def test_a_client_at_its_running_limit_is_passed_over_and_its_freed_slot_rings(django_capture_on_commit_callbacks,
                                                                                monkeypatch):
    limited, other = Client.objects.create(name="limited", max_running=2), Client.objects.create(name="other")
    _backlog(limited, 5)
    _backlog(other, 2)
    order = [job.client.name for job in _starts(10)]
    assert sorted(order) == ["limited", "limited", "other", "other"]  # then nothing may start
    assert dispatch.job_start() is None
    assert ClientTurn.objects.get(client=limited).blocked
    assert Job.objects.filter(client=limited, holds_slot=True).count() == 2

    rung = []
    monkeypatch.setattr(chain, "ring", lambda client_id=None: rung.append(str(client_id)))
    running = Job.objects.filter(client=limited, status=JobStatus.RUNNING).first()
    with django_capture_on_commit_callbacks(execute=True):
        assert services.job_finish(job_id=running.id, status=JobStatus.SUCCEEDED, output={})
    assert rung == [str(limited.id)]  # the freed slot rings once for the client's next job
    assert _starts(2)[0].client == limited and dispatch.job_start() is None

    # A slot let go by a render that now waits on its provider rings the same way.
    waiting = Job.objects.filter(client=limited, holds_slot=True).first()
    with django_capture_on_commit_callbacks(execute=True):
        services.job_release_slot(job_id=waiting.id)
        services.job_release_slot(job_id=waiting.id)  # once only: it holds none now
    assert rung == [str(limited.id)] * 2
    assert _starts(1)[0].client == limited


@pytest.mark.django_db
def test_a_finished_job_of_an_unblocked_client_rings_nothing(django_capture_on_commit_callbacks, monkeypatch):
    a = Client.objects.create(name="a")
    _backlog(a, 2)
    job = _starts(1)[0]
    rung = []
    monkeypatch.setattr(chain, "ring", lambda client_id=None: rung.append(client_id))
    with django_capture_on_commit_callbacks(execute=True):
        services.job_finish(job_id=job.id, status=JobStatus.SUCCEEDED, output={})
    assert rung == [] and not Job.objects.get(id=job.id).holds_slot


@pytest.mark.django_db
def test_the_limit_counts_only_jobs_holding_a_slot_and_zero_means_none(settings):
    settings.CLIENT_MAX_RUNNING = 1
    a = Client.objects.create(name="a")
    b = Client.objects.create(name="b", max_running=0)
    _backlog(a, 3)
    _backlog(b, 3)
    assert sorted(job.client.name for job in _starts(10)) == ["a", "b", "b", "b"]
    started = Job.objects.get(client=a, status=JobStatus.RUNNING)
    services.job_release_slot(job_id=started.id)  # its render waits on the provider: a slot is free
    assert [job.client.name for job in _starts(10)] == ["a"]


@pytest.mark.django_db
def test_a_cancelled_queued_job_is_never_started():
    a = Client.objects.create(name="a")
    first, second = _backlog(a, 2)
    services.job_cancel(job=first)
    assert [job.id for job in _starts(5)] == [second.id]


@pytest.mark.django_db
def test_the_sweeper_leaves_a_job_waiting_for_its_clients_slot_and_rings_once_one_is_free(settings):
    limited = Client.objects.create(name="limited", max_running=1)
    waiting = _backlog(limited, 2)
    started = _starts(5)
    assert len(started) == 1 and dispatch.job_start() is None  # passed over: blocked
    Job.objects.filter(client=limited).update(lease_until="2000-01-01T00:00:00Z")
    stuck = {row[0] for row in selectors.stuck_jobs(handoff=timedelta(seconds=60))}
    queued = next(job for job in waiting if job.id != started[0].id)
    assert queued.id not in stuck  # at its client's limit: waiting its turn, not lost
    with connection.cursor() as cursor:  # the slot is freed and its doorbell lost (say a flushed broker)
        cursor.execute("UPDATE jobs_job SET holds_slot = false WHERE id = %s", [started[0].id])
    stuck = {row[0] for row in selectors.stuck_jobs(handoff=timedelta(seconds=60))}
    assert queued.id in stuck


@pytest.mark.django_db
def test_the_job_says_why_it_waits(api, settings):
    client = Client.objects.get(id=api.client_id)
    client.max_running = 1
    client.save()
    first = api.create(media_body(), key="first").json()
    second = api.create(media_body(), key="second").json()
    assert api.job(first["id"])["waiting"]["reason"] == "turn"
    assert api.job(first["id"])["priority"] == 3
    assert _start_own(first["id"]).job_id == first["id"]
    waiting = api.job(second["id"])["waiting"]
    assert (waiting["reason"], waiting["running"], waiting["limit"]) == ("client_limit", 1, 1)
    # Started, and its provider at its calls in flight: held back unsent, and said so.
    settings.PROVIDER_MAX_IN_FLIGHT = {"sandbox": 1}
    assert api.job(first["id"])["waiting"] is None  # nothing else is in flight: it is not held back
    other = _create(Client.objects.create(name="other"), "other")
    # An attempt of another client's job in flight fills the limit.
    Attempt.objects.create(job=other, run=1, number=1, provider="sandbox", model="video-keyed",
                           upstream_key=f"payonce-{other.id}-1", state="running", sends=1)
    waiting = api.job(first["id"])["waiting"]
    assert (waiting["reason"], waiting["limit"], waiting["in_flight"]) == ("provider_limit", "sandbox", 1)
    # The list and the events do not ask it of every job.
    assert "waiting" not in api.get("/v1/jobs").json()["results"][0]


@pytest.mark.django_db
def test_operators_set_a_clients_limits_from_the_command_line():
    client = Client.objects.create(name="tenant")
    out = io.StringIO()
    call_command("client_limits", "tenant", "--max-running", "7", "--weight", "3", stdout=out)
    shown = json.loads(out.getvalue())
    assert (shown["max_running"], shown["weight"]) == (7, 3)
    client.refresh_from_db()
    assert (client.max_running, client.weight) == (7, 3)
    with pytest.raises(CommandError, match="weight"):
        call_command("client_limits", "tenant", "--weight", "0", "--max-running", "9", stdout=io.StringIO())
    client.refresh_from_db()
    assert (client.max_running, client.weight) == (7, 3)  # refused: nothing changed, not even the valid one
    with pytest.raises(CommandError, match="not a number"):
        call_command("client_limits", "tenant", "--max-running", "lots", stdout=io.StringIO())
    out = io.StringIO()
    call_command("client_limits", str(client.id), "--max-running", "default", stdout=out)
    assert json.loads(out.getvalue())["max_running"] == 100 and "max_running" in json.loads(out.getvalue())["defaults"]


@pytest.mark.django_db
def test_a_job_starts_in_its_first_transaction_only_as_the_only_choice_and_in_a_free_slot():
    a = Client.objects.create(name="a", max_running=1)
    first, second = _backlog(a, 2)

    def start_first(job, only_choice=True) -> bool:
        try:
            with transaction.atomic():
                dispatch.job_start_first(job_id=job.id, client_id=a.id, only_choice=only_choice)
            return True
        except NotStarted:  # and the transaction it was in rolled back
            return False

    assert start_first(first)
    assert Job.objects.filter(id=first.id, status=JobStatus.RUNNING, holds_slot=True).exists()
    assert not start_first(second)  # no slot left
    assert not start_first(first)  # not queued any more (started by another, or cancelled)
    assert Job.objects.get(id=second.id).status == JobStatus.QUEUED
    Client.objects.filter(id=a.id).update(max_running=0)  # no limit: it starts
    assert start_first(second)
    # Not the only choice: another client's queued job (on either side of a's id), or a job of its own
    # client with a higher priority. Named (no fair dispatch), it starts all the same.
    third, urgent = _create(a, "third"), _create(a, "urgent", priority=5)
    assert not start_first(third)
    Job.objects.filter(id=urgent.id).update(status=JobStatus.CANCELLED)
    assert start_first(third, only_choice=False) is True
    fourth = _create(a, "fourth")
    for name in ("b", "c"):
        other = _create(Client.objects.create(name=name), name)
        assert not start_first(fourth)
        Job.objects.filter(id=other.id).update(status=JobStatus.CANCELLED)
    assert start_first(fourth)
    assert Job.objects.filter(client=a, holds_slot=True).count() == 4


@pytest.mark.django_db(transaction=True)
def test_two_starts_at_once_never_take_more_slots_than_the_limit():
    a = Client.objects.create(name="a", max_running=1)
    jobs = _backlog(a, 2)

    def start(job):
        def run():
            try:
                with transaction.atomic():
                    dispatch.job_start_first(job_id=job.id, client_id=a.id, only_choice=False)
                    time.sleep(0.2)  # the lock is held to the commit: the other waits, then counts this one
                    return "started"
            except NotStarted:
                return "refused"
        return run

    assert sorted(concurrently(start(jobs[0]), start(jobs[1]))) == ["refused", "started"]
    assert Job.objects.filter(client=a, holds_slot=True).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_start_in_a_first_transaction_and_a_start_by_the_rotation_take_one_lock():
    # The SQL function's lock key and jobs.dispatch's are one: a start of the rotation while a job's first
    # transaction holds the client's last slot, uncommitted, waits for it and then counts it.
    a = Client.objects.create(name="a", max_running=1)
    first, _ = _backlog(a, 2)

    def in_first_transaction():
        with transaction.atomic():
            dispatch.job_start_first(job_id=first.id, client_id=a.id, only_choice=False)
            time.sleep(0.5)
        return "started"

    def by_the_rotation():
        time.sleep(0.2)  # the first transaction holds the lock by now
        return dispatch.job_start()

    assert concurrently(in_first_transaction, by_the_rotation) == ["started", None]
    assert list(Job.objects.filter(client=a, holds_slot=True).values_list("id", flat=True)) == [first.id]


@pytest.mark.django_db
def test_a_doorbell_whose_job_another_doorbell_started_starts_the_next_one():
    a = Client.objects.create(name="a")
    mine, theirs = _backlog(a, 2)
    assert _starts(1)[0].id == mine.id  # another doorbell (theirs) starts mine first: theirs is left over
    # Mine's doorbell: its job is not queued, so it does not run it (no transaction is opened) ...
    outcome = runner.run_stage(job_id=mine.id, run=1, stage="prepare", owner="t", start=FirstStart.ONLY_CHOICE)
    assert outcome == Stop("not queued (run 1, running)", undecided=True)
    # ... and fair dispatch starts the fairest job in its place, as the task does next.
    assert _start_own(mine.id).job_id == str(theirs.id)
    assert Job.objects.get(id=theirs.id).status == JobStatus.RUNNING


@pytest.mark.django_db
def test_a_doorbell_not_the_only_choice_is_rolled_back_whole_and_starts_the_fairest_job():
    a, b = Client.objects.create(name="a"), Client.objects.create(name="b")
    mine = _create(a, "mine")
    theirs = _create(b, "theirs")
    ClientTurn.objects.create(client=a, pass_value=100.0)  # b's turn: a has had many
    outcome = runner.run_stage(job_id=mine.id, run=1, stage="prepare", owner="t", start=FirstStart.ONLY_CHOICE)
    assert outcome == Stop("not started in its first transaction", undecided=True)
    mine.refresh_from_db()
    assert (mine.status, mine.holds_slot) == (JobStatus.QUEUED, False)
    assert not Step.objects.filter(job=mine).exists()  # the first transaction's done marks and lease rolled back
    assert _start_own(mine.id).job_id == str(theirs.id)
