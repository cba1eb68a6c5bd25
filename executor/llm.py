"""A paid LLM call (a report's synthesis, a chapter): up to policy.LLM_ATTEMPTS attempts of one step, each
on the record with its upstream key, usage and derived cost, failed ones included
(docs/design.md, "Reports and orders").

LLM providers have neither key nor lookup, and their calls are cheap: an answer nobody received makes the
attempt uncertain, kept as spent (unpriced), and the next attempt goes out under the next key by rule
(Capabilities.resubmit_uncertain), never a person's decision.
"""

import time
from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from billing import rates
from executor import policy, record, services
from executor import tracing as provider_tracing
from executor.models import Attempt, AttemptState, Paid
from executor.providers.base import ProviderError
from executor.record import Money
from jobs.engine.outcomes import JobErrorCode, JobFailure, StepRetry


def worst_case(model_name: str, *, system: str, messages: list[dict], max_tokens: int) -> Decimal:
    """The most one call can cost: its prompt's every byte a token at the dearest input rate, and all of its
    output tokens (max_tokens, capped as the call caps it)."""
    return rates.worst_case(model_name, max_tokens=policy.llm_max_tokens(max_tokens),
                            input_tokens=rates.input_tokens_bound(system, messages))


def llm_call(job, *, step: str, model_name: str, system: str, messages: list[dict], max_tokens: int,
             pool: str | None = None) -> dict:
    """One LLM call of `step`, as up to LLM_ATTEMPTS attempts of this run: on 429, 5xx and network errors
    another attempt after a back-off (Retry-After wins), on any other error none (policy.LLM_RETRYABLE).
    Returns {"text", "attempt", "cost_usd"}; raises StepRetry to wait between attempts (no thread sleeps
    through a back-off) and JobFailure when the call failed for good. `pool`: a fan-out's reservation
    that each attempt's worst case is drawn from.

    A pass reads the step's earlier attempts first: one that succeeded is the answer (no call, no pay).
    One still `submitting` belongs to an execution that is gone: the caller holds the step's lease
    (jobs.engine.steps), so it took the step over from a dead worker. Its call may have been paid and nothing
    can tell: it becomes uncertain with its reservation kept as spent, counts as a try, and the rule for
    cheap calls pays again under the next key."""
    max_tokens = policy.llm_max_tokens(max_tokens)
    earlier = list(Attempt.objects.filter(job=job, run=job.run, step=step).order_by("number"))
    for attempt in earlier:
        if attempt.state == AttemptState.SUCCEEDED:
            return _answer(attempt)
        if attempt.state == AttemptState.SUBMITTING:
            provider_tracing.recovered(attempt, text=True)  # its span died with its sender: emitted before the end
            record.end(attempt, AttemptState.UNCERTAIN, expect=AttemptState.SUBMITTING, money=Money.KEEP,
                       error=attempt.error or "the execution sending it died before its answer was recorded")
    if earlier:
        last = earlier[-1]
        if last.state == AttemptState.FAILED and last.error_class not in policy.LLM_RETRYABLE:
            code = (policy.STOP_CODES.get(last.error_class)
                    or policy.MOVE_ON.get(last.error_class, ("", JobErrorCode.PROVIDER_REFUSED))[1])
            raise JobFailure(code, last.error or "", attempt=last.number)
        if len(earlier) >= policy.LLM_ATTEMPTS:
            raise JobFailure(JobErrorCode.ATTEMPTS_EXHAUSTED, last.error or "no answer", attempt=last.number)
        if last.retry_at and last.retry_at > timezone.now():
            raise StepRetry(f"the LLM call failed ({last.error_class}); again after a back-off",
                            countdown=(last.retry_at - timezone.now()).total_seconds())
    attempt = _attempt(job, step=step, model_name=model_name, system=system, messages=messages,
                       max_tokens=max_tokens, pool=pool, tries=len(earlier) + 1)
    if attempt.state == AttemptState.SUCCEEDED:
        return _answer(attempt)
    return llm_call(job, step=step, model_name=model_name, system=system, messages=messages,
                    max_tokens=max_tokens, pool=pool)  # decide on the attempt just made (retry, or fail)


def _paid_if(exc: ProviderError) -> Paid:
    """Whether a call that failed may have been paid, as its span says: the rule _attempt records by."""
    if getattr(exc, "usage", None):
        return Paid.YES  # a 200 that refused: paid for
    return Paid.UNKNOWN if exc.outcome_unknown and exc.status is None else Paid.NO


def _answer(attempt: Attempt) -> dict:
    return {"text": attempt.answer or "", "attempt": attempt.number,
            "cost_usd": str(attempt.cost_usd) if attempt.cost_usd is not None else None}


def _attempt(job, *, step: str, model_name: str, system: str, messages: list[dict], max_tokens: int,
             pool: str | None, tries: int) -> Attempt:
    """One attempt: the intent with its worst case reserved (or drawn from a fan-out's `pool`), the call,
    then the attempt ended with its usage and derived cost, its reservation settled or released in the
    same transaction."""
    attempt = record.intend(job, model_name, step=step, pool=pool,
                            worst_case=worst_case(model_name, system=system, messages=messages, max_tokens=max_tokens),
                            request={"system": system, "messages": messages, "max_tokens": max_tokens})
    if attempt.state != AttemptState.SUBMITTING:
        return attempt  # the model was gone from the catalog: failed unavailable, nothing reserved or sent
    spec = record.attempt_spec(attempt)
    started = time.monotonic()
    record.log("attempt.sent", attempt, sends=attempt.sends)
    # The call's span ends (and is exported) before its answer is recorded (executor.tracing).
    with provider_tracing.provider_call(job, attempt, text=True) as call:
        try:
            completion = services.provider(spec).complete(
                spec.model, system=system, messages=messages, max_tokens=max_tokens,
                upstream_key=attempt.upstream_key, metadata=attempt.request["metadata"])
        except ProviderError as exc:
            failed = exc
            usage = exc.usage.as_dict() if getattr(exc, "usage", None) else None
            call.answered(paid=_paid_if(exc), usage=usage, status=exc.status, error_class=exc.kind,
                          cost=lambda: (provider_tracing.derived_cost(attempt, usage) if usage else None, "derived"))
        else:
            failed = None
            usage = completion.usage.as_dict()
            call.answered(paid=Paid.YES, usage=usage,
                          cost=lambda: (provider_tracing.derived_cost(attempt, usage), "derived"))
    if failed is not None:
        exc = failed
        elapsed = int((time.monotonic() - started) * 1000)
        paid = getattr(exc, "usage", None)  # a 200 that refused: paid for, priced from its usage
        retry_at = timezone.now() + timedelta(seconds=policy.retry_backoff_s(tries, exc.retry_after))
        if exc.outcome_unknown and exc.status is None:
            # No answer at all: it may have been paid. The attempt is uncertain, its reservation kept as
            # spent (unpriced), and the rule for cheap calls tries again under the next key.
            record.end(attempt, AttemptState.UNCERTAIN, expect=AttemptState.SUBMITTING, money=Money.KEEP,
                       error_class=exc.kind, error=exc.message, duration_ms=elapsed, retry_at=retry_at)
        else:
            # An answer: a 429 or a 5xx (not done, not charged) or another refusal.
            record.end(attempt, AttemptState.FAILED, expect=AttemptState.SUBMITTING,
                       money=Money.SETTLE if paid else Money.RELEASE, error_class=exc.kind, error=exc.message,
                       last_status=exc.status, duration_ms=elapsed, retry_at=retry_at,
                       usage=paid.as_dict() if paid else None)
        return attempt
    record.end(attempt, AttemptState.SUCCEEDED, expect=AttemptState.SUBMITTING, money=Money.SETTLE,
               usage=completion.usage.as_dict(), answer=completion.text, upstream_id=completion.upstream_id or "",
               accepted_at=timezone.now(), duration_ms=int((time.monotonic() - started) * 1000))
    return attempt
