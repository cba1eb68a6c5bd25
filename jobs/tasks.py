"""Celery tasks of the job engine. Thin: load by id, call a service, map a few exceptions to a retry.

The walking skeleton of a `media` run is a chain of three tasks: prepare (mark running, head the output
key, submit) -> wait (poll, re-scheduling itself) -> finish (store the output, end the job).
"""

import logging
import time

from celery import chain, shared_task
from celery.exceptions import Ignore
from django.conf import settings

from executor import services as executor
from executor.providers.base import ProviderError
from jobs import services
from jobs.models import Job, JobStatus

logger = logging.getLogger(__name__)


def start_run(job_id, run: int) -> None:
    """Enqueue the chain that runs `run` of a job. Messages carry ids only."""
    job_id = str(job_id)
    chain(
        prepare.si(job_id, run),
        wait.s(job_id, run),
        finish.s(job_id, run),
    ).apply_async()


def _load_open(job_id: str, run: int) -> Job:
    job = Job.objects.filter(id=job_id).first()
    if job is None or job.run != run or not job.is_open:
        # Deleted, a newer run, or already ended (cancelled, or another delivery finished it): stop the chain.
        raise Ignore()
    return job


def _fail(job: Job, failure: executor.JobFailure) -> None:
    services.job_finish(job_id=job.id, status=JobStatus.FAILED, error=failure.as_error())
    raise Ignore()


@shared_task(name="jobs.prepare", bind=True, max_retries=None)
def prepare(self, job_id: str, run: int) -> dict:
    job = _load_open(job_id, run)
    services.job_mark_running(job_id=job.id)
    try:
        stored = executor.output_check(job)
        if stored is not None:
            return {"stored": stored}
        return executor.media_submit(job)
    except executor.JobFailure as failure:
        _fail(job, failure)
    except ProviderError as exc:
        # Unknown outcome on a keyed provider: the same key goes out again after a pause.
        raise self.retry(exc=exc, countdown=min(2 ** self.request.retries, 30))


@shared_task(name="jobs.wait", bind=True, max_retries=None)
def wait(self, state: dict, job_id: str, run: int) -> dict:
    if "stored" in state:
        return state
    job = _load_open(job_id, run)
    try:
        result = executor.media_poll(job, state)
    except ProviderError as exc:
        raise self.retry(exc=exc, countdown=settings.POLL_INTERVAL_S)
    if result.status == "running":
        if time.time() - state["submitted_at"] > settings.WAIT_DEADLINE_S:
            _fail(job, executor.JobFailure("ATTEMPTS_EXHAUSTED", "the provider did not finish before the deadline"))
        raise self.retry(countdown=settings.POLL_INTERVAL_S)
    if result.status != "succeeded":
        _fail(job, executor.JobFailure("ATTEMPTS_EXHAUSTED", result.error or f"render {result.status} upstream"))
    return {**state, "output_url": result.output_url}


@shared_task(name="jobs.finish", bind=True, max_retries=None)
def finish(self, state: dict, job_id: str, run: int) -> None:
    job = _load_open(job_id, run)
    try:
        output = state.get("stored") or executor.media_store(job, state)
    except executor.JobFailure as failure:
        _fail(job, failure)
    except ProviderError as exc:
        raise self.retry(exc=exc, countdown=min(2 ** self.request.retries, 30))
    services.job_finish(job_id=job.id, status=JobStatus.SUCCEEDED, output=output)
