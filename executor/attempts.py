"""The attempt runner: where money is spent (docs/design.md, "Where money is spent: attempts").

1. Intent before spend: an `Attempt` row is committed in state `submitting`, with its upstream key
   `payonce-{job}-{n}` and the exact request, before the provider is called.
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

Each function here does one transition and returns, or raises StepRetry to be called again later: no
call blocks a worker for a back-off. They run inside a step that holds a lease, so one execution at a
time moves a job's attempts; every row change is still conditional on the state it expects, and a
change that finds the row moved on (zero rows) re-reads it and acts on what it says: a stale execution
changes nothing. The decisions themselves (tables, back-off, windows) are executor.policy's.
"""

import base64
import logging
import time
from contextvars import ContextVar
from datetime import timedelta
from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Max, Q
from django.utils import timezone
from django.utils.module_loading import import_string

from billing import rates as rate_card
from billing import services as billing
from billing.models import RESERVATION_KEY_CONSTRAINT
from config.logs import log_event
from config.metrics import count
from config.sql import update_sql, violated_constraint
from executor import callbacks, policy, services
from executor.models import ATTEMPT_NUMBER_CONSTRAINT, ONE_OUT_PER_RUN_CONSTRAINT, Attempt, AttemptState
from executor.providers.base import ErrorClass, ProviderError
from executor.registry import model_spec, provider_params
from jobs.outcomes import JobFailure, JobHold, NotYet, StepRetry

logger = logging.getLogger(__name__)


class SubmitRefused(Exception):
    """Raised by a pre-submit check (settings.PRE_SUBMIT_CHECKS): nothing may be spent on this request."""


def upstream_key(job, number: int) -> str:
    """One key per decision to pay (seed 002): derived from the durable record, never random."""
    return f"payonce-{job.id}-{number}"


# --- the submit step: until an attempt is accepted -----------------------------------------------------


# The step's done mark (jobs.steps.DoneMark) while submit or wait runs for it: the write that records
# the provider's acceptance, or the attempt's success, carries the mark, so the step's outcome and the
# attempt's commit together.
_DONE_MARK: ContextVar = ContextVar("done_mark", default=None)


def submit(job, *, done=None) -> dict:
    """Get an attempt of this run accepted by a provider. Returns it; raises StepRetry to come back
    after a back-off, JobFailure when the chain is over, JobHold when a person must decide."""
    token = _DONE_MARK.set(done)
    try:
        return _submit(job)
    finally:
        _DONE_MARK.reset(token)


def _submit(job) -> dict:
    current = _latest(job)
    while True:
        if current is not None and current.state in (AttemptState.RUNNING, AttemptState.SUCCEEDED):
            job._latest_attempt = current  # the wait step right after, in this execution, starts from it
            return _accepted(current)
        if current is not None and current.state == AttemptState.SUBMITTING:
            _resolve(job, current)  # an unknown outcome, or a crash while the call was out
            continue
        if current is not None and current.state == AttemptState.UNCERTAIN:
            # Whoever made it uncertain (this execution a moment ago, another one, or one that died before
            # the job's hold was written): the run stays held for a person. The storm found a blind
            # render paid twice in one run when the next pass went on to the next number here.
            _uncertain_decided(current, model_spec(current.model_name))
        model, countdown = _next_model(job, current)
        if countdown > 0:
            raise StepRetry(f"next attempt on {model} after a back-off", countdown=countdown)
        hint = current.number + 1 if current is not None else (1 if job.run == 1 else None)
        current = _intend(job, model, number_hint=hint)
        _send(job, current)  # the row in hand now says what the record says (our answer, or another's)


# --- the wait step: until the accepted attempt is done ---------------------------------------------------


def wait(job, *, rung: bool = False, done=None) -> dict | None:
    token = _DONE_MARK.set(done)
    try:
        return _wait(job, rung=rung)
    finally:
        _DONE_MARK.reset(token)


def _wait(job, *, rung: bool = False) -> dict | None:
    """Look at the current attempt: its output once it succeeded; NotYet (with when to look again) while
    it runs; None after an attempt that failed upstream, a definite end: the runner submits the next one
    (same rules as `submit`).

    Waiting costs little (docs/design.md, "Waiting costs little"): the provider is polled on executor.policy's schedule
    (the first poll at its expected duration where it says one, then growing gaps), and a pass that comes
    before a poll is due asks nothing, unless the provider `rung` (called back): then it polls at once.
    Every wait ends: an accepted attempt is waited on for its window (the job's policy.window_s or the
    provider's own limit, else WAIT_DEADLINE_S), then given up as window_expired. Polls that fail back
    off, inside the same deadline."""
    current = _latest(job)
    if current is None or current.state != AttemptState.RUNNING:
        if current is not None and current.state == AttemptState.SUCCEEDED:
            return _finished(current)
        submit(job)  # a failed or unresolved attempt: get the next one going (or end the run)
        return None
    spec = model_spec(current.model_name)
    window = policy.attempt_window_s(policy_window_s=job.policy.get("window_s"),
                                     provider_window_s=spec.capabilities.window_s,
                                     deadline_s=settings.WAIT_DEADLINE_S)
    waited = (timezone.now() - current.accepted_at).total_seconds()
    telemetry = {}
    if current.request.get("answered_succeeded") and current.request.get("output_url"):
        result_status, output_url, error, error_class = "succeeded", current.request["output_url"], None, None
    else:
        if not rung and waited <= window and not policy.poll_due(waited_s=waited, expected_s=current.expected_s,
                                                                  interval_s=_poll_interval(current)):
            raise NotYet(_next_look(current, waited, window))
        try:
            polled = services.provider(spec).poll(spec.model, current.upstream_id)
        except ProviderError as exc:
            count("polls", outcome="error")
            if waited > window:
                return _expire(job, current, spec, window)
            errors = current.poll_errors + 1
            _update(current, expect=AttemptState.RUNNING, poll_errors=errors)
            countdown = policy.poll_retry_s(errors, poll_interval_s=settings.POLL_INTERVAL_S, left_s=window - waited)
            raise StepRetry(f"poll failed ({exc.kind}: {exc.message})", countdown=countdown) from exc
        result_status, output_url, error, error_class = polled.status, polled.output_url, polled.error, polled.error_class
        count("polls", outcome=result_status)
        telemetry = _telemetry(current, polled.cost_usd, polled.usage)
        if current.poll_errors:
            telemetry["poll_errors"] = 0
        if telemetry and result_status == "running":
            _update(current, expect=AttemptState.RUNNING, **telemetry)
    if result_status == "succeeded":
        if not _end(current, AttemptState.SUCCEEDED, expect=AttemptState.RUNNING, money=SETTLE, output_url=output_url,
                    mark=_finished, **telemetry):
            return None  # ended meanwhile (a cancel): the next pass reads what the record says
        return _finished(current)
    if result_status == "running":
        if waited > window:
            return _expire(job, current, spec, window)
        raise NotYet(_next_look(current, waited, window))
    # Accepted, then failed (or cancelled) upstream: a definite end; the number grows.
    _end(current, AttemptState.FAILED, expect=AttemptState.RUNNING, money=SETTLE, error_class=error_class or ErrorClass.SERVER_ERROR,
         error=error or f"the render ended {result_status} upstream",
         retry_at=timezone.now() + timedelta(seconds=policy.retry_backoff_s(current.sends, None)), **telemetry)
    submit(job)
    return None


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


def finish_answered(job, mark) -> tuple[dict, bool] | None:
    """The wait of an attempt whose submit answer carried the finished work, as this execution had it
    accepted a moment ago: no poll and no lease needed. The attempt's end (succeeded), its settle and
    the wait step's done mark (`mark(result, when=...)`, jobs.steps.step_done_cte) are one statement:
    the settle and the mark only if the end changed the row (conditional on `running`, so a cancel that
    ended it meanwhile wins). Returns (result, whether the mark was written), or None when that is not
    the case or the end lost (the wait step then looks at the record as usual)."""
    current = job.__dict__.get("_latest_attempt")
    if current is None or current.state != AttemptState.RUNNING or not (
            current.request.get("answered_succeeded") and current.request.get("output_url")):
        return None
    del job.__dict__["_latest_attempt"]
    fields = _end_fields(current, money=SETTLE, output_url=current.request["output_url"],
                         fields={"state": AttemptState.SUCCEEDED})
    result = {**_accepted(current), "output_url": fields["request"]["output_url"],
              "finished_at": fields["finished_at"].isoformat()}  # what _finished says of it once ended
    work, work_params = update_sql(Attempt.objects.filter(id=current.id, state=AttemptState.RUNNING), fields)
    when = "EXISTS (SELECT 1 FROM work)"
    settle, settle_params = billing.settle_cte(key=current.upstream_key, cost=fields.get("cost_usd", current.cost_usd),
                                               when=when)
    done, done_params = mark(result, when=when)
    with connection.cursor() as cursor:
        cursor.execute(f"WITH work AS ({work} RETURNING 1), settle AS ({settle}), mark AS ({done})"
                       f" SELECT (SELECT count(*) FROM work), (SELECT id FROM mark)",
                       [*work_params, *settle_params, *done_params])
        ended_now, marked = cursor.fetchone()
    if not ended_now:
        return None  # ended meanwhile (a cancel): the wait step reads what the record says
    for name, value in fields.items():
        setattr(current, name, value)
    _log_end(current)
    return result, marked


def _expire(job, current: Attempt, spec, window: float) -> None:
    """Past the attempt's window: cancel upstream where the provider can and end it `window_expired`.
    The provider may bill the whole run: a paid failure, so the same model is not tried again, and the
    next one only if the policy's fallback_on and paid_retries allow (else the job fails WINDOW_EXPIRED,
    or PAID_ATTEMPT_FAILED where going on would pay again)."""
    services.cancel_upstream(spec, current.upstream_id)
    _end(current, AttemptState.FAILED, expect=AttemptState.RUNNING, money=SETTLE, error_class=ErrorClass.WINDOW_EXPIRED,
         error=f"no result within the attempt's window of {window:g} s")
    submit(job)
    return None


def _end_orphaned_intent(attempt: Attempt) -> float | None:
    """A cancelled job's attempt still `submitting`: the chain stops at the cancel, so no execution will
    resolve it, and its reservation would stay held forever (the storm found one: an upload failed, was
    given back, then the cancel came). Once no answer can still arrive (its last send is older than a
    send may take), it ends: with no send out, `failed` and released; after a send, `uncertain` and kept
    as spent, unpriced (it may have been paid, and a cancel is a person's decision, as job_cancel keeps
    uncertain spend). Conditional on (`submitting`, `sends`): a send claims the attempt by bumping `sends`
    first (_claim_send), so a send that claimed it a moment ago keeps it and this changes nothing.
    Returns how long until it may be ended, when that is not yet."""
    in_flight_s = settings.PROVIDER_CONNECT_TIMEOUT_S + max(settings.PROVIDER_READ_TIMEOUT_S, settings.LLM_READ_TIMEOUT_S)
    since_s = (timezone.now() - attempt.submitted_at).total_seconds() if attempt.submitted_at else in_flight_s
    if attempt.sends and since_s < in_flight_s:
        return in_flight_s - since_s  # its answer may still come, to the execution that sent it
    unsent = attempt.sends == 0
    state = AttemptState.FAILED if unsent else AttemptState.UNCERTAIN
    with transaction.atomic():
        ended = Attempt.objects.filter(id=attempt.id, state=AttemptState.SUBMITTING, sends=attempt.sends).update(
            state=state, error_class=ErrorClass.CANCELLED if unsent else attempt.error_class,
            error="the job was cancelled before it was sent" if unsent else
            "the job was cancelled while the outcome of its send was unknown",
            **_end_fields(attempt, money=RELEASE if unsent else HOLD, output_url=None, fields={}))
        if ended and unsent:
            billing.release(key=attempt.upstream_key)
        elif ended:
            billing.settle(key=attempt.upstream_key, cost=None)
        if ended:
            _log(f"attempt.{state.value}", attempt, error_class=ErrorClass.CANCELLED if unsent else attempt.error_class)
    return None


def sweep_cancelled(limit: int = 100) -> int:
    """The sweeper's share of a cancel: every attempt of a cancelled job still out (`submitting` or
    `running`, a render or a report's chapter) is ended as cancel_current ends one, so none is left
    holding money when stop_upstream's message (or its second look) was lost to a flushed broker or a
    database restart, or when nothing would look (a report's chapter whose worker died). The storm found
    all three: an intent left submitting, a render accepted just after the cancel left running with its
    money reserved, and a cancelled report's chapters left submitting. Returns how many it looked at."""
    out = list(Attempt.objects.filter(state__in=[AttemptState.SUBMITTING, AttemptState.RUNNING],
                                      job__status="cancelled").select_related("job").order_by("id")[:limit])
    for attempt in out:
        if _cancel_out(attempt) is None:  # None: ended; a float: its send's answer may still come
            count("sweeper_recoveries", what="cancelled_attempt")
    return len(out)


def cancel_current(job) -> float | None:
    """The job was cancelled: stop its running attempt upstream where the provider can, and end it on
    the record (cancelled, with its duration; what it cost stays). An attempt still `submitting` is left
    to the execution sending it while its answer may still come (that answer must reach the record
    first), then ended here (_end_orphaned_intent). Returns the seconds until it should be looked at
    again, or None."""
    return _cancel_out(_latest(job))


def _cancel_out(current: Attempt | None) -> float | None:
    if current is not None and current.state == AttemptState.SUBMITTING:
        return _end_orphaned_intent(current)
    if current is None or current.state != AttemptState.RUNNING:
        return None
    if current.upstream_id:
        services.cancel_upstream(model_spec(current.model_name), current.upstream_id)
    # Conditional on `running`: a poll that saw the render finish at the same moment keeps its success.
    _end(current, AttemptState.FAILED, expect=AttemptState.RUNNING, money=SETTLE, error_class=ErrorClass.CANCELLED,
         error="the job was cancelled")
    return None


# --- a paid LLM call ------------------------------------------------------------------------------------

LLM_MAX_TOKENS = 8000
LLM_ATTEMPTS = 3
# Worth another try: the provider said "not now" (429, 5xx) or never answered. Any other 4xx gets the
# same answer again, so it ends the call.
LLM_RETRYABLE = frozenset({ErrorClass.RATE_LIMITED, ErrorClass.SERVER_ERROR, ErrorClass.TIMEOUT, ErrorClass.NETWORK})


def llm_call(job, *, step: str, model_name: str, system: str, messages: list[dict], max_tokens: int,
             pool: str | None = None) -> dict:
    """One LLM call of `step` (a synthesis, a chapter), as up to LLM_ATTEMPTS attempts of this run: on
    429, 5xx and network errors another attempt after a back-off (Retry-After wins), on any other error
    none. Every attempt is on the record with its upstream key, usage and derived cost, failed ones
    included. Returns {"text", "attempt", "cost_usd"}; raises StepRetry to wait between attempts (no
    thread sleeps through a back-off) and JobFailure when the call failed for good.

    A pass reads the step's earlier attempts first: one that succeeded is the answer (no call, no pay).
    One still `submitting` belongs to an execution that is gone: the caller holds the step's lease
    (jobs.steps), so it took the step over from a dead worker. Its call may have been paid and nothing
    can tell (LLM providers have neither key nor lookup): it becomes uncertain with its reservation kept
    as spent, counts as a try, and the rule for cheap calls pays again under the next key."""
    max_tokens = min(max_tokens, LLM_MAX_TOKENS)
    earlier = list(Attempt.objects.filter(job=job, run=job.run, step=step).order_by("number"))
    for attempt in earlier:
        if attempt.state == AttemptState.SUCCEEDED:
            return _llm_answer(attempt)
        if attempt.state == AttemptState.SUBMITTING:
            if _end(attempt, AttemptState.UNCERTAIN, expect=AttemptState.SUBMITTING, money=HOLD,
                    error=attempt.error or "the execution sending it died before its answer was recorded"):
                billing.settle(key=attempt.upstream_key, cost=None)
    if earlier:
        last = earlier[-1]
        if last.state == AttemptState.FAILED and last.error_class not in LLM_RETRYABLE:
            raise JobFailure(policy.STOP_CODES.get(last.error_class, "PROVIDER_REFUSED"), last.error or "",
                             attempt=last.number)
        if len(earlier) >= LLM_ATTEMPTS:
            raise JobFailure("ATTEMPTS_EXHAUSTED", last.error or "no answer", attempt=last.number)
        if last.retry_at and last.retry_at > timezone.now():
            raise StepRetry(f"the LLM call failed ({last.error_class}); again after a back-off",
                            countdown=(last.retry_at - timezone.now()).total_seconds())
    attempt = _llm_attempt(job, step=step, model_name=model_name, system=system, messages=messages,
                           max_tokens=max_tokens, pool=pool, tries=len(earlier) + 1)
    if attempt.state == AttemptState.SUCCEEDED:
        return _llm_answer(attempt)
    return llm_call(job, step=step, model_name=model_name, system=system, messages=messages,
                    max_tokens=max_tokens, pool=pool)  # decide on the attempt just made (retry, or fail)


def _llm_answer(attempt: Attempt) -> dict:
    return {"text": attempt.answer or "", "attempt": attempt.number,
            "cost_usd": str(attempt.cost_usd) if attempt.cost_usd is not None else None}


def _llm_attempt(job, *, step: str, model_name: str, system: str, messages: list[dict], max_tokens: int,
                 pool: str | None, tries: int) -> Attempt:
    """One attempt: the intent with its worst case reserved (or drawn from a fan-out's `pool`), the call,
    then the attempt ended with its usage and derived cost, its reservation settled or released in the
    same transaction."""
    spec = model_spec(model_name)
    worst = rate_card.worst_case(model_name, max_tokens=max_tokens,
                                 input_tokens=rate_card.input_tokens_bound(system, messages))
    attempt = _intend(job, model_name, step=step, worst_case=worst, pool=pool,
                      request_extra={"system": system, "messages": messages, "max_tokens": max_tokens})
    started = time.monotonic()
    _log("attempt.sent", attempt, sends=attempt.sends)
    try:
        completion = services.provider(spec).complete(
            spec.model, system=system, messages=messages, max_tokens=max_tokens,
            upstream_key=attempt.upstream_key, metadata=attempt.request["metadata"])
    except ProviderError as exc:
        elapsed = int((time.monotonic() - started) * 1000)
        paid = getattr(exc, "usage", None)  # a 200 that refused: paid for, priced from its usage
        retry_at = timezone.now() + timedelta(seconds=policy.retry_backoff_s(tries, exc.retry_after))
        if exc.outcome_unknown and exc.status is None:
            # No answer at all: it may have been paid. The attempt is uncertain, its reservation stays
            # spent (unpriced), and the rule for cheap calls tries again under the next key.
            _end(attempt, AttemptState.UNCERTAIN, expect=AttemptState.SUBMITTING, money=HOLD,
                 error_class=exc.kind, error=exc.message, duration_ms=elapsed, retry_at=retry_at)
            billing.settle(key=attempt.upstream_key, cost=None)
        else:
            # An answer: a 429 or a 5xx (not done, not charged) or another refusal.
            _end(attempt, AttemptState.FAILED, expect=AttemptState.SUBMITTING, money=SETTLE if paid else RELEASE,
                 error_class=exc.kind, error=exc.message, last_status=exc.status, duration_ms=elapsed,
                 retry_at=retry_at, usage=paid.as_dict() if paid else None)
        return attempt
    _end(attempt, AttemptState.SUCCEEDED, expect=AttemptState.SUBMITTING, money=SETTLE,
         usage=completion.usage.as_dict(), answer=completion.text, upstream_id=completion.upstream_id or "",
         accepted_at=timezone.now(), duration_ms=int((time.monotonic() - started) * 1000))
    return attempt


# --- decisions -----------------------------------------------------------------------------------------


def _latest(job) -> Attempt | None:
    """The run's latest render attempt. The submit step leaves the one it just had accepted for the wait
    step after it in the same execution (taken once): that row is what the record said a moment ago, and
    every change made from it is conditional on its state, so a change since only costs a re-read."""
    remembered = job.__dict__.pop("_latest_attempt", None)
    if remembered is not None:
        return remembered
    if job.__dict__.pop("has_attempts", None) is False:
        # The job was loaded with none (jobs.selectors.job_with_steps), a moment ago. One made since by
        # another execution is still seen where it matters: the new intent loses on the constraints.
        return None
    return Attempt.objects.filter(job=job, run=job.run, step="submit").order_by("-number").first()


def _next_model(job, last: Attempt | None) -> tuple[str, float]:
    """The model of the next attempt and how long to wait first (executor.policy decides)."""
    if last is None:
        return job.model_chain[0], 0.0
    # The decision is about `last`: its model's tries up to it. An attempt after it means another
    # execution (a callback's and a poll's passes meet here) has already decided and is paying: deciding
    # again from `last` would count that attempt as a try, call the model exhausted, and fail the job
    # with the other attempt out and charged (the storm found exactly that). This one steps back.
    # A try is an attempt (its unknown outcomes resent under one key are not tries); a paid failure is an
    # attempt the provider accepted (charged, or maybe charged) that then failed: Attempt.paid == "yes".
    paid = Q(accepted_at__isnull=False) | Q(cost_usd__isnull=False)
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
                                   paid=last.paid == "yes", paid_failures=counts["paid_failures"])
    if isinstance(decided, policy.Over) and decided.code == policy.PAID_ATTEMPT_FAILED:
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
        policy.PAID_ATTEMPT_FAILED,
        f"Attempt {last.number} on {last.model_name} was accepted and paid ({cost}), then failed: {words}. "
        f"The job's policy allows {allowed} paid retr{'y' if allowed == 1 else 'ies'} in a run; "
        "POST /v1/jobs/{id}/retry pays again under a new key.",
        attempt=last.number, model=last.model_name, upstream_key=last.upstream_key,
        cost_usd=str(last.cost_usd) if last.cost_usd is not None else None, provider_error=last.error,
    )


# --- the calls ---------------------------------------------------------------------------------------


# The intent, inserted only if its reservation fit (billing.services.reserve_then runs it after the
# reservation, in the same statement: `reserved` is that reservation).
_INTENT_SQL = f"""
INSERT INTO executor_attempt (job_id, run, step, number, provider, model, upstream_key, upstream_id, state,
                              request, sends, poll_errors, created_at, submitted_at)
SELECT %(a_job)s, %(a_run)s, %(a_step)s, %(a_number)s, %(a_provider)s, %(a_model)s, %(a_key)s, '',
       '{AttemptState.SUBMITTING}', %(a_request)s, 1, 0, %(a_now)s, %(a_now)s
  FROM reserved
RETURNING id
"""


def _intend(job, model_name: str, *, step: str = "submit", worst_case: Decimal | None = None,
            pool: str | None = None, request_extra: dict | None = None, number_hint: int | None = None) -> Attempt:
    """Commit the attempt as `submitting`, with its key and the exact request, before anything is sent.

    1. The number is the job's next (across runs and models): its upstream key is payonce-{job}-{n}.
    2. The worst case of the call (the rate card's; the penalty tier for a model it does not know) is
       reserved against the client's month, or drawn from a fan-out's `pool`, in the same statement as
       the INSERT (billing.services.reserve_then): one statement, so one transaction of its own,
       committed here, before the call, with intent and reservation together or not at all. Refused:
       nothing is written, nothing is sent, and the job fails BUDGET_EXCEEDED.
    3. It refuses to run inside an outer transaction: one rolled back after the call went out would
       leave spend with no record (the provider charged; the intent, its key and its reservation gone).
    4. Two executions deciding to pay at once race on the named constraints. On attempt_job_number or
       reservation_key (the same number, so the same upstream key: parallel chapters of one job) the
       loser's statement fails whole, its reservation too, and it takes the next number at once. On
       attempt_one_out_per_run (this step has an attempt out already) it sends nothing and comes back
       later. Any other integrity error is a bug, and is raised.
    """
    if connection.in_atomic_block:
        raise RuntimeError("the intent to pay must commit on its own before the call: not inside a transaction, "
                           "whose rollback after the call would lose the record of the spend")
    spec = model_spec(model_name)
    worst = worst_case if worst_case is not None else rate_card.worst_case(model_name)
    for _ in range(_NUMBER_TRIES):
        # The caller's guess (the run's latest attempt + 1, or 1 for a first run's first) saves the read;
        # a wrong guess loses on attempt_job_number and the next pass reads the number.
        number, number_hint = number_hint or _next_number(job), None
        key = upstream_key(job, number)
        params = provider_params(job.input)
        request = {
            "prompt": job.input.get("prompt", ""),
            "params": params,
            "metadata": {"payonce_job": str(job.id), "payonce_attempt": number, "upstream_key": key},
            **(request_extra or {}),
        }
        now = timezone.now()
        intent = {"a_job": job.id, "a_run": job.run, "a_step": step, "a_number": number, "a_provider": spec.provider,
                  "a_model": spec.model, "a_key": key, "a_now": now,
                  "a_request": Attempt._meta.get_field("request").get_db_prep_save(request, connection)}
        try:
            rows = billing.reserve_then(_INTENT_SQL, intent, client_id=job.client_id, job_id=job.id, key=key,
                                        model=model_name, amount=worst, guard=job.NOT_CANCELLED_SQL, pool=pool)
        except IntegrityError as exc:
            constraint = violated_constraint(exc)
            if constraint in (ATTEMPT_NUMBER_CONSTRAINT, RESERVATION_KEY_CONSTRAINT):
                continue  # another step of this job (a sibling chapter) took the number first: the next one
            if constraint == ONE_OUT_PER_RUN_CONSTRAINT:
                raise StepRetry(f"another execution is paying for this step ({constraint})", countdown=1.0) from None
            raise
        if rows is None:
            if job.cancelled_now():  # the reservation refuses a cancelled job (billing.services)
                raise JobFailure("CANCELLED", "The job was cancelled before this attempt was sent.")
            raise JobFailure("BUDGET_EXCEEDED", f"The most this call to {model_name} can cost (${worst}) does not "
                             "fit under this month's budget; nothing was sent.", model=model_name,
                             worst_case_usd=str(worst))
        attempt = Attempt(id=rows[0][0], job=job, run=job.run, step=step, number=number, provider=spec.provider,
                          model=spec.model, upstream_key=key, upstream_id="", state=AttemptState.SUBMITTING,
                          request=request, sends=1, poll_errors=0, created_at=now, submitted_at=now)
        attempt.intended_now = True  # this execution just wrote it (and the cancel check with it)
        _log("attempt.intent", attempt, worst_case_usd=worst)
        return attempt
    raise StepRetry("the job's attempt numbers are contended; trying again", countdown=0.2)


# How often an intent takes the job's next number again after a sibling step took it first.
_NUMBER_TRIES = 20


def _next_number(job) -> int:
    """The job's next attempt number, across runs and models (read here, claimed by the INSERT)."""
    return (Attempt.objects.filter(job=job).aggregate(n=Max("number"))["n"] or 0) + 1


def _send(job, attempt: Attempt) -> None:
    """Run the pre-submit checks, upload the inputs, and send the request once; record the answer."""
    spec = model_spec(attempt.model_name)
    try:
        for path in settings.PRE_SUBMIT_CHECKS:
            import_string(path)(job, attempt.request)
    except SubmitRefused as refusal:
        _end(attempt, AttemptState.FAILED, expect=AttemptState.SUBMITTING, money=RELEASE, error_class="pre_submit_refused",
             error=str(refusal))
        return
    # Seen between deciding and spending: an API cancel is final. An attempt this execution has just
    # intended was checked by its intent's own statement (no reservation for a cancelled job); one
    # that waited on checks or uploads, or is sent again, is checked here, right before the call.
    fresh = getattr(attempt, "intended_now", False) and not settings.PRE_SUBMIT_CHECKS and not job.input.get("references")
    attempt.intended_now = False
    if not fresh and job.cancelled_now():
        if attempt.sends > 1:
            # An earlier send of this key went out and nobody knows its outcome: it may have been paid, so
            # releasing its reservation would lose money the ledger may hold. A cancel is a person's
            # decision, so it stays spent, unpriced (as jobs.services.job_cancel keeps uncertain spend).
            if _end(attempt, AttemptState.UNCERTAIN, expect=AttemptState.SUBMITTING, money=HOLD,
                    error_class=attempt.error_class, error="cancelled while an earlier send's outcome was unknown"):
                billing.settle(key=attempt.upstream_key, cost=None)
        else:
            _end(attempt, AttemptState.FAILED, expect=AttemptState.SUBMITTING, money=RELEASE,
                 error_class=ErrorClass.CANCELLED, error="the job was cancelled")
        raise JobFailure("CANCELLED", "The job was cancelled before this attempt was sent.")
    try:
        # A send of an attempt that went out before reuses what it referred to: the same key must carry
        # the same request. A new attempt uploads the references again.
        inputs = attempt.request.get("inputs")
        if inputs is None:
            inputs = _upload_inputs(job, spec)
            if inputs and not _update(attempt, expect=AttemptState.SUBMITTING,
                                      request={**attempt.request, "inputs": inputs}):
                return  # resolved by another execution meanwhile: send nothing
    except ProviderError as exc:
        if exc.outcome_unknown or exc.never_sent or exc.kind == ErrorClass.RATE_LIMITED:
            # Uploads cost nothing: the next pass uploads again under the same attempt.
            _release_send(attempt)
            raise StepRetry(f"input upload failed ({exc.kind}: {exc.message})") from exc
        _end(attempt, AttemptState.FAILED, expect=AttemptState.SUBMITTING, money=RELEASE, error_class="upload_failed",
             error=exc.message)
        return
    except StepRetry:  # a reference could not be read for now: nothing was sent, so this send does not count
        _release_send(attempt)
        raise
    except JobFailure as unreadable:  # a reference that cannot be read at all: nothing was sent
        _end(attempt, AttemptState.FAILED, expect=AttemptState.SUBMITTING, money=RELEASE, error_class=ErrorClass.INVALID_INPUT,
             error=unreadable.message)
        return
    provider = services.provider(spec)
    started = time.monotonic()
    _log("attempt.sent", attempt, sends=attempt.sends)  # before the call: a crash during it still shows the send
    try:
        submission = provider.submit(spec.model, upstream_key=attempt.upstream_key, inputs=inputs,
                                     prompt=attempt.request["prompt"], params=attempt.request["params"],
                                     metadata=attempt.request["metadata"])
    except ProviderError as exc:
        _answered_error(job, attempt, spec, exc, started)
        return
    _answered_accepted(attempt, submission, started)


def _resolve(job, attempt: Attempt, *, resend: bool = True) -> None:
    """An attempt found in `submitting`: its last send's outcome is unknown. Resolve it by capability
    (docs/design.md, "Intent before spend, and the recovery table"). `resend=False` right after our own failed send: a
    keyed or proven absent attempt then goes out again only after a back-off (StepRetry)."""
    spec = model_spec(attempt.model_name)
    caps = spec.capabilities
    if attempt.sends == 0:
        # Nothing went out (its input upload failed before the call): nothing to resolve; send it.
        _send_again(job, attempt, resend, "never sent")
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
        if policy.key_may_have_expired(age_s=age_s, ttl_s=caps.key_ttl_s, in_flight_s=_in_flight_s()):
            _uncertain(job, attempt, spec)
            return
        _send_again(job, attempt, resend, bounded=False)
        return
    if caps.lookup:
        try:
            found = services.provider(spec).lookup(
                spec.model, upstream_key=attempt.upstream_key, metadata=attempt.request["metadata"],
                prompt=attempt.request["prompt"], params=attempt.request["params"],
                submitted_at=(attempt.submitted_at or attempt.created_at).timestamp(),
                inputs=attempt.request.get("inputs") or [],
            )
        except ProviderError as exc:
            raise StepRetry(f"lookup failed ({exc.kind}: {exc.message})") from exc
        if found is not None:
            logger.info("attempt %s: found upstream as %s, adopted", attempt.upstream_key, found.upstream_id)
            _answered_accepted(attempt, found, None)
            return
        # Not found. That proves the send absent only once it can no longer land: its answer came (a
        # 5xx), or it went out longer ago than a send may take. Before that, a send held in flight (a
        # slow provider, a worker killed mid-call) may still be accepted, and charged, after this
        # lookup: a resend now would pay for the same work twice.
        in_flight_s = _in_flight_s()
        since_s = (timezone.now() - attempt.submitted_at).total_seconds() if attempt.submitted_at else in_flight_s
        if attempt.last_status is None and since_s < in_flight_s:
            raise StepRetry(f"not found upstream yet; its last send may still land for {in_flight_s - since_s:.0f} s",
                            countdown=min(max(in_flight_s - since_s, 0.5), 5.0))
        # Proven absent: nothing was accepted, so nothing was paid. Send it (again) under the same key.
        _send_again(job, attempt, resend, f"not accepted after {attempt.sends} sends")
        return
    _uncertain(job, attempt, spec)


def _in_flight_s() -> float:
    """The longest a media send may take to reach the provider and be answered."""
    return settings.PROVIDER_CONNECT_TIMEOUT_S + settings.PROVIDER_READ_TIMEOUT_S


def _sends_allowed(job) -> int:
    return job.policy.get("attempts_per_model", policy.DEFAULT_ATTEMPTS_PER_MODEL)


def _send_again(job, attempt: Attempt, resend: bool, given_up: str = "", *, bounded: bool = True) -> None:
    """The same request under the same key once more: at once, or (resend=False) after a back-off. An
    attempt known not to have been paid (never sent, or proven absent upstream) that has gone out
    attempts_per_model times is given up (failed), and the runner decides what comes next."""
    if bounded and attempt.sends >= _sends_allowed(job):
        _end(attempt, AttemptState.FAILED, expect=AttemptState.SUBMITTING, money=RELEASE,
             error_class=attempt.error_class or ErrorClass.SERVER_ERROR,
             error=f"{given_up}: {attempt.error or ''}".strip(": "))
        return
    if not resend:
        raise StepRetry(f"submit outcome unknown ({attempt.error_class}); the same key goes out again",
                        countdown=policy.retry_backoff_s(attempt.sends, None))
    if not _claim_send(attempt):
        raise StepRetry("another execution is resending this attempt", countdown=1.0)
    _send(job, attempt)


def _uncertain(job, attempt: Attempt, spec) -> None:
    """Neither key nor lookup: nothing can tell whether the provider has (and charged for) the work."""
    if not _end(attempt, AttemptState.UNCERTAIN, expect=AttemptState.SUBMITTING, money=HOLD, error_class=attempt.error_class,
                error=attempt.error or "the outcome of the submit is unknown"):
        return  # resolved by another execution meanwhile: the caller reads what it decided
    _uncertain_decided(attempt, spec)


def _uncertain_decided(attempt: Attempt, spec) -> None:
    """An uncertain attempt of this run: raises JobHold (a person decides), unless the rule for cheap calls
    pays again, under the next number: then the uncertain one, which may have been paid, keeps its
    reservation as spent, unpriced (once: a settle moves only a held reservation)."""
    if spec.capabilities.resubmit_uncertain:
        billing.settle(key=attempt.upstream_key, cost=None)
        return
    raise JobHold(
        "UNCERTAIN_SUBMIT",
        f"The submit of attempt {attempt.number} to {attempt.model_name} may or may not have been accepted "
        f"(and charged). Check the provider for upstream key {attempt.upstream_key}; "
        "POST /v1/jobs/{id}/retry pays again under a new key.",
        attempt=attempt.number, upstream_key=attempt.upstream_key,
    )


def _answered_accepted(attempt: Attempt, submission, started: float | None) -> None:
    fields = {
        "state": AttemptState.RUNNING, "upstream_id": submission.upstream_id, "accepted_at": timezone.now(),
        "error_class": None, "error": None, **_telemetry(attempt, submission.cost_usd, submission.usage),
        "expected_s": submission.expected_s,
    }
    if submission.status == "succeeded" and submission.output_url:
        # The provider answered the submit with the finished work: no poll needed for it.
        fields["request"] = {**attempt.request, "answered_succeeded": True, "output_url": submission.output_url}
    done = _DONE_MARK.get()
    if done is not None and attempt.step == "submit":
        # The acceptance and the submit step's done mark: one statement, one commit.
        result = {**_accepted(attempt), "upstream_id": submission.upstream_id}
        if done.with_update(result, Attempt.objects.filter(id=attempt.id, state=AttemptState.SUBMITTING), fields):
            for name, value in fields.items():
                setattr(attempt, name, value)
            _log("attempt.accepted", attempt, upstream_id=attempt.upstream_id)
            return
        attempt.refresh_from_db()
    elif _update(attempt, expect=AttemptState.SUBMITTING, **fields):
        _log("attempt.accepted", attempt, upstream_id=attempt.upstream_id)
        return
    logger.warning("attempt %s: accepted as %s, but another execution had resolved it first (%s)",
                   attempt.upstream_key, submission.upstream_id, attempt.state)


def _answered_error(job, attempt: Attempt, spec, exc: ProviderError, started: float) -> None:
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
    kind = policy.failure_kind(accepted=False, outcome_unknown=exc.outcome_unknown,
                               answered_unpaid=spec.capabilities.answered_unpaid(exc.status),
                               key_pinned=_key_pinned(attempt, spec))
    if kind is policy.Failure.UNKNOWN:
        if _update(attempt, expect=AttemptState.SUBMITTING, error_class=exc.kind, error=exc.message,
                   last_status=exc.status):
            _resolve(job, attempt, resend=False)
        return
    retry_at = timezone.now() + timedelta(seconds=policy.retry_backoff_s(attempt.sends, exc.retry_after))
    _end(attempt, AttemptState.FAILED, expect=AttemptState.SUBMITTING, money=RELEASE, error_class=exc.kind, error=exc.message,
         retry_at=retry_at, last_status=exc.status, duration_ms=int((time.monotonic() - started) * 1000))


def _key_pinned(attempt: Attempt, spec) -> bool:
    """A keyed attempt sent more than once: every resend of a key follows a send whose outcome is unknown
    (an answered "not accepted" ends the attempt instead), so that earlier send may have been accepted,
    and charged. Whatever a later send is told then speaks for that send only: the key keeps going out,
    and nothing falls back (no second provider is paid for work the first may be doing). The storm found
    both halves: a 429 on a resend ending the attempt as unpaid with a charge in the ledger, and the
    attempt sent to a person whose retry paid the same render twice under a new key."""
    return spec.capabilities.idempotency_key and attempt.sends > 1


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


# --- row changes -------------------------------------------------------------------------------------


def _update(attempt: Attempt, *, expect: str, **fields) -> bool:
    """Change the attempt only if it is still in the state `expect`. Zero rows: another execution moved
    it on first; this one changes nothing, re-reads the row, and its caller acts on what it says."""
    if not Attempt.objects.filter(id=attempt.id, state=expect).update(**fields):
        attempt.refresh_from_db()
        return False
    for name, value in fields.items():
        setattr(attempt, name, value)
    return True


SETTLE, RELEASE, HOLD = "settle", "release", "hold"


def _end(attempt: Attempt, state: str, *, expect: str, money: str, output_url: str | None = None,
         mark=None, **fields) -> bool:
    """End the attempt and move its reservation in the same transaction (one commit): `settle` when the
    provider took it (its actual cost, or all of the reservation when nobody could price it), `release`
    when it definitely did not charge; `hold` keeps it, counted as unpriced (an outcome nobody knows waits
    for a person). The reservation moves only if this execution ended the attempt."""
    fields = _end_fields(attempt, money=money, output_url=output_url, fields=fields)
    # No savepoint inside a caller's transaction (jobs.runner's ready wait): it all commits or none does.
    with transaction.atomic(savepoint=False):
        if not _update(attempt, expect=expect, state=state, **fields):
            return False
        if money == SETTLE:
            billing.settle(key=attempt.upstream_key, cost=attempt.cost_usd)
        elif money == RELEASE:
            billing.release(key=attempt.upstream_key)
        else:
            billing.hold_unpriced(key=attempt.upstream_key)
        done = _DONE_MARK.get() if mark is not None else None
        if done is not None:  # the step this end finishes is marked done in the same commit
            done.in_transaction(mark(attempt))
        _log_end(attempt)
    return True


def _log(event: str, attempt: Attempt, **fields) -> None:
    """One line per attempt event (config.logs), with the ids an operator finds it by. Never the request:
    it holds the prompt."""
    log_event(logger, event, job_id=attempt.job_id, run=attempt.run, step=attempt.step, attempt=attempt.number,
              upstream_key=attempt.upstream_key, model=attempt.model_name, **fields)


def _log_end(attempt: Attempt) -> None:
    """attempt.succeeded, attempt.failed or attempt.uncertain: how it ended, what it cost, how long it took.
    The provider's words stay on the record (they may quote the input)."""
    _log(f"attempt.{AttemptState(attempt.state).value}", attempt, error_class=attempt.error_class,
         last_status=attempt.last_status, sends=attempt.sends, cost_usd=attempt.cost_usd,
         cost_source=attempt.cost_source or None, duration_ms=attempt.duration_ms)


def _end_fields(attempt: Attempt, *, money: str, output_url: str | None, fields: dict) -> dict:
    """What an attempt's end writes besides its state: when, how long, the output, the derived cost."""
    now = timezone.now()
    fields.setdefault("finished_at", now)
    if "duration_ms" not in fields:
        begun = attempt.accepted_at or attempt.submitted_at or attempt.created_at
        fields["duration_ms"] = int((now - begun).total_seconds() * 1000)
    if output_url:
        fields["request"] = {**attempt.request, "output_url": output_url}
    if money == SETTLE and fields.get("cost_usd", attempt.cost_usd) is None:
        # Nobody quoted it: derive it from the rate card (what it used, or its unit price); None stays
        # unpriced, and the whole reservation is kept as spent.
        derived = rate_card.cost_of(attempt.model_name, fields.get("usage", attempt.usage))
        if derived is not None:
            fields.update(cost_usd=derived, cost_source="derived")
    return fields


def _claim_send(attempt: Attempt) -> bool:
    """The right to send this attempt's request once more: a conditional bump of `sends`, so two
    executions resolving the same attempt never both send it. The new send has no answer yet."""
    claimed = Attempt.objects.filter(id=attempt.id, state=AttemptState.SUBMITTING, sends=attempt.sends).update(
        sends=attempt.sends + 1, submitted_at=timezone.now(), last_status=None
    )
    if claimed:
        attempt.sends, attempt.last_status = attempt.sends + 1, None
    return bool(claimed)


def _release_send(attempt: Attempt) -> None:
    """A send that never left (its input upload failed): it does not count."""
    Attempt.objects.filter(id=attempt.id, state=AttemptState.SUBMITTING, sends=attempt.sends).update(
        sends=max(attempt.sends - 1, 0))
    attempt.sends = max(attempt.sends - 1, 0)


def _telemetry(attempt: Attempt, cost_usd: str | None, usage) -> dict:
    """Usage and the provider's quoted cost, overwritten on every report (a replayed report changes
    nothing else: outcome, error and timing stay as they are)."""
    fields = {}
    if usage is not None:
        fields["usage"] = usage.as_dict()
    if cost_usd is not None:
        try:
            fields.update(cost_usd=Decimal(cost_usd).quantize(Decimal("0.000001")), cost_source="quoted")
        except InvalidOperation:
            logger.warning("attempt %s: unreadable cost %r", attempt.upstream_key, cost_usd)
    return fields


def _accepted(attempt: Attempt) -> dict:
    return {"attempt": attempt.number, "model": attempt.model_name, "upstream_id": attempt.upstream_id,
            "upstream_key": attempt.upstream_key}


def _finished(attempt: Attempt) -> dict:
    finished_at = attempt.finished_at.isoformat() if attempt.finished_at else None
    return {**_accepted(attempt), "output_url": attempt.request.get("output_url"), "finished_at": finished_at}
