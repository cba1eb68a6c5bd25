"""Recipes: a job's kind names its ordered steps (DESIGN.md, section 2).

`media`: mark running, reserve budget, check the output key, submit | wait | store output, finish.
Three stages, so three messages: steps that only touch the database or read run inline in one task,
each still its own `Step` row; a message is needed only where the job waits on the provider.
"""

from executor import attempts
from executor import services as executor
from jobs import services
from jobs.models import JobStatus
from jobs.workflow import Effect, Recipe, Stage, StepSpec, recipe_register


def mark_running(ctx) -> dict:
    return {"started": services.job_mark_running(job_id=ctx.job.id)}


def reserve_budget(ctx) -> dict:
    # The budget guard (DESIGN.md, section 6) reserves the worst case here; until billing lands it is a
    # checkpoint that reserves nothing.
    return {"reserved_usd": None}


def check_output(ctx) -> dict:
    output = executor.output_check(ctx.job)
    return {"exists": output is not None, "output": output}


def submit(ctx) -> dict:
    if ctx.result("check_output")["exists"]:
        return {"skipped": True}  # this job's output is already stored: nothing to pay for
    return attempts.submit(ctx.job)


def wait(ctx) -> dict | None:
    if ctx.result("submit").get("skipped"):
        return {"skipped": True}
    return attempts.wait(ctx.job)


def store_output(ctx) -> dict:
    existing = ctx.result("check_output")
    if existing["exists"]:
        return {"output": existing["output"]}
    return {"output": executor.media_store(ctx.job, ctx.result("wait"))}


def finish(ctx) -> dict:
    won = services.job_finish(job_id=ctx.job.id, status=JobStatus.SUCCEEDED, output=ctx.result("store_output")["output"])
    return {"won": won}


def cancel_upstream(ctx) -> None:
    attempts.cancel_current(ctx.job)


MEDIA = recipe_register(
    Recipe(
        kind="media",
        stages=(
            Stage("prepare", (
                StepSpec("mark_running", mark_running, Effect.DB),
                StepSpec("reserve_budget", reserve_budget, Effect.DB),
                StepSpec("check_output", check_output, Effect.READ),
                StepSpec("submit", submit, Effect.EXTERNAL),
            )),
            Stage("wait", (StepSpec("wait", wait, Effect.WAIT),)),
            # Writing the output is create-only and idempotent for this job, so it needs no lease.
            Stage("finish", (
                StepSpec("store_output", store_output, Effect.READ),
                StepSpec("finish", finish, Effect.DB),
            )),
        ),
        on_cancel=cancel_upstream,
    )
)
