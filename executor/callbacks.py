"""Provider callbacks: a doorbell for the waiting step (docs/design.md, "Callbacks are a doorbell").

A provider that calls back on completion (the sandbox's `callback_url`, Replicate's and fal's webhooks) is
asked to POST to /v1/callbacks/<provider>. A callback changes no record: it is verified (Standard Webhooks
with the provider's secret, or fal's ED25519 signature: a forged body or an old timestamp is refused), then
it wakes the job's waiting step at once, which still reads the provider's answer itself (a poll), exactly
as a scheduled poll would. So a callback that lies, comes twice or never comes can cost a poll, never a
state: polling stays the fallback on its back-off schedule.

Idempotent: a message id is acted on once (the cache below, across web processes); its repeats are
answered 200 and change nothing. A message that arrives before the job could be woken (the worker that
submitted has not recorded the provider's answer yet) is answered non-2xx without being marked seen, so
the provider sends it again.

The executor owns the doorbell, not the door: what waits on an attempt, and how it is woken, is the job
engine's, which stands above the executor. Its view hands its wake-up service down (`ring(..., wake=)`);
that service answers in this module's vocabulary (`Wake`).
"""

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from config.metrics import count
from executor import providers
from executor.models import AttemptState
from executor.selectors import attempt_by_upstream_id

logger = logging.getLogger(__name__)

# Longer than Standard Webhooks' timestamp tolerance (5 minutes): a repeat of a message is either still
# remembered here or refused for its old timestamp.
SEEN_TTL_S = 900


def secret_of(provider: str) -> str:
    """The provider's callback secret (its spec's `callback_secret`, else the setting its spec names); ""
    takes no callbacks from it. Read from the specs at call time: the adapters import this module while
    executor.providers builds them."""
    spec = providers.spec_of(provider)
    if spec is None:
        return ""
    if spec.callback_secret is not None:
        return spec.callback_secret()
    return getattr(settings, spec.callback_secret_setting, "") if spec.callback_secret_setting else ""


def takes_callbacks(provider: str) -> bool:
    """Whether a callback from `provider` can be verified here: a secret to check it with, or (a provider
    with a scheme of its own, fal's published keys) what its spec's `callbacks_on` says."""
    spec = providers.spec_of(provider)
    if spec is not None and spec.callbacks_on is not None:
        return bool(spec.callbacks_on())
    return bool(secret_of(provider))


def callback_url(provider: str) -> str | None:
    """Where `provider` should call back, or None (callbacks off, or nothing to verify them with)."""
    base = settings.PROVIDER_CALLBACK_BASE_URL
    if not base or base.lower() == "off" or not takes_callbacks(provider):
        return None
    return f"{base}/v1/callbacks/{provider}"


@dataclass(frozen=True)
class Answer:
    status: int
    code: str  # rung | duplicate | ended | CALLBACK_* error codes
    message: str = ""


class Refused(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.answer = Answer(status, code, message)


def verify(provider: str, body: bytes, headers) -> tuple[str, str]:
    """(message id, generation id) of a callback whose signature and timestamp hold; Refused otherwise.
    The refusal never says which check failed."""
    if not takes_callbacks(provider):
        count("callbacks", outcome="not_configured")
        raise Refused(404, "CALLBACK_NOT_CONFIGURED", f"No callbacks are taken from {provider!r}.")
    verifier = providers.spec_of(provider).callback_verifier  # takes_callbacks: a spec of a known provider
    if verifier is not None:  # a scheme of its own (fal's ED25519 signature)
        return verifier(body, headers)
    secret = secret_of(provider)
    wanted = {name: headers.get(name, "") for name in ("webhook-id", "webhook-timestamp", "webhook-signature")}
    try:
        payload = Webhook(secret).verify(body, wanted)
    except (WebhookVerificationError, ValueError, UnicodeDecodeError):
        count("callbacks", outcome="bad_signature")
        raise Refused(400, "CALLBACK_UNVERIFIED", "The callback's signature or timestamp does not verify.") from None
    generation = payload.get("id") if isinstance(payload, dict) else None
    if not isinstance(generation, str) or not generation or len(generation) > 200:
        count("callbacks", outcome="invalid")
        raise Refused(422, "INVALID_REQUEST", "The callback names no generation id.")
    return wanted["webhook-id"], generation


class Wake(enum.Enum):
    """What waking a job's waiting step came to (the job engine's wake-up service answers with one)."""

    RUNG = "rung"  # the waiting step was woken: it polls the provider now
    EARLY = "early"  # nothing waits on the attempt yet (its acceptance is not recorded): send it again
    ENDED = "ended"  # nothing waits on it any more
    DUPLICATE = "duplicate"  # the message was taken already (claim() said no)


# The HTTP answer to each (the provider's retry policy reads the status: 409 is sent again).
_WAKE_ANSWER = {
    Wake.RUNG: Answer(202, "rung", "The waiting step was woken."),
    Wake.EARLY: Answer(409, "CALLBACK_EARLY", "The job is not waiting on that generation yet; send it again."),
    Wake.ENDED: Answer(200, "ended", "Nothing waits on that generation any more."),
    Wake.DUPLICATE: Answer(200, "duplicate", "That message was taken already."),
}


def ring(provider: str, body: bytes, headers, *, wake: Callable[..., Wake]) -> Answer:
    """Verify a callback and wake the step waiting on its generation: `wake(job_id=, run=, step=, claim=)`,
    the job engine's service, which calls `claim()` just before it wakes anything. No write here but the
    message id's mark."""
    try:
        message_id, generation = verify(provider, body, headers)
    except Refused as refused:
        return refused.answer
    attempt = attempt_by_upstream_id(provider=provider, upstream_id=generation)
    if attempt is None:
        count("callbacks", outcome="unknown_generation")
        return Answer(404, "CALLBACK_UNKNOWN_GENERATION", "No attempt of ours has that generation.")
    if attempt.state != AttemptState.RUNNING:
        count("callbacks", outcome="ended")
        return _WAKE_ANSWER[Wake.ENDED]

    def claim() -> bool:
        # Closes the race of two deliveries of one message (a provider's retry crossing our answer, two
        # web processes): the message id is taken once, atomically, and only the taker wakes the step.
        # Scoped by the attempt's upstream key: a provider's ids are its own, ours are unique across jobs.
        return cache.add(f"callback:{provider}:{attempt.upstream_key}:{message_id}", 1, timeout=SEEN_TTL_S)

    woken = wake(job_id=attempt.job_id, run=attempt.run, step=attempt.step, claim=claim)
    count("callbacks", outcome=woken.value)
    if woken is Wake.RUNG:
        logger.info("callback %s from %s: woke job %s", message_id, provider, attempt.job_id,
                    extra={"job_id": attempt.job_id, "run": attempt.run, "upstream_key": attempt.upstream_key})
    return _WAKE_ANSWER[woken]
