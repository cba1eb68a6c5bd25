"""An attempt's record: its upstream key, the intent committed (with its reservation) before any call,
and every later change of its row, each conditional on the state it expects, with its money moved in the
same transaction (docs/design.md, "Intent before spend, and the recovery table").

The attempt runners (executor.render for media, executor.llm for LLM calls, executor.cancel for a
cancelled job's) change attempts only through these functions.
"""

import enum
import logging
import re
import uuid
from collections.abc import Callable
from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Max
from django.utils import timezone

from billing import rates
from billing import services as billing
from billing.models import RESERVATION_KEY_CONSTRAINT
from config.logs import log_event
from config.retry import jittered
from config.sql import violated_constraint
from executor.models import (ATTEMPT_NUMBER_CONSTRAINT, ONE_OUT_PER_RUN_CONSTRAINT,
                             STORED_OUTPUT, Attempt, AttemptState, ModelKind)
from executor import in_flight
from executor import tracing as provider_tracing
from executor.policy import job_deadline
from executor.selectors import attempts_maybe_paid
from executor.providers import ADAPTERS, http
from executor.providers.base import CHEAP_LLM, ErrorClass
from executor.registry import ModelSpec, code_spec, model_spec
from jobs.engine.outcomes import JobErrorCode, JobFailure, StepRetry

logger = logging.getLogger(__name__)

# --- the upstream key -------------------------------------------------------------------------------------

_UPSTREAM_KEY = re.compile(r"\Apayonce-(?P<job>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
                           r"-(?P<n>[0-9]+)\Z", re.ASCII)


def upstream_key(job_id, number: int) -> str:
    """One key per decision to pay (seed 002): derived from the durable record, never random, so anyone
    holding the job row computes it again."""
    return f"payonce-{job_id}-{number}"


def upstream_key_parts(text: str) -> tuple[uuid.UUID, int] | None:
    """(job id, attempt number) of an upstream key, or None for anything that is not one."""
    match = _UPSTREAM_KEY.match(text or "")
    return (uuid.UUID(match["job"]), int(match["n"])) if match else None


# --- the intent: committed before anything is sent ----------------------------------------------------------

# The intent, inserted only if its reservation fit (billing.services.reserve_then runs it after the
# reservation, in the same statement: `reserved` is that reservation). One statement joining the work of
# two apps to save a commit: tests/jobs/test_commit_budget.py holds the budget it exists for.
_INTENT_SQL = f"""
INSERT INTO executor_attempt (job_id, run, step, number, provider, model, upstream_key, upstream_id, state,
                              request, spec, sends, poll_errors, created_at, submitted_at)
SELECT %(a_job)s, %(a_run)s, %(a_step)s, %(a_number)s, %(a_provider)s, %(a_model)s, %(a_key)s, '',
       '{AttemptState.SUBMITTING}', %(a_request)s, %(a_spec)s, 1, 0, %(a_now)s, %(a_now)s
  FROM reserved
RETURNING id
"""
# How often an intent takes the job's next number again after a sibling step took it first.
_NUMBER_TRIES = 20
# How long a call held back by a limit of calls in flight waits before it asks again (jittered).
HELD_BACK_S = 1.0


def media_worst_case(model_name: str, request: dict) -> Decimal:
    """The most one render can cost: its unit price for the parameters it sends (a price may depend on an
    image's size and quality), and its prompt as input tokens where the provider bills them too."""
    prompt = request.get("prompt") or ""
    return rates.worst_case(model_name, params=request.get("params") or {},
                            input_tokens=rates.input_tokens_bound(None, [{"content": prompt}]))


def _before_deadline(job) -> None:
    """`policy.deadline_s` (or `deadline_at`): a job whose first paid call has not gone out by then ends DEADLINE_EXCEEDED, with
    nothing reserved or sent. Only before its first paid call: once an attempt of the job may have been paid
    (Paid: yes or unknown, PAID_YES | PAID_UNKNOWN), the job is never cut short by it (its waits are bounded
    as every wait is). Read here, at the one decision to pay, so no path to a provider passes it by."""
    deadline = job_deadline(job.created_at, job.policy)
    if deadline is None or timezone.now() < deadline:
        return
    if attempts_maybe_paid(job.id):
        return
    raise JobFailure(JobErrorCode.DEADLINE_EXCEEDED, deadline_message(deadline))


def deadline_message(deadline) -> str:
    return (f"The job's deadline ({deadline.isoformat().replace('+00:00', 'Z')}) passed before its first paid call "
            "went out: nothing was sent or paid.")


def intend(job, model_name: str, *, step: str, request: dict, worst_case: Decimal | None = None,
           pool: str | None = None, number_hint: int | None = None) -> Attempt:
    """Commit the attempt as `submitting`, with its key and the exact request (`request` and the metadata
    that ties a charge to it), before anything is sent. Returns it, sent once (`sends` 1).

    1. The number is the job's next (across runs and models): its upstream key is payonce-{job}-{n}.
       The caller's guess (`number_hint`) saves the read; a wrong guess loses on attempt_job_number and
       the next pass reads the number.
    2. The worst case of the call (the rate card's; the penalty tier for a model it does not know) is
       reserved against the client's month, or drawn from a fan-out's `pool`, in the same statement as
       the INSERT (billing.services.reserve_then): one statement, so one transaction of its own,
       committed here, before the call, with intent and reservation together or not at all. Refused:
       nothing is written, nothing is sent, and the job fails BUDGET_EXCEEDED (or CANCELLED: nothing is
       reserved for a cancelled job, Job.NOT_CANCELLED_SQL).
    3. It refuses to run inside an outer transaction: one rolled back after the call went out would
       leave spend with no record (the provider charged; the intent, its key and its reservation gone).
       The intent keeps the model's spec as it is now (Attempt.spec): the attempt is waited on,
       resolved, cancelled and stored by it, whatever the catalog says later. A model the catalog no
       longer has (disabled or removed since the job was accepted) is not sent to: the attempt is
       written failed `unavailable`, with nothing reserved, and the runner falls back or ends the run.
    4. Two executions deciding to pay at once race on the named constraints. On attempt_job_number or
       reservation_key (the same number, so the same upstream key: parallel chapters of one job) the
       loser's statement fails whole, its reservation too, and it takes the next number at once. On
       attempt_one_out_per_run (this step has an attempt out already) it sends nothing and comes back
       later. Any other integrity error is a bug, and is raised.
    """
    # The race this closes: an outer transaction rolled back after the call went out would take the intent,
    # its key and its reservation with it, and the provider's charge would have no record (step 3). Like
    # Django's durable check (Atomic.__enter__), a block a TestCase opened around the test (`_from_testcase`)
    # does not count: it is no caller's transaction, and tests of the money paths run under its rollback.
    if connection.atomic_blocks and not connection.atomic_blocks[-1]._from_testcase:
        raise RuntimeError("the intent to pay must commit on its own before the call: not inside a transaction, "
                           "whose rollback after the call would lose the record of the spend")
    _before_deadline(job)
    spec = model_spec(model_name)
    if spec is None:
        return _unavailable(job, model_name, step=step, number_hint=number_hint)
    kept = Attempt._meta.get_field("spec").get_db_prep_save(spec.snapshot(), connection)
    limits = in_flight.limits_for(spec.provider, spec.model)
    worst = worst_case if worst_case is not None else media_worst_case(model_name, request)
    for _ in range(_NUMBER_TRIES):
        number, number_hint = number_hint or next_number(job), None
        key = upstream_key(job.id, number)
        sent = {**request, "metadata": {"payonce_job": str(job.id), "payonce_attempt": number, "upstream_key": key}}
        intent = {"a_job": job.id, "a_run": job.run, "a_step": step, "a_number": number, "a_provider": spec.provider,
                  "a_model": spec.model, "a_key": key, "a_spec": kept,
                  "a_request": Attempt._meta.get_field("request").get_db_prep_save(sent, connection)}
        try:
            # Under the provider's and the model's limits of calls in flight, where they have one: a call past
            # one is held back here, before anything is written (executor.in_flight).
            with in_flight.slot(limits):
                # Its moment is read once it holds its slot: an attempt is in flight from then, never from
                # before a wait on another's lock (an interval that would overlap one that had ended).
                intent["a_now"] = now = timezone.now()
                rows = billing.reserve_then(_INTENT_SQL, intent, client_id=job.client_id, job_id=job.id, key=key,
                                            model=model_name, amount=worst, guard=job.NOT_CANCELLED_SQL, pool=pool)
        except in_flight.Full as full:
            raise StepRetry(f"held back, nothing sent: {full}", countdown=jittered(HELD_BACK_S)) from None
        except IntegrityError as exc:
            constraint = violated_constraint(exc)
            if constraint in (ATTEMPT_NUMBER_CONSTRAINT, RESERVATION_KEY_CONSTRAINT):
                continue  # another step of this job (a sibling chapter) took the number first: the next one
            if constraint == ONE_OUT_PER_RUN_CONSTRAINT:
                raise StepRetry(f"another execution is paying for this step ({constraint})", countdown=1.0) from None
            raise
        if rows is None:
            if job.cancelled_now():  # the reservation refuses a cancelled job
                raise JobFailure(JobErrorCode.CANCELLED, "The job was cancelled before this attempt was sent.")
            raise JobFailure(JobErrorCode.BUDGET_EXCEEDED,
                             f"The most this call to {model_name} can cost (${worst}) does not fit under this "
                             "month's budget; nothing was sent.", model=model_name, worst_case_usd=str(worst))
        attempt = Attempt(id=rows[0][0], job=job, run=job.run, step=step, number=number, provider=spec.provider,
                          model=spec.model, upstream_key=key, upstream_id="", state=AttemptState.SUBMITTING,
                          request=sent, spec=spec.snapshot(), sends=1, poll_errors=0, created_at=now, submitted_at=now)
        log("attempt.intent", attempt, worst_case_usd=worst)
        return attempt
    raise StepRetry("the job's attempt numbers are contended; trying again", countdown=0.2)


def _unavailable(job, model_name: str, *, step: str, number_hint: int | None) -> Attempt:
    """An attempt on a model the catalog no longer has, ended before anything was reserved or sent: a
    definite, unpaid end (`unavailable`), so the attempt runner's table decides what follows (the chain's
    next model where the policy's fallback_on allows, else PROVIDER_UNAVAILABLE). Its number is the job's
    next, as any attempt's."""
    provider, _, model = model_name.partition("/")
    for _ in range(_NUMBER_TRIES):
        number, number_hint = number_hint or next_number(job), None
        now = timezone.now()
        try:
            with transaction.atomic():
                attempt = Attempt.objects.create(
                    job=job, run=job.run, step=step, number=number, provider=provider, model=model,
                    upstream_key=upstream_key(job.id, number), state=AttemptState.FAILED,
                    error_class=ErrorClass.UNAVAILABLE, sends=0, created_at=now, finished_at=now, duration_ms=0,
                    error=f"{model_name} is disabled or no longer in the catalog; nothing was sent")
        except IntegrityError as exc:
            if violated_constraint(exc) == ATTEMPT_NUMBER_CONSTRAINT:
                continue  # a sibling step took the number first: the next one
            raise
        log_end(attempt)
        return attempt
    raise StepRetry("the job's attempt numbers are contended; trying again", countdown=0.2)


def attempt_spec(attempt: Attempt) -> ModelSpec:
    """The model as the attempt went out with it (its intent's snapshot), whatever the catalog says now:
    an attempt out is waited on, resolved, cancelled and stored by it. An attempt written before the
    snapshot was kept takes the catalog's spec, else the code's, else its adapter's own capabilities."""
    if attempt.spec:
        return ModelSpec.from_snapshot(attempt.spec)
    name = attempt.model_name
    found = model_spec(name) or code_spec(name)
    if found is not None:
        return found
    text = attempt.step != "submit"  # a report's synthesis and chapters are text calls; a render is `submit`
    capabilities = getattr(ADAPTERS.get(attempt.provider), "capabilities", CHEAP_LLM)
    return ModelSpec(attempt.provider, attempt.model, ModelKind.TEXT if text else ModelKind.IMAGE,
                     "text/markdown" if text else "application/octet-stream", "md" if text else "bin", capabilities)


def next_number(job) -> int:
    """The job's next attempt number, across runs and models (read here, claimed by the INSERT)."""
    return (Attempt.objects.filter(job=job).aggregate(n=Max("number"))["n"] or 0) + 1


def latest(job, *, step: str) -> Attempt | None:
    """The latest attempt of this run's `step`."""
    return Attempt.objects.filter(job=job, run=job.run, step=step).order_by("-number").first()


# --- changes of the row ---------------------------------------------------------------------------------------


class Money(enum.Enum):
    """What an attempt's end does with its reservation (billing.services)."""

    SETTLE = "settle"  # the provider took it: spent at its cost (all of the reservation when nobody could price it)
    RELEASE = "release"  # it definitely did not charge: the reservation goes back
    HOLD = "hold"  # nobody knows whether it was paid: held, counted as unpriced, until a person decides
    KEEP = "keep"  # nobody knows, and it is decided (a cancel, the rule for cheap calls): spent, all of it, unpriced


def move_money(key: str, money: Money, *, cost: Decimal | None = None) -> None:
    """Move an ended attempt's reservation as `money` says, in the transaction that ended it. Each move is
    conditional on the reservation being held, so whoever ends the attempt moves its money once."""
    if money is Money.SETTLE:
        billing.settle(key=key, cost=cost)
    elif money is Money.RELEASE:
        billing.release(key=key)
    elif money is Money.KEEP:
        billing.settle(key=key, cost=None)
    else:
        billing.hold_unpriced(key=key)


def update(attempt: Attempt, *, expect: str, **fields) -> bool:
    """Change the attempt only if it is still in the state `expect`. Zero rows: another execution moved
    it on first; this one changes nothing, re-reads the row, and its caller acts on what it says."""
    if not Attempt.objects.filter(id=attempt.id, state=expect).update(**fields):
        attempt.refresh_from_db()
        return False
    for name, value in fields.items():
        setattr(attempt, name, value)
    return True


def end(attempt: Attempt, state: str, *, expect: str, money: Money, in_commit: Callable[[], None] | None = None,
        **fields) -> bool:
    """End the attempt and move its reservation in the same transaction (one commit), as `money` says. `in_commit` is more work of the same commit, done only if this execution
    ended the attempt (the done mark of the step the end finishes). False, and nothing moved, when the
    attempt had moved on already (the row is re-read)."""
    fields = end_fields(attempt, money=money, fields=fields)
    # No savepoint inside a caller's transaction (jobs.engine.runner's ready wait): it all commits or none does.
    with transaction.atomic(savepoint=False):
        if not update(attempt, expect=expect, state=state, **fields):
            return False
        move_money(attempt.upstream_key, money, cost=attempt.cost_usd)
        if in_commit is not None:
            in_commit()
        log_end(attempt)
    provider_tracing.ended(attempt)
    return True


def end_fields(attempt: Attempt, *, money: Money, fields: dict) -> dict:
    """What an attempt's end writes besides its state: when, how long, the derived cost."""
    now = timezone.now()
    fields.setdefault("finished_at", now)
    if "duration_ms" not in fields:
        begun = attempt.accepted_at or attempt.submitted_at or attempt.created_at
        fields["duration_ms"] = int((now - begun).total_seconds() * 1000)
    if money is Money.SETTLE and fields.get("cost_usd", attempt.cost_usd) is None:
        # Nobody quoted it: derive it from the rate card (what it used, or its unit price); None stays
        # unpriced, and the whole reservation is kept as spent.
        derived = rates.cost_of(attempt.model_name, fields.get("usage", attempt.usage),
                                params=(attempt.request or {}).get("params"))
        if derived is not None:
            fields.update(cost_usd=derived, cost_source="derived")
    return fields


def in_flight_s(attempt: Attempt) -> float:
    """The longest a send of this attempt may take to reach its provider and be answered: the connect
    timeout and the read timeout of its kind of call (an LLM call may write for minutes; a model no longer
    in the catalog, and of which the attempt keeps no spec, is given the longer one)."""
    known = attempt.spec or model_spec(attempt.model_name) or code_spec(attempt.model_name)
    text = not known or attempt_spec(attempt).kind == ModelKind.TEXT
    return settings.PROVIDER_CONNECT_TIMEOUT_S + (settings.LLM_READ_TIMEOUT_S if text else settings.PROVIDER_READ_TIMEOUT_S)


def may_still_land_s(attempt: Attempt) -> float:
    """How much longer the attempt's last send may reach the provider and be accepted (0 once it cannot,
    or when it never went out): until then, finding nothing upstream proves nothing."""
    if attempt.submitted_at is None:
        return 0.0
    return max(in_flight_s(attempt) - (timezone.now() - attempt.submitted_at).total_seconds(), 0.0)


def claim_send(attempt: Attempt) -> bool:
    """The right to send this attempt's request once more: a conditional bump of `sends`, so two
    executions resolving the same attempt never both send it. The new send has no answer yet."""
    claimed = Attempt.objects.filter(id=attempt.id, state=AttemptState.SUBMITTING, sends=attempt.sends).update(
        sends=attempt.sends + 1, submitted_at=timezone.now(), last_status=None
    )
    if claimed:
        attempt.sends, attempt.last_status = attempt.sends + 1, None
    return bool(claimed)


def release_send(attempt: Attempt) -> None:
    """A send that never left (its input upload failed): it does not count."""
    Attempt.objects.filter(id=attempt.id, state=AttemptState.SUBMITTING, sends=attempt.sends).update(
        sends=max(attempt.sends - 1, 0))
    attempt.sends = max(attempt.sends - 1, 0)


def telemetry(attempt: Attempt, cost_usd: str | None, usage) -> dict:
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


# --- what a step keeps of an attempt ---------------------------------------------------------------------


def accepted(attempt: Attempt) -> dict:
    """The submit step's result: the attempt a provider accepted."""
    return {"attempt": attempt.number, "model": attempt.model_name, "upstream_id": attempt.upstream_id,
            "upstream_key": attempt.upstream_key}


def finished(attempt: Attempt, *, finished_at=None) -> dict:
    """The wait step's result: the attempt that succeeded, where its output is (a reference, never the
    bytes: output_reference), and what it made (its content type, as the attempt's spec says: the model
    may have left the catalog since it went out)."""
    finished_at = finished_at or attempt.finished_at
    return {**accepted(attempt), **output_reference(attempt.output_url),
            "finished_at": finished_at.isoformat() if finished_at else None,
            "content_type": attempt_spec(attempt).content_type}


def output_reference(output_url: str | None) -> dict:
    """Where a step's result says an attempt's output is: the provider's URL, or only that the attempt's
    row holds it. Never the bytes a provider answered in its body (a `data:` URL, executor.render.
    _answered_accepted): the row is their one durable place until the store holds them, and a step's
    result is kept for good. The store step reads them from the row (executor.services.media_store),
    and once they are stored the row keeps the stored key instead (executor.services.media_stored)."""
    if http.is_data_url(output_url) or (output_url or "").startswith(STORED_OUTPUT):
        return {"output_url": None, "output_on_attempt": True}
    return {"output_url": output_url}


# --- the log -------------------------------------------------------------------------------------------------


def log(event: str, attempt: Attempt, **fields) -> None:
    """One line per attempt event (config.logs), with the ids an operator finds it by. Never the request:
    it holds the prompt."""
    log_event(logger, event, job_id=attempt.job_id, run=attempt.run, step=attempt.step, attempt=attempt.number,
              upstream_key=attempt.upstream_key, model=attempt.model_name, **fields)


def log_end(attempt: Attempt) -> None:
    """attempt.succeeded, attempt.failed or attempt.uncertain: how it ended, what it cost, how long it took.
    The provider's words stay on the record (they may quote the input)."""
    log(f"attempt.{AttemptState(attempt.state).value}", attempt, error_class=attempt.error_class,
        last_status=attempt.last_status, sends=attempt.sends, cost_usd=attempt.cost_usd,
        cost_source=attempt.cost_source or None, duration_ms=attempt.duration_ms)
