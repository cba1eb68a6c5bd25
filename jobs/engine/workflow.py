"""The vocabulary of recipes (docs/design.md, "How a job runs: durable steps"): how a job's kind names its
steps and stages, and what else a kind declares (`Kind`). The kinds (jobs.kinds: one module each, one line
in its table) declare their recipes in it; jobs.engine.runner runs them, and answers the chain with the outcomes
of jobs.engine.outcomes; jobs.engine.tasks turns those into Celery actions.

A recipe is a list of stages; a stage is one Celery task running one or more steps, each its own `Step`
row (a checkpoint is a row, not a message). A stage ends where the job must wait (a polling step) or fan
out (parallel sub-steps).
"""

import enum
from dataclasses import dataclass
from typing import Callable


class Effect(enum.Enum):
    DB = "db"  # only database effects: they and the done mark commit together
    READ = "read"  # reads outside the database (or effects that are idempotent by key): run, then mark done
    EXTERNAL = "external"  # effects outside the database: lease, heartbeat, then mark done
    WAIT = "wait"  # polls something slow: holds a lease across polls, re-scheduled until finished


@dataclass(frozen=True)
class StepSpec:
    name: str
    fn: Callable  # fn(ctx) -> JSON result; a WAIT step raises NotYet while it is still waiting
    effect: Effect
    # A WAIT step whose work may already be over when it starts (a render finished in its submit's
    # answer): ready(ctx, mark) -> None (wait as usual), or the step's result after making only database
    # writes, with no lease: there is nothing to wait for. `mark` is the step's done mark (a fresh
    # jobs.engine.steps.DoneMark), for the ready work's own statement to carry (`mark.cte`); if it does
    # not, the runner writes it.
    ready: Callable | None = None


@dataclass(frozen=True)
class FanOutSpec:
    """Parallel sub-steps of one stage, one `Step` row each (`{name}-{key}`), joined when all have ended."""

    name: str
    keys: Callable  # keys(ctx) -> list[str]
    fn: Callable  # fn(ctx, key) -> JSON result (an EXTERNAL effect)
    # lead(ctx, pending) -> the key that must end before the others start, or None (all at once): what the
    # first sub-step leaves behind (a provider's prompt cache) makes the others cheaper.
    lead: Callable | None = None

    def step_name(self, key: str) -> str:
        return f"{self.name}-{key}"

    @property
    def join_name(self) -> str:
        return f"{self.name}:joined"


@dataclass(frozen=True)
class Stage:
    name: str
    steps: tuple[StepSpec, ...] = ()
    fanout: FanOutSpec | None = None

    @property
    def waits(self) -> bool:
        """A stage that polls (a provider's callback wakes it: executor.callbacks)."""
        return any(spec.effect is Effect.WAIT for spec in self.steps)

    def step_names(self) -> list[str]:
        return [self.fanout.join_name] if self.fanout else [spec.name for spec in self.steps]


@dataclass(frozen=True)
class Recipe:
    stages: tuple[Stage, ...]
    # on_cancel(ctx): stop upstream work of a cancelled job; returns seconds until it should run again
    # (a send whose answer may still come), or None
    on_cancel: Callable | None = None

    def index(self, stage_name: str) -> int:
        return next(i for i, stage in enumerate(self.stages) if stage.name == stage_name)

    def waiting_stage(self) -> int:
        """The index of the stage that polls (the one a provider's callback wakes)."""
        return next(i for i, stage in enumerate(self.stages) if stage.waits)

    def waiting_step(self) -> "StepSpec | None":
        """The step that polls (the one a provider's callback wakes), or None: nothing of this kind waits."""
        return next((spec for stage in self.stages for spec in stage.steps if spec.effect is Effect.WAIT), None)


@dataclass(frozen=True)
class Kind:
    """Everything the code says of one job kind, declared once (jobs.kinds.KINDS holds one per kind): what
    the API, the engine and the operators would otherwise each decide with a `kind ==` branch."""

    name: str  # the API's and the row's word for it (the OpenAPI enum JobKind lists the names)
    # The executor.models.ModelKind values whose models serve this kind. The mapping lives here, on the jobs
    # side: the executor sits below jobs and knows model kinds only (and that a text model is a `complete`
    # call, the others a `submit`); which job kind a model serves is jobs' word, so jobs maps down to it.
    model_kinds: frozenset[str]
    recipe: Recipe
    # accept_input(attrs, client=...) -> {field: errors}: the create serializer's check of `input` (the
    # kind's input serializer) and of whatever else of the request the kind refuses. Accepted, it sets
    # attrs["input_as_sent"] (the body's hash is over it) and attrs["input"] (the cleaned input, stored).
    accept_input: Callable
    # worst_cases(jobs) -> Decimal: the most new runs of `jobs` (a QuerySet of this kind's jobs) may
    # reserve, every call at its worst case, in a few statements whatever their number (an operator's
    # retry preview: operators.operations.retry_worst_cases).
    worst_cases: Callable
    # answer(job, attempts) -> dict: the fields job_as_dict adds for this kind (a report's chapters).
    answer: Callable = lambda job, attempts: {}
    # text(job) -> str | None: a kind whose output is a text read at GET /v1/jobs/{id}/report (the sealed
    # text, or None while there is none), not an object in the client's store. None: the output is an
    # object in the store, read at GET /v1/jobs/{id}/output.
    text: Callable | None = None
    # timeline(job) -> facts | None: the kind's section of the operators' job page (operators.timeline
    # calls it; operators sit above jobs and read this table), or None: the kind has no section.
    timeline: Callable | None = None
