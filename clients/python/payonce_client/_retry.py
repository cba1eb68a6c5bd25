"""When a request is sent again, and after how long: one policy for the sync and the async client.

The rule that matters is which requests may be sent again at all. A request is *repeatable* when sending
it twice has the effect of sending it once: every GET; ``POST /v1/jobs``, because this library sends the
same ``Idempotency-Key`` on every try of one call and payonce answers a key it has seen with the job it
already made (202); ``POST /v1/orders``, which payonce keys by ``payment_id``; and cancel, which can only
ever cancel. Those are tried again on anything that may pass: a connection that failed or broke, a lost
answer, a timeout, ``408``, ``429``, ``503`` and the other 5xx.

``POST /v1/jobs/{id}/retry`` is not repeatable: it is a person's decision to pay again, and a second
retry of a job that failed again in between would pay a third time. It is sent again only when the
connection was never made, because then payonce cannot have seen it.
"""

from __future__ import annotations

import enum
import random
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Optional

import httpx

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 8.0
RETRY_AFTER_CAP_S = 60.0
RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class Mode(enum.Enum):
    REPEATABLE = "repeatable"  # sending it twice is sending it once (see the module's docstring)
    ONCE = "once"  # sent again only if payonce cannot have seen it


def backoff_s(retry: int) -> float:
    """The pause before retry number ``retry`` (0 for the first): 0.5 s doubling up to 8 s, with "equal
    jitter" (between half and all of it), so that many clients cut off at the same moment do not all come
    back at the same moment."""
    ceiling = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2.0 ** retry)
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def parse_retry_after(value: Optional[str]) -> Optional[float]:
    """``Retry-After`` in seconds (a number, or an HTTP date), or None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def retry_after_pause(value: Optional[str], retry: int) -> Optional[float]:
    """The pause an answer that asks for one (``429``, ``503``) is owed. With ``Retry-After``: at least
    what it says (plus up to 10% so that clients told the same second spread out), and never past 60 s;
    a server asking for more than 60 s gets None (the caller stops and raises the answer, which carries
    ``retry_after``) rather than a shorter wait it did not allow. Without it: the exponential back-off."""
    asked = parse_retry_after(value)
    if asked is None:
        return backoff_s(retry)
    if asked > RETRY_AFTER_CAP_S:
        return None
    return min(asked * (1 + 0.1 * random.random()), RETRY_AFTER_CAP_S) if asked else 0.0


def never_connected(exc: BaseException) -> bool:
    """Whether a transport error means the request never left: no connection was made (refused,
    unreachable, a connect timeout, no free connection in the pool)."""
    return isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout))


def may_pass(exc: BaseException) -> bool:
    """Whether a transport error is one that may pass by itself: any failure of the network, a timeout,
    or a server that closed the connection without answering. Not: a URL this library cannot speak to,
    or a request it built wrong (those would fail the same way every time)."""
    return isinstance(exc, (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError))


def pause_after_error(mode: Mode, retry: int, max_retries: int, exc: BaseException) -> Optional[float]:
    """The pause before trying again after a transport error, or None to stop."""
    if retry >= max_retries or not may_pass(exc):
        return None
    if mode is Mode.ONCE and not never_connected(exc):
        return None
    return backoff_s(retry)


def pause_after_status(mode: Mode, retry: int, max_retries: int, status: int,
                       retry_after: Optional[str]) -> Optional[float]:
    """The pause before trying again after an error answer, or None to stop (and raise it)."""
    if retry >= max_retries or mode is Mode.ONCE or status not in RETRYABLE_STATUSES:
        return None
    if status in (429, 503):
        return retry_after_pause(retry_after, retry)
    return backoff_s(retry)
