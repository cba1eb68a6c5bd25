"""fal's callbacks, as executor.callbacks takes them: fal signs with ED25519 by keys it publishes (no shared
secret), checked by executor.providers.fal.webhooks. Its spec hands `verify_callback` and `callbacks_on` to
executor.callbacks."""

from django.conf import settings

from config.metrics import count
from executor.callbacks import Refused
from executor.providers.base import ProviderError
from executor.providers.fal import webhooks as fal_webhooks


def callbacks_on() -> bool:
    """fal is asked to call back only while it is the real provider: its recorded answers come from no fal
    that could sign."""
    return bool(settings.REAL_PROVIDERS and settings.FAL_WEBHOOK_JWKS_URL)


def verify_callback(body: bytes, headers) -> tuple[str, str]:
    """fal's ED25519 signature (executor.providers.fal.webhooks), by a key of its JWKS: a signature no kept
    key verifies is tried once more against the keys fetched again (fal may have published a new one;
    the fetch is rate-limited there, so forged callbacks cannot make us fetch in a loop)."""
    try:
        # Headers first: a forged callback missing them, or out of time, is refused without a key fetched.
        fal_webhooks.signed_headers(headers)
        try:
            payload = fal_webhooks.verify_webhook(body, headers, jwks=fal_webhooks.jwks())
        except ValueError:
            payload = fal_webhooks.verify_webhook(body, headers, jwks=fal_webhooks.jwks(refresh=True))
    except ProviderError:
        count("callbacks", outcome="keys_unavailable")
        raise Refused(503, "CALLBACK_UNVERIFIED", "The callback cannot be verified now.") from None
    except ValueError:
        count("callbacks", outcome="bad_signature")
        raise Refused(400, "CALLBACK_UNVERIFIED", "The callback's signature or timestamp does not verify.") from None
    generation = payload.get("request_id")
    if not isinstance(generation, str) or not generation or len(generation) > 200:
        count("callbacks", outcome="invalid")
        raise Refused(422, "INVALID_REQUEST", "The callback names no generation id.")
    # fal sends a webhook again, signed anew, until it is answered 2xx: the request and its timestamp.
    timestamp = {str(name).lower(): value for name, value in headers.items()}.get("x-fal-webhook-timestamp", "")
    return f"fal:{generation}:{timestamp}", generation
