"""The vocabulary of recipes (docs/design.md, "How a job runs: durable steps"): how a job's kind names its
steps and stages. jobs.recipes declares recipes in it; jobs.runner runs them, and answers the chain with
the outcomes of jobs.outcomes; jobs.tasks turns those into Celery actions.

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
    # answer): ready(ctx, mark) -> None (wait as usual), or (result, marked) after making only database
    # writes, with no lease: there is nothing to wait for. `mark(result, when=...)` is the step's done
    # mark as a part of the ready work's own statement (jobs.steps.step_done_cte); marked is whether it
    # was written, or None if the work did not carry it (the runner writes it).
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
    kind: str
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


RECIPES: dict[str, Recipe] = {}


def recipe_register(recipe: Recipe) -> Recipe:
    RECIPES[recipe.kind] = recipe
    return recipe
