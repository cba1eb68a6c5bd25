"""The check of the webhooks fal signs (the adapter is executor.providers.fal).

fal signs with ED25519: the message is the X-Fal-Webhook-Request-Id, -User-Id and -Timestamp headers and
the hex SHA-256 of the raw body, joined by newlines; X-Fal-Webhook-Signature is its signature, in hex, by
one of the keys fal publishes as a JWKS at FAL_WEBHOOK_JWKS_URL; the timestamp is within 5 minutes. Apart
from the adapter, so that executor.callbacks (which the adapter asks for its callback URL) can verify a
fal callback without a cycle.
"""

import base64
import hashlib
import json
import time
from urllib.parse import urlsplit

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.conf import settings

from executor.providers import http, real
from executor.providers.base import ErrorClass, ProviderError

WEBHOOK_TOLERANCE_S = 300.0
# fal's guide caches its webhook keys for up to a day; an hour picks up a rotation sooner.
JWKS_TTL_S = 3600.0
# A refresh asked for sooner than this after the last fetch is served from the cache: a stream of forged
# callbacks must not become a stream of fetches.
JWKS_MIN_REFRESH_S = 60.0


# -- webhooks --------------------------------------------------------------------------------------------


def verify_webhook(body: bytes, headers, *, jwks: dict, now: float | None = None) -> dict:
    """The payload of a webhook fal signed, `{"request_id", "status": "OK" | "ERROR", "payload", "error"}`.
    ValueError when a header is missing, the timestamp is more than WEBHOOK_TOLERANCE_S from `now`, no
    Ed25519 key of `jwks` signed this very body, or the body names another request than the signed header.
    The reason is for logs; a caller answers every refusal alike."""
    given = {str(name).lower(): value for name, value in headers.items()}
    request_id, user_id, timestamp, signature = (
        given.get(f"x-fal-webhook-{name}") or "" for name in ("request-id", "user-id", "timestamp", "signature"))
    if not (request_id and user_id and timestamp and signature):
        raise ValueError("a X-Fal-Webhook-* header is missing")
    try:
        sent_at = int(timestamp)
        signed = bytes.fromhex(signature)
    except ValueError:
        raise ValueError("the timestamp or the signature is malformed") from None
    if abs((time.time() if now is None else now) - sent_at) > WEBHOOK_TOLERANCE_S:
        raise ValueError("the timestamp is too old or in the future")
    message = "\n".join((request_id, user_id, timestamp, hashlib.sha256(body).hexdigest())).encode()
    keys = public_keys(jwks)
    if not keys:
        raise ValueError("the JWKS holds no Ed25519 key")
    if not any(_signed_by(key, signed, message) for key in keys):
        raise ValueError("no published key signed this body")
    try:
        payload = json.loads(body)
    except ValueError:
        raise ValueError("the body is not JSON") from None
    if not isinstance(payload, dict) or payload.get("request_id", request_id) != request_id:
        raise ValueError("the body is not a webhook of the signed request")
    return payload


def public_keys(jwks) -> list[Ed25519PublicKey]:
    """The Ed25519 keys of a JWKS (`{"keys": [{"kty": "OKP", "crv": "Ed25519", "x": base64url}]}`); others
    and unreadable ones are skipped."""
    found = []
    for jwk in (jwks.get("keys") if isinstance(jwks, dict) else None) or []:
        if not isinstance(jwk, dict) or jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
            continue
        x = jwk.get("x")
        if not isinstance(x, str) or not x:
            continue
        try:
            found.append(Ed25519PublicKey.from_public_bytes(base64.urlsafe_b64decode(x + "=" * (-len(x) % 4))))
        except ValueError:
            continue
    return found


def _signed_by(key: Ed25519PublicKey, signature: bytes, message: bytes) -> bool:
    try:
        key.verify(signature, message)
    except InvalidSignature:
        return False
    return True


# This process's copy of the webhook keys, per URL and replay mode: (fetched at, monotonic; the JWKS).
# A dict's reads and writes are atomic; two threads that find it stale at once only fetch it twice.
_jwks_cache: dict[tuple[str, bool], tuple[float, dict]] = {}


def jwks(*, refresh: bool = False, replay: bool | None = None) -> dict:
    """fal's webhook keys, fetched from FAL_WEBHOOK_JWKS_URL (recorded ones with REAL_PROVIDERS off) and
    kept JWKS_TTL_S. `refresh` fetches them again, no sooner than JWKS_MIN_REFRESH_S after the last fetch:
    a signature no kept key verifies may be by a key fal published since. ProviderError when they cannot
    be had."""
    url = settings.FAL_WEBHOOK_JWKS_URL
    replaying = real.replaying(replay)
    cached = _jwks_cache.get((url, replaying))
    if cached is not None:
        age = time.monotonic() - cached[0]
        if age < (JWKS_MIN_REFRESH_S if refresh else JWKS_TTL_S):
            return cached[1]
    parts = urlsplit(url)
    response = real.send("GET", url, base_url=f"{parts.scheme}://{parts.netloc}", replay=replaying)
    if response.status_code >= 400:
        raise ProviderError(ErrorClass.SERVER_ERROR, f"the JWKS at {url} answered {response.status_code}",
                            status=response.status_code)
    found = http.json_answer(response)
    if not public_keys(found):
        raise ProviderError(ErrorClass.SERVER_ERROR, f"the JWKS at {url} holds no Ed25519 key")
    _jwks_cache[(url, replaying)] = (time.monotonic(), found)
    return found
