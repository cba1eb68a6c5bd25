"""The provider port: what an adapter can do (capabilities), what it answers, and how it fails.

Two kinds of adapter sit behind it: media providers (async renders: submit, poll, fetch) and text
providers (LLM calls: complete). Error classes (docs/design.md, "The attempt runner") are carried on the exception, so
retry policy is decided in one place (executor.policy), never by scattered try/except blocks.
"""

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from config.retry import parse_retry_after  # noqa: F401 (the adapters read Retry-After through here)

# A key's lifetime where the provider documents none: a day (Stripe's, and the common choice).
DEFAULT_KEY_TTL_S = 24 * 3600.0


@dataclass(frozen=True)
class Capabilities:
    idempotency_key: bool  # accepts a caller-chosen request id and returns the same work for a repeat
    lookup: bool  # can find an earlier submission (by metadata we put in it, or by listing)
    asynchronous: bool  # submit returns an upstream id; completion is polled
    cancel: bool  # can cancel upstream work
    window_s: float | None = None  # per-attempt window matching the provider's own prediction limit
    # With neither key nor lookup, an unknown outcome is held for a person by default. A provider of
    # cheap calls (LLM chapters) may instead resubmit automatically, under a new upstream key.
    resubmit_uncertain: bool = False
    # The 5xx (and 408) answers the provider documents as "not accepted, not charged". Any other 4xx is
    # a refusal before acceptance whatever the provider says; a 5xx not named here may have been
    # accepted, so it is an unknown outcome (docs/design.md, "Three kinds of failure").
    unpaid_statuses: frozenset = frozenset()
    # How long a keyed provider remembers an idempotency key, in seconds (None: for ever). Within it a
    # resend is free and settles every unknown outcome; past it a resend may make (and bill) new work.
    key_ttl_s: float | None = DEFAULT_KEY_TTL_S
    # The provider can call back when the work ends (executor.callbacks verifies it; polling stays the
    # fallback, so a provider without it loses nothing but the doorbell).
    callbacks: bool = False

    def answered_unpaid(self, status: int | None) -> bool:
        """Whether an HTTP answer with `status` says the provider accepted nothing and charged nothing."""
        if status is None:
            return False  # no answer at all: nobody knows
        return (400 <= status < 500 and status != 408) or status in self.unpaid_statuses


# An LLM call: synchronous, no key, no lookup, and cheap, so an unknown outcome is resubmitted under a
# new key by rule instead of held for a person. Anthropic and OpenAI document 429, 500, 503 and 529
# ("overloaded") as errors of a request that was not served, and charge nothing for them.
CHEAP_LLM = Capabilities(idempotency_key=False, lookup=False, asynchronous=False, cancel=False,
                         resubmit_uncertain=True, unpaid_statuses=frozenset({429, 500, 502, 503, 504, 529}))


# --- a model: what the registry knows of it, and what an attempt keeps (executor.registry builds them from
# the specs' declarations, the models file and the admin's rows) ---------------------------------------

@dataclass(frozen=True)
class Param:
    """A provider parameter a model takes in a media job's input: its JSON type and bounds (inclusive).

    `type` is "number" (an int or a finite float, never a bool), "integer" (never a bool) or "string".
    """

    name: str
    type: str
    minimum: float | None = None
    maximum: float | None = None
    nullable: bool = False
    choices: tuple | None = None  # the only values taken (a size, a quality)

    def problem(self, value) -> str | None:
        """Why `value` is not a value of this parameter, or None."""
        if value is None:
            return None if self.nullable else "May not be null."
        if self.choices is not None and (isinstance(value, bool) or value not in self.choices):
            return f"Must be one of: {', '.join(map(str, self.choices))}."
        if self.type == "string":
            return None if isinstance(value, str) else "A string is required."
        wanted = "An integer" if self.type == "integer" else "A number"
        if isinstance(value, bool) or not isinstance(value, int if self.type == "integer" else (int, float)):
            return f"{wanted}{' or null' if self.nullable else ''} is required."
        try:
            finite = math.isfinite(value)
        except OverflowError:  # an int beyond a double's range (310 digits): isfinite cannot make it a float
            return "A finite number that fits a double (at most about 1.8e308 in size) is required."
        if not finite:
            return "A finite number is required."
        if self.minimum is not None and value < self.minimum:
            return f"Ensure this value is greater than or equal to {self.minimum:g}."
        if self.maximum is not None and value > self.maximum:
            return f"Ensure this value is less than or equal to {self.maximum:g}."
        return None


@dataclass(frozen=True)
class ModelSpec:
    provider: str
    model: str
    kind: str  # "video", "image" or "text"
    content_type: str
    extension: str
    capabilities: Capabilities
    # The `input` parameters the model takes, or None: passed through unchecked (a model whose adapter cannot
    # know them, an arbitrary Replicate model; text models, whose input is a report's, checked elsewhere).
    # Declared, an undeclared key is refused at submit: otherwise a typo is paid for as a default render.
    params: tuple[Param, ...] | None = None

    @property
    def name(self) -> str:
        return f"{self.provider}/{self.model}"

    def snapshot(self) -> dict:
        """The spec as an attempt keeps it (Attempt.spec): what waiting on, cancelling and settling the
        attempt need, whatever happens to the catalog after it went out. Its parameters are not kept:
        they are checked at submit, before any attempt exists."""
        capabilities = dataclasses.asdict(self.capabilities)
        capabilities["unpaid_statuses"] = sorted(self.capabilities.unpaid_statuses)
        return {"provider": self.provider, "model": self.model, "kind": self.kind, "content_type": self.content_type,
                "extension": self.extension, "capabilities": capabilities}

    @classmethod
    def from_snapshot(cls, kept: Mapping) -> "ModelSpec":
        capabilities = {name: value for name, value in kept["capabilities"].items() if name in CAPABILITY_FIELDS}
        capabilities["unpaid_statuses"] = frozenset(capabilities.get("unpaid_statuses") or ())
        return cls(kept["provider"], kept["model"], kept["kind"], kept["content_type"], kept["extension"],
                   Capabilities(**capabilities))


CAPABILITY_FIELDS = {each.name: each for each in dataclasses.fields(Capabilities)}


class ErrorClass(StrEnum):
    """Why an attempt failed (Attempt.error_class): what the policy's tables decide by. A provider's
    failure carries its class (ProviderError.kind); the last two are payonce's own refusals before a send."""

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
    PRE_SUBMIT_REFUSED = "pre_submit_refused"  # a pre-submit check said no (settings.PRE_SUBMIT_CHECKS)
    UPLOAD_FAILED = "upload_failed"  # an input could not be uploaded, for good


class ProviderError(Exception):
    """A provider call that did not give us what we asked for.

    `outcome_unknown` is True when the provider may have accepted (and charged for) the call: a
    transport error, a timeout or a 5xx on a submit. Such a call must be resolved by capability (same
    key, lookup, or a person) before anything else is paid for
    (docs/design.md, "Intent before spend, and the recovery table").
    `never_sent` is True when no byte of the request left (the connection was refused, or never
    made): nothing can have been accepted, so the outcome is known, not paid, and it is no answer either.
    `message` keeps the provider's own words.
    """

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        outcome_unknown: bool = False,
        never_sent: bool = False,
    ):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.retry_after = retry_after
        self.outcome_unknown = outcome_unknown
        self.never_sent = never_sent

    def __repr__(self):
        return f"ProviderError({self.kind!r}, {self.message!r}, status={self.status})"


@dataclass
class Usage:
    """What a call used, as the provider reported it, normalised: `input_tokens` never includes cached
    tokens (Anthropic reports them apart; OpenAI's prompt_tokens includes them and is split here)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    units: float | None = None  # media: seconds rendered or images made, when the provider says

    def as_dict(self) -> dict:
        return {key: value for key, value in self.__dict__.items() if value}


class WorkStatus(StrEnum):
    """Where the work a provider took is, as an adapter answers it (Submission.status, PollResult.status): a
    `str` enum, so a comparison with "running" and the JSON of a status are what they were as strings."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({WorkStatus.SUCCEEDED, WorkStatus.FAILED, WorkStatus.CANCELLED})


@dataclass
class Submission:
    upstream_id: str
    status: WorkStatus  # RUNNING, or already SUCCEEDED / FAILED when the provider answers synchronously
    cost_usd: str | None = None  # quoted by the provider, as a decimal string
    output_url: str | None = None
    error: str | None = None
    usage: Usage | None = None
    raw: dict = field(default_factory=dict)
    expected_s: float | None = None  # how long the provider expects the work to take, where it says
    # A synchronous provider that answers the finished work in its body (OpenAI's images, as base64):
    # the bytes, kept by the executor before the acceptance is recorded (they were paid for).
    output: bytes | None = None
    output_content_type: str | None = None


@dataclass
class PollResult:
    status: WorkStatus
    output_url: str | None = None
    content_type: str | None = None
    error: str | None = None
    error_class: str | None = None  # why it failed upstream, when the provider says (refused, ...)
    cost_usd: str | None = None
    usage: Usage | None = None
    raw: dict = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


@dataclass
class Completion:
    upstream_id: str
    text: str
    stop_reason: str | None
    usage: Usage
    cost_usd: str | None = None
    raw: dict = field(default_factory=dict)


class MediaProvider(Protocol):
    """An async renderer (video, image)."""

    name: str

    def upload_input(self, model: str, payload: bytes, content_type: str) -> str:
        """Put reference media into the provider's input store; returns what a submit refers to it by."""

    def submit(self, model: str, *, upstream_key: str, prompt: str, params: dict, metadata: dict,
               inputs: list[str]) -> Submission:
        """Start a render. `upstream_key` goes out as the provider's idempotency key where it has one;
        `metadata` carries payonce_job, payonce_attempt and upstream_key wherever the provider keeps it."""

    def poll(self, model: str, upstream_id: str) -> PollResult: ...

    def lookup(self, model: str, *, upstream_key: str, metadata: dict, prompt: str, params: dict,
               submitted_at: float, inputs: list[str] | None = None) -> Submission | None:
        """Find a submission made earlier for this attempt (capability `lookup`); None only when it is
        proven absent (a search that could not finish raises, with an unknown outcome)."""

    def cancel(self, model: str, upstream_id: str) -> None: ...

    def fetch(self, url: str) -> bytes: ...


class TextProvider(Protocol):
    """A synchronous LLM call."""

    name: str

    def complete(self, model: str, *, system: str, messages: list[dict], max_tokens: int, upstream_key: str,
                 metadata: dict) -> Completion: ...


def classify_http_error(status: int, refused: bool = False) -> tuple[str, bool]:
    """(error class, outcome unknown) for an HTTP error answer to a call that may create paid work.
    `refused` is the adapter's reading of the body: a content-policy refusal."""
    if status >= 500 or status == 408:
        return (ErrorClass.TIMEOUT if status in (408, 504) else ErrorClass.SERVER_ERROR), True
    if status == 429:
        return ErrorClass.RATE_LIMITED, False
    if status in (401, 403):
        return ErrorClass.AUTH, False
    if status == 404:
        return ErrorClass.UNAVAILABLE, False
    if refused:
        return ErrorClass.REFUSED, False
    return ErrorClass.INVALID_INPUT, False
