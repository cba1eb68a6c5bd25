"""The money path's invariants, each in the schema or in one conditional statement, each with a test that
fails without it (real PostgreSQL, the sandbox over HTTP, the executor driven in-process):

- attempt_job_number: one attempt per number, whatever the provider (the upstream key's uniqueness);
- attempt_one_out_per_run: at most one attempt of a run out (submitting or running) at a time;
- the intent commits on its own, before the call, and refuses to run inside an outer transaction;
- every attempt state change is conditional on the state it expects: a stale execution changes nothing;
- a step's failure is written over a running step only under this execution's lease;
- every wait ends: WAIT_DEADLINE_S, and polls that fail back off inside it.
"""

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import IntegrityError, connections, transaction
from django.utils import timezone

from config.sql import violated_constraint
from executor import cancel, record, render
from executor.models import Attempt, AttemptState
from executor.providers.base import Submission
from executor.record import Money
from jobs.engine.outcomes import Continue, Done, Later, StepRetry, Stop
from jobs.engine.steps import StepContext, step_end_failed
from jobs.models import Job, Step
from tests.conftest import media_body
from tests.support.books import assert_books_balance

pytestmark = pytest.mark.django_db(transaction=True)


def new_job(api, *, models=("sandbox/video-keyed",), render_s: float = 0, policy=None) -> Job:
    """A job row as the API writes it, not enqueued: these tests drive its steps themselves."""
    body = media_body(models=list(models), input={"prompt": "an invariant", "render_s": render_s})
    job_id = uuid.uuid4()
    return Job.objects.create(
        id=job_id, client_id=api.client_id, idempotency_key=f"k-{job_id}", request_hash="0" * 64, kind="media",
        model_chain=body["models"], input=body["input"],
        policy=policy or {"attempts_per_model": 3, "fallback_on": []}, output_key=f"outputs/{job_id}/o.mp4",
        metadata={}, lease_until=timezone.now() + timedelta(minutes=10),
    )


def attempt_row(job, number: int, state=AttemptState.FAILED, provider="sandbox", model="video-keyed") -> Attempt:
    return Attempt.objects.create(job=job, run=job.run, number=number, provider=provider, model=model,
                                  upstream_key=f"payonce-{job.id}-{number}", state=state, sends=1)


# --- attempt_job_number ------------------------------------------------------------------------------------


def test_two_attempts_with_one_number_are_refused_whatever_their_provider(api):
    job = new_job(api)
    attempt_row(job, 1, provider="sandbox", model="video-keyed")
    with pytest.raises(IntegrityError) as refused, transaction.atomic():
        attempt_row(job, 1, provider="replicate", model="owner/name")
    assert violated_constraint(refused.value) == "attempt_job_number"


def test_two_executions_deciding_on_one_number_take_two_numbers_and_reserve_once_each(api, ledger, monkeypatch):
    from billing.models import Reservation

    job = new_job(api)
    attempt_row(job, 1)  # another execution (a sibling step) took number 1 a moment ago ...
    stale, real = iter([1]), record.next_number
    monkeypatch.setattr(record, "next_number", lambda job: next(stale, None) or real(job))  # ... we read it stale
    attempt = render.intend(job, "sandbox/video-keyed")
    assert attempt.number == 2 and attempt.upstream_key == f"payonce-{job.id}-2"
    assert sorted(Attempt.objects.filter(job=job).values_list("number", flat=True)) == [1, 2]
    assert list(Reservation.objects.values_list("key", flat=True)) == [f"payonce-{job.id}-2"]  # no orphan
    assert ledger.calls() == []


# --- attempt_one_out_per_run -----------------------------------------------------------------------------


@pytest.mark.parametrize("state", [AttemptState.SUBMITTING, AttemptState.RUNNING])
def test_a_second_attempt_of_a_run_is_refused_while_one_is_out(api, ledger, state):
    job = new_job(api)
    attempt_row(job, 1, state=state)
    with pytest.raises(StepRetry, match="attempt_one_out_per_run"):
        render.intend(job, "sandbox/video-keyed")
    assert list(Attempt.objects.filter(job=job).values_list("number", flat=True)) == [1]
    assert ledger.calls() == []


def test_the_limit_is_one_out_per_run(api):
    job = new_job(api)
    attempt_row(job, 1, state=AttemptState.RUNNING)  # run 1's attempt, still out
    Job.objects.filter(id=job.id).update(run=2)
    job.refresh_from_db()
    attempt_row(job, 2, state=AttemptState.RUNNING)  # run 2 may have its own
    with pytest.raises(IntegrityError) as refused, transaction.atomic():
        attempt_row(job, 3, state=AttemptState.SUBMITTING)  # but only one
    assert violated_constraint(refused.value) == "attempt_one_out_per_run"


# --- intent before spend ---------------------------------------------------------------------------------


def test_the_intent_refuses_to_run_inside_an_outer_transaction(api, ledger):
    job = new_job(api)
    with pytest.raises(RuntimeError, match="not inside a transaction"), transaction.atomic():
        render.intend(job, "sandbox/video-keyed")
    assert Attempt.objects.filter(job=job).count() == 0 and ledger.calls() == []


@pytest.mark.django_db  # under rollback: the block pytest-django's TestCase opened around the test
def test_the_intent_runs_under_a_test_cases_own_block_and_still_refuses_one_opened_inside_it(api, ledger):
    # Like Django's durable check, the guard does not count the test case's own block (so the money paths
    # are tested under rollback), and any block opened inside it still counts.
    job = new_job(api)
    with pytest.raises(RuntimeError, match="not inside a transaction"), transaction.atomic():
        render.intend(job, "sandbox/video-keyed")
    assert Attempt.objects.filter(job=job).count() == 0

    attempt = render.intend(job, "sandbox/video-keyed")

    assert (attempt.number, attempt.state, attempt.sends) == (1, "submitting", 1)
    assert ledger.calls() == []  # the intent only: nothing was sent


def test_the_intent_is_committed_when_the_provider_receives_the_call(api, ledger):
    job = new_job(api)
    ledger.faults([{"model": "video-keyed", "action": "delay", "seconds": 2}])  # hold the call at the provider
    outcome = {}

    def pay():
        try:
            outcome["result"] = render.submit(job)
        finally:
            connections.close_all()

    payer = threading.Thread(target=pay)
    payer.start()
    deadline = time.monotonic() + 10
    while not [c for c in ledger.calls() if c["kind"] == "submit"]:
        assert time.monotonic() < deadline, "the submit never reached the provider"
        time.sleep(0.02)
    # The call is at the provider, its answer not yet back: this connection sees the committed intent.
    [seen] = Attempt.objects.filter(job=job)
    assert (seen.state, seen.upstream_key, seen.sends) == ("submitting", f"payonce-{job.id}-1", 1)
    payer.join(timeout=15)
    assert outcome["result"].upstream_key == f"payonce-{job.id}-1"
    assert len(assert_books_balance(ledger)) == 1


# --- conditional state changes ------------------------------------------------------------------------------


def test_a_stale_execution_changes_nothing(api, ledger):
    job = new_job(api)
    fresh = attempt_row(job, 1, state=AttemptState.SUBMITTING)
    stale = Attempt.objects.get(id=fresh.id)
    # The fresh execution resolved the attempt: uncertain, a person decides.
    assert record.end(fresh, AttemptState.UNCERTAIN, expect=AttemptState.SUBMITTING, money=Money.HOLD,
                         error="unknown")
    # The stale one, still holding `submitting`, records an acceptance it thinks it saw: nothing changes,
    # and it re-reads what the record says.
    render._answered_accepted(stale, Submission(upstream_id="gen_stale", status="running"), done=None)
    row = Attempt.objects.get(id=fresh.id)
    assert (row.state, row.upstream_id, row.accepted_at) == ("uncertain", "", None)
    assert stale.state == "uncertain"


def test_a_cancel_that_loses_to_a_success_leaves_the_success(api, ledger):
    job = new_job(api)
    fresh = attempt_row(job, 1, state=AttemptState.RUNNING)
    stale = Attempt.objects.get(id=fresh.id)
    assert record.end(fresh, AttemptState.SUCCEEDED, expect=AttemptState.RUNNING, money=Money.SETTLE)
    assert not record.end(stale, AttemptState.FAILED, expect=AttemptState.RUNNING, money=Money.SETTLE,
                             error_class="cancelled")
    assert Attempt.objects.get(id=fresh.id).state == "succeeded"


# --- a step's failure respects the lease -------------------------------------------------------------------


def test_a_failure_is_never_written_over_a_step_another_execution_holds_or_finished(api):
    job = new_job(api)
    held = Step.objects.create(job=job, run=1, name="submit", status="running", lease_owner="other#1",
                               lease_until=timezone.now() + timedelta(seconds=30))
    done = Step.objects.create(job=job, run=1, name="check_output", status="done", result={"exists": False},
                               lease_owner="other#1")
    stale = StepContext(job=job, task_id="mine", chain="my-chain")

    assert not step_end_failed(stale, "submit", {"error": "stale"})
    assert not step_end_failed(stale, "check_output", {"error": "stale"})
    held.refresh_from_db()
    done.refresh_from_db()
    assert (held.status, held.lease_owner, held.result) == ("running", "other#1", None)
    assert (done.status, done.result) == ("done", {"exists": False})
    # Once the other execution's lease ran out (its worker died), the failure is recorded.
    Step.objects.filter(id=held.id).update(lease_until=timezone.now() - timedelta(seconds=1))
    assert step_end_failed(stale, "submit", {"error": "taken over"})
    assert Step.objects.get(id=held.id).status == "failed"


# --- every wait ends ---------------------------------------------------------------------------------------


def test_a_render_that_never_finishes_ends_at_the_wait_deadline(engine, api, ledger, settings):
    settings.WAIT_DEADLINE_S = 1.5  # neither the job nor the sandbox sets a window
    job = new_job(api, render_s=600)
    # The first poll would be at the render's expected 600 s; the deadline comes first.
    first = engine.stage(job, "prepare")[-1]
    assert isinstance(first, Continue) and first.countdown <= 1.6

    outcomes = engine.stage(job, "wait")

    assert outcomes[-1] == Stop("failed: WINDOW_EXPIRED")
    job.refresh_from_db()
    assert job.status == "failed" and job.error["code"] == "WINDOW_EXPIRED"
    [attempt] = Attempt.objects.filter(job=job)
    assert (attempt.state, attempt.error_class) == ("failed", "window_expired")
    assert "1.5 s" in attempt.error and attempt.duration_ms >= 1500
    assert [c["kind"] for c in ledger.calls() if c["kind"] == "cancel"] == ["cancel"]  # stopped upstream
    assert len(assert_books_balance(ledger)) == 1


def test_polls_that_fail_back_off_inside_the_deadline_and_the_wait_still_ends(engine, api, ledger, settings):
    settings.WAIT_DEADLINE_S = 6
    job = new_job(api, render_s=2)
    assert isinstance(engine.stage(job, "prepare")[-1], Continue)  # the first poll is due at 2 s
    ledger.faults([{"model": "video-keyed", "action": "status_503", "on": "poll", "times": 50}])

    outcomes = engine.stage(job, "wait")

    waits = [o.countdown for o in outcomes if isinstance(o, Later)][1:]  # after the first poll
    assert outcomes[-1] == Stop("failed: WINDOW_EXPIRED")
    assert len(waits) >= 3 and waits[1] > waits[0] and waits[2] > waits[1]  # backing off, not hammering
    polls = [c for c in ledger.calls() if c["kind"] == "poll"]
    assert 3 <= len(polls) <= 7  # 0.5, ~1, ~2, ~4 s: a handful within 6 s, not one per poll interval
    assert Attempt.objects.get(job=job).error_class == "window_expired"
    assert len(assert_books_balance(ledger)) == 1


# --- unknown outcomes: a 5xx the adapter does not declare unpaid -------------------------------------------


def left_out_with_a_502(job, model: str) -> Attempt:
    """The intent of `model`, sent once and answered 502 long ago (a proxy in front of the provider: a
    status the sandbox does not declare unpaid, so that send may have reached it), left `submitting`."""
    attempt = render.intend(job, model)
    Attempt.objects.filter(id=attempt.id).update(last_status=502, error_class="server_error", error="Bad Gateway",
                                                 submitted_at=timezone.now() - timedelta(minutes=5))
    return attempt


def test_an_undeclared_5xx_on_a_lookup_model_is_looked_up_and_sent_again_under_the_same_key(engine, api, ledger):
    job = new_job(api, models=("sandbox/image-lookup",))
    attempt = left_out_with_a_502(job, "sandbox/image-lookup")

    assert engine.stage(job, "prepare")[-1] == Done()  # a render of 0 s: finished in the same pass

    kinds = [c["kind"] for c in ledger.calls() if c["kind"] != "media"]  # "media": the output fetched
    assert kinds == ["lookup", "submit"]  # looked up first: proven absent, then sent (the only send it had)
    attempt.refresh_from_db()
    assert (attempt.number, attempt.sends, attempt.state) == (1, 2, AttemptState.SUCCEEDED)
    assert ledger.calls()[1]["metadata"]["upstream_key"] == f"payonce-{job.id}-1"
    assert len(assert_books_balance(ledger)) == 1


def test_an_undeclared_5xx_on_a_keyed_model_sends_the_same_key_again(engine, api, ledger):
    job = new_job(api)
    attempt = left_out_with_a_502(job, "sandbox/video-keyed")

    assert engine.stage(job, "prepare")[-1] == Done()

    assert [(c["kind"], c["request_id"]) for c in ledger.calls() if c["kind"] != "media"] == [
        ("submit", f"payonce-{job.id}-1")]
    attempt.refresh_from_db()
    assert (attempt.number, attempt.sends, attempt.state) == (1, 2, AttemptState.SUCCEEDED)
    assert len(assert_books_balance(ledger)) == 1


# --- a cancelled job's intents: never left holding money ---------------------------------------------------


@pytest.mark.parametrize("sends, state, reservation", [(0, AttemptState.FAILED, "released"),
                                                       (1, AttemptState.UNCERTAIN, "settled")])
def test_the_sweeper_ends_a_cancelled_jobs_attempt_left_submitting(api, ledger, sends, state, reservation):
    # stop_upstream's second look can be lost with the broker; the sweeper ends the intent instead, once
    # no answer can still come. Sent: it may have been paid, so it is kept as spent, unpriced.
    from billing.models import Reservation

    job = new_job(api)
    attempt = render.intend(job, "sandbox/video-keyed")
    long_ago = timezone.now() - timedelta(minutes=5)
    Attempt.objects.filter(id=attempt.id).update(sends=sends, submitted_at=long_ago)
    young = render.intend(new_job(api), "sandbox/video-keyed")  # its answer may still come: left alone
    chapter = record.intend(job, "sandbox/llm", step="chapter-intro", request={})  # a report's chapter, its worker gone
    Attempt.objects.filter(id=chapter.id).update(submitted_at=long_ago)
    Job.objects.filter(id__in=[job.id, young.job_id]).update(status="cancelled")

    cancel.sweep_cancelled()
    attempt.refresh_from_db()
    assert attempt.state == state
    held = Reservation.objects.get(key=attempt.upstream_key)
    assert held.state == reservation and held.unpriced == (sends > 0)
    assert Attempt.objects.get(id=young.id).state == AttemptState.SUBMITTING
    assert Attempt.objects.get(id=chapter.id).state == AttemptState.UNCERTAIN
    assert Reservation.objects.get(key=chapter.upstream_key).unpriced
    assert cancel.sweep_cancelled() == 1  # only the young one is still out, and still left alone
    assert Attempt.objects.get(id=young.id).state == AttemptState.SUBMITTING


def test_the_sweeper_ends_a_cancelled_jobs_render_left_running_and_settles_its_cost(api, ledger):
    # Found by the storm (tests/chaos): accepted just after the cancel, the render stayed `running` with
    # its quoted cost on the job, and its money reserved, when stop_upstream's message was flushed away.
    from billing.models import Reservation

    job = new_job(api)
    attempt = render.intend(job, "sandbox/video-keyed")
    Attempt.objects.filter(id=attempt.id).update(state=AttemptState.RUNNING, accepted_at=timezone.now(),
                                                 cost_usd="0.400000", cost_source="quoted", upstream_id="gen_x")
    Job.objects.filter(id=job.id).update(status="cancelled")

    assert cancel.sweep_cancelled() == 1
    attempt.refresh_from_db()
    assert (attempt.state, attempt.error_class) == (AttemptState.FAILED, "cancelled")
    settled = Reservation.objects.get(key=attempt.upstream_key)
    assert (settled.state, str(settled.spent)) == ("settled", "0.400000")
    assert cancel.sweep_cancelled() == 0


def test_an_uncertain_attempt_holds_its_run_even_when_the_hold_never_reached_the_job(api, ledger):
    # Found by the storm (tests/chaos): a worker marked a blind render's attempt uncertain and died before
    # writing the job's hold; the sweeper's next pass went on to attempt 2, and the same render was paid
    # twice in one run without anyone deciding to.
    from jobs.engine.outcomes import JobHold

    job = new_job(api, models=("sandbox/image-blind",))
    Attempt.objects.create(job=job, run=job.run, number=1, provider="sandbox", model="image-blind", step="submit",
                           upstream_key=f"payonce-{job.id}-1", state=AttemptState.UNCERTAIN, sends=1, request={})
    with pytest.raises(JobHold) as held:
        render.submit(job)
    assert held.value.code == "UNCERTAIN_SUBMIT"
    assert list(Attempt.objects.filter(job=job).values_list("number", flat=True)) == [1]
    assert ledger.calls() == []


def test_a_pass_deciding_from_a_stale_attempt_steps_back_instead_of_failing_the_job(api, ledger):
    # Found by the storm (tests/chaos): a callback's pass and a poll's pass both saw attempt 1 fail; one
    # sent attempt 2 (the model's last try), the other counted it as a try, called the model exhausted
    # and failed the job with attempt 2 out and charged.
    job = new_job(api, policy={"attempts_per_model": 2, "fallback_on": []})
    first = attempt_row(job, 1, state=AttemptState.FAILED)
    Attempt.objects.filter(id=first.id).update(error_class="server_error", error="render failed upstream")
    first.refresh_from_db()
    attempt_row(job, 2, state=AttemptState.SUBMITTING)  # the other pass's, out now

    with pytest.raises(StepRetry):
        render._next_model(job, first)
    assert Job.objects.get(id=job.id).status not in ("failed",)
    # With no attempt after it, the same decision is the model's last try spent: the chain is over.
    Attempt.objects.filter(job=job, number=2).update(state=AttemptState.FAILED)
    from jobs.engine.outcomes import JobFailure

    with pytest.raises(JobFailure):
        render._next_model(job, Attempt.objects.get(job=job, number=2))
