"""Steps more than one kind's recipe runs."""

from jobs import services


def mark_running(ctx) -> dict:
    if ctx.started:  # the start that ran this execution made it running (jobs.dispatch): no second UPDATE
        return {"started": True}
    return {"started": services.job_mark_running(job_id=ctx.job.id)}
