"""Celery tasks of the job engine. Thin: take ids, call the runner, turn its outcome into a Celery action.

Messages carry ids only; the rows say what to do. Every task is safe to deliver twice.
"""

import logging

from celery import chain, group, shared_task
from celery.exceptions import Ignore

from jobs import runner, sweeper

logger = logging.getLogger(__name__)


def start_run(job_id, run: int, kind: str = "media", from_stage: int = 0) -> None:
    """Enqueue the chain of a run's stages (from `from_stage`): one task per stage."""
    stages = runner.RECIPES[kind].stages[from_stage:]
    chain(*(run_stage.si(str(job_id), run, stage.name) for stage in stages)).apply_async()


def cancel_upstream(job_id, run: int) -> None:
    stop_upstream.delay(str(job_id), run)


def _follow(task, outcome, job_id: str, run: int):
    if isinstance(outcome, runner.Continue):
        return None
    if isinstance(outcome, runner.Later):
        raise task.retry(countdown=outcome.countdown)
    if isinstance(outcome, runner.FanOut):
        group(run_substep.si(job_id, run, outcome.stage, key) for key in outcome.keys).apply_async()
    elif isinstance(outcome, runner.Resume):
        start_run(job_id, run, outcome.kind, outcome.stage_index)
    raise Ignore()  # Stop, FanOut, Resume: this chain ends here


@shared_task(name="jobs.run_stage", bind=True, max_retries=None)
def run_stage(self, job_id: str, run: int, stage: str):
    outcome = runner.run_stage(job_id=job_id, run=run, stage=stage, owner=self.request.id)
    return _follow(self, outcome, job_id, run)


@shared_task(name="jobs.run_substep", bind=True, max_retries=None)
def run_substep(self, job_id: str, run: int, stage: str, key: str):
    outcome = runner.run_substep(job_id=job_id, run=run, stage=stage, key=key, owner=self.request.id)
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
