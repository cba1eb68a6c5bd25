"""The messages that move a job: a run's chain of stages, and the stop of a cancelled job's upstream work.
Sent by task name (jobs.engine.tasks defines the tasks), so that the services that enqueue on commit do not
import the tasks, which import the runner, which calls the services."""

from config.celery import app

RUN_STAGE, RUN_SUBSTEP, STOP_UPSTREAM = "jobs.run_stage", "jobs.run_substep", "jobs.stop_upstream"
START_NEXT = "jobs.start_next"


def start_run(job_id, run: int, kind: str = "media", from_stage: int = 0, countdown: float = 0.0, *,
              root_id: str | None = None, rung: bool = False, task_id: str | None = None,
              doorbell: bool = False) -> None:
    """Enqueue the chain of a run's stages from `from_stage`, one link per stage. A link finds its steps
    done when an earlier link ran its stage inline, and the link that runs the last stage ends the chain.
    A link whose stage waits is sent when its first look is due (Continue's countdown).

    `root_id` sends the chain as part of an existing one (the chain holding a polling lease), and `rung`
    says a provider called back: the waiting stage looks at once (jobs.services.job_wake). `task_id`: the
    message's id, when a lease held for a task's id must be found by the message that takes it up.

    A first stage's message is a doorbell (jobs.dispatch): it starts the fairest queued job, this one when
    it is its turn; `doorbell` says it was rung for a job created or retried (one such message per job)."""
    from jobs.kinds import KINDS  # at call time: services imports this module, kinds import services (jobs.kinds)

    first, *rest = KINDS[kind].recipe.stages[from_stage:]
    links = [app.signature(RUN_STAGE, (str(job_id), run, stage.name), immutable=True) for stage in rest]
    # The chain travels in the first message (Celery's own `chain` field, links in reverse order), as
    # canvas.chain would send it, without freezing every link up front: this runs in every POST.
    kwargs = {name: True for name, on in (("rung", rung), ("doorbell", doorbell)) if on}
    app.send_task(RUN_STAGE, (str(job_id), run, first.name), kwargs or None,
                  countdown=countdown or None, root_id=root_id, task_id=task_id,
                  chain=[dict(link) for link in reversed(links)] or None)


def start_created(job_id, run: int, kind: str) -> None:
    """The doorbell of a job created or retried (jobs.dispatch counts one per such job)."""
    start_run(job_id, run, kind, doorbell=True)


def ring(client_id=None, countdown: float | None = None) -> None:
    """A doorbell of fair dispatch with no job of its own: start the fairest queued job (jobs.dispatch).
    `client_id`: the client whose freed slot rang it; `countdown`: rung again after a while."""
    app.send_task(START_NEXT, (str(client_id) if client_id else None,), countdown=countdown)


def stop_upstream(job_id, run: int, countdown: float | None = None) -> None:
    """A cancel won: stop the job's upstream work now rather than at its next poll (or after `countdown`)."""
    app.send_task(STOP_UPSTREAM, (str(job_id), run), countdown=countdown)
