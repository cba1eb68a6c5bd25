"""The `Step` row primitives (the services of jobs_step): claim a lease, renew it, mark a step done,
record a step that needed no lease, end one failed, and adopt what another execution recorded.

Every write here is one statement conditional on the row's state and lease, so two executions of a step
(a redelivered message, the sweeper's resume, a second chain) decide their race in PostgreSQL:
- a claim is an upsert whose WHERE admits a new row, a lease that ran out, our own lease, or one reserved
  for our task id; the loser gets no row back and attaches or stops;
- `done` is written only while we hold the lease (zero rows: our lease ran out and someone took over);
- a step needing no lease is inserted `done` once (ON CONFLICT DO NOTHING); the second writer adopts;
- a failure is written over a `running` row only under our lease or one that ran out, never over `done`.
"""

import enum
import logging
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, connections
from django.db.models.functions import Now

from config.logs import log_event
from config.metrics import count
from config.sql import update_sql
from jobs.engine.outcomes import Later, Stop
from jobs.models import Job, Step, StepStatus

logger = logging.getLogger(__name__)

RUNNING, DONE, FAILED = StepStatus.RUNNING.value, StepStatus.DONE.value, StepStatus.FAILED.value


class Claim(enum.Enum):
    """What claiming a step's lease found (step_claim, step_attach)."""

    CLAIMED = "claimed"  # the lease is this execution's: do the work
    HELD = "held"  # another execution holds a live lease: attach to it, or stop
    DONE = "done"  # the step is done (its row read into ctx.rows): go on
    FAILED = "failed"  # the step failed: the run stops

    @classmethod
    def of(cls, row: "StepRow") -> "Claim":
        """What a row not claimed says: held while it runs elsewhere, else its end."""
        return {RUNNING: cls.HELD, DONE: cls.DONE, FAILED: cls.FAILED}[row.status]


class FirstStart(enum.Enum):
    """How a run's first stage starts its queued job (jobs.dispatch.job_start_first, from mark_running)."""

    ONLY_CHOICE = "only_choice"  # a doorbell: only if it is the fairest, being the only choice there is
    NAMED = "named"  # a message that names its job (no fair dispatch, or a test running one job)


class Marked(enum.Enum):
    """What became of a done mark the work carried (DoneMark)."""

    DONE = "done"  # written with the work's last write: the step is done
    LOST = "lost"  # the lease was someone else's: take the other execution's outcome


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
    """One execution of a task on one job: what its steps read, and the runner's notes on this pass.

    Leases name their holder. `owner` is this execution (the task id plus a nonce: two deliveries of one
    message are two executions); `task_id` alone is what a step that backs off reserves its lease for,
    so the task sent again after the pause takes it back; `chain` (the Celery root id, shared by every
    link and re-send of one chain) holds a polling step's lease across polls and links.

    The mutable fields each have one writer, and live no longer than this execution (nothing here is
    stored: another execution reads the rows instead):

    | field | written by | read by |
    | `rows` | the step primitives here (claim, DoneMark, reload) | the runner; a kind's steps, via `result()` |
    | `deferred`, `claimed` | the runner only (jobs.engine.runner) | the runner only |
    | `done_mark` | the runner, around a leased step's work | that work (a kind's step hands it to executor.render) |
    | `handoff` | a kind's step | a later step of the same kind, in this execution |

    `rung`, `started` and `start` are set when the execution starts (the task's arguments) and only read.
    """

    job: Job
    task_id: str
    chain: str
    owner: str = ""
    rows: dict[str, StepRow] = field(default_factory=dict)
    rung: bool = False  # a provider called back: a waiting step looks now (executor.callbacks)
    started: bool = False  # this execution started the job (queued -> running, jobs.dispatch) just before
    # The job starts in its first transaction, from the mark_running step (jobs.dispatch.job_start_first):
    # only if it is the only choice there is (FirstStart.ONLY_CHOICE, its doorbell), or as named (NAMED).
    start: "FirstStart | None" = None
    # READ steps' done marks not written yet: they go out with the next transaction the runner commits
    # (jobs.engine.runner), always before anything leaves the database. A READ is safe to run again, so a mark
    # lost with a crash costs a re-read, never a result.
    deferred: list = field(default_factory=list)
    # Leases claimed ahead, in the transaction of the database-only steps before them: name -> claim.
    claimed: dict = field(default_factory=dict)
    # The running leased step's done mark, for its work's last write to carry (DoneMark); None between steps.
    done_mark: "DoneMark | None" = None
    # What a step hands to a later step of this same execution, by the name of the step that made it (the
    # submit step's accepted attempt, for the wait run right after it): never stored; another execution
    # reads the record instead.
    handoff: dict = field(default_factory=dict)

    def __post_init__(self):
        self.owner = self.owner or f"{self.task_id}#{uuid.uuid4().hex[:8]}"

    @property
    def run(self) -> int:
        return self.job.run

    def result(self, name: str, default=None):
        row = self.rows.get(name)
        return row.result if row is not None and row.status == DONE else default

    def holders(self) -> tuple[str, str, str]:
        """Every lease owner that is this execution: itself, its task id (a back-off's reservation), its chain."""
        return self.owner, self.task_id, self.chain


def _json(value):
    return Step._meta.get_field("result").get_db_prep_save(value, connection)


# --- claiming and holding a lease ------------------------------------------------------------------------


_CLAIM_SQL = f"""
INSERT INTO jobs_step (job_id, run, name, status, result, attempts, lease_owner, lease_until, started_at)
VALUES (%(job)s, %(run)s, %(name)s, '{RUNNING}', NULL, 1, %(owner)s, now() + %(lease)s, now())
ON CONFLICT ON CONSTRAINT step_job_run_name DO UPDATE
   SET lease_owner = EXCLUDED.lease_owner, lease_until = EXCLUDED.lease_until, attempts = jobs_step.attempts + 1
 WHERE jobs_step.status = '{RUNNING}'
   AND (jobs_step.lease_until < now() OR jobs_step.lease_owner IN (EXCLUDED.lease_owner, %(reserved)s))
RETURNING id, attempts, lease_until
"""


def step_claim(ctx: StepContext, name: str, lease_s: float, *, owner: str | None = None) -> tuple[Claim, StepRow]:
    """Claim the step's lease: the row is new, its lease ran out (a dead holder), it is ours, or it was
    reserved for this task (sent again after a back-off). Returns what it found, and the row.

    The upsert's WHERE decides a race between two executions: Postgres serialises them on the row, the
    second re-evaluates the WHERE against the first's lease and gets no row back.
    """
    owner = owner or ctx.owner
    params = {"job": ctx.job.id, "run": ctx.run, "name": name, "owner": owner, "reserved": ctx.task_id,
              "lease": timedelta(seconds=lease_s)}
    with connection.cursor() as cursor:
        cursor.execute(_CLAIM_SQL, params)
        claimed = cursor.fetchone()
    if claimed is not None:
        row = StepRow(claimed[0], name, RUNNING, None, claimed[1], owner, claimed[2])
        _log_claim(ctx, name, ctx.rows.get(name), row)
        ctx.rows[name] = row
        return Claim.CLAIMED, row
    row = step_reload(ctx, name)
    return Claim.of(row), row


def _log_claim(ctx: StepContext, name: str, before: StepRow | None, row: StepRow) -> None:
    """A claim that changes hands is an event: the first (step.claimed), or one taken from another holder
    whose lease ran out (step.taken_over). A holder claiming its own lease again (each poll of a wait, the
    pass after a back-off) is not."""
    if row.attempts == 1:
        event = "step.claimed"
    elif before is not None and before.lease_owner in ctx.holders():
        return
    else:
        event = "step.taken_over"
        count("lease_takeovers", kind=ctx.job.kind)
    log_event(logger, event, job_id=ctx.job.id, run=ctx.run, step=name, claims=row.attempts,
              lease_owner=row.lease_owner,
              previous_owner=before.lease_owner if before is not None and event == "step.taken_over" else None)


def step_attach(ctx: StepContext, name: str) -> tuple[Claim, StepRow | None]:
    """Another execution holds a live lease: wait for its result instead of doing the work again. If its
    lease runs out meanwhile (its worker died), take the step over."""
    deadline = time.monotonic() + settings.ATTACH_WAIT_S
    claim, row = Claim.HELD, None
    while time.monotonic() < deadline:
        time.sleep(0.2)
        claim, row = step_claim(ctx, name, settings.STEP_LEASE_S)
        if claim is not Claim.HELD:
            break
    return claim, row


@contextmanager
def step_heartbeat(step_id: int, owner: str, lease_s: float):
    """Renew the lease every third of its length while the work runs, from a thread of its own. Yields an
    Event that is set if the lease was lost (another execution took the step over)."""
    stop, lost = threading.Event(), threading.Event()

    def beat():
        try:
            while not stop.wait(lease_s / 3):
                if not step_renew_lease(step_id, owner, lease_s):
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


def step_renew_lease(step_id: int, owner: str, lease_s: float) -> bool:
    """Push our lease out to now + lease_s; False if it is no longer ours."""
    return bool(Step.objects.filter(id=step_id, lease_owner=owner, status=RUNNING).update(
        lease_until=Now() + timedelta(seconds=lease_s)
    ))


def step_hold_for_retry(step_id: int, owner: str, reserve_for: str, hold_s: float) -> None:
    """Keep the lease across a pause (so a duplicate attaches) but let it run out if the retry is lost.
    An execution's lease is reserved for its task id (the same task, sent again after the pause, takes it
    back); a chain's polling lease stays the chain's."""
    Step.objects.filter(id=step_id, lease_owner=owner, status=RUNNING).update(
        lease_owner=reserve_for, lease_until=Now() + timedelta(seconds=hold_s)
    )


# --- recording outcomes --------------------------------------------------------------------------------


# A done mark's two statements (DoneMark.cte), each written only `when` the rest of its statement says so.
# A leased step's: ours only while we hold the lease (zero rows: someone took the step over).
_LEASED_MARK_SQL = f"""
UPDATE jobs_step SET status = '{DONE}', result = %s, lease_until = NULL, finished_at = now()
 WHERE id = %s AND lease_owner = %s AND status = '{RUNNING}' AND {{when}}
RETURNING id
"""
# A step that needed no lease: inserted done once (no row back: another execution recorded it first).
_FRESH_MARK_SQL = f"""
INSERT INTO jobs_step (job_id, run, name, status, result, attempts, lease_owner, lease_until, started_at, finished_at)
SELECT %s, %s, %s, '{DONE}', %s, 1, %s, NULL, now(), now() WHERE {{when}}
ON CONFLICT ON CONSTRAINT step_job_run_name DO NOTHING
RETURNING id
"""


class DoneMark:
    """The one way a step is marked done: every done mark the engine writes is one of these.

    A mark is of one of two rows. A leased step's (`DoneMark.leased`) is an UPDATE of our `running` row,
    written only while we hold its lease: zero rows means our lease ran out and another execution took
    the step over. A step that needed no lease (`DoneMark.fresh`: a read, a database step, a fan-out's
    join, a wait that was over before it started) is an INSERT done, once: ON CONFLICT DO NOTHING, so of
    two executions recording it the second writes nothing and adopts the first's outcome.

    It rides the step's work in one of four ways, so the work's last write and the mark commit together
    (one commit instead of two; tests/jobs/test_commit_budget.py holds the count). The work calls at most one:
    - `with_update(result, queryset, fields)`: the work's conditional UPDATE and the mark in one statement,
      the mark only if the UPDATE changed its row (executor.render, a provider's acceptance);
    - `in_transaction(result)`: the mark inside a transaction the work has open (an attempt's end);
    - `cte(result, when=...)`: the mark as one part of the work's own statement, only `when` a condition on
      its other parts holds; the statement returns the part's `id`, handed back by `took` (a render
      finished in its submit's answer, executor.render.finish_answered).
    If the work carried none, the runner writes it alone (`write`). Afterwards `state` says what became of
    it (None: not written yet; Marked.DONE; Marked.LOST: take the other execution's outcome), and a
    written mark is in ctx.rows with the result it wrote.
    """

    def __init__(self, ctx: StepContext, name: str, *, step_id: int | None = None, owner: str = "",
                 attempts: int = 1):
        self.ctx, self.name, self.step_id, self.owner, self.attempts = ctx, name, step_id, owner, attempts
        self.state: Marked | None = None
        self.result = None

    @classmethod
    def leased(cls, ctx: StepContext, row: StepRow, owner: str) -> "DoneMark":
        return cls(ctx, row.name, step_id=row.id, owner=owner, attempts=row.attempts)

    @classmethod
    def fresh(cls, ctx: StepContext, name: str) -> "DoneMark":
        return cls(ctx, name, owner=ctx.owner)

    def cte(self, result, *, when: str) -> tuple[str, list]:
        if self.step_id is not None:
            return _LEASED_MARK_SQL.format(when=when), [_json(result), self.step_id, self.owner]
        return _FRESH_MARK_SQL.format(when=when), [self.ctx.job.id, self.ctx.run, self.name, _json(result), self.owner]

    def took(self, result, step_id: int | None) -> None:
        """What the work's statement returned of the `cte` part: the step's id, or None (not written)."""
        self.state, self.result = (Marked.DONE if step_id is not None else Marked.LOST), result
        if step_id is not None:
            self.ctx.rows[self.name] = StepRow(step_id, self.name, DONE, result, self.attempts, self.owner)
            log_event(logger, "step.done", job_id=self.ctx.job.id, run=self.ctx.run, step=self.name)

    def write(self, result) -> bool:
        """The mark alone, one statement. False: lost (see `state`)."""
        sql, params = self.cte(result, when="TRUE")
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            written = cursor.fetchone()
        self.took(result, written[0] if written else None)
        return self.state is Marked.DONE

    def in_transaction(self, result) -> None:
        if not connection.in_atomic_block:
            raise RuntimeError("the mark commits with the work's own transaction")
        self.write(result)

    def with_update(self, result, queryset, fields: dict) -> bool:
        """Returns whether the work's UPDATE changed its row (the mark is written only if it did)."""
        update, update_params = update_sql(queryset, fields)
        mark, mark_params = self.cte(result, when="EXISTS (SELECT 1 FROM work)")
        with connections[queryset.db].cursor() as cursor:
            cursor.execute(f"WITH work AS ({update} RETURNING 1), mark AS ({mark})"
                           f" SELECT (SELECT count(*) FROM work), (SELECT id FROM mark)", [*update_params, *mark_params])
            updated, step_id = cursor.fetchone()
        if updated:
            self.took(result, step_id)
        return bool(updated)

    @staticmethod
    def write_all(ctx: StepContext, marks: list[tuple[str, object]]) -> bool:
        """Fresh marks of several steps in one INSERT (a group of database steps, the reads deferred before
        them). False: another execution recorded one of them first (the caller rolls back and adopts)."""
        values = ", ".join([f"(%s, %s, %s, '{DONE}', %s, 1, %s, NULL, now(), now())"] * len(marks))
        sql = (f"INSERT INTO jobs_step (job_id, run, name, status, result, attempts, lease_owner, lease_until,"
               f" started_at, finished_at) VALUES {values}"
               f" ON CONFLICT ON CONSTRAINT step_job_run_name DO NOTHING RETURNING id, name")
        params = [value for name, result in marks for value in (ctx.job.id, ctx.run, name, _json(result), ctx.owner)]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            inserted = {name: ident for ident, name in cursor.fetchall()}
        if len(inserted) < len(marks):
            return False
        for name, result in marks:
            DoneMark.fresh(ctx, name).took(result, inserted[name])
        return True


_END_FAILED_SQL = f"""
INSERT INTO jobs_step (job_id, run, name, status, result, attempts, lease_owner, lease_until, started_at, finished_at)
VALUES (%(job)s, %(run)s, %(name)s, '{FAILED}', %(result)s, 1, %(owner)s, NULL, now(), now())
ON CONFLICT ON CONSTRAINT step_job_run_name DO UPDATE
   SET status = '{FAILED}', result = EXCLUDED.result, lease_until = NULL, finished_at = now()
 WHERE jobs_step.status = '{RUNNING}'
   AND (jobs_step.lease_until < now() OR jobs_step.lease_owner IN (%(owner)s, %(task)s, %(chain)s))
RETURNING id
"""


def step_end_failed(ctx: StepContext, name: str, result) -> bool:
    """Record the step as failed: a new row, or a `running` one under this execution's lease (or a lease
    that ran out). A step another execution holds, or one already done or failed, is left as it is (the
    race a stale execution would otherwise win: overwriting a live holder's step, or a finished one).
    False if nothing was written."""
    with connection.cursor() as cursor:
        cursor.execute(_END_FAILED_SQL, {"job": ctx.job.id, "run": ctx.run, "name": name, "result": _json(result),
                                         "owner": ctx.owner, "task": ctx.task_id, "chain": ctx.chain})
        return cursor.fetchone() is not None


def step_reload(ctx: StepContext, name: str) -> StepRow:
    step = Step.objects.get(job=ctx.job, run=ctx.run, name=name)
    row = StepRow(step.id, name, step.status, step.result, step.attempts, step.lease_owner, step.lease_until)
    ctx.rows[name] = row
    return row


def step_adopt(ctx: StepContext, name: str):
    """Take the stored outcome of a step another execution recorded: None (done: go on), Stop (failed) or
    Later (still running elsewhere)."""
    row = step_reload(ctx, name)
    if row.status == DONE:
        return None
    if row.status == FAILED:
        return Stop(f"step {name} failed")
    return Later(1.0)
