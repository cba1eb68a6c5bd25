"""Receiving payonce's webhooks: check that a request really is payonce's, and act on each event once.

payonce signs every delivery as Standard Webhooks does (https://www.standardwebhooks.com): the headers
``webhook-id`` (the delivery's id, the same on every try), ``webhook-timestamp`` (Unix seconds) and
``webhook-signature`` (``v1,<base64 HMAC-SHA256>``, several separated by spaces while a secret is being
rotated), over ``"{webhook-id}.{webhook-timestamp}.{body}"`` with the client's ``whsec_...`` secret.
It is implemented here with the standard library, so a receiver needs nothing else::

    from payonce_client import webhooks

    event = webhooks.verify(request.body, request.headers, secret)  # raises WebhookVerificationError
    if dedup.first_time(request.headers["webhook-id"]):
        handle(event)   # event["type"], event["data"] is the job
    return 200

Deliveries are *at least once*: a receiver that answered 2xx may be sent the same event again (a crash on
payonce's side between your answer and its bookkeeping, a replay from its dead letters). Dedupe on
``webhook-id``. :class:`Deduplicator` does it in memory, which is right for a single process and a test;
in production, insert the id into a table of your own with a unique constraint, in the same transaction
as what the event changes, so that the check and the effect cannot come apart.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import threading
import time
from collections import OrderedDict
from typing import Any, Dict, Mapping, Optional, Protocol, Union

from .errors import WebhookVerificationError

__all__ = ["DedupStore", "Deduplicator", "MemoryDedupStore", "WebhookVerificationError", "sign", "verify"]

SECRET_PREFIX = "whsec_"
DEFAULT_TOLERANCE_S = 300


def _secret_bytes(secret: str) -> bytes:
    encoded = (secret.removeprefix(SECRET_PREFIX)).strip()
    try:
        return base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)  # padding is optional
    except (binascii.Error, ValueError):
        raise ValueError("the webhook secret is not a whsec_<base64> secret") from None


def _as_bytes(body: Union[bytes, bytearray, str]) -> bytes:
    return body.encode("utf-8") if isinstance(body, str) else bytes(body)


def sign(body: Union[bytes, str], secret: str, webhook_id: str, timestamp: int) -> str:
    """The ``webhook-signature`` value payonce would send for this body: for testing a receiver."""
    content = f"{webhook_id}.{int(timestamp)}.".encode() + _as_bytes(body)
    digest = hmac.new(_secret_bytes(secret), content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def verify(body: Union[bytes, str], headers: Mapping[str, str], secret: str,
           tolerance_s: float = DEFAULT_TOLERANCE_S, *, now: Optional[float] = None) -> Dict[str, Any]:
    """Check a webhook request and return its parsed envelope, ``{"id", "type", "created_at", "data"}``.

    Pass the body exactly as it arrived (bytes, before any JSON parsing: re-serialised JSON is not what
    was signed). Header names may be in any case. Raises :class:`WebhookVerificationError` when a header
    is missing, no signature matches the secret (a wrong secret, or a body changed on the way), or the
    timestamp is more than ``tolerance_s`` seconds from now, either way: an old request replayed by
    someone who recorded it is refused even though its signature is genuine.
    """
    lowered = {str(name).lower(): value for name, value in headers.items()}
    webhook_id = lowered.get("webhook-id")
    stamp = lowered.get("webhook-timestamp")
    signatures = lowered.get("webhook-signature")
    if not webhook_id or not stamp or not signatures:
        raise WebhookVerificationError("Missing webhook-id, webhook-timestamp or webhook-signature header.")
    try:
        sent_at = int(stamp)
    except ValueError:
        raise WebhookVerificationError("The webhook-timestamp is not a whole number of seconds.") from None
    current = time.time() if now is None else now
    if sent_at < current - tolerance_s:
        raise WebhookVerificationError("The webhook-timestamp is too old: a replay, or a clock far off.")
    if sent_at > current + tolerance_s:
        raise WebhookVerificationError("The webhook-timestamp is in the future: a clock far off.")
    payload = _as_bytes(body)
    expected = sign(payload, secret, webhook_id, sent_at).encode("ascii")
    # Every signature is compared, in constant time, so the time taken tells nothing about which came close.
    matched = False
    for candidate in signatures.split(" "):
        if candidate.startswith("v1,"):
            matched |= hmac.compare_digest(candidate.encode("utf-8", "replace"), expected)
    if not matched:
        raise WebhookVerificationError("No webhook-signature matches: a wrong secret, or the body was changed.")
    try:
        envelope = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        envelope = None
    if not isinstance(envelope, dict):
        raise WebhookVerificationError("The signed body is not a JSON object.")
    return envelope


class DedupStore(Protocol):
    """Where a :class:`Deduplicator` remembers the ids it has seen. ``add`` records ``key`` for ``ttl_s``
    seconds and says whether it was new, atomically (a Redis ``SET key 1 NX EX ttl`` is one); ``discard``
    forgets it."""

    def add(self, key: str, ttl_s: float) -> bool: ...

    def discard(self, key: str) -> None: ...


class MemoryDedupStore:
    """A :class:`DedupStore` in this process's memory: ids expire after their TTL, and the oldest are
    dropped past ``max_size`` so that memory stays bounded whatever arrives. Thread-safe."""

    def __init__(self, max_size: int = 100_000):
        self.max_size = max_size
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, key: str, ttl_s: float) -> bool:
        now = time.monotonic()
        with self._lock:
            while self._seen:  # entries are in the order they expire (one TTL per store in practice)
                oldest, expires = next(iter(self._seen.items()))
                if expires > now:
                    break
                del self._seen[oldest]
            if key in self._seen and self._seen[key] > now:
                return False
            self._seen[key] = now + ttl_s
            self._seen.move_to_end(key)
            while len(self._seen) > self.max_size:
                self._seen.popitem(last=False)
            return True

    def discard(self, key: str) -> None:
        with self._lock:
            self._seen.pop(key, None)

    def __len__(self) -> int:
        return len(self._seen)


class Deduplicator:
    """Says whether a delivery is seen for the first time.

    ``ttl_s`` defaults to three days: payonce's retry schedule spans about 28 hours. A replay from the
    dead letters may come later still; a store that must catch those too is a database table (see the
    module's docstring). If handling an event fails after ``first_time`` said yes, call ``forget`` so
    that the next try of that delivery is handled.
    """

    def __init__(self, store: Optional[DedupStore] = None, *, ttl_s: float = 3 * 24 * 3600.0,
                 max_size: int = 100_000):
        self.store: DedupStore = store if store is not None else MemoryDedupStore(max_size)
        self.ttl_s = ttl_s

    def first_time(self, webhook_id: str) -> bool:
        return self.store.add(webhook_id, self.ttl_s)

    def forget(self, webhook_id: str) -> None:
        self.store.discard(webhook_id)
