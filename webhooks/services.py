"""State changes of the webhooks app: endpoints, their secrets, and the delivery outbox."""

import base64
import json
import secrets

from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.utils import timezone

from config.sql import insert_ignore
from webhooks.models import Delivery, Endpoint, SigningSecret


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


EVENTS = ("generation.succeeded", "generation.failed", "generation.cancelled", "generation.needs_review")


def delivery_id(*, job_id, run: int, event: str) -> str:
    return f"{job_id}:{run}:{event}"


def delivery_create(*, job, event: str, data: dict) -> bool:
    """Write the event's outbox row; must run inside the transaction that made the state change.

    The envelope is rendered once, here, and kept byte for byte: every try and every replay sends
    exactly these bytes. Returns False if the row already existed (the same event of the same run).
    """
    assert event in EVENTS, event
    connection = transaction.get_connection()
    if not connection.in_atomic_block:
        raise RuntimeError("delivery_create must run in the transaction of the state change it reports")
    now = timezone.now()
    ident = delivery_id(job_id=job.id, run=job.run, event=event)
    envelope = json.dumps(
        {"id": ident, "type": event, "created_at": now.isoformat().replace("+00:00", "Z"), "data": data},
        separators=(",", ":"),
        cls=DjangoJSONEncoder,
    )
    delivery = Delivery(id=ident, job_id=job.id, client_id=job.client_id, run=job.run, event=event, url=job.webhook_url,
                        envelope=envelope, created_at=now, next_attempt_at=now)
    return insert_ignore(delivery)
