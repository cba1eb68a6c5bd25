"""Reading a request, strictly, the same way wherever it comes in: its JSON body, for every POST that
takes one (the jobs API, jobs.api.views, and the orders API, orders.views), and its Idempotency-Key (the
jobs API, and the `submit` command, which checks a key as the API would). Its own module, not a view's,
so an app above imports it without importing the jobs views."""

import json
import math
import re

from django.conf import settings

from jobs.api.errors import (
    IdempotencyKeyInvalid,
    IdempotencyKeyMissing,
    InvalidRequest,
    PayloadTooLarge,
    UnsupportedMediaType,
)

_JSON_CONTENT_TYPE = re.compile(r"\Aapplication/([a-z0-9.+-]+\+)?json\Z", re.IGNORECASE | re.ASCII)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _contains_nul(value) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_contains_nul(k) or _contains_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_contains_nul(v) for v in value)
    return False


def check_json_content_type(content_type: str) -> None:
    """The body must say it is JSON (`application/json`, or `application/<x>+json`), in UTF-8: a missing
    Content-Type is not taken for JSON, and another charset is not decoded as if it were UTF-8."""
    media_type, *params = [part.strip() for part in content_type.split(";")]
    if not _JSON_CONTENT_TYPE.match(media_type):
        shown = f"not {content_type[:100]!r}" if content_type else "and say so in Content-Type"
        raise UnsupportedMediaType(f"Send the body as application/json, {shown}.")
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            raise UnsupportedMediaType(f"Send the body in UTF-8, not {value.strip()[:40]!r}.")


def read_json_body(request) -> object:
    """Read at most JOB_BODY_MAX_BYTES of the body (also when it arrives chunked) and parse strict JSON.

    The web process's ASGI guard (config.limits) refuses a larger body before Django sees it; this is the
    same bound for any other way in. Rejected here so nothing half-valid reaches PostgreSQL: NaN/Infinity
    and out-of-range numbers, invalid UTF-8, and NUL characters (jsonb cannot store them).
    """
    limit = settings.JOB_BODY_MAX_BYTES
    declared = request.META.get("CONTENT_LENGTH") or ""
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"The request body is larger than {limit} bytes.", limit_bytes=limit)
    raw = request._request.read(limit + 1)
    if len(raw) > limit:
        raise PayloadTooLarge(f"The request body is larger than {limit} bytes.", limit_bytes=limit)
    if not raw:
        raise InvalidRequest("The request body is empty: send the job as JSON.", fields={"body": ["Required."]})
    check_json_content_type(request.META.get("CONTENT_TYPE", ""))
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite_float)
        if _contains_nul(body):
            raise ValueError("NUL characters are not allowed in strings")
        return body
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InvalidRequest("The request body is not valid JSON.", fields={"body": [str(exc)[:300]]}) from None


# 1 to 255 visible ASCII characters (docs/design.md, "One key and one body are one job"). The schema's form (ECMA
# anchors); the code matches the whole string (\A...\Z: `$` would also match before a final newline).
IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]{1,255}$"
_IDEMPOTENCY_KEY = re.compile(r"\A[\x21-\x7e]{1,255}\Z")


def idempotency_key_valid(key: str) -> bool:
    return _IDEMPOTENCY_KEY.match(key) is not None


def idempotency_key_from(request) -> str:
    """The POST's Idempotency-Key header: exactly one, 1 to 255 visible ASCII characters."""
    # Django joins a repeated header with "," ("K" twice reads "K,K", itself a valid key): count the raw
    # headers the server received, so two keys are never taken for a third one.
    raw_headers = getattr(request._request, "scope", {}).get("headers", ())
    if sum(1 for name, _ in raw_headers if name.lower() == b"idempotency-key") > 1:
        raise IdempotencyKeyInvalid("Send exactly one Idempotency-Key header.")
    key = request.META.get("HTTP_IDEMPOTENCY_KEY")
    if key is None or key == "":
        raise IdempotencyKeyMissing("The Idempotency-Key header is required for POST /v1/jobs.")
    if not idempotency_key_valid(key):
        raise IdempotencyKeyInvalid("The Idempotency-Key must be 1 to 255 visible ASCII characters.")
    return key
