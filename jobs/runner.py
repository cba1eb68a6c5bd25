"""The durable step runner: Celery moves the work, Postgres remembers it (DESIGN.md, section 2).

A recipe is a list of stages; a stage is one Celery task running one or more steps, each its own `Step`
row (a checkpoint is a row, not a message). A stage ends where the job must wait (a polling step) or fan
out (parallel sub-steps). Every step is safe to deliver twice:

- a `done` step returns its stored result and does nothing else;
- a step with effects outside the database claims a lease by conditional upsert; a second execution that
  finds a live lease attaches (waits, re-reads, returns the result) instead of doing the work again;
  the holder renews the lease while it works, and a lease that ran out (a dead worker) is taken over;
- a step marks itself `done` in the same transaction as its own database effects.

The runner talks only to the database. It returns an outcome that the task layer (jobs.tasks) turns into
Celery actions, so every path here can be driven directly from a test.
"""

import enum
import logging
import random
import threading
import time
import uuid
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Callable

from django.conf import settings
from django.db import connection, connections, transaction
from django.db.models.functions import Now
from django.utils import timezone

from jobs import services
from jobs.models import Job, JobStatus, Step, StepStatus
from jobs.outcomes import JobFailure, JobHold, StepRetry

logger = logging.getLogger(__name__)


class Effect(enum.Enum):
    DB = "db"  # only database effects: they and the done mark commit together
    READ = "read"  # reads outside the database (or effects that are idempotent by key): run, then mark done
    EXTERNAL = "external"  # effects outside the database: lease, heartbeat, then mark done
    WAIT = "wait"  # polls something slow: holds a lease across polls, re-scheduled until finished


@dataclass(frozen=True)
class StepSpec:
    name: str
    fn: Callable  # fn(ctx) -> JSON result; a WAIT step returns None while it is still waiting
    effect: Effect
    # EXTERNAL only: database effects committed with the claim (intent before spend) ...
    claim: Callable | None = None  # claim(ctx) -> None
    # ... and with the done mark.
    apply: Callable | None = None  # apply(ctx, result) -> None


@dataclass(frozen=True)
class FanOutSpec:
    """Parallel sub-steps of one stage, one `Step` row each (`{name}-{key}`), joined when all have ended."""

    name: str
    keys: Callable  # keys(ctx) -> list[str]
    fn: Callable  # fn(ctx, key) -> JSON result (an EXTERNAL effect)

    def step_name(self, key: str) -> str:
        return f"{self.name}-{key}"

    @property
    def join_name(self) -> str:
        return f"{self.name}:joined"


@dataclass(frozen=True)
class Stage:
    name: str
    steps: tuple[StepSpec, ...] = ()
    fanout: FanOutSpec | None = None

    @property
    def waits(self) -> bool:
        """A stage that polls: as a later link of a chain it is sent with a countdown (the stage before
        it already polled once, inline)."""
        return any(spec.effect is Effect.WAIT for spec in self.steps)

    def step_names(self) -> list[str]:
        return [self.fanout.join_name] if self.fanout else [spec.name for spec in self.steps]


@dataclass(frozen=True)
class Recipe:
    kind: str
    stages: tuple[Stage, ...]
    on_cancel: Callable | None = None  # on_cancel(ctx): stop upstream work of a cancelled job

    def index(self, stage_name: str) -> int:
        return next(i for i, stage in enumerate(self.stages) if stage.name == stage_name)


RECIPES: dict[str, Recipe] = {}


def recipe_register(recipe: Recipe) -> Recipe:
    RECIPES[recipe.kind] = recipe
    return recipe


# --- outcomes ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Continue:
    """The stage is done: the chain goes on."""


@dataclass(frozen=True)
class Done:
    """The run went through its last stage: nothing is left for the chain."""


@dataclass(frozen=True)
class Stop:
    """Nothing more for this chain: the job ended, moved on to another run, or someone else carries it."""

    reason: str


@dataclass(frozen=True)
class Later:
    """Run this stage again after `countdown` seconds (a poll, a back-off, a lease held elsewhere)."""

    countdown: float


@dataclass(frozen=True)
class FanOut:
    """Start these sub-steps in parallel; their join continues the run."""

    stage: str
    keys: list[str]


@dataclass(frozen=True)
class Resume:
    """Start the rest of the run from this stage (after a fan-out joined, or from the sweeper)."""

    kind: str
    stage_index: int
    countdown: float = 0.0


# --- context -----------------------------------------------------------------------------------------------


@dataclass
class StepRow:
    """What the runner needs of a `Step` row (read with plain SQL: this is the hot path of every job)."""

    id: int
    name: str
    status: str
    result: object = None
    attempts: int = 1
    lease_owner: str = ""
    lease_until: datetime | None = None


@dataclass
class StepContext:
    """One execution of a task on one job.

    Leases name their holder. `owner` is this execution (the task id plus a nonce: two deliveries of one
    message are two executions); `task_id` alone is what a step that backs off reserves its lease for,
    so the task sent again after the pause takes it back; `chain` (the Celery root id, shared by every
    link and re-send of one chain) holds a polling step's lease across polls and links.
    """

    job: Job
    task_id: str
    chain: str
    owner: str = ""
    rows: dict[str, StepRow] = field(default_factory=dict)

    def __post_init__(self):
        self.owner = self.owner or f"{self.task_id}#{uuid.uuid4().hex[:8]}"

    @property
    def run(self) -> int:
        return self.job.run

    def result(self, name: str, default=None):
        row = self.rows.get(name)
        return row.result if row is not None and row.status == StepStatus.DONE else default


# How long a READ step waits before it is tried again after an error that may pass.
READ_RETRY_S = 5.0


class _LostRace(Exception):
    """Another execution committed this step first; read its result instead of ours."""


# --- entry points ------------------------------------------------------------------------------------------


# The job and the steps of its current run, in one statement.
_LOAD_SQL = """
SELECT j.*, (SELECT coalesce(json_agg(json_build_object(
                 'id', s.id, 'name', s.name, 'status', s.status, 'result', s.result, 'attempts', s.attempts,
                 'lease_owner', s.lease_owner, 'lease_until', s.lease_until)), '[]'::json)
               FROM jobs_step s WHERE s.job_id = j.id AND s.run = j.run) AS step_rows
  FROM jobs_job j WHERE j.id = %s
"""


def _load(job_id, run: int, owner: str, chain: str | None) -> tuple[StepContext | None, Stop | None]:
    job = next(iter(Job.objects.raw(_LOAD_SQL, [job_id])), None)
    if job is None:
        return None, Stop("no such job")
    if job.run != run:
        return None, Stop(f"run {run} was replaced by run {job.run}")
    ctx = StepContext(job=job, task_id=owner, chain=chain or owner)
    for row in job.step_rows:
        lease_until = datetime.fromisoformat(row["lease_until"]) if row["lease_until"] else None
        ctx.rows[row["name"]] = StepRow(**{**row, "lease_until": lease_until})
    if job.status == JobStatus.CANCELLED:
        recipe = RECIPES[job.kind]
        if recipe.on_cancel is not None:
            recipe.on_cancel(ctx)
        return None, Stop("cancelled")
    if job.status not in (JobStatus.QUEUED, JobStatus.RUNNING):
        return None, Stop(f"job is {job.status}")
    return ctx, None


def run_stage(*, job_id, run: int, stage: str, owner: str, chain: str | None = None):
    """Run a stage of a job's run, then the stages after it, inline, for as long as none has to wait: a
    render the provider finished at submit needs no message to wait for it.

    Returns Later (run this stage again after a pause: a poll, a back-off), Continue (a later stage has
    to wait: the chain's next link, sent with a countdown, runs it), Done (the run went through its last
    stage: the chain's remaining links are not needed), Stop, FanOut or Resume.
    """
    ctx, stop = _load(job_id, run, owner, chain)
    if stop:
        return stop
    recipe = RECIPES[ctx.job.kind]
    first = recipe.index(stage)
    for index in range(first, len(recipe.stages)):
        outcome = _run_one_stage(ctx, recipe, recipe.stages[index])
        if isinstance(outcome, Continue):
            continue
        if isinstance(outcome, Later) and index > first:
            # A later stage has to wait: hand it over. The chain's next link is that stage, sent with
            # a countdown; a stage further on is resumed with a chain of its own.
            return Continue() if index == first + 1 else Resume(ctx.job.kind, index, outcome.countdown)
        return outcome
    return Done()


def _run_one_stage(ctx: StepContext, recipe: Recipe, stage: Stage):
    if stage.fanout is not None:
        return _fan_out(ctx, recipe, stage)
    for group in _groups(stage.steps):
        outcome = _run_step(ctx, *group)
        if outcome is not None:
            return outcome
    return Continue()


def _groups(specs) -> list[list[StepSpec]]:
    """Consecutive database-only steps share one transaction (each still its own row); any other step
    stands alone, because it talks to the network and no transaction stays open across that."""
    groups: list[list[StepSpec]] = []
    for spec in specs:
        if spec.effect is Effect.DB and groups and groups[-1][-1].effect is Effect.DB:
            groups[-1].append(spec)
        else:
            groups.append([spec])
    return groups


def run_substep(*, job_id, run: int, stage: str, key: str, owner: str, chain: str | None = None):
    """Run one sub-step of a fan-out stage, then join the stage if every sub-step has ended."""
    ctx, stop = _load(job_id, run, owner, chain)
    if stop:
        return stop
    recipe = RECIPES[ctx.job.kind]
    fanout = recipe.stages[recipe.index(stage)].fanout
    spec = StepSpec(fanout.step_name(key), lambda c: fanout.fn(c, key), Effect.EXTERNAL)
    try:
        outcome = _run_step(ctx, spec, fail_job=False)
    except JobFailure as failure:  # a sub-step's failure is its own; the stage after the join decides
        _upsert_ended(ctx, spec.name, StepStatus.FAILED, {"error": failure.as_error()})
        outcome = None
    if outcome is not None:
        return outcome
    return _join(ctx, recipe, recipe.index(stage))


def stop_cancelled(*, job_id, run: int, owner: str) -> Stop:
    """Run the recipe's cancel hook if the job was cancelled (loading it does exactly that)."""
    _, stop = _load(job_id, run, owner, None)
    return stop or Stop("not cancelled")


def resume_point(job: Job) -> int | None:
    """The first stage of the job's current run with a step not yet done (None: every stage is done)."""
    recipe = RECIPES[job.kind]
    done = set(Step.objects.filter(job=job, run=job.run, status=StepStatus.DONE).values_list("name", flat=True))
    for index, stage in enumerate(recipe.stages):
        if not set(stage.step_names()) <= done:
            return index
    return None


# --- one step ----------------------------------------------------------------------------------------------


def _run_step(ctx: StepContext, *specs: StepSpec, fail_job: bool = True):
    """Run one step (or a group of database-only steps) unless it is done; end the job on a failure."""
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
        if spec.effect is Effect.DB:
            return _run_db(ctx, pending)
        if spec.effect is Effect.READ:
            return _run_read(ctx, spec)
        if spec.effect is Effect.EXTERNAL:
            return _run_external(ctx, spec)
        return _run_wait(ctx, spec)
    except JobFailure as failure:  # JobHold too: the run ends here, waiting for a person or failed
        if not fail_job:
            raise
        error = failure.as_error()
        with transaction.atomic():
            if isinstance(failure, JobHold):
                services.job_hold(job_id=ctx.job.id, run=ctx.run, error=error)
            else:
                services.job_finish(job_id=ctx.job.id, status=JobStatus.FAILED, error=error)
            _upsert_ended(ctx, getattr(failure, "step", spec.name), StepStatus.FAILED, {"error": error})
        return Stop(f"{'held' if isinstance(failure, JobHold) else 'failed'}: {failure.code}")


def _run_db(ctx: StepContext, specs: list[StepSpec]):
    try:
        with transaction.atomic():
            for spec in specs:
                try:
                    result = spec.fn(ctx)
                except JobFailure as failure:
                    failure.step = spec.name  # the whole group rolls back; this step is the one that failed
                    raise
                if not _insert_done(ctx, spec.name, result):
                    raise _LostRace  # rolls back our effects: the other execution's stand
    except _LostRace:
        for spec in specs:
            outcome = _adopt(ctx, spec.name)
            if outcome is not None:
                return outcome
    return None


def _run_read(ctx: StepContext, spec: StepSpec):
    try:
        result = spec.fn(ctx)
    except StepRetry as retry:
        # A read that may pass (the output store unreachable): no lease to keep, so the job's enqueue
        # lease is pushed past the pause instead, and the sweeper does not send a second chain meanwhile.
        countdown = retry.countdown if retry.countdown is not None else READ_RETRY_S * random.uniform(0.8, 1.2)
        services.job_extend_enqueue_lease(job_id=ctx.job.id, seconds=countdown + settings.ENQUEUE_LEASE_S)
        logger.info("job %s step %s: %s; again in %.1fs", ctx.job.id, spec.name, retry.reason, countdown)
        return Later(countdown)
    if not _insert_done(ctx, spec.name, result):
        return _adopt(ctx, spec.name)
    return None


def _run_external(ctx: StepContext, spec: StepSpec):
    state, row = _claim(ctx, spec, settings.STEP_LEASE_S)
    if state == "held":
        state, row = _attach(ctx, spec)
    if state == "held":
        return Later(max(1.0, min(settings.STEP_LEASE_S, 5.0)))
    if state != "claimed":  # done or failed meanwhile: _claim read the row into ctx.rows
        return None if state == StepStatus.DONE else Stop(f"step {spec.name} failed")
    with _heartbeat(row.id, ctx.owner, settings.STEP_LEASE_S) as lost:
        try:
            result = spec.fn(ctx)
        except StepRetry as retry:
            return _back_off(ctx, row, retry)
    if lost.is_set():
        logger.warning("job %s step %s: lease lost while working; attaching", ctx.job.id, spec.name)
    return _record_done(ctx, spec, row, ctx.owner, result)


def _run_wait(ctx: StepContext, spec: StepSpec):
    """Claim the polling lease (held by the chain across its polls, so the sweeper can tell a live
    poller from a lost one, and a second chain stops instead of polling alongside), poll under a
    heartbeat (a poll may submit the next attempt), then record what it said."""
    state, row = _claim(ctx, spec, settings.POLL_INTERVAL_S + settings.STEP_LEASE_S, owner=ctx.chain)
    if state == "held":
        return Stop(f"another poller holds {spec.name}")
    if state != "claimed":
        return None if state == StepStatus.DONE else Stop(f"step {spec.name} failed")
    with _heartbeat(row.id, ctx.chain, settings.STEP_LEASE_S):
        try:
            result = spec.fn(ctx)
        except StepRetry as retry:
            return _back_off(ctx, row, retry, owner=ctx.chain)
    if result is None:
        Step.objects.filter(id=row.id, lease_owner=ctx.chain, status=StepStatus.RUNNING).update(
            lease_until=Now() + timedelta(seconds=settings.POLL_INTERVAL_S + settings.STEP_LEASE_S)
        )
        return Later(settings.POLL_INTERVAL_S)
    return _record_done(ctx, spec, row, ctx.chain, result)


def _record_done(ctx: StepContext, spec: StepSpec, row: StepRow, owner: str, result):
    """Mark a leased step done, with its `apply` effects in the same transaction (one statement alone
    needs no transaction of its own). If the lease was lost meanwhile, take the other execution's."""
    try:
        with transaction.atomic() if spec.apply is not None else nullcontext():
            if spec.apply is not None:
                spec.apply(ctx, result)
            if not _mark_done(row.id, owner, result):
                raise _LostRace  # our lease ran out and another execution took the step over
    except _LostRace:
        return _adopt(ctx, spec.name)
    ctx.rows[spec.name] = StepRow(row.id, spec.name, StepStatus.DONE, result, row.attempts, owner)
    return None


def _back_off(ctx: StepContext, row: StepRow, retry: StepRetry, *, owner: str | None = None) -> Later:
    """Keep the lease across the pause (so a duplicate attaches) but let it run out if our retry is lost.
    An execution's lease is reserved for its task id (the same task, sent again after the pause, takes it
    back); a chain's polling lease stays the chain's."""
    countdown = retry.countdown
    if countdown is None:
        countdown = min(2 ** max(row.attempts - 1, 0), 30) * random.uniform(0.8, 1.2)
    Step.objects.filter(id=row.id, lease_owner=owner or ctx.owner, status=StepStatus.RUNNING).update(
        lease_owner=owner or ctx.task_id, lease_until=Now() + timedelta(seconds=countdown + settings.STEP_LEASE_S)
    )
    logger.info("job %s step %s: %s; again in %.1fs", ctx.job.id, row.name, retry.reason, countdown)
    return Later(countdown)


# --- fan-out -----------------------------------------------------------------------------------------------


def _fan_out(ctx: StepContext, recipe: Recipe, stage: Stage):
    fanout = stage.fanout
    if ctx.result(fanout.join_name) is not None:
        return Continue()
    now = timezone.now()
    pending = []
    for key in fanout.keys(ctx):
        row = ctx.rows.get(fanout.step_name(key))
        ended = row is not None and row.status in (StepStatus.DONE, StepStatus.FAILED)
        alive = row is not None and row.status == StepStatus.RUNNING and row.lease_until and row.lease_until > now
        if not ended and not alive:
            pending.append(key)  # resume only the missing ones
    if not pending:
        return _join(ctx, recipe, recipe.index(stage.name))
    return FanOut(stage.name, pending)


def _join(ctx: StepContext, recipe: Recipe, index: int):
    """Continue the run once every sub-step has ended. Many sub-steps may finish at once; the join's own
    step row is inserted once, so exactly one of them continues the run."""
    fanout = recipe.stages[index].fanout
    names = [fanout.step_name(key) for key in fanout.keys(ctx)]
    ended = Step.objects.filter(
        job=ctx.job, run=ctx.run, name__in=names, status__in=[StepStatus.DONE, StepStatus.FAILED]
    ).count()
    if ended < len(names):
        return Stop("waiting for sibling sub-steps")
    if not _insert_done(ctx, fanout.join_name, {"steps": len(names)}):
        return Stop("another sub-step joined the stage")
    if index + 1 >= len(recipe.stages):
        return Stop("fan-out was the last stage")
    return Resume(ctx.job.kind, index + 1)


# --- leases ------------------------------------------------------------------------------------------------


_CLAIM_SQL = """
INSERT INTO jobs_step (job_id, run, name, status, result, attempts, lease_owner, lease_until, started_at)
VALUES (%(job)s, %(run)s, %(name)s, 'running', NULL, 1, %(owner)s, now() + %(lease)s, now())
ON CONFLICT ON CONSTRAINT step_job_run_name DO UPDATE
   SET lease_owner = EXCLUDED.lease_owner, lease_until = EXCLUDED.lease_until, attempts = jobs_step.attempts + 1
 WHERE jobs_step.status = 'running'
   AND (jobs_step.lease_until < now() OR jobs_step.lease_owner IN (EXCLUDED.lease_owner, %(reserved)s))
RETURNING id, attempts, lease_until
"""


def _claim(ctx: StepContext, spec: StepSpec, lease_s: float, *, owner: str | None = None) -> tuple[str, StepRow]:
    """Claim the step's lease: the row is new, its lease ran out (a dead holder), it is ours, or it was
    reserved for this task (sent again after a back-off). Returns ("claimed" | "done" | "failed" | "held", row).

    The upsert's WHERE decides a race between two executions: Postgres serialises them on the row, the
    second re-evaluates the WHERE against the first's lease and gets no row back.
    """
    owner = owner or ctx.owner
    params = {"job": ctx.job.id, "run": ctx.run, "name": spec.name, "owner": owner, "reserved": ctx.task_id,
              "lease": timedelta(seconds=lease_s)}
    with transaction.atomic() if spec.claim is not None else nullcontext():
        with connection.cursor() as cursor:
            cursor.execute(_CLAIM_SQL, params)
            claimed = cursor.fetchone()
        if claimed is not None:
            row = StepRow(claimed[0], spec.name, StepStatus.RUNNING, None, claimed[1], owner, claimed[2])
            ctx.rows[spec.name] = row
            if spec.claim is not None:
                spec.claim(ctx)  # intent before spend: committed together with the lease
            return "claimed", row
    row = _reload(ctx, spec.name)
    if row.status == StepStatus.RUNNING:
        return "held", row
    return row.status, row


def _attach(ctx: StepContext, spec: StepSpec) -> tuple[str, StepRow]:
    """Another execution holds a live lease: wait for its result instead of doing the work again. If its
    lease runs out meanwhile (its worker died), take the step over."""
    deadline = time.monotonic() + settings.ATTACH_WAIT_S
    state, row = "held", None
    while time.monotonic() < deadline:
        time.sleep(0.2)
        state, row = _claim(ctx, spec, settings.STEP_LEASE_S)
        if state != "held":
            break
    return state, row


@contextmanager
def _heartbeat(step_id: int, owner: str, lease_s: float):
    """Renew the lease every third of its length while the work runs, from a thread of its own."""
    stop, lost = threading.Event(), threading.Event()

    def beat():
        try:
            while not stop.wait(lease_s / 3):
                renewed = Step.objects.filter(id=step_id, lease_owner=owner, status=StepStatus.RUNNING).update(
                    lease_until=Now() + timedelta(seconds=lease_s)
                )
                if not renewed:
                    lost.set()
                    return
        except Exception:
            logger.exception("heartbeat of step %s failed", step_id)
        finally:
            connections.close_all()  # this thread's connection goes back to the pool

    thread = threading.Thread(target=beat, name=f"heartbeat-{step_id}", daemon=True)
    thread.start()
    try:
        yield lost
    finally:
        stop.set()
        thread.join()


def _json(value):
    return Step._meta.get_field("result").get_db_prep_save(value, connection)


def _mark_done(step_id: int, owner: str, result) -> bool:
    """running -> done, only while we still hold the lease. Zero rows: another execution took over."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE jobs_step SET status = 'done', result = %s, lease_until = NULL, finished_at = now()"
            " WHERE id = %s AND lease_owner = %s AND status = 'running'",
            [_json(result), step_id, owner],
        )
        return cursor.rowcount == 1


_INSERT_DONE_SQL = """
INSERT INTO jobs_step (job_id, run, name, status, result, attempts, lease_owner, lease_until, started_at, finished_at)
VALUES (%s, %s, %s, 'done', %s, 1, %s, NULL, now(), now())
ON CONFLICT ON CONSTRAINT step_job_run_name DO NOTHING RETURNING id
"""


def _insert_done(ctx: StepContext, name: str, result) -> bool:
    """A step that needed no lease, recorded done. False: another execution recorded it first."""
    with connection.cursor() as cursor:
        cursor.execute(_INSERT_DONE_SQL, [ctx.job.id, ctx.run, name, _json(result), ctx.owner])
        inserted = cursor.fetchone()
    if inserted is None:
        return False
    ctx.rows[name] = StepRow(inserted[0], name, StepStatus.DONE, result, 1, ctx.owner)
    return True


def _upsert_ended(ctx: StepContext, name: str, status: str, result) -> None:
    Step.objects.update_or_create(
        job=ctx.job, run=ctx.run, name=name,
        defaults={"status": status, "result": result, "lease_until": None, "finished_at": timezone.now()},
    )


def _reload(ctx: StepContext, name: str) -> StepRow:
    step = Step.objects.get(job=ctx.job, run=ctx.run, name=name)
    row = StepRow(step.id, name, step.status, step.result, step.attempts, step.lease_owner, step.lease_until)
    ctx.rows[name] = row
    return row


def _adopt(ctx: StepContext, name: str):
    """Take the stored outcome of a step another execution completed."""
    row = _reload(ctx, name)
    if row.status == StepStatus.DONE:
        return None
    if row.status == StepStatus.FAILED:
        return Stop(f"step {name} failed")
    return Later(1.0)

