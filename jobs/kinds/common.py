"""Steps more than one kind's recipe runs."""

from jobs import dispatch, services


def mark_running(ctx) -> dict:
    if ctx.started:  # the start that ran this execution made it running (jobs.dispatch): no second UPDATE
        return {"started": True}
    if ctx.take_slot is not None:  # the start is this step's, in a slot of its client's limit (jobs.dispatch)
        client_id, limit = ctx.take_slot
        started = dispatch.job_start_in_slot(job_id=ctx.job.id, client_id=client_id, limit=limit)
        ctx.job.holds_slot = ctx.job.holds_slot or started
        if not started:
            # Another doorbell started this job (or it was cancelled) between the choice and now: that
            # doorbell's own job is left without one, so this one rings in its place (jobs.dispatch).
            services.ring_for_client(client_id)
        return {"started": started}
    return {"started": services.job_mark_running(job_id=ctx.job.id)}
