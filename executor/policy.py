"""The attempt runner's decisions, as tables and pure functions (DESIGN.md, section 3): what an attempt's
error class means for the chain, how long to wait before the next try, how long an attempt may be
waited on. No database and no network here: executor.attempts reads the record and acts on what these
say, and tests/test_policy.py checks them row by row.
"""

from dataclasses import dataclass

from config.retry import backoff_s
from executor.providers.base import ErrorClass

# What ends the chain at once, with the job's error code.
STOP_CODES = {
    ErrorClass.AUTH: "PROVIDER_AUTH",
    ErrorClass.INVALID_INPUT: "INVALID_INPUT",
    ErrorClass.CANCELLED: "CANCELLED",
    ErrorClass.BUDGET_EXCEEDED: "BUDGET_EXCEEDED",
    "pre_submit_refused": "PRE_SUBMIT_REFUSED",
    "upload_failed": "UPLOAD_FAILED",
}
# The classes that may try the same model again, while it has tries left.
RETRY_SAME_MODEL = frozenset({ErrorClass.RATE_LIMITED, ErrorClass.TIMEOUT, ErrorClass.SERVER_ERROR,
                              ErrorClass.NETWORK, ErrorClass.REFUSED})
# Why the chain moves on to the next model (a reason the job's policy.fallback_on may name), and the
# job's error code when it cannot.
MOVE_ON = {
    ErrorClass.RATE_LIMITED: ("exhausted", "ATTEMPTS_EXHAUSTED"),
    ErrorClass.TIMEOUT: ("exhausted", "ATTEMPTS_EXHAUSTED"),
    ErrorClass.SERVER_ERROR: ("exhausted", "ATTEMPTS_EXHAUSTED"),
    ErrorClass.NETWORK: ("exhausted", "ATTEMPTS_EXHAUSTED"),
    ErrorClass.REFUSED: ("refused", "PROVIDER_REFUSED"),
    ErrorClass.UNAVAILABLE: ("unavailable", "PROVIDER_UNAVAILABLE"),
    ErrorClass.WINDOW_EXPIRED: ("window_expired", "WINDOW_EXPIRED"),
}
DEFAULT_ATTEMPTS_PER_MODEL = 3
BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 60.0
RETRY_AFTER_MAX_S = 300.0
# Polls that fail back off from the poll interval up to this, inside the attempt's deadline.
POLL_BACKOFF_MAX_S = 60.0


@dataclass(frozen=True)
class Next:
    """The next attempt: on `model`, after `wait_s` seconds."""

    model: str
    wait_s: float = 0.0


@dataclass(frozen=True)
class Over:
    """The chain is over: the job fails with `code`."""

    code: str


def after_attempt(*, chain: list[str], policy: dict, model: str, error_class: str | None, tries_on_model: int,
                  retry_in_s: float = 0.0) -> Next | Over:
    """What follows an attempt on `model` that ended without success (DESIGN.md's attempt-runner table).

    `tries_on_model`: how often this run has sent to `model` so far; `retry_in_s`: how long the ended
    attempt asked to wait before another try (its back-off, or the provider's Retry-After)."""
    cls = error_class or ErrorClass.SERVER_ERROR
    if cls in STOP_CODES:
        return Over(STOP_CODES[cls])
    if cls in RETRY_SAME_MODEL and tries_on_model < policy.get("attempts_per_model", DEFAULT_ATTEMPTS_PER_MODEL):
        return Next(model, max(retry_in_s, 0.0))
    reason, code = MOVE_ON.get(cls, ("exhausted", "ATTEMPTS_EXHAUSTED"))
    position = chain.index(model) if model in chain else len(chain)
    if reason in policy.get("fallback_on", []) and position + 1 < len(chain):
        return Next(chain[position + 1])
    return Over(code)


def retry_backoff_s(tries: int, retry_after: float | None) -> float:
    """How long to wait before trying again after the `tries`-th failure: exponential with jitter; a
    provider's Retry-After wins (within bounds)."""
    if retry_after is not None:
        return min(retry_after, RETRY_AFTER_MAX_S)
    from django.conf import settings

    return backoff_s(tries, base=BACKOFF_BASE_S, cap=min(BACKOFF_MAX_S, settings.RETRY_BACKOFF_MAX_S))


def attempt_window_s(*, policy_window_s: float | None, provider_window_s: float | None, deadline_s: float) -> float:
    """How long an accepted attempt may be waited on (DESIGN.md, section 9: every wait ends): the
    tighter of the job's policy.window_s and the provider's own limit, else the deadline for everyone
    (WAIT_DEADLINE_S)."""
    windows = [w for w in (policy_window_s, provider_window_s) if w]
    return min(windows) if windows else deadline_s


def poll_retry_s(poll_errors: int, *, poll_interval_s: float, left_s: float) -> float:
    """After the `poll_errors`-th poll that failed in a row: back off from the poll interval, never past
    the attempt's deadline (the pass at the deadline ends the attempt)."""
    wait = backoff_s(poll_errors, base=poll_interval_s, cap=POLL_BACKOFF_MAX_S)
    return max(min(wait, left_s), 0.05)


def next_poll_s(*, waited_s: float, expected_s: float | None, interval_s: float, cap_s: float,
                left_s: float) -> float:
    """How long until the next poll of an accepted attempt that has been waited on for `waited_s`
    (DESIGN.md, section 9: waiting costs little). Stateless, from the clock alone, so it costs no write:

    - before the provider's expected duration (where it says one): at that duration;
    - past it (or with none said): as long as the render has run over already, at least `interval_s`
      and at most `cap_s`, so the gaps double: with a 2 s interval and no expected duration, a 60 s
      render is polled at 2, 4, 8, 16, 32 and 62 s;
    - never past the attempt's deadline (`left_s`): the pass at the deadline ends the attempt.
    """
    if expected_s and waited_s < expected_s:
        wait = expected_s - waited_s
    else:
        over = waited_s - (expected_s or 0.0)
        wait = min(max(over, interval_s), cap_s)
    return max(min(wait, left_s), 0.05)


def poll_due(*, waited_s: float, expected_s: float | None, interval_s: float) -> bool:
    """Whether a pass of the wait step should ask the provider now: not before the expected duration (or,
    with none said, one poll interval), unless the provider rang (a callback), which the caller checks
    first. A pass that comes early (the stage run inline right after the submit) schedules the first
    poll instead. A little early counts as due: timers fire a few milliseconds either side."""
    return waited_s >= (expected_s or interval_s) * 0.98
