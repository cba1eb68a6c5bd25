"""The runner's outcomes, in one place: what a step raises besides returning its result (and the executor
it calls raises with it), and what running a stage answers the chain (docs/design.md, "How a job runs:
durable steps").

This module imports nothing of payonce's: the layers below the job engine (the executor) raise its
exceptions from inside a step without importing the engine
(docs/architecture.md, "Reaching up: ports handed down").

Two ways to say "not now", both raised by a step and both turned into the stage's `Later` by the runner:
`StepRetry` (something did not work and may: back off) and `NotYet` (nothing failed: a waiting step's
work is not done, and its schedule says when to look). `Continue(countdown)` and `Later(countdown)` are
what the runner answers the chain: the next stage after a pause, or this one again.

What running a stage answers, and what the task does with it (jobs.engine.chain.start_run sends one message for
a run's first stage and carries the later stages as the links of Celery's own `chain` field;
`jobs.engine.runner.run_stage` runs its stage and then the following stages inline, for as long as none has to
wait; jobs.engine.tasks._follow does the rest):

| answer | the runner means | the task does |
| --- | --- | --- |
| `Continue(countdown)` | a later stage has to wait `countdown` s (its first poll is not due); it is the chain's next link | sends the chain's next link with that countdown (the rest of the chain with it), and drops the chain here |
| `Done` | the run went through its last stage | drops the rest of the chain (those links would find their steps done) |
| `Stop(reason)` | nothing more for this chain: the job ended, moved to another run, or someone else carries it | drops the rest of the chain |
| `Later(countdown, kept)` | run this same stage again after a pause (a poll, a back-off, a lease held elsewhere); `kept` says whose the step's lease is meanwhile | sends this very task again after `countdown`, with the rest of its chain, and drops the chain here |
| `FanOut(stage, keys, lead)` | start these sub-steps in parallel; their join continues the run. `lead`: one sub-step alone, the others held back until it ends | sends one `run_substep` per key (the lead's with `lead=True`: it sends the rest when it ends) and drops the chain here |
| `Resume(kind, index, countdown)` | start the rest of the run from stage `index` (a fan-out joined, or a stage two or more links on has to wait) | calls `start_run` from that stage: a new chain |
"""

from dataclasses import dataclass
from enum import StrEnum

# --- what a step raises -------------------------------------------------------------------------------------


class JobErrorCode(StrEnum):
    """Every code a job's `error.code` can carry: the codes a step ends its run with (JobFailure, JobHold)
    and a cancel writes. docs/api.md, "Job statuses and error codes", lists each with the status it ends
    in; tests/jobs/test_error_codes.py holds this enum and that table to each other. Here, in the module
    the layers below the engine may import, so the executor raises them without a string of its own."""

    PAID_ATTEMPT_FAILED = "PAID_ATTEMPT_FAILED"
    ATTEMPTS_EXHAUSTED = "ATTEMPTS_EXHAUSTED"
    PROVIDER_REFUSED = "PROVIDER_REFUSED"
    PROVIDER_UNAVAILABLE = "PROVIDER_UNAVAILABLE"
    PROVIDER_AUTH = "PROVIDER_AUTH"
    INVALID_INPUT = "INVALID_INPUT"
    WINDOW_EXPIRED = "WINDOW_EXPIRED"
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
    PRE_SUBMIT_REFUSED = "PRE_SUBMIT_REFUSED"
    OUTPUT_KEY_CONFLICT = "OUTPUT_KEY_CONFLICT"
    UPLOAD_FAILED = "UPLOAD_FAILED"
    CHAPTER_FAILED = "CHAPTER_FAILED"
    INTERNAL_INPUT_ERROR = "INTERNAL_INPUT_ERROR"
    UNCERTAIN_SUBMIT = "UNCERTAIN_SUBMIT"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    CANCELLED = "CANCELLED"


class JobFailure(Exception):
    """A definite end of the run: the job fails with one of the job error codes (JobErrorCode)."""

    def __init__(self, code: JobErrorCode, message: str, **details):
        super().__init__(message)
        # A code outside the enum (a typo, a string of another vocabulary) is an error where it is raised,
        # not a job ending with a code no document names.
        self.code = JobErrorCode(code)
        self.message = message
        self.details = details

    def as_error(self) -> dict:
        return {"code": self.code, "message": self.message, **self.details}


class JobInputError(JobFailure):
    """A database error that will recur (a value the column cannot hold, a check constraint) met while a
    step ran: however often the step is run again it fails the same way, so the run ends
    INTERNAL_INPUT_ERROR from whichever step it came, a fan-out's sub-step included."""

    CODE = JobErrorCode.INTERNAL_INPUT_ERROR

    def __init__(self, exc: BaseException):
        cause = exc.__cause__ or exc
        words = str(getattr(getattr(cause, "diag", None), "message_primary", None) or cause).splitlines()[0][:300]
        super().__init__(self.CODE, f"A value of this job could not be stored: {words}.",
                         sqlstate=getattr(cause, "sqlstate", None))


class JobHold(JobFailure):
    """The run cannot go on without a person: the job goes to `waiting` (JobErrorCode.UNCERTAIN_SUBMIT)."""


class StepRetry(Exception):
    """The step's outcome is not known yet (a transport error, a 5xx): run the same step again later.
    `countdown` None lets the runner back off by how often the step was tried."""

    def __init__(self, reason: str, countdown: float | None = None):
        super().__init__(reason)
        self.reason = reason
        self.countdown = countdown


class NotYet(Exception):
    """A waiting step's work is not done yet (a render still running): look again after `countdown`
    seconds. Not a retry: nothing failed, the schedule (executor.policy.next_poll_s) said when."""

    def __init__(self, countdown: float):
        super().__init__(f"not done; next look in {countdown:.1f}s")
        self.countdown = countdown


class NotStarted(Exception):
    """The job's first transaction did not start it (jobs.dispatch.job_start_first): it is not the only choice
    there is (another client has queued work, or a job of higher priority waits), its client has no slot
    free, or it is no longer queued (another starter took it, or it was cancelled). Raised by the step that
    starts it, in the transaction that then rolls back: nothing of the job was written, and the task asks
    fair dispatch which job to start instead (jobs.dispatch.job_start)."""


# --- what running a stage answers (the table above) ----------------------------------------------------------


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
    again_s: float | None = None  # a cancelled job's upstream work to look at again (jobs.engine.tasks.stop_upstream)
    undecided: bool = False  # NotStarted: fair dispatch decides which job this message starts (jobs.engine.tasks)


class Kept(StrEnum):
    """Whose the step's lease is across a pause: who may take the step back when the pause is over."""

    TASK = "task"  # reserved for this execution's task id: only this very task, sent again, takes it back
    CHAIN = "chain"  # the chain's polling lease: any link of this chain takes it back


@dataclass(frozen=True)
class Later:
    """Run this stage again after `countdown` seconds (a poll, a back-off, a lease held elsewhere).
    `kept`: whose the step's lease is across the pause, or None when none is kept."""

    countdown: float
    kept: Kept | None = None


@dataclass(frozen=True)
class FanOut:
    """Start these sub-steps in parallel; their join continues the run."""

    stage: str
    keys: list[str]
    lead: bool = False  # one sub-step sent alone: the rest are sent when it ends (FanOutSpec.lead)


@dataclass(frozen=True)
class Resume:
    """Start the rest of the run from this stage (after a fan-out joined, or from the sweeper)."""

    kind: str
    stage_index: int
    countdown: float = 0.0
