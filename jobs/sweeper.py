"""The sweeper: the recovery path when messages are lost (a dead worker, a flushed or restarted broker).

It finds jobs that should be moving (`queued` or `running`) but show no sign of a live chain, and returns
where to resume each. Safe to run twice at once and beside live chains: each job is claimed by pushing
its enqueue lease out with a conditional update, and every step is idempotent, so a duplicate resume is
harmless. Recovery takes at most the sweep interval plus the lease that ran out.
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from jobs.models import Job, JobStatus
from jobs.runner import resume_point

logger = logging.getLogger(__name__)

# No live chain: the enqueue lease ran out, no step of the current run holds a live lease, and no step
# finished within the lease (a message handing the job to its next stage may still be queued).
_STUCK_SQL = """
SELECT j.id, j.run, j.kind FROM jobs_job j
 WHERE j.status IN ('queued', 'running')
   AND j.lease_until < now()
   AND NOT EXISTS (
       SELECT 1 FROM jobs_step s
        WHERE s.job_id = j.id AND s.run = j.run
          AND ((s.status = 'running' AND s.lease_until >= now()) OR s.finished_at >= now() - %(handoff)s))
 ORDER BY j.lease_until
 LIMIT %(limit)s
"""


def stuck_jobs(limit: int = 500) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(_STUCK_SQL, {"handoff": timedelta(seconds=settings.ENQUEUE_LEASE_S), "limit": limit})
        return cursor.fetchall()


def sweep(limit: int = 500) -> list[tuple]:
    """Claim stuck jobs and say where each resumes: [(job_id, run, kind, stage_index)]."""
    resumed = []
    for job_id, run, kind in stuck_jobs(limit):
        # The claim: two sweepers may both have read this job as stuck; the UPDATE re-checks the lease on
        # the committed row, so only the first pushes it out and resumes the job.
        claimed = Job.objects.filter(
            id=job_id, run=run, status__in=[JobStatus.QUEUED, JobStatus.RUNNING], lease_until__lt=Now()
        ).update(lease_until=Now() + timedelta(seconds=settings.ENQUEUE_LEASE_S), updated_at=timezone.now())
        if not claimed:
            continue
        job = Job(id=job_id, run=run, kind=kind)
        stage_index = resume_point(job)
        if stage_index is None:
            logger.error("job %s run %s is open but every step is done; leaving it to an operator", job_id, run)
            continue
        logger.info("sweeper: resuming job %s run %s at stage %s", job_id, run, stage_index)
        resumed.append((str(job_id), run, kind, stage_index))
    return resumed
