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

from config.logs import log_event
from config.metrics import count
from jobs import selectors
from jobs.engine.runner import resume_point
from jobs.models import Job, JobStatus

logger = logging.getLogger(__name__)

def sweep(limit: int = 500) -> list[tuple]:
    """Claim stuck jobs and say where each resumes: [(job_id, run, kind, stage_index)]."""
    resumed = []
    for job_id, run, kind in selectors.stuck_jobs(handoff=timedelta(seconds=settings.ENQUEUE_LEASE_S), limit=limit):
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
        count("sweeper_recoveries", what="stuck_job")
        resumed.append((str(job_id), run, kind, stage_index))
    return resumed
