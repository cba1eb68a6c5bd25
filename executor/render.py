"""The render machine: getting a media job's attempt accepted by a provider (submit), waiting on it (wait),
and resolving an attempt whose send's outcome is unknown (docs/design.md, "Where money is spent: attempts").

1. Intent before spend: every attempt is committed `submitting`, with its upstream key and the exact
   request, before the provider is called (executor.record.intend).
2. The three kinds of failure (executor.policy.failure_kind): unpaid (a 4xx, a 429, a 5xx the adapter
   declares unpaid) is a definite end with nothing charged; unknown (no answer, an undeclared 5xx, any
   answer on a key whose earlier send went unanswered) is resolved by what the provider can do: the
   same key again while the key lives (keyed), a search by metadata (lookup), or `uncertain` and a
   person's decision (neither); paid (accepted, then failed) ends the run PAID_ATTEMPT_FAILED unless
   policy.paid_retries allows paying again. Only an unpaid failure lets the runner try again freely.
3. The error class decides what comes next: the same model again after a back-off (with jitter,
   honouring Retry-After), the next model of the chain if the job's policy allows, or the end of the run.
4. The upstream number grows only after a definite end, or a person's or a rule's decision to pay
   again; every other pass sends the same key. Every attempt is on the record as it happens.

Each function does one transition and returns, or raises StepRetry to be called again later: no call
blocks a worker for a back-off. They run inside a step that holds a lease, so one execution at a time
moves a job's attempts; every row change is still conditional on the state it expects, and a change
that finds the row moved on re-reads it and acts on what it says. The step's done mark (jobs.engine.steps.
DoneMark) is handed in as `done`, so the write that records the provider's acceptance, or the attempt's
success, carries it: one commit for both.
"""

import base64
import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Count, Q
from django.utils import timezone
from django.utils.module_loading import import_string

from billing import services as billing
from config.metrics import count
from config.sql import update_sql
from executor import callbacks, policy, record, services
from executor import tracing as provider_tracing
from executor.models import PAID_YES, Attempt, AttemptState, Paid
from executor.providers import http
from executor.providers.base import ErrorClass, ProviderError, WorkStatus
from executor.record import Money
from executor.registry import model_spec, provider_params
from jobs.engine.outcomes import JobErrorCode, JobFailure, JobHold, NotYet, StepRetry

logger = logging.getLogger(__name__)

# The step of a media run that owns its attempts (Attempt.step).
SUBMIT_STEP = "submit"


class SubmitRefused(Exception):
    """Raised by a pre-submit check (settings.PRE_SUBMIT_CHECKS): nothing may be spent on this request."""


# --- submit: until an attempt is accepted -------------------------------------------------------------------


def submit(job, *, done=None, none_yet: bool = False) -> Attempt:
    """Get an attempt of this run accepted by a provider. Returns it (running, or succeeded already);
    raises StepRetry to come back after a back-off, JobFailure when the chain is over, JobHold when a
    person must decide. `done`: the submit step's done mark, carried by the write that records the
    acceptance. `none_yet`: the caller knows the job had no attempt at all a moment ago (it was loaded
    with `has_attempts`, jobs.selectors.job_with_steps): the read of the run's latest is spared. One made
    since by another execution is still seen where it matters: the new intent loses on the constraints."""
    return _submit(job, None if none_yet else record.latest(job, step=SUBMIT_STEP), done=done)


def _submit(job, current: Attempt | None, *, done) -> Attempt:
    while True:
        if current is not None and current.state in (AttemptState.RUNNING, AttemptState.SUCCEEDED):
            return current
        if current is not None and current.state == AttemptState.SUBMITTING:
            _resolve(job, current, done=done)  # an unknown outcome, or a crash while the call was out
            continue
        if current is not None and current.state == AttemptState.UNCERTAIN:
            # Whoever made it uncertain (this execution a moment ago, another one, or one that died before
            # the job's hold was written): the run stays held for a person. The storm found a blind
            # render paid twice in one run when the next pass went on to the next number here.
            _uncertain_decided(current, record.attempt_spec(current))
        model, countdown = _next_model(job, current)
        if countdown > 0:
            raise StepRetry(f"next attempt on {model} after a back-off", countdown=countdown)
        hint = current.number + 1 if current is not None else (1 if job.run == 1 else None)
        current = intend(job, model, number_hint=hint)
        if current.state == AttemptState.SUBMITTING:  # else the model was gone: failed unavailable, unsent
            _send(job, current, done=done, fresh=True)  # the row in hand now says what the record says


def intend(job, model_name: str, *, number_hint: int | None = None) -> Attempt:
    """A render's intent (executor.record.intend): the job's prompt and provider parameters, under the
    submit step."""
    return record.intend(job, model_name, step=SUBMIT_STEP, number_hint=number_hint,
                         request={"prompt": job.input.get("prompt", ""), "params": provider_params(job.input)})


# --- wait: until the accepted attempt is done ---------------------------------------------------------------


def wait(job, *, attempt: Attempt | None = None, rung: bool = False, done=None) -> dict:
    """Wait on the run's accepted attempt. Returns its result (executor.record.finished) once it
    succeeded. Raises NotYet (when to look again) while it runs, and once the run's next attempt is out
    after this one failed upstream or outlasted its window (that one is waited on next); StepRetry when
    the provider could not be polled; JobFailure or JobHold when the run is over. `attempt`: the attempt
    the submit step had accepted in this same execution (it saves a read); `done`: the wait step's done
    mark, carried by the write that records the success.

    Waiting costs little (docs/design.md, "Waiting costs little"): the provider is polled on
    executor.policy's schedule (the first poll at its expected duration where it says one, then growing
    gaps), and a pass that comes before a poll is due asks nothing, unless the provider `rung` (called
    back): then it polls at once. Every wait ends: an accepted attempt is waited on for its window (the
    job's policy.window_s or the provider's own limit, else WAIT_DEADLINE_S), then given up as
    window_expired. Polls that fail back off, inside the same deadline."""
    current = attempt if attempt is not None else record.latest(job, step=SUBMIT_STEP)
    if current is not None and current.state == AttemptState.SUCCEEDED:
        return record.finished(current)
    if current is None or current.state != AttemptState.RUNNING:
        raise _next_attempt(job)  # a failed or unresolved attempt: the next one goes out (or the run ends)
    spec = record.attempt_spec(current)  # as it went out, whatever the catalog says now
    window = policy.attempt_window_s(policy_window_s=job.policy.get("window_s"),
                                     provider_window_s=spec.capabilities.window_s,
                                     deadline_s=settings.WAIT_DEADLINE_S)
    waited = (timezone.now() - current.accepted_at).total_seconds()
    answer = _answer(current, spec, rung=rung, waited=waited, window=window)
    if answer is None or (answer.status == WorkStatus.RUNNING and waited > window):
        _expire(current, spec, window)
        raise _next_attempt(job)
    if answer.status == WorkStatus.RUNNING:
        raise NotYet(_next_look(current, waited, window))
    if answer.status == WorkStatus.SUCCEEDED:
        if not record.end(current, AttemptState.SUCCEEDED, expect=AttemptState.RUNNING, money=Money.SETTLE,
                          output_url=answer.output_url, in_commit=_marking(done, current), **answer.telemetry):
            raise NotYet(settings.POLL_INTERVAL_S)  # ended meanwhile (a cancel): the next pass reads the record
        return record.finished(current)
    # Accepted, then failed (or cancelled) upstream: a definite end; the number grows.
    record.end(current, AttemptState.FAILED, expect=AttemptState.RUNNING, money=Money.SETTLE,
               error_class=answer.error_class or ErrorClass.SERVER_ERROR,
               error=answer.error or f"the render ended {answer.status} upstream",
               retry_at=timezone.now() + timedelta(seconds=policy.retry_backoff_s(current.sends, None)),
               **answer.telemetry)
    raise _next_attempt(job)


@dataclass(frozen=True)
class _Answer:
    """What the provider said of an accepted attempt, and the usage and cost it reported with it."""

    status: WorkStatus
    output_url: str | None = None
    error: str | None = None
    error_class: str | None = None
    telemetry: dict = field(default_factory=dict)


def _answer(current: Attempt, spec, *, rung: bool, waited: float, window: float) -> _Answer | None:
    """The accepted attempt's state: its submit's answer, when that carried the finished work; else a poll,
    when one is due or the provider rang. Raises NotYet when no poll is due, StepRetry when the poll failed
    inside the attempt's window; None when it failed past the window (the wait is over)."""
    if current.output_url:  # running with its output: the submit's answer carried the finished work
        return _Answer(WorkStatus.SUCCEEDED, current.output_url)
    if not rung and waited <= window and not policy.poll_due(waited_s=waited, expected_s=current.expected_s,
                                                              interval_s=_poll_interval(current)):
        raise NotYet(_next_look(current, waited, window))
    try:
        polled = services.provider(spec).poll(spec.model, current.upstream_id)
    except ProviderError as exc:
        count("polls", outcome="error")
        if waited > window:
            return None
        errors = current.poll_errors + 1
        record.update(current, expect=AttemptState.RUNNING, poll_errors=errors)
        countdown = policy.poll_retry_s(errors, poll_interval_s=settings.POLL_INTERVAL_S, left_s=window - waited)
        raise StepRetry(f"poll failed ({exc.kind}: {exc.message})", countdown=countdown) from exc
    count("polls", outcome=polled.status)
    telemetry = record.telemetry(current, polled.cost_usd, polled.usage)
    if current.poll_errors:
        telemetry["poll_errors"] = 0
    if telemetry and polled.status == WorkStatus.RUNNING:
        record.update(current, expect=AttemptState.RUNNING, **telemetry)
    return _Answer(polled.status, polled.output_url, polled.error, polled.error_class, telemetry)


def _next_attempt(job) -> NotYet:
    """The run's current attempt is over without success: have the next one accepted (or end the run:
    JobFailure, JobHold; or come back after a back-off: StepRetry), read from the record afresh. What is
    returned is raised: the next attempt is out, and looked at after a poll interval."""
    _submit(job, record.latest(job, step=SUBMIT_STEP), done=None)  # the wait step's mark is not the submit's
    return NotYet(settings.POLL_INTERVAL_S)


def _marking(done, attempt: Attempt):
    """The wait step's done mark as work of the commit that ends the attempt (record.end's in_commit)."""
    if done is None:
        return None
    return lambda: done.in_transaction(record.finished(attempt))


# A countdown is a message the broker holds: it must come due well inside the broker's visibility timeout.
_LONGEST_LOOK_S = settings.BROKER_VISIBILITY_TIMEOUT_S / 2


def _poll_interval(current: Attempt) -> float:
    """Where the provider was asked to call back, polling is only the fallback: its gaps start
    POLL_CALLBACK_FACTOR times longer (docs/design.md, "Callbacks are a doorbell")."""
    if callbacks.callback_url(current.provider):
        return settings.POLL_INTERVAL_S * settings.POLL_CALLBACK_FACTOR
    return settings.POLL_INTERVAL_S


def _next_look(current: Attempt, waited: float, window: float) -> float:
    return min(policy.next_poll_s(waited_s=waited, expected_s=current.expected_s,
                                  interval_s=_poll_interval(current), cap_s=settings.POLL_MAX_INTERVAL_S,
                                  left_s=window - waited + 0.05), _LONGEST_LOOK_S)


def finish_answered(job, attempt: Attempt | None, mark) -> dict | None:
    """The wait of an attempt whose submit answer carried the finished work, as this execution had it
    accepted a moment ago (`attempt`, handed over by the submit step): no poll and no lease needed. The
    attempt's end (succeeded), its settle and the wait step's done mark (`mark.cte`, a
    jobs.engine.steps.DoneMark) are one statement: the settle and the mark only if the end changed the row
    (conditional on `running`, so a cancel that ended it meanwhile wins). Returns the step's result (the
    mark says whether it was written); None when there is no such attempt in hand, or when the end lost
    (the attempt is read again, and the wait step looks at it as usual).

    One statement joining the work of three apps to save two commits (tests/jobs/test_commit_budget.py)."""
    if attempt is None or attempt.state != AttemptState.RUNNING or not attempt.output_url:
        return None
    fields = record.end_fields(attempt, money=Money.SETTLE, fields={"state": AttemptState.SUCCEEDED})
    result = record.finished(attempt, finished_at=fields["finished_at"])  # what it says of it once ended
    work, work_params = update_sql(Attempt.objects.filter(id=attempt.id, state=AttemptState.RUNNING), fields)
    when = "EXISTS (SELECT 1 FROM work)"
    settle, settle_params = billing.settle_cte(key=attempt.upstream_key, cost=fields.get("cost_usd", attempt.cost_usd),
                                               when=when)
    marked_sql, mark_params = mark.cte(result, when=when)
    with connection.cursor() as cursor:
        cursor.execute(f"WITH work AS ({work} RETURNING 1), {settle}, mark AS ({marked_sql})"
                       f" SELECT (SELECT count(*) FROM work), (SELECT id FROM mark),"
                       f" {', '.join(billing.SETTLE_DRIFT_COLUMNS)}",
                       [*work_params, *settle_params, *mark_params])
        ended_now, marked, *drift = cursor.fetchone()
    if not ended_now:
        attempt.refresh_from_db()  # ended meanwhile (a cancel): the wait step reads what the record says
        return None
    mark.took(result, marked)
    billing.drift_noticed(attempt.upstream_key, *drift)
    for name, value in fields.items():
        setattr(attempt, name, value)
    record.log_end(attempt)
    return result


def _expire(current: Attempt, spec, window: float) -> None:
    """Past the attempt's window: cancel upstream where the provider can and end it `window_expired`.
    The provider may bill the whole run: a paid failure, so the same model is not tried again, and the
    next one only if the policy's fallback_on and paid_retries allow (else the job fails WINDOW_EXPIRED,
    or PAID_ATTEMPT_FAILED where going on would pay again)."""
    services.cancel_upstream(spec, current.upstream_id)
    record.end(current, AttemptState.FAILED, expect=AttemptState.RUNNING, money=Money.SETTLE,
               error_class=ErrorClass.WINDOW_EXPIRED, error=f"no result within the attempt's window of {window:g} s")


# --- decisions ------------------------------------------------------------------------------------------------


def _next_model(job, last: Attempt | None) -> tuple[str, float]:
    """The model of the next attempt and how long to wait first (executor.policy decides)."""
    if last is None:
        return job.model_chain[0], 0.0
    # The decision is about `last`: its model's tries up to it. An attempt after it means another
    # execution (a callback's and a poll's passes meet here) has already decided and is paying: deciding
    # again from `last` would count that attempt as a try, call the model exhausted, and fail the job
    # with the other attempt out and charged (the storm found exactly that). This one steps back.
    # A try is an attempt (its unknown outcomes resent under one key are not tries); a paid failure is an
    # attempt the provider accepted (charged, or maybe charged) that then failed: Attempt.paid == Paid.YES.
    paid = PAID_YES
    earlier = Q(step=last.step, number__lte=last.number)
    counts = Attempt.objects.filter(job=job, run=job.run).aggregate(
        tries=Count("id", filter=earlier & Q(provider=last.provider, model=last.model)),
        paid_failures=Count("id", filter=earlier & Q(state=AttemptState.FAILED) & paid),
        newer=Count("id", filter=Q(step=last.step, number__gt=last.number)))
    if counts["newer"]:
        raise StepRetry(f"attempt {last.number} was followed by another execution's attempt", countdown=0.2)
    retry_in = (last.retry_at - timezone.now()).total_seconds() if last.retry_at else 0.0
    decided = policy.after_attempt(chain=job.model_chain, policy=job.policy, model=last.model_name,
                                   error_class=last.error_class, tries_on_model=counts["tries"], retry_in_s=retry_in,
                                   paid=last.paid == Paid.YES, paid_failures=counts["paid_failures"])
    if isinstance(decided, policy.Over) and decided.code == JobErrorCode.PAID_ATTEMPT_FAILED:
        raise _paid_attempt_failed(job, last)
    if isinstance(decided, policy.Over):
        details = {"attempt": last.number}
        if decided.code not in policy.STOP_CODES.values():
            details["model"] = last.model_name
        raise JobFailure(decided.code, last.error or last.error_class or ErrorClass.SERVER_ERROR, **details)
    return decided.model, decided.wait_s


def _paid_attempt_failed(job, last: Attempt) -> JobFailure:
    """The run ends at a paid failure: going on would pay again, which only policy.paid_retries or a person
    decides. The error names the attempt, what it cost and the provider's own words."""
    cost = f"${last.cost_usd}" if last.cost_usd is not None else "an unpriced amount"
    allowed = job.policy.get("paid_retries", policy.DEFAULT_PAID_RETRIES)
    words = last.error or last.error_class or "it failed upstream"
    return JobFailure(
        JobErrorCode.PAID_ATTEMPT_FAILED,
        f"Attempt {last.number} on {last.model_name} was accepted and paid ({cost}), then failed: {words}. "
        f"The job's policy allows {allowed} paid retr{'y' if allowed == 1 else 'ies'} in a run; "
        "POST /v1/jobs/{id}/retry pays again under a new key.",
        attempt=last.number, model=last.model_name, upstream_key=last.upstream_key,
        cost_usd=str(last.cost_usd) if last.cost_usd is not None else None, provider_error=last.error,
    )


# --- the call ---------------------------------------------------------------------------------------------------


def _send(job, attempt: Attempt, *, done, fresh: bool = False) -> None:
    """Run the pre-submit checks, upload the inputs, and send the request once; record the answer.
    `fresh`: this execution has just intended the attempt (and its intent's statement checked the cancel)."""
    spec = record.attempt_spec(attempt)
    try:
        for path in settings.PRE_SUBMIT_CHECKS:
            import_string(path)(job, attempt.request)
    except SubmitRefused as refusal:
        record.end(attempt, AttemptState.FAILED, expect=AttemptState.SUBMITTING, money=Money.RELEASE,
                   error_class=ErrorClass.PRE_SUBMIT_REFUSED, error=str(refusal))
        return
    # Seen between deciding and spending: an API cancel is final. An attempt this execution has just
    # intended was checked by its intent's own statement (no reservation for a cancelled job); one
    # that waited on checks or uploads, or is sent again, is checked here, right before the call.
    checked = fresh and not settings.PRE_SUBMIT_CHECKS and not job.input.get("references")
    if not checked and job.cancelled_now():
        if attempt.sends > 1:
            # An earlier send of this key went out and nobody knows its outcome: it may have been paid, so
            # releasing its reservation would lose money the ledger may hold. A cancel is a person's
            # decision, so it stays spent, unpriced (as jobs.services.job_cancel keeps uncertain spend).
            record.end(attempt, AttemptState.UNCERTAIN, expect=AttemptState.SUBMITTING, money=Money.KEEP,
                       error_class=attempt.error_class, error="cancelled while an earlier send's outcome was unknown")
        else:
            record.end(attempt, AttemptState.FAILED, expect=AttemptState.SUBMITTING, money=Money.RELEASE,
                       error_class=ErrorClass.CANCELLED, error="the job was cancelled")
        raise JobFailure(JobErrorCode.CANCELLED, "The job was cancelled before this attempt was sent.")
    try:
        # A send of an attempt that went out before reuses what it referred to: the same key must carry
        # the same request. A new attempt uploads the references again.
        inputs = attempt.uploaded_inputs
        if inputs is None:
            inputs = _upload_inputs(job, spec)
            if inputs and not record.update(attempt, expect=AttemptState.SUBMITTING, uploaded_inputs=inputs):
                return  # resolved by another execution meanwhile: send nothing
    except ProviderError as exc:
        if exc.outcome_unknown or exc.never_sent or exc.kind == ErrorClass.RATE_LIMITED:
            # Uploads cost nothing: the next pass uploads again under the same attempt.
            record.release_send(attempt)
            raise StepRetry(f"input upload failed ({exc.kind}: {exc.message})") from exc
        record.end(attempt, AttemptState.FAILED, expect=AttemptState.SUBMITTING, money=Money.RELEASE,
                   error_class=ErrorClass.UPLOAD_FAILED, error=exc.message)
        return
    except StepRetry:  # a reference could not be read for now: nothing was sent, so this send does not count
        record.release_send(attempt)
        raise
    except JobFailure as unreadable:  # a reference that cannot be read at all: nothing was sent
        record.end(attempt, AttemptState.FAILED, expect=AttemptState.SUBMITTING, money=Money.RELEASE,
                   error_class=ErrorClass.INVALID_INPUT, error=unreadable.message)
        return
    provider = services.provider(spec)
    started = time.monotonic()
    record.log("attempt.sent", attempt, sends=attempt.sends)  # before the call: a crash during it still shows the send
    # The call's span ends (and is exported) before its answer is recorded (executor.tracing).
    with provider_tracing.provider_call(job, attempt) as call:
        try:
            submission = provider.submit(spec.model, upstream_key=attempt.upstream_key, inputs=inputs,
                                         prompt=attempt.request["prompt"], params=attempt.request["params"],
                                         metadata=attempt.request["metadata"])
        except ProviderError as exc:
            failed = exc
            call.answered(paid=_paid_if(_failure_kind(attempt, spec, exc)), status=exc.status, error_class=exc.kind)
        else:
            failed = None
            call.answered(paid=Paid.YES, cost=lambda: _cost_of(attempt, submission))
    if failed is not None:
        _answered_error(job, attempt, spec, failed, started, done=done)
        return
    _answered_accepted(attempt, submission, done=done)


def _upload_inputs(job, spec) -> list[str]:
    references = job.input.get("references") or []
    if not references:
        return []
    provider = services.provider(spec)
    uploaded = []
    for reference in references:
        if "output_key" in reference:
            payload = services.reference_read(job, reference["output_key"])
            content_type = reference.get("content_type", "application/octet-stream")
        else:
            payload, content_type = base64.b64decode(reference["data"]), reference["content_type"]
        uploaded.append(provider.upload_input(spec.model, payload, content_type))
    return uploaded


def _answered_accepted(attempt: Attempt, submission, *, done) -> None:
    """The provider accepted the send: the attempt runs under its upstream id, with what it cost and how
    long it expects to take; where the answer carried the finished work, where that is (no poll needed for
    it). With the submit step's done mark in hand, the acceptance and the mark are one statement, one
    commit (DoneMark.with_update; tests/jobs/test_commit_budget.py holds the budget)."""
    fields = {
        "state": AttemptState.RUNNING, "upstream_id": submission.upstream_id, "accepted_at": timezone.now(),
        "error_class": None, "error": None, **record.telemetry(attempt, submission.cost_usd, submission.usage),
        "expected_s": submission.expected_s,
    }
    if submission.status == WorkStatus.SUCCEEDED and submission.output_url:
        fields["output_url"] = submission.output_url
    elif submission.status == WorkStatus.SUCCEEDED and submission.output is not None:
        # The finished work came in the answer's body (a synchronous provider): it was paid for, and this
        # row is the one durable place it can be kept in the commit that records the acceptance. The
        # wait step's result only names the row (record.output_reference); the store step reads the
        # bytes from it, and they leave it once stored (executor.services.media_store, media_stored).
        fields["output_url"] = http.data_url(submission.output, submission.output_content_type)
    if done is not None:
        result = {**record.accepted(attempt), "upstream_id": submission.upstream_id}
        if done.with_update(result, Attempt.objects.filter(id=attempt.id, state=AttemptState.SUBMITTING), fields):
            for name, value in fields.items():
                setattr(attempt, name, value)
            record.log("attempt.accepted", attempt, upstream_id=attempt.upstream_id)
            return
        attempt.refresh_from_db()
    elif record.update(attempt, expect=AttemptState.SUBMITTING, **fields):
        record.log("attempt.accepted", attempt, upstream_id=attempt.upstream_id)
        return
    logger.warning("attempt %s: accepted as %s, but another execution had resolved it first (%s)",
                   attempt.upstream_key, submission.upstream_id, attempt.state)


def _answered_error(job, attempt: Attempt, spec, exc: ProviderError, started: float, *, done) -> None:
    """A send that was not accepted: which kind of failure it is (executor.policy.failure_kind) decides.

    - unknown (no answer, a 5xx the adapter does not declare unpaid, or any answer on a pinned key):
      the attempt stays `submitting`, with what happened and whether the provider answered at all
      (`last_status`), and is resolved by capability: a keyed or a proven-absent attempt goes out again
      under the same key, after a back-off. Never a try.
    - unpaid (a refusal, a 429, a 5xx the provider documents as "not accepted, not charged", or a
      connection that never opened): a definite end, its reservation released, and the attempt runner
      decides what comes next (the same model after a back-off, or the next by fallback_on). So a keyed
      provider whose every send is answered 503 lets the chain fall back instead of holding the job.
    """
    kind = _failure_kind(attempt, spec, exc)
    if kind is policy.Failure.UNKNOWN:
        if record.update(attempt, expect=AttemptState.SUBMITTING, error_class=exc.kind, error=exc.message,
                         last_status=exc.status):
            _resolve(job, attempt, done=done, resend=False)
        return
    retry_at = timezone.now() + timedelta(seconds=policy.retry_backoff_s(attempt.sends, exc.retry_after))
    record.end(attempt, AttemptState.FAILED, expect=AttemptState.SUBMITTING, money=Money.RELEASE, error_class=exc.kind,
               error=exc.message, retry_at=retry_at, last_status=exc.status,
               duration_ms=int((time.monotonic() - started) * 1000))


def _failure_kind(attempt: Attempt, spec, exc: ProviderError) -> policy.Failure:
    return policy.failure_kind(accepted=False, outcome_unknown=exc.outcome_unknown,
                               answered_unpaid=spec.capabilities.answered_unpaid(exc.status),
                               key_pinned=_key_pinned(attempt, spec))


def _cost_of(attempt: Attempt, submission) -> tuple:
    """What an accepted send costs, as its span says: the provider's quote, else the rate card's."""
    if submission.cost_usd is not None:
        return submission.cost_usd, "quoted"
    return provider_tracing.derived_cost(attempt, submission.usage.as_dict() if submission.usage else None), "derived"


def _paid_if(kind: policy.Failure) -> Paid:
    """Whether a send that was not accepted may have been paid, as its span says."""
    return Paid.UNKNOWN if kind is policy.Failure.UNKNOWN else Paid.NO


def _key_pinned(attempt: Attempt, spec) -> bool:
    """A keyed attempt sent more than once: every resend of a key follows a send whose outcome is unknown
    (an answered "not accepted" ends the attempt instead), so that earlier send may have been accepted,
    and charged. Whatever a later send is told then speaks for that send only: the key keeps going out,
    and nothing falls back (no second provider is paid for work the first may be doing). The storm found
    both halves: a 429 on a resend ending the attempt as unpaid with a charge in the ledger, and the
    attempt sent to a person whose retry paid the same render twice under a new key."""
    return spec.capabilities.idempotency_key and attempt.sends > 1


# --- an unknown outcome: resolved by what the provider can do -------------------------------------------------


def _resolve(job, attempt: Attempt, *, done, resend: bool = True) -> None:
    """An attempt found in `submitting`: its last send's outcome is unknown. Resolve it by capability
    (docs/design.md, "Intent before spend, and the recovery table"). `resend=False` right after our own
    failed send: a keyed or proven absent attempt then goes out again only after a back-off (StepRetry).
    It is resolved by the spec it went out with: a model disabled since still has its sends settled."""
    spec = record.attempt_spec(attempt)
    caps = spec.capabilities
    provider_tracing.recover(attempt)  # its sender died with the call out: the paid call's span is emitted here
    if attempt.sends == 0:
        # Nothing went out (its input upload failed before the call): nothing to resolve; send it, unless
        # its model is gone from the catalog meanwhile: then nothing is, and the runner decides what follows.
        if model_spec(attempt.model_name) is None:
            record.end(attempt, AttemptState.FAILED, expect=AttemptState.SUBMITTING, money=Money.RELEASE,
                       error_class=ErrorClass.UNAVAILABLE,
                       error=f"{attempt.model_name} is disabled or no longer in the catalog; nothing was sent")
            return
        _send_again(job, attempt, done=done, resend=resend, given_up="never sent")
        return
    if caps.idempotency_key:
        # The same key again: the provider returns the work it already has, or makes the one that never
        # arrived. Exactly one is paid. A resend costs nothing, so attempts_per_model does not bound it:
        # giving the attempt up `failed` after N unanswered sends released money that may be spent and
        # let the runner pay another attempt for the same work (the storm found both: a charge the
        # attempt did not record, and a second charge after a person's retry). Only an outcome known not
        # to have been paid lets the runner go on. Keys have a lifetime: within the provider's
        # key_ttl_s the key goes out again after every recovery, however long the outage (WAIT_DEADLINE_S
        # bounds the wait for an accepted render, not a key); once the key may have been forgotten, a
        # resend could make and bill the work again, so the attempt is uncertain and a person decides.
        age_s = (timezone.now() - attempt.created_at).total_seconds()
        if policy.key_may_have_expired(age_s=age_s, ttl_s=caps.key_ttl_s, in_flight_s=record.in_flight_s(attempt)):
            _uncertain(attempt, spec)
            return
        if _unknown_too_long(attempt, spec):
            return
        _send_again(job, attempt, done=done, resend=resend, bounded=False)
        return
    if caps.lookup:
        try:
            found = services.provider(spec).lookup(
                spec.model, upstream_key=attempt.upstream_key, metadata=attempt.request["metadata"],
                prompt=attempt.request["prompt"], params=attempt.request["params"],
                submitted_at=(attempt.submitted_at or attempt.created_at).timestamp(),
                inputs=attempt.uploaded_inputs or [],
            )
        except ProviderError as exc:
            if _unknown_too_long(attempt, spec, f"lookups could not conclude ({exc.kind}: {exc.message})"):
                return
            raise StepRetry(f"lookup failed ({exc.kind}: {exc.message})") from exc
        if found is not None:
            logger.info("attempt %s: found upstream as %s, adopted", attempt.upstream_key, found.upstream_id)
            _answered_accepted(attempt, found, done=done)
            return
        # Not found. That proves the send absent only once it can no longer land: its answer came (a
        # 5xx), or it went out longer ago than a send may take. Before that, a send held in flight (a
        # slow provider, a worker killed mid-call) may still be accepted, and charged, after this
        # lookup: a resend now would pay for the same work twice.
        may_land_s = record.may_still_land_s(attempt)
        if attempt.last_status is None and may_land_s > 0:
            raise StepRetry(f"not found upstream yet; its last send may still land for {may_land_s:.0f} s",
                            countdown=min(max(may_land_s, 0.5), 5.0))
        # Proven absent: nothing was accepted, so nothing was paid. Send it (again) under the same key.
        _send_again(job, attempt, done=done, resend=resend, given_up=f"not accepted after {attempt.sends} sends")
        return
    _uncertain(attempt, spec)


def _send_again(job, attempt: Attempt, *, done, resend: bool, given_up: str = "", bounded: bool = True) -> None:
    """The same request under the same key once more: at once, or (resend=False) after a back-off. An
    attempt known not to have been paid (never sent, or proven absent upstream) that has gone out
    attempts_per_model times is given up (failed), and the runner decides what comes next."""
    if bounded and attempt.sends >= job.policy.get("attempts_per_model", policy.DEFAULT_ATTEMPTS_PER_MODEL):
        record.end(attempt, AttemptState.FAILED, expect=AttemptState.SUBMITTING, money=Money.RELEASE,
                   error_class=attempt.error_class or ErrorClass.SERVER_ERROR,
                   error=f"{given_up}: {attempt.error or ''}".strip(": "))
        return
    if not resend:
        raise StepRetry(f"submit outcome unknown ({attempt.error_class}); the same key goes out again",
                        countdown=policy.retry_backoff_s(attempt.sends, None))
    if not record.claim_send(attempt):
        raise StepRetry("another execution is resending this attempt", countdown=1.0)
    _send(job, attempt, done=done)


def _unknown_too_long(attempt: Attempt, spec, words: str = "") -> bool:
    """Every wait ends, whatever the provider can do: an attempt whose send's outcome nothing has settled
    for UNKNOWN_OUTCOME_MAX_S since it first went out (a key resent and never answered, lookups that cannot
    conclude) becomes uncertain and its job waits for a person (JobHold), as a blind provider's does at
    once. Nothing falls back meanwhile: the first provider may be doing, and billing, the work. False while
    the bound is not reached; True when the attempt was ended here without a hold (another execution
    resolved it first, or the rule for cheap calls pays again): the caller reads the record again."""
    bound = settings.UNKNOWN_OUTCOME_MAX_S
    if (timezone.now() - attempt.created_at).total_seconds() < bound:
        return False
    last = words or (f"{attempt.error_class}: {attempt.error}" if attempt.error else "no answer")
    _uncertain(attempt, spec, error=f"no answer settled this attempt within {bound:g} s of its first send ({last})")
    return True


def _uncertain(attempt: Attempt, spec, *, error: str | None = None) -> None:
    """Neither key nor lookup (or nothing settled it in time): nothing can tell whether the provider has
    (and charged for) the work."""
    if not record.end(attempt, AttemptState.UNCERTAIN, expect=AttemptState.SUBMITTING, money=Money.HOLD,
                      error_class=attempt.error_class,
                      error=error or attempt.error or "the outcome of the submit is unknown"):
        return  # resolved by another execution meanwhile: the caller reads what it decided
    _uncertain_decided(attempt, spec)


def _uncertain_decided(attempt: Attempt, spec) -> None:
    """An uncertain attempt of this run: raises JobHold (a person decides), unless the rule for cheap calls
    pays again, under the next number: then the uncertain one, which may have been paid, keeps its
    reservation as spent, unpriced (once: a settle moves only a held reservation)."""
    if spec.capabilities.resubmit_uncertain:
        record.move_money(attempt.upstream_key, Money.KEEP)
        return
    raise JobHold(
        JobErrorCode.UNCERTAIN_SUBMIT,
        f"The submit of attempt {attempt.number} to {attempt.model_name} may or may not have been accepted "
        f"(and charged). Check the provider for upstream key {attempt.upstream_key}; "
        "POST /v1/jobs/{id}/retry pays again under a new key.",
        attempt=attempt.number, upstream_key=attempt.upstream_key,
    )
