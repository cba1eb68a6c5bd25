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
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable

from django.conf import settings
from django.db import connection, connections, transaction
from django.db.models.functions import Now
from django.utils import timezone

from config.sql import insert_ignore
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


# --- context -----------------------------------------------------------------------------------------------


@dataclass
class StepContext:
    job: Job
    owner: str  # who holds leases for this execution (the Celery task id)
    rows: dict[str, Step] = field(default_factory=dict)

    @property
    def run(self) -> int:
        return self.job.run

    def result(self, name: str, default=None):
        row = self.rows.get(name)
        return row.result if row is not None and row.status == StepStatus.DONE else default


class _LostRace(Exception):
    """Another execution committed this step first; read its result instead of ours."""


# --- entry points ------------------------------------------------------------------------------------------


def _load(job_id, run: int, owner: str) -> tuple[StepContext | None, Stop | None]:
    job = Job.objects.filter(id=job_id).first()
    if job is None:
        return None, Stop("no such job")
    if job.run != run:
        return None, Stop(f"run {run} was replaced by run {job.run}")
    ctx = StepContext(job=job, owner=owner)
    if job.status == JobStatus.CANCELLED:
        ctx.rows = {row.name: row for row in Step.objects.filter(job=job, run=run)}
        recipe = RECIPES[job.kind]
        if recipe.on_cancel is not None:
            recipe.on_cancel(ctx)
        return None, Stop("cancelled")
    if job.status not in (JobStatus.QUEUED, JobStatus.RUNNING):
        return None, Stop(f"job is {job.status}")
    ctx.rows = {row.name: row for row in Step.objects.filter(job=job, run=run)}
    return ctx, None


def run_stage(*, job_id, run: int, stage: str, owner: str):
    """Run one stage of a job's run. Returns Continue, Stop, Later, FanOut or Resume."""
    ctx, stop = _load(job_id, run, owner)
    if stop:
        return stop
    recipe = RECIPES[ctx.job.kind]
    current = recipe.stages[recipe.index(stage)]
    if current.fanout is not None:
        return _fan_out(ctx, recipe, current)
    for spec in current.steps:
        outcome = _run_step(ctx, spec)
        if outcome is not None:
            return outcome
    return Continue()


def run_substep(*, job_id, run: int, stage: str, key: str, owner: str):
    """Run one sub-step of a fan-out stage, then join the stage if every sub-step has ended."""
    ctx, stop = _load(job_id, run, owner)
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
    _, stop = _load(job_id, run, owner)
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


def _run_step(ctx: StepContext, spec: StepSpec, *, fail_job: bool = True):
    row = ctx.rows.get(spec.name)
    if row is not None and row.status == StepStatus.DONE:
        return None  # a completed step is never re-run
    if row is not None and row.status == StepStatus.FAILED:
        return Stop(f"step {spec.name} failed")
    try:
        if spec.effect is Effect.DB:
            return _run_db(ctx, spec)
        if spec.effect is Effect.READ:
            return _run_read(ctx, spec)
        if spec.effect is Effect.EXTERNAL:
            return _run_external(ctx, spec)
        return _run_wait(ctx, spec)
    except JobHold as hold:
        if not fail_job:
            raise
        with transaction.atomic():
            services.job_hold(job_id=ctx.job.id, run=ctx.run, error=hold.as_error())
            _upsert_ended(ctx, spec.name, StepStatus.FAILED, {"error": hold.as_error()})
        return Stop(f"held: {hold.code}")
    except JobFailure as failure:
        if not fail_job:
            raise
        with transaction.atomic():
            services.job_finish(job_id=ctx.job.id, status=JobStatus.FAILED, error=failure.as_error())
            _upsert_ended(ctx, spec.name, StepStatus.FAILED, {"error": failure.as_error()})
        return Stop(f"failed: {failure.code}")


def _run_db(ctx: StepContext, spec: StepSpec):
    try:
        with transaction.atomic():
            result = spec.fn(ctx)
            if not _insert_done(ctx, spec.name, result):
                raise _LostRace  # rolls back our effects: the other execution's stand
    except _LostRace:
        return _adopt(ctx, spec.name)
    return None


def _run_read(ctx: StepContext, spec: StepSpec):
    result = spec.fn(ctx)
    if not _insert_done(ctx, spec.name, result):
        return _adopt(ctx, spec.name)
    return None


def _run_external(ctx: StepContext, spec: StepSpec):
    state, row = _claim(ctx, spec, settings.STEP_LEASE_S)
    if state == "held":
        state, row = _attach(ctx, spec)
    if state == "held":
        return Later(max(1.0, min(settings.STEP_LEASE_S, 5.0)))
    if state != "claimed":
        ctx.rows[spec.name] = row
        return None if state == StepStatus.DONE else Stop(f"step {spec.name} failed")
    with _heartbeat(row.id, ctx.owner, settings.STEP_LEASE_S) as lost:
        try:
            result = spec.fn(ctx)
        except StepRetry as retry:
            return _back_off(ctx, row, retry)
    if lost.is_set():
        logger.warning("job %s step %s: lease lost while working; attaching", ctx.job.id, spec.name)
    try:
        with transaction.atomic():
            if spec.apply is not None:
                spec.apply(ctx, result)
            if not _mark_done(row.id, ctx.owner, result):
                raise _LostRace  # our lease ran out and another execution took the step over
    except _LostRace:
        return _adopt(ctx, spec.name)
    ctx.rows[spec.name] = _done_row(ctx, row, result)
    return None


def _run_wait(ctx: StepContext, spec: StepSpec):
    state, row = _claim(ctx, spec, settings.POLL_INTERVAL_S + settings.STEP_LEASE_S)
    if state == "held":
        return Stop(f"another poller holds {spec.name}")
    if state != "claimed":
        ctx.rows[spec.name] = row
        return None if state == StepStatus.DONE else Stop(f"step {spec.name} failed")
    ctx.rows[spec.name] = row
    try:
        result = spec.fn(ctx)
    except StepRetry as retry:
        return _back_off(ctx, row, retry)
    if result is None:
        return Later(settings.POLL_INTERVAL_S)
    if not _mark_done(row.id, ctx.owner, result):
        return _adopt(ctx, spec.name)
    ctx.rows[spec.name] = _done_row(ctx, row, result)
    return None


def _back_off(ctx: StepContext, row: Step, retry: StepRetry) -> Later:
    """Keep the lease across the pause (so a duplicate attaches) but let it run out if our retry is lost."""
    countdown = retry.countdown
    if countdown is None:
        countdown = min(2 ** max(row.attempts - 1, 0), 30) * random.uniform(0.8, 1.2)
    Step.objects.filter(id=row.id, lease_owner=ctx.owner, status=StepStatus.RUNNING).update(
        lease_until=Now() + timedelta(seconds=countdown + settings.STEP_LEASE_S)
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
   AND (jobs_step.lease_until < now() OR jobs_step.lease_owner = EXCLUDED.lease_owner)
RETURNING id, attempts, started_at, lease_until
"""


def _claim(ctx: StepContext, spec: StepSpec, lease_s: float) -> tuple[str, Step | None]:
    """Claim the step's lease: the row is new, its lease ran out (a dead holder), or it is ours (a retry
    of this very task). Returns ("claimed" | "done" | "failed" | "held", row).

    The upsert's WHERE decides a race between two executions: Postgres serialises them on the row, the
    second re-evaluates the WHERE against the first's lease and gets no row back.
    """
    params = {"job": ctx.job.id, "run": ctx.run, "name": spec.name, "owner": ctx.owner,
              "lease": timedelta(seconds=lease_s)}
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(_CLAIM_SQL, params)
            claimed = cursor.fetchone()
        if claimed is not None:
            row = Step(id=claimed[0], job=ctx.job, run=ctx.run, name=spec.name, status=StepStatus.RUNNING,
                       attempts=claimed[1], started_at=claimed[2], lease_until=claimed[3], lease_owner=ctx.owner)
            if spec.claim is not None:
                spec.claim(ctx)  # intent before spend: committed together with the lease
            return "claimed", row
    row = Step.objects.get(job=ctx.job, run=ctx.run, name=spec.name)
    if row.status == StepStatus.RUNNING:
        return "held", row
    return row.status, row


def _attach(ctx: StepContext, spec: StepSpec) -> tuple[str, Step]:
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


def _mark_done(step_id: int, owner: str, result) -> bool:
    """running -> done, only while we still hold the lease. Zero rows: another execution took over."""
    return bool(
        Step.objects.filter(id=step_id, lease_owner=owner, status=StepStatus.RUNNING).update(
            status=StepStatus.DONE, result=result, lease_until=None, finished_at=Now()
        )
    )


def _insert_done(ctx: StepContext, name: str, result) -> bool:
    row = Step(job=ctx.job, run=ctx.run, name=name, status=StepStatus.DONE, result=result,
               lease_owner=ctx.owner, started_at=timezone.now(), finished_at=timezone.now())
    if insert_ignore(row, conflict="step_job_run_name"):
        ctx.rows[name] = row
        return True
    return False


def _upsert_ended(ctx: StepContext, name: str, status: str, result) -> None:
    Step.objects.update_or_create(
        job=ctx.job, run=ctx.run, name=name,
        defaults={"status": status, "result": result, "lease_until": None, "finished_at": timezone.now()},
    )


def _adopt(ctx: StepContext, name: str):
    """Take the stored outcome of a step another execution completed."""
    row = Step.objects.get(job=ctx.job, run=ctx.run, name=name)
    ctx.rows[name] = row
    if row.status == StepStatus.DONE:
        return None
    if row.status == StepStatus.FAILED:
        return Stop(f"step {name} failed")
    return Later(1.0)


def _done_row(ctx: StepContext, row: Step, result) -> Step:
    row.status, row.result, row.lease_until = StepStatus.DONE, result, None
    return row
