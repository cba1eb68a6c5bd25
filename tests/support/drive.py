"""The job engine driven in this process, as its tasks would drive it: the real runner, the real database and
the sandbox over HTTP, with no worker and no broker (docs/testing.md: an engine or money rule runs the real
runner in process; only a process boundary starts processes). A job row is written as the API writes one, and its stages are run in order, each
followed through its back-offs (Later) until it settles."""

import time
import uuid
from datetime import timedelta

from django.utils import timezone

from jobs import runner
from jobs.models import Job
from jobs.outcomes import Later, Stop

MEDIA_STAGES = ("prepare", "wait", "finish")


def media_job(client_id, *, models=("sandbox/video-keyed",), input=None, policy=None) -> Job:
    """A media job's row as POST /v1/jobs writes it, not enqueued: the test drives its stages."""
    job_id = uuid.uuid4()
    return Job.objects.create(
        id=job_id, client_id=client_id, idempotency_key=f"k-{job_id}", request_hash="0" * 64, kind="media",
        model_chain=list(models), input=input or {"prompt": "a lighthouse at dusk", "render_s": 0},
        policy=policy or {"attempts_per_model": 3, "fallback_on": []}, output_key=f"outputs/{job_id}/output.bin",
        metadata={}, lease_until=timezone.now() + timedelta(minutes=10))


def drive(job: Job, stage: str, *, timeout: float = 30.0, owner: str = "t", chain: str = "c") -> list:
    """Run one stage as its task would, following Later until it settles; every outcome, in order."""
    outcomes = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        outcome = runner.run_stage(job_id=job.id, run=job.run, stage=stage, owner=owner, chain=chain)
        outcomes.append(outcome)
        if not isinstance(outcome, Later):
            return outcomes
        time.sleep(min(max(outcome.countdown, 0.01), 0.5))
    raise AssertionError(f"stage {stage} did not settle within {timeout} s: {outcomes[-3:]}")


def run_media(job: Job, *, timeout: float = 30.0):
    """Every stage of a media job, in order, until one stops the run; the last outcome."""
    outcome = None
    for stage in MEDIA_STAGES:
        outcome = drive(job, stage, timeout=timeout)[-1]
        if isinstance(outcome, Stop):
            return outcome
    return outcome
