"""Steps more than one kind's recipe runs."""

from jobs import dispatch, services
from jobs.engine.steps import FirstStart


def mark_running(ctx) -> dict:
    if ctx.started:  # the start that ran this execution made it running (jobs.dispatch): no second UPDATE
        return {"started": True}
    if ctx.start is not None:  # queued: started here, in a slot of its client's limit (jobs.dispatch)
        dispatch.job_start_first(job_id=ctx.job.id, client_id=ctx.job.client_id,
                                 only_choice=ctx.start is FirstStart.ONLY_CHOICE)  # NotStarted: rolled back
        ctx.job.holds_slot = True
        return {"started": True}
    return {"started": services.job_mark_running(job_id=ctx.job.id)}
