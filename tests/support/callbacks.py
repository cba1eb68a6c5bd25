"""A provider callback as the sandbox sends one: the body and its Standard Webhooks headers, signed with
a provider's callback secret (or a wrong one, an old timestamp, a replayed message id)."""

import json
import uuid
from datetime import datetime, timezone

from standardwebhooks.webhooks import Webhook

from executor import callbacks


def signed(body: dict, *, secret: str = callbacks.secret_of("sandbox"), message_id: str | None = None,
           at: datetime | None = None) -> tuple[str, dict]:
    message_id = message_id or f"msg-{uuid.uuid4()}"
    text = json.dumps(body)
    at = at or datetime.now(timezone.utc)
    headers = {"Content-Type": "application/json", "webhook-id": message_id,
               "webhook-timestamp": str(int(at.timestamp())),
               "webhook-signature": Webhook(secret).sign(message_id, at, text)}
    return text, headers
