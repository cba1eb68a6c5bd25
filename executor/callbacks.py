"""Provider callbacks: a doorbell for the waiting step (docs/design.md, "Callbacks are a doorbell").

A provider that calls back on completion (the sandbox's `callback_url`, Replicate's webhooks) is asked to
POST to /v1/callbacks/<provider>. A callback changes no record: it is verified (Standard Webhooks, with
the provider's secret: a forged body or an old timestamp is refused), then it wakes the job's waiting step
at once, which still reads the provider's answer itself (a poll), exactly as a scheduled poll would. So a
callback that lies, comes twice or never comes can cost a poll, never a state: polling stays the
fallback on its back-off schedule.

Idempotent: a message id is acted on once (the cache below, across web processes); its repeats are
answered 200 and change nothing. A message that arrives before the job could be woken (the worker that
submitted has not recorded the provider's answer yet) is answered non-2xx without being marked seen, so
the provider sends it again.
"""

import logging
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from config.metrics import count
from executor.models import AttemptState
from jobs.models import JobStatus, StepStatus

logger = logging.getLogger(__name__)

# Longer than Standard Webhooks' timestamp tolerance (5 minutes): a repeat of a message is either still
# remembered here or refused for its old timestamp.
SEEN_TTL_S = 900
_SECRETS = {"sandbox": "SANDBOX_CALLBACK_SECRET", "replicate": "REPLICATE_WEBHOOK_SECRET"}


def _secret(provider: str) -> str:
    """The provider's callback secret; "" takes no callbacks from it. The sandbox rings only while it is
    the configured provider (REAL_PROVIDERS off): its secret has a development default, known to anyone
    who reads the repository, so with real providers on a callback signed with it is refused (404)
    instead of waking waiting steps into provider polls."""
    if provider == "sandbox" and settings.REAL_PROVIDERS:
        return ""
    return getattr(settings, _SECRETS[provider], "") if provider in _SECRETS else ""


def callback_url(provider: str) -> str | None:
    """Where `provider` should call back, or None (callbacks off, or no secret to verify them with)."""
    base = settings.PROVIDER_CALLBACK_BASE_URL
    if not base or base.lower() == "off" or not _secret(provider):
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
    secret = _secret(provider)
    if not secret:
        count("callbacks", outcome="not_configured")
        raise Refused(404, "CALLBACK_NOT_CONFIGURED", f"No callbacks are taken from {provider!r}.")
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


_FIND_SQL = f"""
SELECT a.job_id, a.upstream_key, a.state, a.run = j.run, j.status, j.kind, j.run, w.status, w.lease_owner, s.status
  FROM executor_attempt a
  JOIN jobs_job j ON j.id = a.job_id
  LEFT JOIN jobs_step w ON w.job_id = a.job_id AND w.run = a.run AND w.name = %(wait)s
  LEFT JOIN jobs_step s ON s.job_id = a.job_id AND s.run = a.run AND s.name = a.step
 WHERE a.provider = %(provider)s AND a.upstream_id = %(upstream_id)s
 -- A provider's ids are its own: should one name two attempts (a sandbox reset starts its ids again),
 -- the one still running is the one waited on, else the newest.
 ORDER BY a.state = '{AttemptState.RUNNING}' DESC, a.id DESC
 LIMIT 1
"""


def ring(provider: str, body: bytes, headers) -> Answer:
    """Verify a callback and wake the step waiting on its generation. One read, no write."""
    from jobs import tasks, workflow  # the job engine is the executor's caller; imported late

    try:
        message_id, generation = verify(provider, body, headers)
    except Refused as refused:
        return refused.answer
    with connection.cursor() as cursor:
        cursor.execute(_FIND_SQL, {"wait": "wait", "provider": provider, "upstream_id": generation})
        found = cursor.fetchone()
    if found is None:
        count("callbacks", outcome="unknown_generation")
        return Answer(404, "CALLBACK_UNKNOWN_GENERATION", "No attempt of ours has that generation.")
    job_id, key, attempt_state, current_run, job_status, kind, run, wait_status, wait_owner, submit_status = found
    if attempt_state != AttemptState.RUNNING or not current_run or job_status != JobStatus.RUNNING:
        count("callbacks", outcome="ended")
        return Answer(200, "ended", "Nothing waits on that generation any more.")
    if wait_status is None and submit_status != StepStatus.DONE:
        # The worker that submitted has not recorded the acceptance yet; it will be waiting in a moment.
        count("callbacks", outcome="early")
        return Answer(409, "CALLBACK_EARLY", "The job is not waiting on that generation yet; send it again.")
    if wait_status not in (None, StepStatus.RUNNING):
        count("callbacks", outcome="ended")
        return Answer(200, "ended", "The wait is over.")
    # Closes the race of two deliveries of one message (a provider's retry crossing our answer, two web
    # processes): the message id is taken once, atomically, and only the taker wakes the step. Scoped
    # by the attempt's upstream key: a provider's ids are its own, ours are unique across every job.
    if not cache.add(f"callback:{provider}:{key}:{message_id}", 1, timeout=SEEN_TTL_S):
        count("callbacks", outcome="duplicate")
        return Answer(200, "duplicate", "That message was taken already.")
    stage = workflow.RECIPES[kind].waiting_stage()
    # The wake runs the waiting stage under the chain that holds its polling lease (so it takes the
    # lease rather than stopping at it); with no wait row yet, under a chain of its own.
    tasks.start_run(job_id, run, kind, stage, root_id=wait_owner or None, rung=True)
    logger.info("callback %s from %s: woke job %s", message_id, provider, job_id,
                extra={"job_id": job_id, "run": run, "upstream_key": key})
    count("callbacks", outcome="rung")
    return Answer(202, "rung", "The waiting step was woken.")
