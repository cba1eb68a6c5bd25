"""The check of the webhooks fal signs (the adapter is executor.providers.fal.adapter).

fal signs with ED25519: the message is the X-Fal-Webhook-Request-Id, -User-Id and -Timestamp headers and
the hex SHA-256 of the raw body, joined by newlines; X-Fal-Webhook-Signature is its signature, in hex, by
one of the keys fal publishes as a JWKS at FAL_WEBHOOK_JWKS_URL; the timestamp is within 5 minutes. Apart
from the adapter, so that executor.callbacks (which the adapter asks for its callback URL) can verify a
fal callback without a cycle.
"""

import base64
import hashlib
import json
import logging
import math
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.conf import settings

from config.metrics import count
from executor.providers import http, real
from executor.providers.base import ErrorClass, ProviderError

logger = logging.getLogger(__name__)

WEBHOOK_TOLERANCE_S = 300.0
# fal's guide caches its webhook keys for up to a day; an hour picks up a rotation sooner.
JWKS_TTL_S = 3600.0
# No two fetches of the key page start closer than this, whatever the first came to (keys, an error
# status, a timeout): a stream of forged callbacks, or of fal's genuine retries while its key page is
# down, must not become a stream of fetches. A failure is thus "cached" this long.
JWKS_MIN_INTERVAL_S = 30.0


# -- webhooks --------------------------------------------------------------------------------------------


def signed_headers(headers, *, now: float | None = None) -> tuple[str, str, str, bytes]:
    """The X-Fal-Webhook-* headers a signature covers (request id, user id, timestamp) and the signature's
    bytes. ValueError when one is missing or malformed, or the timestamp is more than WEBHOOK_TOLERANCE_S
    from `now`: checked before any key is needed, so a callback refused on its headers alone never makes
    anyone fetch the key page."""
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
    return request_id, user_id, timestamp, signed


def verify_webhook(body: bytes, headers, *, jwks: dict, now: float | None = None) -> dict:
    """The payload of a webhook fal signed, `{"request_id", "status": "OK" | "ERROR", "payload", "error"}`.
    ValueError when a header is missing, the timestamp is more than WEBHOOK_TOLERANCE_S from `now`, no
    Ed25519 key of `jwks` signed this very body, or the body names another request than the signed header.
    The reason is for logs; a caller answers every refusal alike."""
    request_id, user_id, timestamp, signed = signed_headers(headers, now=now)
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


@dataclass
class _KeyPage:
    """This process's knowledge of one key page (per URL and replay mode). Read and written under _lock."""

    keys: dict | None = None  # the last good JWKS, kept through failed refreshes
    fetched_at: float = -math.inf  # when `keys` was fetched (monotonic)
    tried_at: float = -math.inf  # when the last fetch began, whatever it came to
    failure: ProviderError | None = None  # what the last fetch came to, if it failed
    fetching: bool = False  # a thread is fetching it now


_lock = threading.Lock()
_jwks_cache: dict[tuple[str, bool], _KeyPage] = {}


def jwks(*, refresh: bool = False, replay: bool | None = None) -> dict:
    """fal's webhook keys, fetched from FAL_WEBHOOK_JWKS_URL (recorded ones with REAL_PROVIDERS off) and
    kept JWKS_TTL_S. `refresh`: a signature no kept key verifies may be by a key fal published since, so
    fetch them again now. ProviderError when no keys can be had.

    Bounded whatever the key page does (issue 38: forged callbacks during a key-page outage held every web
    thread for PROVIDER_READ_TIMEOUT_S each, and each made a fetch):
    - at most one fetch per JWKS_MIN_INTERVAL_S per page and process, whatever its outcome: inside it a
      caller gets the kept keys, or, with none, the last failure at once;
    - single flight: while one thread fetches, the others do not wait for it: they use the kept keys, or
      with none are refused at once (the callback answers 503 CALLBACK_UNVERIFIED, the provider sends it
      again, and the waiting step polls meanwhile);
    - keys past their TTL are refreshed on a thread of their own while requests go on with them;
    - a fetch on a request's thread (no keys yet, or `refresh`) waits FAL_WEBHOOK_JWKS_TIMEOUT_S at most,
      not PROVIDER_READ_TIMEOUT_S: so one thread per process, for a few seconds, per interval."""
    url = settings.FAL_WEBHOOK_JWKS_URL
    replaying = real.replaying(replay)
    now = time.monotonic()
    with _lock:
        page = _jwks_cache.setdefault((url, replaying), _KeyPage())
        may_fetch = not page.fetching and now - page.tried_at >= JWKS_MIN_INTERVAL_S
        if page.keys is not None and not refresh:
            if now - page.fetched_at >= JWKS_TTL_S and may_fetch:
                _begin(page, now)
                threading.Thread(target=_refresh_quietly, args=(page, url, replaying), name="fal-jwks",
                                 daemon=True).start()
            return page.keys
        if not may_fetch:
            if page.keys is not None:
                return page.keys
            # A new error each time: the kept one, raised again and again, would grow its traceback.
            raise ProviderError(ErrorClass.SERVER_ERROR, f"the JWKS at {url} is being fetched" if page.fetching
                                else f"the JWKS at {url} could not be had {now - page.tried_at:.0f} s ago: "
                                     f"{page.failure}")
        _begin(page, now)
        kept = page.keys
    try:
        return _fetch_into(page, url, replaying)
    except ProviderError:
        if kept is None:
            raise
        return kept  # a refresh that failed: the keys kept still verify what they verified


def _refresh_quietly(page: _KeyPage, url: str, replaying: bool) -> None:
    """A refresh of keys past their TTL, on a thread of its own: a failure is logged and kept (_fetch_into)."""
    try:
        _fetch_into(page, url, replaying)
    except ProviderError:
        pass


def _begin(page: _KeyPage, now: float) -> None:
    """Claim the page's one fetch (under _lock): nobody else starts one until it ends and the interval passes."""
    page.fetching = True
    page.tried_at = now


def _fetch_into(page: _KeyPage, url: str, replaying: bool) -> dict:
    """Fetch the key page the caller claimed (_begin), keep what it came to, and release the claim. The
    keys; ProviderError (kept as the page's failure, the last good keys staying) when none could be had."""
    try:
        found = _fetch(url, replaying)
    except ProviderError as exc:
        with _lock:
            page.failure, page.fetching = exc, False
        count("key_page_fetches", outcome="failed")
        logger.warning("fal's webhook keys could not be fetched (next try in %s s): %s", JWKS_MIN_INTERVAL_S, exc)
        raise
    except BaseException:
        with _lock:
            page.fetching = False
        raise
    with _lock:
        page.keys, page.fetched_at, page.failure, page.fetching = found, time.monotonic(), None, False
    count("key_page_fetches", outcome="ok")
    return found


def _fetch(url: str, replaying: bool) -> dict:
    timeout = settings.FAL_WEBHOOK_JWKS_TIMEOUT_S
    parts = urlsplit(url)
    response = real.send("GET", url, base_url=f"{parts.scheme}://{parts.netloc}", replay=replaying,
                         timeout=(timeout, timeout))
    if response.status_code >= 400:
        raise ProviderError(ErrorClass.SERVER_ERROR, f"the JWKS at {url} answered {response.status_code}",
                            status=response.status_code)
    found = http.json_answer(response)
    if not public_keys(found):
        raise ProviderError(ErrorClass.SERVER_ERROR, f"the JWKS at {url} holds no Ed25519 key")
    return found
