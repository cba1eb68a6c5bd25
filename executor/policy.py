"""The attempt runners' decisions, as tables and pure functions (docs/design.md, "Where money is spent: attempts"):
what a job's policy says when the request does not, which of the three kinds of failure an ended send is,
what an attempt's error class means for the chain, how long to wait before the next try, how long an
attempt may be waited on and its key lives, and the LLM call's own rules. No database and no network
here: executor.render and executor.llm read the record and act on what these say, and
tests/executor/test_policy.py checks them row by row.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from config.retry import backoff_s
from executor.providers.base import ErrorClass
from jobs.engine.outcomes import JobErrorCode

# A job's policy where the request says nothing (jobs.api.serializers.PolicySerializer's defaults).
DEFAULT_ATTEMPTS_PER_MODEL = 3
DEFAULT_FALLBACK_ON = ("exhausted", "unavailable")
# How often a run may pay again automatically after a paid attempt failed, when the policy does not say.
DEFAULT_PAID_RETRIES = 0
# Why the chain may move on to the next model: the reasons a policy's fallback_on may name, in the order a
# stored policy lists them.
FALLBACK_REASONS = ("exhausted", "unavailable", "refused", "window_expired")


def default_policy() -> dict:
    """The policy of a job whose request names none (as PolicySerializer fills it in)."""
    return {"attempts_per_model": DEFAULT_ATTEMPTS_PER_MODEL, "fallback_on": list(DEFAULT_FALLBACK_ON)}


# What ends the chain at once, with the job's error code.
STOP_CODES = {
    ErrorClass.AUTH: JobErrorCode.PROVIDER_AUTH,
    ErrorClass.INVALID_INPUT: JobErrorCode.INVALID_INPUT,
    ErrorClass.CANCELLED: JobErrorCode.CANCELLED,
    ErrorClass.BUDGET_EXCEEDED: JobErrorCode.BUDGET_EXCEEDED,
    ErrorClass.PRE_SUBMIT_REFUSED: JobErrorCode.PRE_SUBMIT_REFUSED,
    ErrorClass.UPLOAD_FAILED: JobErrorCode.UPLOAD_FAILED,
}
# The classes that may try the same model again, while it has tries left.
RETRY_SAME_MODEL = frozenset({ErrorClass.RATE_LIMITED, ErrorClass.TIMEOUT, ErrorClass.SERVER_ERROR,
                              ErrorClass.NETWORK, ErrorClass.REFUSED})
# Why the chain moves on to the next model (a reason the job's policy.fallback_on may name), and the
# job's error code when it cannot.
MOVE_ON = {
    ErrorClass.RATE_LIMITED: ("exhausted", JobErrorCode.ATTEMPTS_EXHAUSTED),
    ErrorClass.TIMEOUT: ("exhausted", JobErrorCode.ATTEMPTS_EXHAUSTED),
    ErrorClass.SERVER_ERROR: ("exhausted", JobErrorCode.ATTEMPTS_EXHAUSTED),
    ErrorClass.NETWORK: ("exhausted", JobErrorCode.ATTEMPTS_EXHAUSTED),
    ErrorClass.REFUSED: ("refused", JobErrorCode.PROVIDER_REFUSED),
    ErrorClass.UNAVAILABLE: ("unavailable", JobErrorCode.PROVIDER_UNAVAILABLE),
    ErrorClass.WINDOW_EXPIRED: ("window_expired", JobErrorCode.WINDOW_EXPIRED),
}
BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 60.0
RETRY_AFTER_MAX_S = 300.0
# Polls that fail back off from the poll interval up to this, inside the attempt's deadline.
POLL_BACKOFF_MAX_S = 60.0


# An LLM call (executor.llm): up to LLM_ATTEMPTS attempts, each writing at most LLM_MAX_TOKENS.
LLM_MAX_TOKENS = 8000
LLM_ATTEMPTS = 3
# Worth another try: the provider said "not now" (429, 5xx) or never answered. Any other 4xx gets the
# same answer again, so it ends the call.
LLM_RETRYABLE = frozenset({ErrorClass.RATE_LIMITED, ErrorClass.SERVER_ERROR, ErrorClass.TIMEOUT, ErrorClass.NETWORK})


def llm_max_tokens(asked: int) -> int:
    """The output tokens a call may write: what was asked for, at most LLM_MAX_TOKENS."""
    return min(asked, LLM_MAX_TOKENS)


class Failure(StrEnum):
    """The three kinds of failure: the rule behind the name. Only the first lets the attempt runner try
    again on its own; nothing automatic ever pays twice for the same work."""

    UNPAID = "unpaid"  # the provider said no before accepting: tried again under attempts_per_model, fallback_on
    UNKNOWN = "unknown"  # nobody knows: resolved by capability (same key, lookup, or a person), never a try
    PAID = "paid"  # accepted, then failed: paid again only under policy.paid_retries, or by a person's retry


def failure_kind(*, accepted: bool, outcome_unknown: bool = False, answered_unpaid: bool = False,
                 key_pinned: bool = False) -> Failure:
    """Which kind of failure an ended send (or attempt) is. The rows, first match wins:

    | what happened                                                       | kind    |
    | ------------------------------------------------------------------- | ------- |
    | accepted, then failed (a failed render, an expired window, a paid refusal) | paid |
    | any answer to a resend of a key one of whose earlier sends went unanswered | unknown |
    | an answer the adapter declares unpaid (a 4xx refusal, a 429, a declared 5xx) | unpaid |
    | no answer, a lost reply, a 5xx not declared unpaid                  | unknown |
    | any other answer (a refusal, a connection that never opened)        | unpaid  |

    `key_pinned`: the key went out before and that send's outcome is unknown, so the provider may be
    doing (and billing) the work: whatever this send is told speaks for this send only.
    """
    if accepted:
        return Failure.PAID
    if key_pinned:
        return Failure.UNKNOWN
    if answered_unpaid:
        return Failure.UNPAID
    if outcome_unknown:
        return Failure.UNKNOWN
    return Failure.UNPAID


def key_may_have_expired(*, age_s: float, ttl_s: float | None, in_flight_s: float) -> bool:
    """Whether a resend of a key first sent `age_s` ago could reach a provider that has forgotten it (and
    so make, and bill, the work a second time). `ttl_s` None: the provider remembers keys for ever. A
    send takes up to `in_flight_s` to arrive, so the margin is that long (at most a tenth of the TTL)."""
    if ttl_s is None:
        return False
    return age_s >= ttl_s - min(in_flight_s, ttl_s / 10)


@dataclass(frozen=True)
class Next:
    """The next attempt: on `model`, after `wait_s` seconds."""

    model: str
    wait_s: float = 0.0


@dataclass(frozen=True)
class Over:
    """The chain is over: the job fails with `code`."""

    code: JobErrorCode


def after_attempt(*, chain: list[str], policy: dict, model: str, error_class: str | None, tries_on_model: int,
                  retry_in_s: float = 0.0, paid: bool = False, paid_failures: int = 0) -> Next | Over:
    """What follows an attempt on `model` that ended without success (the attempt-runner table).

    `tries_on_model`: how many attempts of this run went to `model` so far; `retry_in_s`: how long the
    ended attempt asked to wait before another try (its back-off, or the provider's Retry-After). `paid`:
    the ended attempt was accepted (so charged, or maybe charged); `paid_failures`: how many attempts of
    this run were, this one included. Another attempt after a paid one pays again: only while
    policy.paid_retries allows it, else the run ends PAID_ATTEMPT_FAILED (a person may retry)."""
    cls = error_class or ErrorClass.SERVER_ERROR
    if cls in STOP_CODES:
        return Over(STOP_CODES[cls])
    decided = _chain_next(chain=chain, policy=policy, model=model, cls=cls, tries_on_model=tries_on_model,
                          retry_in_s=retry_in_s)
    if paid and isinstance(decided, Next) and paid_failures > policy.get("paid_retries", DEFAULT_PAID_RETRIES):
        return Over(JobErrorCode.PAID_ATTEMPT_FAILED)
    return decided


def _chain_next(*, chain: list[str], policy: dict, model: str, cls: str, tries_on_model: int,
                retry_in_s: float) -> Next | Over:
    if cls in RETRY_SAME_MODEL and tries_on_model < policy.get("attempts_per_model", DEFAULT_ATTEMPTS_PER_MODEL):
        return Next(model, max(retry_in_s, 0.0))
    reason, code = MOVE_ON.get(cls, ("exhausted", JobErrorCode.ATTEMPTS_EXHAUSTED))
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
    """How long an accepted attempt may be waited on (docs/design.md, "Every wait ends"): the
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
    (docs/design.md, "Waiting costs little"). Stateless, from the clock alone, so it costs no write:

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


def job_deadline(created_at: datetime, policy: dict | None) -> datetime | None:
    """The moment by which a job's first paid call must go out (`policy.deadline_s` after its create, or
    `policy.deadline_at`: the earlier), or None: it has none (executor.record, jobs.engine.sweeper)."""
    policy = policy or {}
    moments = []
    if policy.get("deadline_s") is not None:
        moments.append(created_at + timedelta(seconds=policy["deadline_s"]))
    if policy.get("deadline_at"):
        moments.append(datetime.fromisoformat(policy["deadline_at"]))
    return min(moments) if moments else None
