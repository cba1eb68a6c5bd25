"""The attempt runner: where money is spent (DESIGN.md, section 3; seed 002).

1. Intent before spend: an `Attempt` row is committed in state `submitting`, with its upstream key
   `payonce-{job}-{n}` and the exact request, before the provider is called.
2. The three answers: a 4xx is a definite end (nothing charged; the provider's words kept); a 2xx is
   accepted (`running`, polled); a transport error or a 5xx is an unknown outcome, resolved by what the
   provider can do: the same key again (keyed), a search by metadata (lookup), or `uncertain` and a
   person's decision (neither). Only an outcome known not to have been paid lets the runner try again.
3. The error class decides what comes next: the same model again after a back-off (with jitter,
   honouring Retry-After), the next model of the chain if the job's policy allows, or the end of the run.
4. The upstream number grows only after a definite end, or a person's or a rule's decision to pay
   again; every other pass sends the same key. Every attempt is on the record as it happens.

Each function here does one transition and returns, or raises StepRetry to be called again later: no
call blocks a worker for a back-off. They run inside a step that holds a lease, so one execution at a
time moves a job's attempts; the row updates are still conditional, so a second one changes nothing.
"""

import base64
import logging
import random
import time
from datetime import timedelta
from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.db import IntegrityError
from django.db.models import Max, Sum
from django.utils import timezone
from django.utils.module_loading import import_string

from executor import services
from executor.models import Attempt, AttemptState
from executor.providers.base import ErrorClass, ProviderError
from executor.registry import model_spec
from jobs.outcomes import JobFailure, JobHold, StepRetry

logger = logging.getLogger(__name__)

# What ends the chain at once, with the job's error code.
STOP_CODES = {
    ErrorClass.AUTH: "PROVIDER_AUTH",
    ErrorClass.INVALID_INPUT: "INVALID_INPUT",
    ErrorClass.CANCELLED: "CANCELLED",
    ErrorClass.BUDGET_EXCEEDED: "BUDGET_EXCEEDED",
    "pre_submit_refused": "PRE_SUBMIT_REFUSED",
    "upload_failed": "UPLOAD_FAILED",
}
RETRY_SAME_MODEL = {ErrorClass.RATE_LIMITED, ErrorClass.TIMEOUT, ErrorClass.SERVER_ERROR, ErrorClass.NETWORK,
                    ErrorClass.REFUSED}
# Why the chain moves on to the next model (the job's policy.fallback_on), and the code when it cannot.
MOVE_ON = {
    ErrorClass.RATE_LIMITED: ("exhausted", "ATTEMPTS_EXHAUSTED"),
    ErrorClass.TIMEOUT: ("exhausted", "ATTEMPTS_EXHAUSTED"),
    ErrorClass.SERVER_ERROR: ("exhausted", "ATTEMPTS_EXHAUSTED"),
    ErrorClass.NETWORK: ("exhausted", "ATTEMPTS_EXHAUSTED"),
    ErrorClass.REFUSED: ("refused", "PROVIDER_REFUSED"),
    ErrorClass.UNAVAILABLE: ("unavailable", "PROVIDER_UNAVAILABLE"),
    ErrorClass.WINDOW_EXPIRED: ("window_expired", "WINDOW_EXPIRED"),
}
BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 60.0
RETRY_AFTER_MAX_S = 300.0


class SubmitRefused(Exception):
    """Raised by a pre-submit check (settings.PRE_SUBMIT_CHECKS): nothing may be spent on this request."""


def upstream_key(job, number: int) -> str:
    """One key per decision to pay (seed 002): derived from the durable record, never random."""
    return f"payonce-{job.id}-{number}"


# --- the submit step: until an attempt is accepted -----------------------------------------------------


def submit(job) -> dict:
    """Get an attempt of this run accepted by a provider. Returns it; raises StepRetry to come back
    after a back-off, JobFailure when the chain is over, JobHold when a person must decide."""
    current = _latest(job)
    while True:
        if current is not None and current.state in (AttemptState.RUNNING, AttemptState.SUCCEEDED):
            return _accepted(current)
        if current is not None and current.state == AttemptState.SUBMITTING:
            _resolve(job, current)  # an unknown outcome, or a crash while the call was out
            continue
        model, countdown = _next_model(job, current)
        if countdown > 0:
            raise StepRetry(f"next attempt on {model} after a back-off", countdown=countdown)
        current = _intend(job, model)
        _send(job, current)  # the row in hand now says what the provider answered


# --- the wait step: until the accepted attempt is done ---------------------------------------------------


def wait(job) -> dict | None:
    """Poll the current attempt. None while it runs; its output once it succeeded. An attempt that
    failed upstream is a definite end: the runner submits the next one (same rules as `submit`)."""
    current = _latest(job)
    if current is None or current.state != AttemptState.RUNNING:
        if current is not None and current.state == AttemptState.SUCCEEDED:
            return _finished(current)
        submit(job)  # a failed or unresolved attempt: get the next one going (or end the run)
        return None
    spec = model_spec(current.model_name)
    window = _window(job, spec)
    telemetry = {}
    if current.request.get("answered_succeeded") and current.request.get("output_url"):
        result_status, output_url, error, error_class = "succeeded", current.request["output_url"], None, None
    else:
        try:
            polled = services.provider(spec).poll(spec.model, current.upstream_id)
        except ProviderError as exc:
            raise StepRetry(f"poll failed ({exc.kind}: {exc.message})", countdown=settings.POLL_INTERVAL_S) from exc
        result_status, output_url, error, error_class = polled.status, polled.output_url, polled.error, polled.error_class
        telemetry = _telemetry(current, polled.cost_usd, polled.usage)
        if telemetry and result_status == "running":
            _update(current, **telemetry)
    if result_status == "succeeded":
        _end(current, AttemptState.SUCCEEDED, output_url=output_url, **telemetry)
        return _finished(current)
    if result_status == "running":
        if window is not None and (timezone.now() - current.accepted_at).total_seconds() > window:
            # The provider may bill the whole run: no retry of this model, only the next one if allowed.
            services.cancel_upstream(spec, current.upstream_id)
            _end(current, AttemptState.FAILED, error_class=ErrorClass.WINDOW_EXPIRED,
                 error=f"no result within the attempt's window of {window:g} s")
            submit(job)
        return None
    # Accepted, then failed (or cancelled) upstream: a definite end; the number grows.
    _end(current, AttemptState.FAILED, error_class=error_class or ErrorClass.SERVER_ERROR,
         error=error or f"the render ended {result_status} upstream",
         retry_at=timezone.now() + timedelta(seconds=_backoff(current.sends, None)), **telemetry)
    submit(job)
    return None


def cancel_current(job) -> None:
    """The job was cancelled: stop its running attempt upstream where the provider can, and end it on
    the record (cancelled, with its duration; what it cost stays). An attempt still `submitting` is left
    to the execution sending it: its answer, whatever it is, must reach the record first."""
    current = _latest(job)
    if current is None or current.state != AttemptState.RUNNING:
        return
    if current.upstream_id:
        services.cancel_upstream(model_spec(current.model_name), current.upstream_id)
    # Conditional on `running`: a poll that saw the render finish at the same moment keeps its success.
    _end(current, AttemptState.FAILED, error_class=ErrorClass.CANCELLED, error="the job was cancelled",
         expect=AttemptState.RUNNING)


# --- decisions -----------------------------------------------------------------------------------------


def _latest(job) -> Attempt | None:
    return Attempt.objects.filter(job=job, run=job.run).order_by("-number").first()


def _next_model(job, last: Attempt | None) -> tuple[str, float]:
    """The model of the next attempt and how long to wait first (DESIGN.md's attempt-runner table)."""
    chain = job.model_chain
    if last is None:
        return chain[0], 0.0
    cls = last.error_class or ErrorClass.SERVER_ERROR
    if cls in STOP_CODES:
        raise JobFailure(STOP_CODES[cls], last.error or cls, attempt=last.number)
    policy = job.policy
    tries = (
        Attempt.objects.filter(job=job, run=job.run, provider=last.provider, model=last.model)
        .aggregate(n=Sum("sends"))["n"] or 0
    )
    if cls in RETRY_SAME_MODEL and tries < policy.get("attempts_per_model", 3):
        countdown = (last.retry_at - timezone.now()).total_seconds() if last.retry_at else 0.0
        return last.model_name, max(countdown, 0.0)
    reason, code = MOVE_ON.get(cls, ("exhausted", "ATTEMPTS_EXHAUSTED"))
    position = chain.index(last.model_name) if last.model_name in chain else len(chain)
    if reason in policy.get("fallback_on", []) and position + 1 < len(chain):
        return chain[position + 1], 0.0
    raise JobFailure(code, last.error or cls, attempt=last.number, model=last.model_name)


def _cancelled(job) -> bool:
    from jobs.models import Job, JobStatus

    return Job.objects.filter(id=job.id, status=JobStatus.CANCELLED).exists()


def _backoff(tries: int, retry_after: float | None) -> float:
    """Exponential with jitter; a provider's Retry-After wins (within bounds)."""
    if retry_after is not None:
        return min(retry_after, RETRY_AFTER_MAX_S)
    return min(BACKOFF_BASE_S * 2 ** max(tries - 1, 0), BACKOFF_MAX_S) * random.uniform(0.8, 1.2)


def _window(job, spec) -> float | None:
    windows = [w for w in (job.policy.get("window_s"), spec.capabilities.window_s) if w]
    return min(windows) if windows else None


# --- the calls ---------------------------------------------------------------------------------------


def _intend(job, model_name: str) -> Attempt:
    """Commit the attempt as `submitting`, with its key and the exact request, before anything is sent.
    The number is the job's next (across runs and models). Two executions deciding to pay at once race
    on (job, provider, number): the loser's INSERT fails, it sends nothing and comes back later."""
    spec = model_spec(model_name)
    number = (Attempt.objects.filter(job=job).aggregate(n=Max("number"))["n"] or 0) + 1
    key = upstream_key(job, number)
    params = {name: value for name, value in job.input.items() if name not in ("prompt", "references")}
    request = {
        "prompt": job.input.get("prompt", ""),
        "params": params,
        "metadata": {"payonce_job": str(job.id), "payonce_attempt": number, "upstream_key": key},
    }
    try:
        return Attempt.objects.create(
            job=job, run=job.run, number=number, provider=spec.provider, model=spec.model, upstream_key=key,
            request=request, sends=1, submitted_at=timezone.now(),
        )
    except IntegrityError:  # autocommit: the failed INSERT leaves no transaction to clean up
        raise StepRetry("another execution took this attempt number", countdown=1.0) from None


def _send(job, attempt: Attempt) -> None:
    """Run the pre-submit checks, upload the inputs, and send the request once; record the answer."""
    spec = model_spec(attempt.model_name)
    try:
        for path in settings.PRE_SUBMIT_CHECKS:
            import_string(path)(job, attempt.request)
    except SubmitRefused as refusal:
        _end(attempt, AttemptState.FAILED, error_class="pre_submit_refused", error=str(refusal))
        return
    if _cancelled(job):
        # Seen between deciding and spending: an API cancel is final.
        _end(attempt, AttemptState.FAILED, error_class=ErrorClass.CANCELLED, error="the job was cancelled")
        raise JobFailure("CANCELLED", "The job was cancelled before this attempt was sent.")
    try:
        # A send of an attempt that went out before reuses what it referred to: the same key must carry
        # the same request. A new attempt uploads the references again.
        inputs = attempt.request.get("inputs")
        if inputs is None:
            inputs = _upload_inputs(job, spec)
            if inputs:
                _update(attempt, request={**attempt.request, "inputs": inputs})
    except ProviderError as exc:
        if exc.outcome_unknown or exc.kind == ErrorClass.RATE_LIMITED:
            # Uploads cost nothing: the next pass uploads again under the same attempt.
            _release_send(attempt)
            raise StepRetry(f"input upload failed ({exc.kind}: {exc.message})") from exc
        _end(attempt, AttemptState.FAILED, error_class="upload_failed", error=exc.message)
        return
    except StepRetry:  # a reference could not be read for now: nothing was sent, so this send does not count
        _release_send(attempt)
        raise
    except JobFailure as unreadable:  # a reference that cannot be read at all: nothing was sent
        _end(attempt, AttemptState.FAILED, error_class=ErrorClass.INVALID_INPUT, error=unreadable.message)
        return
    provider = services.provider(spec)
    started = time.monotonic()
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
    (DESIGN.md, the recovery table). `resend=False` right after our own failed send: a keyed or proven
    absent attempt then goes out again only after a back-off (StepRetry)."""
    spec = model_spec(attempt.model_name)
    caps = spec.capabilities
    if caps.idempotency_key:
        # The same key again: the provider returns the work it already has, or makes the one that never
        # arrived. Exactly one is paid.
        _send_again(job, attempt, resend, f"no answer after {attempt.sends} sends of the same key")
        return
    if caps.lookup:
        try:
            found = services.provider(spec).lookup(
                spec.model, upstream_key=attempt.upstream_key, metadata=attempt.request["metadata"],
                prompt=attempt.request["prompt"], params=attempt.request["params"],
                submitted_at=attempt.submitted_at.timestamp(), inputs=attempt.request.get("inputs") or [],
            )
        except ProviderError as exc:
            raise StepRetry(f"lookup failed ({exc.kind}: {exc.message})") from exc
        if found is not None:
            logger.info("attempt %s: found upstream as %s, adopted", attempt.upstream_key, found.upstream_id)
            _answered_accepted(attempt, found, None)
            return
        # Proven absent: nothing was accepted, so nothing was paid. Send it (again) under the same key.
        _send_again(job, attempt, resend, f"not accepted after {attempt.sends} sends")
        return
    _uncertain(job, attempt, spec)


def _send_again(job, attempt: Attempt, resend: bool, given_up: str) -> None:
    """The same request under the same key once more: at once, or (resend=False) after a back-off. An
    attempt that has gone out attempts_per_model times without an answer is given up (failed), and the
    runner decides what comes next."""
    if attempt.sends >= job.policy.get("attempts_per_model", 3):
        _end(attempt, AttemptState.FAILED, error_class=attempt.error_class or ErrorClass.SERVER_ERROR,
             error=f"{given_up}: {attempt.error or ''}".strip(": "))
        return
    if not resend:
        raise StepRetry(f"submit outcome unknown ({attempt.error_class}); the same key goes out again",
                        countdown=_backoff(attempt.sends, None))
    if not _claim_send(attempt):
        raise StepRetry("another execution is resending this attempt", countdown=1.0)
    _send(job, attempt)


def _uncertain(job, attempt: Attempt, spec) -> None:
    """Neither key nor lookup: nothing can tell whether the provider has (and charged for) the work."""
    _end(attempt, AttemptState.UNCERTAIN, error_class=attempt.error_class,
         error=attempt.error or "the outcome of the submit is unknown")
    if spec.capabilities.resubmit_uncertain:
        return  # a cheap call: the rule decides to pay again, under the next number
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
    }
    if submission.status == "succeeded" and submission.output_url:
        # The provider answered the submit with the finished work: no poll needed for it.
        fields["request"] = {**attempt.request, "answered_succeeded": True, "output_url": submission.output_url}
    _update(attempt, **fields)


def _answered_error(job, attempt: Attempt, spec, exc: ProviderError, started: float) -> None:
    if exc.outcome_unknown:
        # Record what happened, keep the attempt `submitting`: resolve it by capability (a keyed or a
        # proven-absent attempt goes out again under the same key, after a back-off).
        _update(attempt, error_class=exc.kind, error=exc.message)
        _resolve(job, attempt, resend=False)
        return
    tries = attempt.sends
    retry_at = timezone.now() + timedelta(seconds=_backoff(tries, exc.retry_after))
    _end(attempt, AttemptState.FAILED, error_class=exc.kind, error=exc.message, retry_at=retry_at,
         duration_ms=int((time.monotonic() - started) * 1000))


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


def _update(attempt: Attempt, *, expect: str | None = None, **fields) -> bool:
    rows = Attempt.objects.filter(id=attempt.id)
    if expect is not None:
        rows = rows.filter(state=expect)
    if not rows.update(**fields):
        return False  # another execution moved the attempt on first: this one changes nothing
    for name, value in fields.items():
        setattr(attempt, name, value)
    return True


def _end(attempt: Attempt, state: str, *, output_url: str | None = None, **fields) -> bool:
    now = timezone.now()
    fields.setdefault("finished_at", now)
    if "duration_ms" not in fields:
        begun = attempt.accepted_at or attempt.submitted_at or attempt.created_at
        fields["duration_ms"] = int((now - begun).total_seconds() * 1000)
    if output_url:
        fields["request"] = {**attempt.request, "output_url": output_url}
    return _update(attempt, state=state, **fields)


def _claim_send(attempt: Attempt) -> bool:
    """The right to send this attempt's request once more: a conditional bump of `sends`, so two
    executions resolving the same attempt never both send it."""
    claimed = Attempt.objects.filter(id=attempt.id, state=AttemptState.SUBMITTING, sends=attempt.sends).update(
        sends=attempt.sends + 1, submitted_at=timezone.now()
    )
    if claimed:
        attempt.sends += 1
    return bool(claimed)


def _release_send(attempt: Attempt) -> None:
    """A send that never left (its input upload failed): it does not count."""
    Attempt.objects.filter(id=attempt.id, sends=attempt.sends).update(sends=max(attempt.sends - 1, 0))
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
