"""What a step can say besides returning a result. Raised by step functions (and the executor they
call), handled in one place: the step runner (jobs.runner)."""


class JobFailure(Exception):
    """A definite end of the run: the job fails with an API error code (OUTPUT_KEY_CONFLICT, ...)."""

    def __init__(self, code: str, message: str, **details):
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    def as_error(self) -> dict:
        return {"code": self.code, "message": self.message, **self.details}


class JobInputError(JobFailure):
    """A database error that will recur (a value the column cannot hold, a check constraint) met while a
    step ran: however often the step is run again it fails the same way, so the run ends
    INTERNAL_INPUT_ERROR from whichever step it came, a fan-out's sub-step included."""

    CODE = "INTERNAL_INPUT_ERROR"

    def __init__(self, exc: BaseException):
        cause = exc.__cause__ or exc
        words = str(getattr(getattr(cause, "diag", None), "message_primary", None) or cause).splitlines()[0][:300]
        super().__init__(self.CODE, f"A value of this job could not be stored: {words}.",
                         sqlstate=getattr(cause, "sqlstate", None))


class JobHold(JobFailure):
    """The run cannot go on without a person: the job goes to `waiting` (UNCERTAIN_SUBMIT, ...)."""


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
