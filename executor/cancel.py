"""A cancelled job's attempts: stopped upstream where the provider can, and ended on the record, so none is
left holding money (docs/design.md, "A job's life": an API cancel is final)."""

import logging

from django.db import transaction

from config.metrics import count
from executor import record, services
from executor import tracing as provider_tracing
from executor.models import Attempt, AttemptState
from executor.providers.base import ErrorClass
from executor.record import Money
from executor.render import SUBMIT_STEP

logger = logging.getLogger(__name__)


def cancel_current(job) -> float | None:
    """The job was cancelled: stop its running render upstream where the provider can, and end it on the
    record (cancelled, with its duration; what it cost stays). An attempt still `submitting` is left to
    the execution sending it while its answer may still come (that answer must reach the record first),
    then ended here (_end_orphaned_intent). Returns the seconds until it should be looked at again, or
    None."""
    return _cancel_out(record.latest(job, step=SUBMIT_STEP))


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
        # Row by row: one attempt that cannot be ended (its provider's cancel raising, a row the code cannot
        # read) is logged and skipped, and the pass goes on. The trial found the pass stopped at the first
        # failing attempt, and another client's cancelled attempt held its reservation for seven sweeps.
        try:
            if _cancel_out(attempt) is None:  # None: ended; a float: its send's answer may still come
                count("sweeper_recoveries", what="cancelled_attempt")
        except Exception:  # noqa: BLE001 - the next sweep tries it again; the others must not wait for it
            logger.exception("sweeper: could not end cancelled attempt %s; skipped", attempt.upstream_key,
                             extra={"job_id": attempt.job_id, "upstream_key": attempt.upstream_key})
            count("sweep_errors", sweep="cancelled_attempts")
    return len(out)


def _cancel_out(current: Attempt | None) -> float | None:
    if current is not None and current.state == AttemptState.SUBMITTING:
        return _end_orphaned_intent(current)
    if current is None or current.state != AttemptState.RUNNING:
        return None
    if current.upstream_id:
        services.cancel_upstream(record.attempt_spec(current), current.upstream_id)  # as it went out
    # Conditional on `running`: a poll that saw the render finish at the same moment keeps its success.
    record.end(current, AttemptState.FAILED, expect=AttemptState.RUNNING, money=Money.SETTLE,
               error_class=ErrorClass.CANCELLED, error="the job was cancelled")
    return None


def _end_orphaned_intent(attempt: Attempt) -> float | None:
    """A cancelled job's attempt still `submitting`: the chain stops at the cancel, so no execution will
    resolve it, and its reservation would stay held forever (the storm found one: an upload failed, was
    given back, then the cancel came). Once no answer can still arrive (its last send can no longer
    land: record.may_still_land_s), it ends: with no send out, `failed` and released; after a send,
    `uncertain` and kept as spent, unpriced (it may have been paid, and a cancel is a person's decision,
    as job_cancel keeps uncertain spend). Conditional on (`submitting`, `sends`): a send claims the
    attempt by bumping `sends` first (record.claim_send), so a send that claimed it a moment ago keeps
    it and this changes nothing. Returns how long until it may be ended, when that is not yet."""
    may_land_s = record.may_still_land_s(attempt)
    if attempt.sends and may_land_s > 0:
        return may_land_s  # its answer may still come, to the execution that sent it
    unsent = attempt.sends == 0
    if not unsent:  # a sender that died with its call out never ended the call's span: emitted before the end
        provider_tracing.orphan_ended(attempt)
    state = AttemptState.FAILED if unsent else AttemptState.UNCERTAIN
    error_class = ErrorClass.CANCELLED if unsent else attempt.error_class
    money = Money.RELEASE if unsent else Money.KEEP
    with transaction.atomic():
        ended = Attempt.objects.filter(id=attempt.id, state=AttemptState.SUBMITTING, sends=attempt.sends).update(
            state=state, error_class=error_class,
            error="the job was cancelled before it was sent" if unsent else
            "the job was cancelled while the outcome of its send was unknown",
            **record.end_fields(attempt, money=money, fields={}))
        if ended:
            record.move_money(attempt.upstream_key, money, cost=None)
            record.log(f"attempt.{state.value}", attempt, error_class=error_class)
    return None
