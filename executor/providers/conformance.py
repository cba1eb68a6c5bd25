"""What a conformance profile says (docs/providers.md, "The conformance suite"): the cases each provider's
folder declares in its `conformance.py` (`PROFILES`), as data, and tests/executor/test_conformance.py runs.
Kept beside the adapter, so a provider is one folder; nothing here runs anything, and nothing outside the
suite reads it.

An *answer* to a route is what the backend is told to answer with: for the replayed providers a fixture
name, a `{"status", "headers", "body"}` dict or DROP (below); for the sandbox a
fault (`{"action": ..., ...}`, docs/sandbox.md "Faults", the model filled in), or None: no fault, the
sandbox answers by itself. A *script* is `(method, path, answer, ...)` for a route other than the submit
(a poll, a listing): the replayed providers only, the sandbox answers those by itself.
"""

from dataclasses import dataclass, field
from decimal import Decimal

from executor.providers.base import Usage

# The answer that reads the request and closes the connection without a word (the request arrived, the
# answer was lost): tests.support.replay_server's DROP.
DROP = "drop-connection"


@dataclass(frozen=True)
class Refusal:
    label: str
    answer: object
    kind: str  # invalid_input or refused
    words: str  # the provider's own words, kept in the message


@dataclass(frozen=True)
class RateLimit:
    answer: object
    retry_after: float  # what its Retry-After says, in seconds


@dataclass(frozen=True)
class PaidFailure:
    label: str
    submit: object  # the answer to the submit (media: an acceptance; text: the 200 that refuses)
    then: tuple = ()  # scripts for the poll (media)
    params: dict | None = None  # the submit's params, when not the profile's
    error: str = ""  # media: the poll's error, exactly; text: words the error's message holds
    error_class: str | None = None  # media: PollResult.error_class
    usage: Usage | None = None  # text: the usage the refusal carries (it was paid for)


@dataclass(frozen=True)
class LookupCase:
    route: tuple[str, str]  # where the search goes
    found: tuple = ()  # scripts before the lookup that finds
    absent: tuple = ()  # scripts before the lookup that proves absence
    found_id: str | None = None  # None: the id of a submit made first (the sandbox)
    submitted_at: float | None = None  # None: now


@dataclass(frozen=True)
class CancelCase:
    route: tuple[str, str]  # method, path with {id}
    answers: tuple = ()  # the cancel route's answers (replayed providers)
    upstream_id: str | None = None  # None: cancel a render submitted first (the sandbox)
    params: dict | None = None  # that render's params


@dataclass(frozen=True)
class PriceCase:
    label: str
    # Worked out by hand from the fixture's (or the sandbox's) numbers and the published price.
    expected: Decimal
    submit: object = None  # the answer to the submit
    then: tuple = ()  # scripts for the poll whose usage is priced (asynchronous media)
    model: str | None = None  # when not the profile's
    params: dict | None = None  # the call's params, and what cost_of is given


@dataclass(frozen=True)
class Profile:
    id: str
    adapter: type
    model: str
    kind: str  # "media" (submit) or "text" (complete)
    backend: str  # "replay" or "sandbox"
    route: tuple[str, str]  # the submit (complete) route
    accepted: object  # the answer that accepts
    accepted_id: str | None  # the upstream id it carries (None: the sandbox's, read from its ledger)
    refusals: tuple[Refusal, ...]
    rate_limit: RateLimit
    server_errors: dict  # status -> answer: every 5xx the adapter has an answer for
    lost: object  # the answer that loses the reply after the request arrived
    paid_failures: tuple[PaidFailure, ...] = ()
    no_paid_failure: str = ""  # why there is none, when no capability says so
    lookup: LookupCase | None = None
    cancel: CancelCase | None = None
    # The suite's signed callback for this provider (tests/executor/test_conformance.py CALLBACKS: it signs
    # as the provider does), by provider name; None: the provider does not call back.
    callback: str | None = None
    prices: tuple[PriceCase, ...] = ()
    params: dict = field(default_factory=dict)
    max_tokens: int = 8000
    # The recorded error answers of the submit route, named `<package>/<stem prefix>`
    # (executor/providers/<package>/fixtures/<stem prefix><status>_*.json): every 5xx among them must be in
    # `server_errors`. None: the sandbox, whose 5xx are its status_5xx faults.
    fixtures: str | None = None
    # Case 11's model and its submit route, when not the profile's: one whose request carries more of
    # payonce's fields (a Replicate model's version).
    wire_model: tuple[str, tuple[str, str]] | None = None

    @property
    def provider(self) -> str:
        return self.adapter.name

    def __str__(self) -> str:
        return self.id
