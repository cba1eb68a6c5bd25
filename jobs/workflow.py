"""The vocabulary of recipes (docs/design.md, "How a job runs: durable steps"): how a job's kind names its steps, and
what running a stage can answer. jobs.recipes declares recipes in it; jobs.runner runs them; jobs.tasks turns the
answers into Celery actions.

A recipe is a list of stages; a stage is one Celery task running one or more steps, each its own `Step`
row (a checkpoint is a row, not a message). A stage ends where the job must wait (a polling step) or fan
out (parallel sub-steps).

The contract between the runner and the chain (jobs.tasks.start_run and jobs.tasks._follow), in one
place. `start_run` sends one message for a run's first stage and carries the later stages as the links
of Celery's own `chain` field.
`runner.run_stage` runs its stage and then the following stages inline, for as long as none has to wait,
and answers:

| answer | the runner means | the task does |
| --- | --- | --- |
| `Continue(countdown)` | a later stage has to wait `countdown` s (its first poll is not due); it is the chain's next link | sends the chain's next link with that countdown (the rest of the chain with it), and drops the chain here |
| `Done` | the run went through its last stage | drops the rest of the chain (those links would find their steps done) |
| `Stop(reason)` | nothing more for this chain: the job ended, moved to another run, or someone else carries it | drops the rest of the chain |
| `Later(countdown)` | run this same stage again after a pause (a poll, a back-off, a lease held elsewhere) | sends this very task again after `countdown`, with the rest of its chain, and drops the chain here |
| `FanOut(stage, keys)` | start these sub-steps in parallel; their join continues the run | sends one `run_substep` per key and drops the chain here |
| `Resume(kind, index, countdown)` | start the rest of the run from stage `index` (a fan-out joined, or a stage two or more links on has to wait) | calls `start_run` from that stage: a new chain |
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
    fn: Callable  # fn(ctx) -> JSON result; a WAIT step returns None while it is still waiting
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


# --- what running a stage answers (the table above) ---------------------------------------------------------


@dataclass(frozen=True)
class Continue:
    """The stage is done, and the next one has to wait `countdown` seconds: the chain's next link runs it."""

    countdown: float = 0.0


@dataclass(frozen=True)
class Done:
    """The run went through its last stage: nothing is left for the chain."""


@dataclass(frozen=True)
class Stop:
    """Nothing more for this chain: the job ended, moved on to another run, or someone else carries it."""

    reason: str
    again_s: float | None = None  # a cancelled job's upstream work to look at again (jobs.tasks.stop_upstream)


@dataclass(frozen=True)
class Later:
    """Run this stage again after `countdown` seconds (a poll, a back-off, a lease held elsewhere)."""

    countdown: float


@dataclass(frozen=True)
class FanOut:
    """Start these sub-steps in parallel; their join continues the run."""

    stage: str
    keys: list[str]


@dataclass(frozen=True)
class Resume:
    """Start the rest of the run from this stage (after a fan-out joined, or from the sweeper)."""

    kind: str
    stage_index: int
    countdown: float = 0.0
