"""State changes of the webhooks app: endpoints and their secrets, the delivery outbox, and each try.

At least once, never blocking paid work (docs/design.md, "Webhooks: at least once, never blocking paid work"):
1. A state change writes its `Delivery` row in its own transaction; the first try is enqueued when that
   transaction commits.
2. A try is claimed by a conditional update of the row's `next_attempt_at` (its lease): only the message
   holding the current value may send, so no two processes send one row at once.
3. The exact stored envelope is signed (Standard Webhooks) and posted through the SSRF guard.
4. 2xx: delivered. 410: the endpoint is disabled and its rows wait. Otherwise the row is due again after
   WEBHOOK_RETRY_SCHEDULE (or the receiver's Retry-After, within bounds), and after the last step it is
   dead, envelope intact, until replayed under the same webhook-id.
5. The drainer (beat) claims due rows with FOR UPDATE SKIP LOCKED and pushes their lease out in the same
   transaction, so a lost message or a dead dispatcher delays a row by at most a lease.
A crash between a receiver's 2xx and marking the row delivered sends it again, with the same id:
receivers dedupe on `webhook-id`.
"""

import base64
import json
import logging
import secrets
import time
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from enum import StrEnum

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from opentelemetry.trace import SpanKind

from config import tracing
from config.celery import app
from config.logs import log_event
from config.retry import jittered, parse_retry_after
from config.sql import insert_ignore
from webhooks import ssrf
from webhooks.models import Delivery, DeliveryAttempt, DeliveryStatus, Endpoint, SigningSecret, WebhookEvent

logger = logging.getLogger(__name__)

ROTATION_OVERLAP = timedelta(hours=24)
RESPONSE_BODY_KEPT = 20 * 1024
RETRY_AFTER_BOUNDS_S = (1.0, 3600.0)
# A target the guard refuses at send for a reason that cannot pass by itself (a private address, a bad
# URL) ends its delivery at once (dead, replayable); a host that does not resolve may come back, so that
# delivery keeps its retry schedule.
_REFUSED_FOR_GOOD = frozenset(ssrf.REASONS) - {"resolve_failed"}
# What a client is told when its webhook URL is refused: never what the host resolves to.
_REFUSAL_WORDS = {
    "private_address": "it resolves to a private or reserved address",
    "resolve_failed": "its host name does not resolve",
}


def webhook_url_refusal(url: str) -> str | None:
    """Why `url` may not be a webhook target, in words fit for the client who sent it, or None. The same
    guard runs again at every send (deliveries_try)."""
    try:
        ssrf.check_url(url)
    except ssrf.Refused as refused:
        return _REFUSAL_WORDS.get(refused.reason) or str(refused)
    return None


# --- endpoints and secrets -------------------------------------------------------------------------


def secret_generate() -> str:
    """`whsec_` + base64 of 32 random bytes, the Standard Webhooks secret format."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def endpoint_create(*, client, url: str = "") -> tuple[Endpoint, str]:
    """Create a client's endpoint with its first signing secret; returns the endpoint and the secret."""
    secret = secret_generate()
    with transaction.atomic():
        endpoint = Endpoint.objects.create(client=client, url=url)
        SigningSecret.objects.create(endpoint=endpoint, secret=secret)
    return endpoint, secret


def secret_rotate(*, client) -> str:
    """Add a new signing secret. The ones in use keep signing for 24 hours beside it (two signatures in
    the header), so a receiver can switch secrets without a failed verification."""
    secret = secret_generate()
    now = timezone.now()
    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update().get(client=client)  # two rotations queue up here
        endpoint.secrets.filter(expires_at__isnull=True).update(expires_at=now + ROTATION_OVERLAP)
        SigningSecret.objects.create(endpoint=endpoint, secret=secret, created_at=now)
    return secret


def endpoint_enable(*, endpoint: Endpoint) -> int:
    """An operator's decision: the endpoint takes deliveries again; its waiting rows are due now."""
    with transaction.atomic():
        Endpoint.objects.filter(id=endpoint.id).update(disabled_at=None, disabled_reason="")
        return Delivery.objects.filter(
            client_id=endpoint.client_id, url="", status=DeliveryStatus.PENDING
        ).update(next_attempt_at=timezone.now())


def signing_secrets(client_id) -> list[str]:
    now = timezone.now()
    return list(
        SigningSecret.objects.filter(endpoint__client_id=client_id)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .values_list("secret", flat=True)
    )


def sign(*, delivery_id: str, timestamp: int, body: str, secrets_: list[str]) -> str:
    """The `webhook-signature` header: one `v1,<base64>` per live secret, space separated."""
    when = datetime.fromtimestamp(timestamp, tz=dt_timezone.utc)
    return " ".join(Webhook(secret).sign(delivery_id, when, body) for secret in secrets_)


# --- the outbox ------------------------------------------------------------------------------------


def delivery_id(*, job_id, run: int, event: str) -> str:
    return f"{job_id}:{run}:{event}"


def delivery_create(*, job, event: WebhookEvent, data: dict) -> bool:
    """Write the event's outbox row; must run inside the transaction that made the state change.

    The envelope is rendered once, here, and kept byte for byte: every try and every replay sends
    exactly these bytes. The first try is enqueued when the transaction commits; the row becomes due for
    the drainer only after WEBHOOK_FIRST_TRY_GRACE_S, in case that message is lost. Returns False if
    the row already existed (the same event of the same run), or if there is nowhere to send it.

    A polling client (no endpoint URL) whose job names no `webhook_url` has nothing to deliver: no row
    is written, so dead letters are only deliveries that were tried and gave up, and the alert on dead
    deliveries never fires for a client that asks GET /v1/jobs/{id} instead. The URL is read in the
    state change's transaction: a client that sets its endpoint URL later gets the events after that.
    """
    if event not in WebhookEvent.values:  # an event no document names would reach a client's receiver
        raise ValueError(event)
    if not connection.in_atomic_block:
        raise RuntimeError("delivery_create must run in the transaction of the state change it reports")
    if not job.webhook_url and not _endpoint_url(job):
        return False
    now = timezone.now()
    ident = delivery_id(job_id=job.id, run=job.run, event=event)
    envelope = json.dumps(
        {"id": ident, "type": event, "created_at": now.isoformat().replace("+00:00", "Z"), "data": data},
        separators=(",", ":"),
        cls=DjangoJSONEncoder,
    )
    due = now + timedelta(seconds=settings.WEBHOOK_FIRST_TRY_GRACE_S)
    delivery = Delivery(id=ident, job_id=job.id, client_id=job.client_id, run=job.run, event=event,
                        url=job.webhook_url, envelope=envelope, created_at=now, next_attempt_at=due,
                        trace_context=job.trace_context)
    if not insert_ignore(delivery):
        return False
    _enqueue_on_commit(ident, due)
    return True


def _endpoint_url(job) -> str:
    """The client's endpoint URL ("" for none). job_finish reads it with the job, in its UPDATE's
    RETURNING (NULL when the client has no endpoint row); anyone else costs one query."""
    if "endpoint_url" in job.__dict__:
        return job.endpoint_url or ""
    return Endpoint.objects.filter(client_id=job.client_id).values_list("url", flat=True).first() or ""


def _ids(delivery: Delivery) -> dict:
    """What a delivery's log line names it by. Never its URL (a receiver's may carry a token) nor its
    envelope."""
    return {"delivery_id": delivery.id, "job_id": delivery.job_id, "run": delivery.run, "webhook_event": delivery.event}


NO_URL = "no webhook URL any more: the job names none and the client's endpoint URL was removed"


def _enqueue_on_commit(ident: str, token: datetime) -> None:
    def enqueue():
        try:  # by name: webhooks.tasks.deliver, which calls back into this module
            app.send_task("webhooks.deliver", (ident, token.isoformat()))
        except Exception:  # the broker is down: the drainer sends the row once it is due
            logger.exception("could not enqueue delivery %s; the drainer will send it", ident)

    transaction.on_commit(enqueue)


def deliveries_claim_due(*, limit: int = 500) -> list[list[tuple[str, str]]]:
    """The drainer: claim due rows and push their lease out, in one transaction.

    FOR UPDATE SKIP LOCKED: two drainers at once each take different rows, never wait on each other.
    Rows of a disabled client endpoint are left waiting. Returns batches of (id, token), each batch for
    one target (so a slow receiver holds up only its own rows); the token is the new `next_attempt_at`,
    which only the message carrying it may use to send.
    """
    lease = timedelta(seconds=settings.WEBHOOK_SEND_LEASE_S)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH due AS (
                SELECT d.id FROM webhooks_delivery d
                  LEFT JOIN webhooks_endpoint e ON e.client_id = d.client_id
                 WHERE d.status = '{DeliveryStatus.PENDING}' AND d.next_attempt_at <= now()
                   AND (d.url <> '' OR e.disabled_at IS NULL)
                 ORDER BY d.next_attempt_at
                 LIMIT %s
                   FOR UPDATE OF d SKIP LOCKED)
            UPDATE webhooks_delivery SET next_attempt_at = now() + %s
              FROM due WHERE webhooks_delivery.id = due.id
            RETURNING webhooks_delivery.id, webhooks_delivery.next_attempt_at, webhooks_delivery.client_id,
                      webhooks_delivery.url
            """,
            [limit, lease],
        )
        claimed = cursor.fetchall()
    by_target: dict[tuple, list] = {}
    for ident, token, client_id, url in claimed:
        by_target.setdefault((client_id, url), []).append((ident, token.isoformat()))
    size = settings.WEBHOOK_BATCH_SIZE
    return [rows[i:i + size] for rows in by_target.values() for i in range(0, len(rows), size)]


_CLAIM_TRIES_SQL = f"""
UPDATE webhooks_delivery d SET next_attempt_at = now() + %s, attempts = d.attempts + 1,
       schedule_position = d.schedule_position + 1
  FROM unnest(%s::text[], %s::timestamptz[]) AS held(id, token)
 WHERE d.id = held.id AND d.next_attempt_at = held.token AND d.status = '{DeliveryStatus.PENDING}'
   AND (d.url <> '' OR NOT EXISTS (SELECT 1 FROM webhooks_endpoint e
                                    WHERE e.client_id = d.client_id AND e.disabled_at IS NOT NULL))
RETURNING d.*
"""


def _claim_tries(items: list[tuple[str, str]]) -> list[Delivery]:
    """The right to try each row once: only the message holding a row's current lease value may send it;
    the update moves the lease, so a duplicate of that message finds nothing to do."""
    lease = timedelta(seconds=settings.WEBHOOK_SEND_LEASE_S)
    ids = [ident for ident, _ in items]
    tokens = [datetime.fromisoformat(token) for _, token in items]
    claimed = {d.id: d for d in Delivery.objects.raw(_CLAIM_TRIES_SQL, [lease, ids, tokens])}
    return [claimed[ident] for ident in ids if ident in claimed]


class Tried(StrEnum):
    """What one try of a delivery came to (what the dispatcher's tasks return)."""

    DELIVERED = "delivered"  # a 2xx: done
    RETRY = "retry"  # anything else, with tries left: due again after the schedule's next step
    DEAD = "dead"  # out of tries, or a target that can never be sent to: kept, envelope intact, replayable
    DISABLED = "disabled"  # 410 Gone from the client's endpoint: it is disabled, and its rows wait for an operator


def delivery_try(*, ident: str, token: str) -> Tried | None:
    """One try of one delivery (the first try, enqueued when its event commits)."""
    outcomes = deliveries_try([(ident, token)])
    return outcomes[0] if outcomes else None


def deliveries_try(items: list[tuple[str, str]]) -> list[Tried]:
    """Try a batch of deliveries (the dispatcher), one after the other, and record every try.

    1. Claim the rows whose lease this message holds (one statement).
    2. Sign the exact stored envelope and POST it through the SSRF guard.
    3. Record the tries (one statement) and the delivered rows (one statement); failures are scheduled
       one by one. A batch stops sending at its first failure or when half the lease has passed: the rows
       it did not try are released, due now, so a slow receiver never outlives the lease of a row it holds.
    """
    deliveries = _claim_tries(items)
    if not deliveries:
        return []
    endpoints = {e.client_id: e for e in Endpoint.objects.filter(client_id__in={d.client_id for d in deliveries})}
    secrets_by_client: dict = {}
    deadline = time.monotonic() + settings.WEBHOOK_SEND_LEASE_S / 2
    tries, delivered, outcomes, untried = [], [], [], []
    with ssrf.Session() as session:  # one kept-alive, vetted connection per receiver for the batch
        for delivery in deliveries:
            if outcomes and (outcomes[-1] is not Tried.DELIVERED or time.monotonic() > deadline):
                untried.append(delivery)
                continue
            endpoint = endpoints.get(delivery.client_id)
            url = delivery.url or (endpoint.url if endpoint else "")
            if not url:
                _dead(delivery, NO_URL)
                outcomes.append(Tried.DEAD)
                continue
            if delivery.client_id not in secrets_by_client:
                secrets_by_client[delivery.client_id] = signing_secrets(delivery.client_id)
            with tracing.job_span("payonce.webhook.deliver", delivery.trace_context, kind=SpanKind.CLIENT, **{
                    "payonce.job_id": str(delivery.job_id), "payonce.run": delivery.run,
                    "payonce.webhook.event": delivery.event, "payonce.webhook.try": delivery.attempts}) as span:
                answer, error, attempt, refused = _post(session, delivery, url, secrets_by_client[delivery.client_id])
                if span is not None:
                    span.set_attribute("http.response.status_code", answer.status if answer else 0)
            tries.append(attempt)
            if refused in _REFUSED_FOR_GOOD:
                _dead(delivery, error)  # no schedule will make this target allowed
                outcomes.append(Tried.DEAD)
            elif answer is not None and 200 <= answer.status < 300:
                delivered.append((delivery, answer.status))
                outcomes.append(Tried.DELIVERED)
            elif answer is not None and answer.status == 410:
                outcomes.append(_gone(delivery, endpoint))
            else:
                retry_after = parse_retry_after(answer.headers.get("retry-after")) if answer else None
                outcomes.append(_again_or_dead(delivery, status=answer.status if answer else None,
                                               error=error or f"HTTP {answer.status}", retry_after=retry_after))
    DeliveryAttempt.objects.bulk_create(tries)
    for tried in tries:
        log_event(logger, "delivery.tried", **_ids(tried.delivery), **{"try": tried.number},
                  status_code=tried.status_code, duration_ms=tried.duration_ms, error=tried.error[:300] or None)
    _mark_delivered(delivered)
    for delivery, code in delivered:
        log_event(logger, "delivery.delivered", **_ids(delivery), **{"try": delivery.attempts}, status_code=code)
    _release(untried)
    return outcomes


def _post(session, delivery: Delivery, url: str, secrets_: list[str]):
    timestamp = int(time.time())
    body = delivery.envelope
    headers = {
        "content-type": "application/json",
        "user-agent": "payonce-webhooks/1",
        "webhook-id": delivery.id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(delivery_id=delivery.id, timestamp=timestamp, body=body, secrets_=secrets_),
    }
    tracing.inject(headers)  # `traceparent`, inside a traced try: the receiver may join the job's trace
    started = time.monotonic()
    answer, error, reason = None, "", None
    try:
        answer = session.post(url, body.encode("utf-8"), headers)
    except ssrf.Refused as refused:
        error, reason = f"refused by the SSRF guard: {refused.reason}: {refused}", refused.reason
    except ssrf.SendError as failed:
        error = f"send failed: {failed}"
    attempt = DeliveryAttempt(
        delivery=delivery, number=delivery.attempts, webhook_timestamp=timestamp, url=url,
        duration_ms=int((time.monotonic() - started) * 1000),
        status_code=answer.status if answer else None,
        response_body=answer.body[:RESPONSE_BODY_KEPT].decode("utf-8", "replace") if answer else "",
        error=error,
    )
    return answer, error, attempt, reason


def _mark_delivered(delivered: list[tuple[Delivery, int]]) -> None:
    """Every row this batch still holds (its try count unchanged since the claim) is delivered."""
    if not delivered:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE webhooks_delivery d SET status = '{DeliveryStatus.DELIVERED}', delivered_at = now(), last_status_code = held.code,
                   last_error = ''
              FROM unnest(%s::text[], %s::int[], %s::int[]) AS held(id, attempts, code)
             WHERE d.id = held.id AND d.attempts = held.attempts AND d.status = '{DeliveryStatus.PENDING}'
            """,
            [[d.id for d, _ in delivered], [d.attempts for d, _ in delivered], [code for _, code in delivered]],
        )


def _release(untried: list[Delivery]) -> None:
    """Rows claimed but not tried: due again now, and this try does not count."""
    for delivery in untried:
        _mine(delivery).update(next_attempt_at=timezone.now(), attempts=delivery.attempts - 1,
                               schedule_position=delivery.schedule_position - 1)


def _mine(delivery: Delivery):
    """The row, as long as this try still holds it (no replay or other try moved it on since)."""
    return Delivery.objects.filter(id=delivery.id, attempts=delivery.attempts, status=DeliveryStatus.PENDING)


def _again_or_dead(delivery: Delivery, *, status, error: str, retry_after: float | None) -> Tried:
    schedule = settings.WEBHOOK_RETRY_SCHEDULE
    position = delivery.schedule_position  # tries so far since creation or the last replay
    if position > len(schedule):
        if _mine(delivery).update(status=DeliveryStatus.DEAD, last_status_code=status, last_error=error[:2000]):
            log_event(logger, "delivery.dead", **_ids(delivery), **{"try": delivery.attempts}, status_code=status,
                      error=error[:300])
        return Tried.DEAD
    if retry_after is not None:
        delay = min(max(retry_after, RETRY_AFTER_BOUNDS_S[0]), RETRY_AFTER_BOUNDS_S[1])
    else:
        delay = jittered(schedule[position - 1], 1.0, 1.2)  # up to 20% later (docs/api.md, "Webhooks")
    _mine(delivery).update(next_attempt_at=timezone.now() + timedelta(seconds=delay), last_status_code=status,
                           last_error=error[:2000])
    return Tried.RETRY


def _gone(delivery: Delivery, endpoint: Endpoint | None) -> Tried:
    """410 Gone: the receiver wants nothing more. A client endpoint is disabled and its rows wait for an
    operator; a job's own webhook_url ends that row (dead, replayable)."""
    if delivery.url or endpoint is None:
        if _mine(delivery).update(status=DeliveryStatus.DEAD, last_status_code=410, last_error="410 Gone"):
            log_event(logger, "delivery.dead", **_ids(delivery), **{"try": delivery.attempts}, status_code=410,
                      error="410 Gone")
        return Tried.DEAD
    with transaction.atomic():
        Endpoint.objects.filter(id=endpoint.id, disabled_at__isnull=True).update(
            disabled_at=timezone.now(), disabled_reason=f"410 Gone answered to {delivery.id}"
        )
        _mine(delivery).update(next_attempt_at=timezone.now(), last_status_code=410,
                               last_error="410 Gone: endpoint disabled; waiting for an operator")
    return Tried.DISABLED


def _dead(delivery: Delivery, error: str) -> None:
    if _mine(delivery).update(status=DeliveryStatus.DEAD, last_error=error):
        log_event(logger, "delivery.dead", **_ids(delivery), **{"try": delivery.attempts}, error=error[:300])


# --- dead letters ------------------------------------------------------------------------------------


def delivery_replay(*, delivery: Delivery) -> None:
    """Send a delivery again (an operator's decision): the exact stored envelope, under the same
    webhook-id, with the retry schedule from its start. Delivered rows may be replayed too (a receiver
    that lost what it got): receivers dedupe on webhook-id."""
    due = timezone.now() + timedelta(seconds=settings.WEBHOOK_FIRST_TRY_GRACE_S)
    with transaction.atomic():
        Delivery.objects.filter(id=delivery.id).update(
            status=DeliveryStatus.PENDING, schedule_position=0, next_attempt_at=due, last_error=""
        )
        _enqueue_on_commit(delivery.id, due)
        log_event(logger, "delivery.replayed", **_ids(delivery))


def deliveries_redact_input(*, job_ids) -> int:
    """Personal data purged: the job's input in the stored envelopes is replaced (a replay sends the
    redacted envelope, under the same webhook-id)."""
    redacted = 0
    for delivery in Delivery.objects.filter(job_id__in=job_ids).only("id", "envelope"):
        envelope = json.loads(delivery.envelope)
        if isinstance(envelope.get("data"), dict) and "input" in envelope["data"]:
            envelope["data"]["input"] = {"purged": True}
            redacted += Delivery.objects.filter(id=delivery.id).update(
                envelope=json.dumps(envelope, separators=(",", ":"), cls=DjangoJSONEncoder))
    return redacted
