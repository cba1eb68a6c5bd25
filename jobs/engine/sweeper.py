"""The sweeper: the recovery path when messages are lost (a dead worker, a flushed or restarted broker).

It finds jobs that should be moving (`queued` or `running`) but show no sign of a live chain, and returns
where to resume each. Safe to run twice at once and beside live chains: each job is claimed by pushing
its enqueue lease out with a conditional update, and every step is idempotent, so a duplicate resume is
harmless. Recovery takes at most the sweep interval plus the lease that ran out.
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db.models.functions import Now
from django.utils import timezone

from config import tracing
from config.logs import log_event
from config.metrics import count
from executor.record import deadline_message
from executor.selectors import attempts_maybe_paid
from jobs import selectors, services
from jobs.engine.outcomes import JobErrorCode
from jobs.engine.runner import resume_point
from jobs.models import Job, JobStatus

logger = logging.getLogger(__name__)

def sweep(limit: int = 500) -> list[tuple]:
    """Claim stuck jobs and say where each resumes: [(job_id, run, kind, stage_index, queued)]. A queued
    job's doorbell was lost: it is rung again, and starts in its turn (jobs.dispatch)."""
    resumed = []
    handoff = timedelta(seconds=settings.ENQUEUE_LEASE_S)
    for job_id, run, kind, queued, trace_context in selectors.stuck_jobs(handoff=handoff, limit=limit):
        # The claim: two sweepers may both have read this job as stuck; the UPDATE re-checks the lease on
        # the committed row, so only the first pushes it out and resumes the job.
        claimed = Job.objects.filter(
            id=job_id, run=run, status__in=[JobStatus.QUEUED, JobStatus.RUNNING], lease_until__lt=Now()
        ).update(lease_until=Now() + timedelta(seconds=settings.ENQUEUE_LEASE_S), updated_at=timezone.now())
        if not claimed:
            continue
        job = Job(id=job_id, run=run, kind=kind)
        try:
            stage_index = resume_point(job)
        except Exception:  # noqa: BLE001 - row by row: one job that cannot be read never stops the pass
            logger.exception("sweeper: could not find where job %s run %s resumes; skipped", job_id, run,
                             extra={"job_id": job_id, "run": run})
            count("sweep_errors", sweep="stuck_jobs")
            continue
        if stage_index is None:
            logger.error("job %s run %s is open but every step is done; leaving it to an operator", job_id, run,
                         extra={"job_id": job_id, "run": run})
            continue
        logger.info("sweeper: resuming job %s run %s at stage %s", job_id, run, stage_index)
        log_event(logger, "sweeper.recovered", job_id=job_id, run=run, kind=kind, stage_index=stage_index)
        # The re-ring in the run's trace, linked to this sweep's own span: the stage it sends joins that trace.
        with tracing.job_span("payonce.sweep.resume", trace_context, **{
                "payonce.job_id": str(job_id), "payonce.run": run, "payonce.stage_index": stage_index}):
            pass
        count("sweeper_recoveries", what="stuck_job")
        resumed.append((str(job_id), run, kind, stage_index, queued))
    return resumed


def end_queued_past_deadline(limit: int = 500) -> int:
    """Queued jobs whose deadline passed before they started (their client's backlog, its running limit, a
    provider's limit upstream of them) end DEADLINE_EXCEEDED now, rather than when their turn comes: nothing
    of theirs was sent or paid. Only a job still queued (job_finish's `only_from`: a start that won the race
    goes on, and the deadline is read again where its call would be paid, executor.record), and none with an
    attempt of an earlier run that may have been paid (a deadline never cuts a paid job short)."""
    ended = 0
    for job_id, run, deadline in selectors.queued_past_deadline(limit=limit):
        if run > 1 and attempts_maybe_paid(job_id):
            continue
        error = {"code": JobErrorCode.DEADLINE_EXCEEDED, "message": deadline_message(deadline)}
        if services.job_finish(job_id=job_id, status=JobStatus.FAILED, error=error, only_from=[JobStatus.QUEUED]):
            ended += 1
    return ended
