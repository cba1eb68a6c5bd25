"""The durable step runner: Celery moves the work, Postgres remembers it
(docs/design.md, "How a job runs: durable steps").

It runs a recipe's stages (jobs.engine.workflow) on a job's `Step` rows (jobs.engine.steps). Every step is safe to
deliver twice:

- a `done` step returns its stored result and does nothing else;
- a step with effects outside the database claims a lease by conditional upsert; a second execution that
  finds a live lease attaches (waits, re-reads, returns the result) instead of doing the work again;
  the holder renews the lease while it works, and a lease that ran out (a dead worker) is taken over;
- a step marks itself `done` in the same transaction as its own database effects.

The runner talks only to the database. It answers with an outcome of jobs.engine.outcomes, which the task layer
(jobs.engine.tasks) turns into Celery actions, so every path here can be driven directly from a test.
"""

import functools
import logging
from contextlib import contextmanager, nullcontext
from datetime import datetime

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from config.db import db_error_recurs
from config import tracing
from config.logs import log_context
from config.retry import backoff_s, jittered
from jobs import selectors, services
from jobs.kinds import KINDS
from jobs.models import JobStatus, StepStatus
from jobs.engine.outcomes import (
    Continue,
    Done,
    FanOut,
    JobFailure,
    JobHold,
    JobInputError,
    Kept,
    Later,
    NotStarted,
    NotYet,
    Resume,
    StepRetry,
    Stop,
)
from jobs.engine.steps import (
    Claim,
    DoneMark,
    FirstStart,
    Marked,
    StepContext,
    StepRow,
    step_adopt,
    step_attach,
    step_claim,
    step_end_failed,
    step_heartbeat,
    step_hold_for_retry,
    step_renew_lease,
)
from jobs.engine.workflow import Effect, Recipe, Stage, StepSpec

logger = logging.getLogger(__name__)

# How long a READ step waits before it is tried again after an error that may pass.
READ_RETRY_S = 5.0


class _LostRace(Exception):
    """Another execution committed this step first; read its result instead of ours."""


# --- entry points ------------------------------------------------------------------------------------------


def _load(job_id, run: int, owner: str, chain: str | None, rung: bool = False, started: bool = False,
          start: FirstStart | None = None) -> tuple[StepContext | None, Stop | None]:
    """The job and its current run's steps; or why this execution has nothing to do."""
    job = selectors.job_with_steps(job_id)
    if job is None:
        return None, Stop("no such job")
    if start is FirstStart.ONLY_CHOICE and (job.run != run or job.status != JobStatus.QUEUED):
        # A doorbell whose job another doorbell started (or that ended, or was retried): it starts whichever
        # job is the fairest instead (jobs.dispatch.job_start), never nothing.
        return None, Stop(f"not queued (run {job.run}, {job.status})", undecided=True)
    if job.run != run:
        return None, Stop(f"run {run} was replaced by run {job.run}")
    if job.status != JobStatus.QUEUED:
        start = None  # a first stage sent again, its job running already: run it as named
    ctx = StepContext(job=job, task_id=owner, chain=chain or owner, rung=rung, started=started, start=start)
    for row in job.step_rows:
        lease_until = datetime.fromisoformat(row["lease_until"]) if row["lease_until"] else None
        ctx.rows[row["name"]] = StepRow(**{**row, "lease_until": lease_until})
    if job.status not in (JobStatus.QUEUED, JobStatus.RUNNING):
        return ctx, Stop("cancelled" if job.status == JobStatus.CANCELLED else f"job is {job.status}")
    return ctx, None


def _stopped(ctx: StepContext | None, stop: Stop) -> Stop:
    """A chain that finds its job cancelled stops its upstream work on the way out."""
    if ctx is not None and ctx.job.status == JobStatus.CANCELLED:
        recipe = KINDS[ctx.job.kind].recipe
        if recipe.on_cancel is not None:
            again_s = recipe.on_cancel(ctx)
            if again_s is not None:
                return Stop(stop.reason, again_s=again_s)
    return stop


def run_stage(*, job_id, run: int, stage: str, owner: str, chain: str | None = None, rung: bool = False,
              started: bool = False, start: FirstStart | None = None):
    """Run a stage of a job's run, then the stages after it, inline, for as long as none has to wait: a
    render the provider finished at submit needs no message to wait for it. Answers with an outcome of
    jobs.engine.outcomes (its table says what each means for the chain). `rung`: a provider called back, so a
    waiting step looks now rather than on its schedule; `started`: the caller has just started the job
    (jobs.dispatch), so it is running already; `start`: the job starts in its first transaction (Stop with
    `undecided` when it may not: fair dispatch then decides, jobs.engine.tasks)."""
    ctx, stop = _load(job_id, run, owner, chain, rung, started, start)
    if stop:
        return _stopped(ctx, stop)
    recipe = KINDS[ctx.job.kind].recipe
    first = recipe.index(stage)
    unfinished = _unfinished_before(ctx, recipe, first)
    if unfinished is not None:
        # No chain sends a stage before the ones it follows have ended (links go out as each stage
        # ends; the sweeper resumes at the first unfinished one). A stage delivered early anyway would
        # act on results that do not exist yet: it stops, and the chain that runs the earlier stage
        # carries on.
        return Stop(f"stage {stage} waits for step {unfinished}")
    for index in range(first, len(recipe.stages)):
        outcome = _run_one_stage(ctx, recipe, recipe.stages[index])
        if isinstance(outcome, Continue):
            continue
        if isinstance(outcome, Later) and recipe.stages[index].waits and ctx.job.holds_slot:
            # Waiting on its provider now: no longer work in progress, so no slot of its client's
            # running limit is held (jobs.dispatch).
            services.job_release_slot(job_id=ctx.job.id)
            ctx.job.holds_slot = False
        if isinstance(outcome, Later) and index > first and _hand_over(outcome, index - first):
            # A later stage has to wait: hand it over. The chain's next link is that stage, sent with
            # a countdown; a stage further on is resumed with a chain of its own.
            return Continue(outcome.countdown) if index == first + 1 else Resume(ctx.job.kind, index, outcome.countdown)
        return outcome
    return Done()


def _hand_over(later: Later, links_on: int) -> bool:
    """Whether a later stage's pause can go to another task: only when whoever runs the stage next can take
    the step's lease back. A back-off keeps the lease for this very task id (Kept.TASK): handed to the
    chain's next link, the retry would find the step held by its own predecessor and wait for the lease to
    run out (STEP_LEASE_S, not the back-off); so this task is sent again instead, and passes the stages it
    ran (done) on its way. A chain's polling lease (Kept.CHAIN) goes with the chain's next link, not with a
    new chain (Resume)."""
    if later.kept is Kept.TASK:
        return False
    return later.kept is None or links_on == 1


def _unfinished_before(ctx: StepContext, recipe: Recipe, index: int) -> str | None:
    """A step of a stage before `index` that is not done, or None."""
    for stage in recipe.stages[:index]:
        for name in stage.step_names():
            if not (ctx.rows.get(name) and ctx.rows[name].status == StepStatus.DONE):
                return name
    return None


def _run_one_stage(ctx: StepContext, recipe: Recipe, stage: Stage):
    if stage.fanout is not None:
        return _fan_out(ctx, recipe, stage)
    groups = _groups(stage.steps)
    for index, group in enumerate(groups):
        after = groups[index + 1][0] if index + 1 < len(groups) else None
        leased_next = after is not None and after.effect in (Effect.EXTERNAL, Effect.WAIT) and not _ended(ctx, after)
        outcome = _run_step(ctx, *group, then=after if leased_next else None)
        if outcome is not None:
            return outcome
    return _flush(ctx) or Continue()


def _ended(ctx: StepContext, spec: StepSpec) -> bool:
    row = ctx.rows.get(spec.name)
    return row is not None and row.status in (StepStatus.DONE, StepStatus.FAILED)


def _groups(specs) -> list[list[StepSpec]]:
    """Consecutive database-only steps share one transaction (each still its own row); any other step
    stands alone, because it talks to the network and no transaction stays open across that. What a
    stage commits is still as few transactions as it can be: a READ step's done mark waits for the next
    one (StepContext.deferred), and a group followed by a leased step claims that lease in its own
    transaction (StepContext.claimed)."""
    groups: list[list[StepSpec]] = []
    for spec in specs:
        if spec.effect is Effect.DB and groups and groups[-1][-1].effect is Effect.DB:
            groups[-1].append(spec)
        else:
            groups.append([spec])
    return groups


def run_substep(*, job_id, run: int, stage: str, key: str, owner: str, chain: str | None = None,
                lead: bool = False):
    """Run one sub-step of a fan-out stage, then join the stage if every sub-step has ended. The stage's
    lead (`lead`) sends the sub-steps held back for it instead."""
    ctx, stop = _load(job_id, run, owner, chain)
    if stop:
        return _stopped(ctx, stop)
    recipe = KINDS[ctx.job.kind].recipe
    fanout = recipe.stages[recipe.index(stage)].fanout
    spec = StepSpec(fanout.step_name(key), lambda c: fanout.fn(c, key), Effect.EXTERNAL)
    try:
        outcome = _run_step(ctx, spec, fail_job=False)
    except JobInputError as failure:  # not the chapter's: every run would meet it again, so the run ends
        return _end_run(ctx, failure, spec.name)
    except JobFailure as failure:  # a sub-step's failure is its own; the stage after the join decides
        step_end_failed(ctx, spec.name, {"error": failure.as_error()})
        outcome = None
    if outcome is not None:
        return outcome
    held = _after_lead(ctx, fanout, key) if lead else []
    if held:
        return FanOut(stage, held)
    return _join(ctx, recipe, recipe.index(stage))


def stop_cancelled(*, job_id, run: int, owner: str) -> Stop:
    """A cancel won: run the recipe's cancel hook now rather than at the job's next poll."""
    ctx, stop = _load(job_id, run, owner, None)
    return _stopped(ctx, stop) if stop else Stop("not cancelled")


def resume_point(job) -> int | None:
    """The first stage of the job's current run with a step not yet done (None: every stage is done)."""
    recipe = KINDS[job.kind].recipe
    done = selectors.done_step_names(job_id=job.id, run=job.run)
    for index, stage in enumerate(recipe.stages):
        if not set(stage.step_names()) <= done:
            return index
    return None


# --- one step ----------------------------------------------------------------------------------------------


def _run_step(ctx: StepContext, *specs: StepSpec, fail_job: bool = True, then: StepSpec | None = None):
    """Run one step (or a group of database-only steps) unless it is done; end the job on a failure.
    `then`: the leased step after a group, whose lease the group's transaction claims."""
    pending = []
    for spec in specs:
        row = ctx.rows.get(spec.name)
        if row is not None and row.status == StepStatus.FAILED:
            return Stop(f"step {spec.name} failed")
        if row is None or row.status != StepStatus.DONE:  # a completed step is never re-run
            pending.append(spec)
    if not pending:
        return None
    spec = pending[0]
    try:
        with _recurring_db_errors_end_the_run():
            if spec.effect is Effect.DB:
                return _run_db(ctx, pending, then)
            if spec.effect is Effect.READ:
                return _run_read(ctx, spec)
            if spec.effect is Effect.EXTERNAL:
                return _run_external(ctx, spec)
            return _run_wait(ctx, spec)
    except JobFailure as failure:  # JobHold too: the run ends here, waiting for a person or failed
        if not fail_job:
            raise
        return _end_run(ctx, failure, getattr(failure, "step", spec.name))
    except NotStarted:  # rolled back, the job still queued: fair dispatch decides what this message starts
        return Stop("not started in its first transaction", undecided=True)


@contextmanager
def _recurring_db_errors_end_the_run():
    """A database error that will recur (config.db.db_error_recurs: a value too long for its column, a
    check constraint) becomes JobInputError, which ends the run: left to escape, the task would fail,
    the job stay open, and every sweep resume it into the same error, for ever. Any other database
    error (a connection cut, a restart, a deadlock) still escapes, and the sweeper resumes the job as
    it always did. Raised after the transaction that met the error has rolled back (every `atomic`
    the step opened lies inside this block), so ending the run writes on a clean connection."""
    try:
        yield
    except DatabaseError as exc:
        if not db_error_recurs(exc):
            raise
        logger.warning("a step met a database error that will recur: %s", exc)
        raise JobInputError(exc) from exc


def _end_run(ctx: StepContext, failure: JobFailure, step_name: str) -> Stop:
    """The run ends on a failure: the job held for a person (JobHold) or failed, its event written in the
    same transaction (jobs.services), and the step that failed recorded so (never run again)."""
    error = failure.as_error()
    with transaction.atomic():
        if isinstance(failure, JobHold):
            services.job_hold(job_id=ctx.job.id, run=ctx.run, error=error)
        else:
            services.job_finish(job_id=ctx.job.id, status=JobStatus.FAILED, error=error)
        step_end_failed(ctx, step_name, {"error": error})
    return Stop(f"{'held' if isinstance(failure, JobHold) else 'failed'}: {failure.code}")


def _run_db(ctx: StepContext, specs: list[StepSpec], then: StepSpec | None = None):
    """The group's effects, its done marks with the READ marks deferred before it (one INSERT), and the
    lease of the step after it: one transaction, one commit."""
    marks = list(ctx.deferred)
    try:
        with transaction.atomic():
            for spec in specs:
                try:
                    with log_context(job_id=ctx.job.id, run=ctx.run, step=spec.name), _recurring_db_errors_end_the_run():
                        marks.append((spec.name, spec.fn(ctx)))
                except JobFailure as failure:
                    failure.step = spec.name  # the whole group rolls back; this step is the one that failed
                    raise
            if not DoneMark.write_all(ctx, marks):
                raise _LostRace  # rolls back our effects: the other execution's stand
            ctx.deferred.clear()
            if then is not None:
                ctx.claimed[then.name] = _claim(ctx, then)
    except _LostRace:
        return _adopt_all(ctx, [name for name, _ in marks])
    return None


def _adopt_all(ctx: StepContext, names: list[str]):
    """Another execution recorded one of these steps first: take what it recorded for each of them."""
    ctx.deferred.clear()
    for name in names:
        outcome = step_adopt(ctx, name)
        if outcome is not None:
            return outcome
    return None


def _flush(ctx: StepContext):
    """Write the READ marks still deferred (the end of a stage). None, or what adopting them says."""
    if ctx.deferred and not DoneMark.write_all(ctx, ctx.deferred):
        return _adopt_all(ctx, [name for name, _ in ctx.deferred])
    ctx.deferred.clear()
    return None


def _claim(ctx: StepContext, spec: StepSpec):
    """Claim a leased step: an EXTERNAL step's lease is this execution's; a WAIT step's polling lease is
    the chain's, across its polls."""
    if spec.effect is Effect.WAIT:
        return step_claim(ctx, spec.name, settings.POLL_INTERVAL_S + settings.STEP_LEASE_S, owner=ctx.chain)
    return step_claim(ctx, spec.name, settings.STEP_LEASE_S)


def _claim_leased(ctx: StepContext, spec: StepSpec) -> tuple[Claim, StepRow] | Stop | Later:
    """The step's lease: claimed ahead by the group before it, or now, in one transaction with the READ
    marks deferred before it (they are written before anything leaves the database). Or, when another
    execution recorded one of those reads first and what it recorded ends this pass, that outcome."""
    if spec.name in ctx.claimed:
        return ctx.claimed.pop(spec.name)
    if not ctx.deferred:
        return _claim(ctx, spec)
    marks = list(ctx.deferred)
    try:
        with transaction.atomic():
            if not DoneMark.write_all(ctx, marks):
                raise _LostRace
            ctx.deferred.clear()
            return _claim(ctx, spec)
    except _LostRace:
        outcome = _adopt_all(ctx, [name for name, _ in marks])
        if outcome is not None:
            return outcome
        return _claim(ctx, spec)  # the other execution's reads stand; this step reads them (ctx.rows)


def _logged_as_step(run_step):
    """A step's code logs with its job, run and step (config.logs.log_context): a line of a provider, the
    store or billing says which step it came from without being told. And it runs in its span (_step_span)."""

    @functools.wraps(run_step)
    def run(ctx: StepContext, spec: StepSpec, *args, **kwargs):
        with log_context(job_id=ctx.job.id, run=ctx.run, step=spec.name), _step_span(ctx, spec):
            return run_step(ctx, spec, *args, **kwargs)

    return run


def _step_span(ctx: StepContext, spec: StepSpec):
    """The step's span in its run's trace (config.tracing.job_span), whatever message woke this execution."""
    if not tracing.enabled():
        return nullcontext()
    return tracing.job_span(f"payonce.step {spec.name}", ctx.job.trace_context, **{
        "payonce.job_id": str(ctx.job.id), "payonce.run": ctx.run, "payonce.step": spec.name,
        "payonce.kind": ctx.job.kind, "payonce.rung": ctx.rung or None})


@_logged_as_step
def _run_read(ctx: StepContext, spec: StepSpec):
    try:
        result = spec.fn(ctx)
    except StepRetry as retry:
        # A read that may pass (the output store unreachable): no lease to keep, so the job's enqueue
        # lease is pushed past the pause instead, and the sweeper does not send a second chain meanwhile.
        countdown = retry.countdown if retry.countdown is not None else jittered(READ_RETRY_S)
        services.job_extend_enqueue_lease(job_id=ctx.job.id, seconds=countdown + settings.ENQUEUE_LEASE_S)
        logger.info("job %s step %s: %s; again in %.1fs", ctx.job.id, spec.name, retry.reason, countdown)
        return Later(countdown)
    ctx.deferred.append((spec.name, result))  # written with the next transaction (StepContext.deferred)
    ctx.rows[spec.name] = StepRow(0, spec.name, StepStatus.DONE, result, 1, ctx.owner)
    return None


@_logged_as_step
def _run_external(ctx: StepContext, spec: StepSpec):
    claimed = _claim_leased(ctx, spec)
    if isinstance(claimed, (Stop, Later)):
        return claimed
    claim, row = claimed
    if claim is Claim.HELD:
        claim, row = step_attach(ctx, spec.name)
    if claim is Claim.HELD:
        return Later(max(1.0, min(settings.STEP_LEASE_S, 5.0)))
    if claim is not Claim.CLAIMED:  # done or failed meanwhile: step_claim read the row into ctx.rows
        return None if claim is Claim.DONE else Stop(f"step {spec.name} failed")
    ctx.done_mark = mark = DoneMark.leased(ctx, row, ctx.owner)
    with step_heartbeat(row.id, ctx.owner, settings.STEP_LEASE_S) as lost:
        try:
            result = spec.fn(ctx)
        except StepRetry as retry:
            return _back_off(ctx, row, retry)
    if lost.is_set():
        logger.warning("job %s step %s: lease lost while working; attaching", ctx.job.id, spec.name)
    return _record_done(ctx, mark, result)


def _run_ready(ctx: StepContext, spec: StepSpec) -> tuple[bool, Stop | None]:
    """A wait that is over before it starts (StepSpec.ready): its writes and its done mark (a fresh one:
    no lease) in one statement. (True, outcome) when it ran (outcome None: go on); (False, None) when it
    must wait as usual."""
    mark = DoneMark.fresh(ctx, spec.name)
    result = spec.ready(ctx, mark)
    if result is None:
        return False, None
    outcome = _record_done(ctx, mark, result)
    if isinstance(outcome, Later):  # another execution polls the step: it is that poller's
        return True, Stop(f"another poller holds {spec.name}")
    return True, outcome


@_logged_as_step
def _run_wait(ctx: StepContext, spec: StepSpec):
    """Claim the polling lease (held by the chain across its polls, so the sweeper can tell a live
    poller from a lost one, and a second chain stops instead of polling alongside), poll under a
    heartbeat (a poll may submit the next attempt), then record what it said."""
    if spec.ready is not None and not ctx.deferred:
        ran, outcome = _run_ready(ctx, spec)
        if ran:
            return outcome
    claimed = _claim_leased(ctx, spec)
    if isinstance(claimed, (Stop, Later)):
        return claimed
    claim, row = claimed
    if claim is Claim.HELD:
        return Stop(f"another poller holds {spec.name}")
    if claim is not Claim.CLAIMED:
        return None if claim is Claim.DONE else Stop(f"step {spec.name} failed")
    ctx.done_mark = mark = DoneMark.leased(ctx, row, ctx.chain)
    with step_heartbeat(row.id, ctx.chain, settings.STEP_LEASE_S):
        try:
            result = spec.fn(ctx)
        except StepRetry as retry:
            return _back_off(ctx, row, retry, owner=ctx.chain)
        except NotYet as not_yet:  # the next look is scheduled (executor.policy.next_poll_s)
            # The lease covers the pause: the sweeper tells a live poller from a lost one by it.
            step_renew_lease(row.id, ctx.chain, not_yet.countdown + settings.STEP_LEASE_S)
            return Later(not_yet.countdown, kept=Kept.CHAIN)
    return _record_done(ctx, mark, result)


def _record_done(ctx: StepContext, mark: DoneMark, result):
    """The step is done: its mark written alone, unless the work carried it with its own last write (then
    the step's result is the one that mark wrote). If the mark was lost (a lease that ran out and was taken
    over, or a fresh row another execution recorded first), take the other execution's outcome."""
    ctx.done_mark = None
    if mark.state is None:
        mark.write(result)
    if mark.state is Marked.LOST:
        return step_adopt(ctx, mark.name)
    return None


def _back_off(ctx: StepContext, row: StepRow, retry: StepRetry, *, owner: str | None = None) -> Later:
    """Pause the step (its lease kept across the pause, reserved for this task or chain)."""
    countdown = retry.countdown if retry.countdown is not None else backoff_s(row.attempts, cap=min(30.0, settings.RETRY_BACKOFF_MAX_S))
    step_hold_for_retry(row.id, owner or ctx.owner, owner or ctx.task_id, countdown + settings.STEP_LEASE_S)
    logger.info("job %s step %s: %s; again in %.1fs", ctx.job.id, row.name, retry.reason, countdown)
    return Later(countdown, kept=Kept.CHAIN if owner else Kept.TASK)


# --- fan-out -----------------------------------------------------------------------------------------------


def _fan_out(ctx: StepContext, recipe: Recipe, stage: Stage):
    fanout = stage.fanout
    if ctx.result(fanout.join_name) is not None:
        return Continue()
    pending = _pending(ctx, fanout)  # resume only the missing ones
    if not pending:
        return _join(ctx, recipe, recipe.index(stage.name))
    lead = _lead(ctx, fanout, pending)
    if lead is not None:
        if lead in pending:
            return FanOut(stage.name, [lead], lead=True)
        return Stop("the lead sub-step runs; the rest follow it")
    return FanOut(stage.name, pending)


def _lead(ctx: StepContext, fanout, pending: list[str]) -> str | None:
    """The sub-step that goes alone first (FanOutSpec.lead), while no sub-step of the stage has ended in
    this run; None once one has (or when the stage has no lead): then the rest go at once."""
    if fanout.lead is None:
        return None
    names = [fanout.step_name(key) for key in fanout.keys(ctx)]
    if any(ctx.rows.get(name) is not None and ctx.rows[name].status in (StepStatus.DONE, StepStatus.FAILED)
           for name in names):
        return None
    running = [key for key in fanout.keys(ctx) if key not in pending]  # alive: the lead, sent before
    return running[0] if running else fanout.lead(ctx, pending)


def _pending(ctx: StepContext, fanout) -> list[str]:
    """The stage's keys whose sub-step has not ended and is not running (under a live lease)."""
    now = timezone.now()
    pending = []
    for key in fanout.keys(ctx):
        row = ctx.rows.get(fanout.step_name(key))
        ended = row is not None and row.status in (StepStatus.DONE, StepStatus.FAILED)
        alive = row is not None and row.status == StepStatus.RUNNING and row.lease_until and row.lease_until > now
        if not ended and not alive:
            pending.append(key)
    return pending


def _after_lead(ctx: StepContext, fanout, key: str) -> list[str]:
    """The keys held back for the lead sub-step `key`, now that it has ended (ctx.rows were read before
    it ran, so its own row is left out by name)."""
    return [other for other in _pending(ctx, fanout) if other != key]


def _join(ctx: StepContext, recipe: Recipe, index: int):
    """Continue the run once every sub-step has ended. Many sub-steps may finish at once; the join's own
    step row is inserted once, so exactly one of them continues the run."""
    fanout = recipe.stages[index].fanout
    names = [fanout.step_name(key) for key in fanout.keys(ctx)]
    if selectors.ended_step_count(job_id=ctx.job.id, run=ctx.run, names=names) < len(names):
        return Stop("waiting for sibling sub-steps")
    if not DoneMark.fresh(ctx, fanout.join_name).write({"steps": len(names)}):
        return Stop("another sub-step joined the stage")
    if index + 1 >= len(recipe.stages):
        return Stop("fan-out was the last stage")
    return Resume(ctx.job.kind, index + 1)
