"""The durable step runner and the sweeper, driven directly (task bodies, no broker), against real
PostgreSQL and the sandbox provider over HTTP."""

import dataclasses
import time
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from executor import services as executor_services
from jobs import services
from jobs.engine import runner, sweeper
from jobs.engine.outcomes import Continue, Done, FanOut, Later, Resume, Stop
from jobs.engine.workflow import Effect, FanOutSpec, Recipe, Stage, StepSpec
from jobs.kinds import KINDS
from jobs.models import Job, JobStatus, Step, StepStatus
from tests.conftest import HOOK_URL, concurrently, media_body
from webhooks.models import Delivery

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def api(make_api):
    """A client that takes webhooks: every event of its jobs is an outbox row these tests can read."""
    return make_api("acme", webhook_url=HOOK_URL)


class RaisingProvider:
    """A provider port that fails the test if anything calls it."""

    def __getattr__(self, name):
        raise AssertionError(f"the provider was called ({name}) for a step that was already done")


def new_job(api, **overrides) -> Job:
    """A job row as POST /v1/jobs writes it, but not enqueued: these tests run its stages themselves, and
    a worker started by another test must not pick it up."""
    body = media_body(**overrides)
    job_id = uuid.uuid4()
    return Job.objects.create(
        id=job_id, client_id=api.client_id, idempotency_key=f"k-{job_id}", request_hash="0" * 64, kind=body["kind"],
        model_chain=body["models"], input=body["input"], policy={"attempts_per_model": 3, "fallback_on": []},
        output_key=f"outputs/{job_id}/output.mp4", metadata={},
        lease_until=timezone.now() + timedelta(minutes=10),
    )


def steps(job: Job) -> dict[str, Step]:
    return {row.name: row for row in Step.objects.filter(job=job, run=job.run)}


# --- a done step is never re-run -----------------------------------------------------------------------


class SubmitRaises:
    """The sandbox adapter, except that submitting (the step that is already done) fails the test."""

    def __init__(self):
        from executor.providers.sandbox.adapter import SandboxProvider

        self.real = SandboxProvider()

    def submit(self, *args, **kwargs):
        raise AssertionError("the provider was asked to submit again for a done step")

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_done_step_is_never_rerun(engine, api, ledger, monkeypatch):
    job = new_job(api, input={"prompt": "a lighthouse", "render_s": 1.5})
    # The prepare stage runs, then the wait stage inline: the render's expected 1.5 s have not passed,
    # so it asks nothing and the chain's next link is sent when the first poll is due.
    outcome = engine.stage(job, "prepare")[-1]
    assert isinstance(outcome, Continue) and 1.0 < outcome.countdown <= 1.5
    before = steps(job)
    assert before["submit"].status == StepStatus.DONE
    assert [c["kind"] for c in ledger.calls()] == ["submit"]

    # Deliver the same stage task again with a provider port that raises if asked to submit.
    monkeypatch.setattr(executor_services, "provider_for", lambda name: SubmitRaises())
    assert isinstance(engine.stage(job, "prepare", task_id="redelivery")[-1], Continue)
    after = steps(job)
    for name in ("mark_running", "check_output", "submit"):
        assert (after[name].status, after[name].result, after[name].attempts) == (
            before[name].status, before[name].result, before[name].attempts)
    monkeypatch.undo()

    time.sleep(1.6)
    assert engine.stage(job, "wait")[-1] == Done()  # the poll finds the render done; store and finish run inline
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    # Every step is done and the job ended: a late delivery of any stage touches nothing at all.
    monkeypatch.setattr(executor_services, "provider_for", lambda name: RaisingProvider())
    calls = len(ledger.calls())
    for stage in ("prepare", "wait", "finish"):
        assert engine.stage(job, stage, task_id="late")[-1] == Stop("job is succeeded")
    assert len(ledger.calls()) == calls
    assert len(ledger.ledger()["charges"]) == 1
    assert [c["kind"] for c in ledger.calls()].count("submit") == 1


def test_stages_run_inline_until_one_has_to_wait(engine, api, ledger):
    job = new_job(api, input={"prompt": "instant", "render_s": 0})
    assert engine.stage(job, "prepare")[-1] == Done()  # the provider answered the submit finished: no wait message
    names = [name for name, row in steps(job).items() if row.status == StepStatus.DONE]
    assert sorted(names) == sorted(
        ["mark_running", "check_output", "submit", "wait", "store_output", "finish"])
    assert [c["kind"] for c in ledger.calls()] == ["submit", "media"]  # no poll was needed


# --- two executions of one step at once: one works, the other attaches -------------------------------------


def test_two_executions_of_one_step_make_one_provider_call(api, ledger):
    job = new_job(api, input={"prompt": "a lighthouse", "render_s": 0})
    ledger.faults([{"model": "video-keyed", "action": "delay", "seconds": 1.5}])  # keep the first one busy
    durations = {}

    def execute(owner):
        started = time.monotonic()
        outcome = runner.run_stage(job_id=job.id, run=job.run, stage="prepare", owner=owner)
        durations[owner] = time.monotonic() - started
        return outcome

    outcomes = concurrently(lambda: execute("first"), lambda: execute("second"))

    assert outcomes == [Done(), Done()]
    submits = [c for c in ledger.calls() if c["kind"] == "submit"]
    assert len(submits) == 1, submits  # the provider saw one call
    assert len(ledger.ledger()["charges"]) == 1
    row = steps(job)["submit"]
    assert row.status == StepStatus.DONE and row.attempts == 1
    assert min(durations.values()) >= 1.4  # the one that attached waited for the other's result


def test_a_step_whose_lease_ran_out_is_taken_over(engine, api, ledger, settings):
    job = new_job(api, input={"prompt": "a lighthouse", "render_s": 0})
    # A worker claimed the submit step and died: its lease is in the past.
    Step.objects.create(job=job, run=1, name="mark_running", status=StepStatus.DONE, result={"started": True})
    Step.objects.create(job=job, run=1, name="submit", status=StepStatus.RUNNING, lease_owner="dead-worker",
                        lease_until=timezone.now() - timedelta(seconds=1))
    assert engine.stage(job, "prepare", task_id="survivor")[-1] == Done()
    row = steps(job)["submit"]
    assert (row.status, row.attempts) == (StepStatus.DONE, 2)
    assert row.lease_owner.startswith("survivor#")


def test_a_live_lease_is_not_taken_over(api, ledger, settings):
    settings.ATTACH_WAIT_S = 0.5
    job = new_job(api, input={"prompt": "a lighthouse", "render_s": 0})
    Step.objects.create(job=job, run=1, name="submit", status=StepStatus.RUNNING, lease_owner="busy-worker",
                        lease_until=timezone.now() + timedelta(seconds=30))
    outcome = runner.run_stage(job_id=job.id, run=1, stage="prepare", owner="second")
    assert isinstance(outcome, Later)
    assert [c for c in ledger.calls() if c["kind"] == "submit"] == []
    assert steps(job)["submit"].lease_owner == "busy-worker"


# --- first terminal state wins --------------------------------------------------------------------------


@pytest.mark.parametrize("round_", range(10))
def test_three_writers_end_one_job_at_once_and_one_wins(api, round_):
    job = new_job(api)
    Job.objects.filter(id=job.id).update(status=JobStatus.RUNNING)
    writers = {
        "succeeded": lambda: services.job_finish(job_id=job.id, status=JobStatus.SUCCEEDED, output={"key": "x"}),
        "failed": lambda: services.job_finish(job_id=job.id, status=JobStatus.FAILED, error={"code": "X", "message": "x"}),
        "cancelled": lambda: services.job_cancel(job=job),
    }
    won = dict(zip(writers, concurrently(*writers.values())))

    winners = [name for name, result in won.items() if result]
    assert len(winners) == 1, won
    job.refresh_from_db()
    assert job.status == winners[0]
    events = list(Delivery.objects.filter(job=job).values_list("id", flat=True))
    assert events == [f"{job.id}:1:generation.{winners[0]}"]


def test_the_event_envelope_is_the_job_after_the_change(api):
    job = new_job(api)
    assert services.job_finish(job_id=job.id, status=JobStatus.FAILED, error={"code": "X", "message": "boom"})
    import json

    delivery = Delivery.objects.get(job=job)
    envelope = json.loads(delivery.envelope)
    assert envelope["id"] == delivery.id == f"{job.id}:1:generation.failed"
    assert envelope["type"] == "generation.failed"
    assert envelope["data"]["status"] == "failed" and envelope["data"]["error"]["message"] == "boom"
    assert envelope["data"]["id"] == str(job.id)
    assert not services.job_finish(job_id=job.id, status=JobStatus.SUCCEEDED)  # a loser writes nothing
    assert Delivery.objects.filter(job=job).count() == 1


# --- the sweeper --------------------------------------------------------------------------------------


def test_sweeper_run_twice_at_once_resumes_each_stuck_job_once(api):
    past = timezone.now() - timedelta(minutes=5)
    stuck_queued = [new_job(api) for _ in range(6)]
    stuck_running = new_job(api)
    alive = new_job(api)  # a step holds a live lease
    handing_off = new_job(api)  # a step finished a moment ago: its next message may be queued
    waiting = new_job(api)  # a person must decide: never swept
    ended = new_job(api)
    Job.objects.filter(id__in=[j.id for j in [*stuck_queued, stuck_running, alive, handing_off, waiting, ended]]).update(
        lease_until=past
    )
    Job.objects.filter(id__in=[stuck_running.id, alive.id, handing_off.id]).update(status=JobStatus.RUNNING)
    Job.objects.filter(id=waiting.id).update(status=JobStatus.WAITING)
    Job.objects.filter(id=ended.id).update(status=JobStatus.SUCCEEDED)
    for job in (stuck_running, alive, handing_off):
        Step.objects.create(job=job, run=1, name="mark_running", status=StepStatus.DONE, finished_at=past)
    Step.objects.create(job=stuck_running, run=1, name="submit", status=StepStatus.RUNNING, lease_owner="dead",
                        lease_until=past)
    Step.objects.create(job=alive, run=1, name="submit", status=StepStatus.RUNNING, lease_owner="busy",
                        lease_until=timezone.now() + timedelta(seconds=30))
    Step.objects.create(job=handing_off, run=1, name="submit", status=StepStatus.DONE, finished_at=timezone.now())

    results = concurrently(sweeper.sweep, sweeper.sweep)

    resumed = [entry for result in results for entry in result]
    resumed_ids = [job_id for job_id, *_ in resumed]
    assert len(resumed_ids) == len(set(resumed_ids))  # nothing resumed twice
    assert set(resumed_ids) == {str(j.id) for j in [*stuck_queued, stuck_running]}
    assert all(stage == 0 for _, _, _, stage, _ in resumed)  # both resume at the prepare stage
    # A queued job is rung for again (it starts in its turn: jobs.dispatch); a running one resumes as named.
    assert {job_id for job_id, *_, queued in resumed if queued} == {str(j.id) for j in stuck_queued}
    assert sweeper.sweep() == []  # their leases were pushed out: a third sweep finds nothing
    for job in [*stuck_queued, stuck_running]:
        job.refresh_from_db()
        assert job.lease_until > timezone.now()


def test_sweeper_resumes_at_the_first_unfinished_stage(api):
    job = new_job(api)
    past = timezone.now() - timedelta(minutes=5)
    Job.objects.filter(id=job.id).update(status=JobStatus.RUNNING, lease_until=past)
    for name in ("mark_running", "check_output", "submit"):
        Step.objects.create(job=job, run=1, name=name, status=StepStatus.DONE, finished_at=past)
    Step.objects.create(job=job, run=1, name="wait", status=StepStatus.RUNNING, lease_owner="lost-poll",
                        lease_until=past)
    assert sweeper.sweep() == [(str(job.id), 1, "media", 1, False)]


# --- fan-out: parallel sub-steps, resumed with only the missing ones ---------------------------------------


def test_fan_out_runs_substeps_once_and_resumes_only_the_missing(api, monkeypatch):
    calls = []

    def chapter(ctx, key):
        calls.append(key)
        return {"text": f"chapter {key}"}

    def seal(ctx):
        return {"chapters": [ctx.result(f"chapter-{key}")["text"] for key in "abc"]}

    recipe = Recipe((
        Stage("chapters", fanout=FanOutSpec("chapter", keys=lambda ctx: ["a", "b", "c"], fn=chapter)),
        Stage("seal", (StepSpec("seal", seal, Effect.DB),)),
    ))
    monkeypatch.setitem(KINDS, "report", dataclasses.replace(KINDS["report"], recipe=recipe))
    job = new_job(api)
    Job.objects.filter(id=job.id).update(kind="report")
    job.refresh_from_db()

    assert runner.run_stage(job_id=job.id, run=1, stage="chapters", owner="t") == FanOut("chapters", ["a", "b", "c"])
    assert runner.run_substep(job_id=job.id, run=1, stage="chapters", key="a", owner="t1") == Stop(
        "waiting for sibling sub-steps"
    )
    # The run is interrupted; resuming fans out only the chapters not done.
    assert runner.run_stage(job_id=job.id, run=1, stage="chapters", owner="t") == FanOut("chapters", ["b", "c"])
    assert runner.resume_point(job) == 0
    assert runner.run_substep(job_id=job.id, run=1, stage="chapters", key="b", owner="t2") == Stop(
        "waiting for sibling sub-steps"
    )
    # A duplicate delivery of a done sub-step does not run it again.
    assert runner.run_substep(job_id=job.id, run=1, stage="chapters", key="a", owner="t3") == Stop(
        "waiting for sibling sub-steps"
    )
    assert runner.run_substep(job_id=job.id, run=1, stage="chapters", key="c", owner="t4") == Resume("report", 1)
    # The join continues the run once: a late duplicate of the last sub-step does not.
    assert runner.run_substep(job_id=job.id, run=1, stage="chapters", key="c", owner="t5") == Stop(
        "another sub-step joined the stage"
    )
    # The resumed run (what the join's Resume enqueues) seals; a late delivery of the fan-out stage only
    # finds it joined and sealed.
    assert runner.run_stage(job_id=job.id, run=1, stage="seal", owner="t") == Done()
    assert runner.run_stage(job_id=job.id, run=1, stage="chapters", owner="t") == Done()
    assert calls == ["a", "b", "c"]
    assert steps(job)["seal"].result == {"chapters": ["chapter a", "chapter b", "chapter c"]}


def test_a_stage_delivered_before_the_stages_it_follows_stops_and_touches_nothing(engine, api, ledger):
    job = new_job(api, input={"prompt": "early", "render_s": 1})
    # No chain sends these before the stages before them have ended; one delivered anyway stops.
    assert engine.stage(job, "finish")[-1] == Stop("stage finish waits for step check_output")
    assert engine.stage(job, "wait")[-1] == Stop("stage wait waits for step check_output")
    assert Step.objects.filter(job=job).count() == 0
    assert ledger.calls() == []
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED
