"""Celery tasks of the job engine. Thin: take ids, call the runner, turn its outcome into a Celery action.

Messages carry ids only; the rows say what to do. Every task is safe to deliver twice.
"""

import logging

from celery import group, shared_task, signature
from django.conf import settings

from executor.cancel import sweep_cancelled
from jobs import dispatch
from jobs.engine import outcomes, runner, sweeper
from jobs.engine.chain import start_run
from jobs.engine.steps import FirstStart
from jobs.kinds import KINDS

logger = logging.getLogger(__name__)

# The stage a run begins with, for every kind: its message is a doorbell of fair dispatch.
FIRST_STAGES = frozenset(kind.recipe.stages[0].name for kind in KINDS.values())


def _follow(task, outcome, job_id: str, run: int) -> None:
    """Turn the runner's outcome into Celery actions, as the table in jobs.engine.outcomes says. Neither Retry
    nor Ignore is raised: each costs a formatted traceback, which is more CPU than a whole fast job; the
    same effects are had directly."""
    if isinstance(outcome, outcomes.Continue):
        if outcome.countdown <= 0 or not task.request.chain:
            return  # the chain's next link runs the next stage now
        _send_next(task, outcome.countdown)
    elif isinstance(outcome, outcomes.Later):
        _send_again(task, outcome.countdown)
    elif isinstance(outcome, outcomes.FanOut):
        if outcome.lead:  # one sub-step alone: the rest follow it (runner.run_substep)
            run_substep.si(job_id, run, outcome.stage, outcome.keys[0], lead=True).apply_async()
        else:
            group(run_substep.si(job_id, run, outcome.stage, key) for key in outcome.keys).apply_async()
    elif isinstance(outcome, outcomes.Resume):
        start_run(job_id, run, outcome.kind, outcome.stage_index, outcome.countdown)
    task.request.chain = None  # Later, Done, Stop, FanOut, Resume: this execution ends the chain here


def _send_again(task, countdown: float) -> None:
    """What task.retry() does: send this very task again after `countdown`, with its id (the lease owner)
    and the rest of its chain, which this execution then does not continue. A doorbell (`rung`) rang
    once: the pass sent again looks on its schedule; a doorbell was answered (jobs.dispatch): the pass sent
    again runs its job as named."""
    again = task.signature_from_request(countdown=countdown, retries=task.request.retries + 1)
    again.kwargs.pop("rung", None)
    again.kwargs.pop("doorbell", None)
    again.apply_async()


def _send_next(task, countdown: float) -> None:
    """What Celery does with a chain when a task returns, but after `countdown`: the next link, carrying
    the rest of the chain, in the same chain (root id)."""
    chain = list(task.request.chain)
    signature(chain.pop(), app=task.app).apply_async(
        countdown=countdown, chain=chain or None, parent_id=task.request.id,
        root_id=task.request.root_id or task.request.id)


def _follow_started(task, outcome, start) -> None:
    """_follow, for a job this message started that is not the one it names (jobs.dispatch): nothing of the
    message's chain is that job's, so what it does next goes as a chain of its own, whose id is this
    task's (the owner of the leases it holds)."""
    if isinstance(outcome, outcomes.Continue):  # its next stage, the one after the first, waits: send it
        start_run(start.job_id, start.run, start.kind, 1, outcome.countdown, root_id=task.request.id)
    elif isinstance(outcome, outcomes.Later):  # the first stage again, under this task's id (Kept.TASK)
        start_run(start.job_id, start.run, start.kind, 0, outcome.countdown, root_id=task.request.id,
                  task_id=task.request.id)
    else:
        _follow(task, outcome, start.job_id, start.run)
    task.request.chain = None


def _run_started(task, start) -> None:
    first = KINDS[start.kind].recipe.stages[0].name
    outcome = runner.run_stage(job_id=start.job_id, run=start.run, stage=first, owner=task.request.id,
                               chain=task.request.id, started=start.claimed)
    _follow_started(task, outcome, start)


@shared_task(name="jobs.run_stage", bind=True, max_retries=None)
def run_stage(self, job_id: str, run: int, stage: str, rung: bool = False, doorbell: bool = False):
    if stage in FIRST_STAGES and not rung:
        # Fair dispatch (jobs.dispatch): the job starts in its first transaction when it is the only choice
        # there is (a doorbell) or the job named; if not, the fairest queued job starts, this one in its turn.
        only_choice = doorbell and settings.FAIR_DISPATCH
        outcome = runner.run_stage(job_id=job_id, run=run, stage=stage, owner=self.request.id,
                                   chain=self.request.root_id,
                                   start=FirstStart.ONLY_CHOICE if only_choice else FirstStart.NAMED)
        if not (isinstance(outcome, outcomes.Stop) and outcome.undecided):
            return _follow(self, outcome, job_id, run)
        start = dispatch.job_start(own=job_id, doorbell=only_choice)
        if start is None:  # nothing may start now (or this job was started by another doorbell)
            self.request.chain = None
            return None
        if start.job_id != job_id:  # another client's turn (or a higher priority): that job runs here
            return _run_started(self, start)
        run = start.run  # a retried job: its current run
        outcome = runner.run_stage(job_id=job_id, run=run, stage=stage, owner=self.request.id,
                                   chain=self.request.root_id, started=start.claimed)
    else:
        outcome = runner.run_stage(job_id=job_id, run=run, stage=stage, owner=self.request.id,
                                   chain=self.request.root_id, rung=rung)
    return _follow(self, outcome, job_id, run)


@shared_task(name="jobs.start_next", bind=True)
def start_next(self, client_id: str | None = None):
    """A doorbell with no job of its own (jobs.engine.chain.ring): start the fairest queued job. Rung for a
    client's freed slot, and none of its jobs is queued any more: stop ringing for it."""
    start = dispatch.job_start()
    if start is None:
        if client_id:
            dispatch.client_unblock(client_id=client_id)
        return None
    return _run_started(self, start)


@shared_task(name="jobs.run_substep", bind=True, max_retries=None)
def run_substep(self, job_id: str, run: int, stage: str, key: str, lead: bool = False):
    outcome = runner.run_substep(job_id=job_id, run=run, stage=stage, key=key, owner=self.request.id,
                                 chain=self.request.root_id, lead=lead)
    return _follow(self, outcome, job_id, run)


@shared_task(name="jobs.stop_upstream", bind=True)
def stop_upstream(self, job_id: str, run: int):
    """A cancel won: stop the job's upstream work now rather than at its next poll; and again once a send
    whose answer may still come can no longer be answered (executor.cancel.cancel_current). Sent by
    jobs.engine.chain.stop_upstream."""
    stop = runner.stop_cancelled(job_id=job_id, run=run, owner=self.request.id)
    if stop.again_s is not None:
        stop_upstream.apply_async((job_id, run), countdown=stop.again_s + 0.5)


@shared_task(name="jobs.sweep")
def sweep() -> int:
    resumed = sweeper.sweep()
    try:
        sweeper.end_queued_past_deadline()
    except Exception:  # never in the way of resuming stuck jobs: the next sweep tries again
        logger.exception("sweeper: could not end queued jobs past their deadline")
    try:
        sweep_cancelled()
    except Exception:  # never in the way of resuming stuck jobs: the next sweep tries again
        logger.exception("sweeper: could not end a cancelled job's attempts left submitting")
    for job_id, run, kind, stage_index, queued in resumed:
        start_run(job_id, run, kind, stage_index, doorbell=queued)
    return len(resumed)
