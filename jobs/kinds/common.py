"""Steps more than one kind's recipe runs."""

from jobs import services


def mark_running(ctx) -> dict:
    return {"started": services.job_mark_running(job_id=ctx.job.id)}
