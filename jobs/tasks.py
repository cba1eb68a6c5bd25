"""Celery tasks of the job engine. Thin: take ids, call the runner, turn its outcome into a Celery action.

Messages carry ids only; the rows say what to do. Every task is safe to deliver twice.
"""

import logging

from celery import group, shared_task
from django.conf import settings

from jobs import runner, sweeper, workflow

logger = logging.getLogger(__name__)


def start_run(job_id, run: int, kind: str = "media", from_stage: int = 0, countdown: float = 0.0) -> None:
    """Enqueue the chain of a run's stages from `from_stage`, one link per stage. A link whose stage
    polls waits a poll interval: the link before it polled once already. A link finds its steps done
    when an earlier link ran its stage inline, and the link that runs the last stage ends the chain."""
    first, *rest = workflow.RECIPES[kind].stages[from_stage:]
    links = [run_stage.si(str(job_id), run, stage.name) for stage in rest]
    links = [link.set(countdown=settings.POLL_INTERVAL_S) if stage.waits else link for link, stage in zip(links, rest)]
    # The chain travels in the first message (Celery's own `chain` field, links in reverse order), as
    # canvas.chain would send it, without freezing every link up front: this runs in every POST.
    run_stage.apply_async((str(job_id), run, first.name), countdown=countdown or None,
                          chain=[dict(link) for link in reversed(links)] or None)


def cancel_upstream(job_id, run: int) -> None:
    stop_upstream.delay(str(job_id), run)


def _follow(task, outcome, job_id: str, run: int) -> None:
    """Turn the runner's outcome into Celery actions, as the table in jobs.workflow says. Neither Retry
    nor Ignore is raised: each costs a formatted traceback, which is more CPU than a whole fast job; the
    same effects are had directly."""
    if isinstance(outcome, workflow.Continue):
        return  # the chain's next link runs the next stage
    if isinstance(outcome, workflow.Later):
        _send_again(task, outcome.countdown)
    elif isinstance(outcome, workflow.FanOut):
        group(run_substep.si(job_id, run, outcome.stage, key) for key in outcome.keys).apply_async()
    elif isinstance(outcome, workflow.Resume):
        start_run(job_id, run, outcome.kind, outcome.stage_index, outcome.countdown)
    task.request.chain = None  # Later, Done, Stop, FanOut, Resume: this execution ends the chain here


def _send_again(task, countdown: float) -> None:
    """What task.retry() does: send this very task again after `countdown`, with its id (the lease owner)
    and the rest of its chain, which this execution then does not continue."""
    task.signature_from_request(countdown=countdown, retries=task.request.retries + 1).apply_async()


@shared_task(name="jobs.run_stage", bind=True, max_retries=None)
def run_stage(self, job_id: str, run: int, stage: str):
    outcome = runner.run_stage(job_id=job_id, run=run, stage=stage, owner=self.request.id,
                               chain=self.request.root_id)
    return _follow(self, outcome, job_id, run)


@shared_task(name="jobs.run_substep", bind=True, max_retries=None)
def run_substep(self, job_id: str, run: int, stage: str, key: str):
    outcome = runner.run_substep(job_id=job_id, run=run, stage=stage, key=key, owner=self.request.id,
                                 chain=self.request.root_id)
    return _follow(self, outcome, job_id, run)


@shared_task(name="jobs.stop_upstream", bind=True)
def stop_upstream(self, job_id: str, run: int):
    """A cancel won: stop the job's upstream work now rather than at its next poll."""
    runner.stop_cancelled(job_id=job_id, run=run, owner=self.request.id)


@shared_task(name="jobs.sweep")
def sweep() -> int:
    resumed = sweeper.sweep()
    for job_id, run, kind, stage_index in resumed:
        start_run(job_id, run, kind, stage_index)
    return len(resumed)
