"""The provider port: what an adapter can do (capabilities), what it answers, and how it fails.

Error classes (DESIGN.md, section 3) are carried on the exception, so retry policy is decided in one
place (the attempt runner), never by scattered try/except blocks.
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Capabilities:
    idempotency_key: bool  # accepts a caller-chosen request id and returns the same work for a repeat
    lookup: bool  # can find an earlier submission by metadata we put in it
    asynchronous: bool  # submit returns an upstream id; completion is polled
    cancel: bool  # can cancel upstream work
    window_s: float | None = None  # per-attempt window matching the provider's own prediction limit


class ErrorClass:
    AUTH = "auth"
    INVALID_INPUT = "invalid_input"
    CANCELLED = "cancelled"
    BUDGET_EXCEEDED = "budget_exceeded"
    RATE_LIMITED = "rate_limited"
    TIMEOUT = "timeout"
    SERVER_ERROR = "server_error"
    NETWORK = "network"
    REFUSED = "refused"
    UNAVAILABLE = "unavailable"
    WINDOW_EXPIRED = "window_expired"


class ProviderError(Exception):
    """A provider call that did not give us what we asked for.

    `outcome_unknown` is True when the provider may have accepted (and charged for) the call: a
    transport error, a timeout or a 5xx. Such a call must be resolved by capability (same key, lookup,
    or a person) before anything else is paid for (DESIGN.md, the recovery table).
    """

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        outcome_unknown: bool = False,
    ):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.retry_after = retry_after
        self.outcome_unknown = outcome_unknown

    def __repr__(self):
        return f"ProviderError({self.kind!r}, {self.message!r}, status={self.status})"


@dataclass
class Submission:
    upstream_id: str
    status: str  # a provider may answer a submit already finished ("succeeded", "failed")
    cost_usd: str | None = None
    output_url: str | None = None
    raw: dict = field(default_factory=dict)


@dataclass
class PollResult:
    status: str  # "running" | "succeeded" | "failed" | "cancelled"
    output_url: str | None = None
    content_type: str | None = None
    error: str | None = None
    cost_usd: str | None = None
    raw: dict = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.status in {"succeeded", "failed", "cancelled"}
