"""`count()`: the event counters, kept in one Redis hash, for events that leave no row (sweeper
recoveries, provider callbacks, polls). Any process counts; /metrics (operators.metrics) reads them back
at scrape time, so every `web` process answers a scrape with the same figures, whichever process did the
work. Label values are bounded enums: never a job id, an upstream key or anything a request can grow
without bound.
"""

import logging
import time

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

logger = logging.getLogger(__name__)

# --- event counters (Redis) --------------------------------------------------------------------------

# name -> (label, its values, help). A value outside its list is counted as "other": the set of series
# stays bounded whatever a caller passes.
OTHER = "other"
COUNTERS = {
    "sweeper_recoveries": ("what", ("stuck_job", "cancelled_attempt"),
                           "Things the sweeper woke: a stuck job resumed, a cancelled job's attempt still out ended."),
    "callbacks": ("outcome", ("rung", "duplicate", "ended", "early", "unknown_generation", "bad_signature",
                              "not_configured", "invalid", "keys_unavailable"),
                  "Provider callbacks received, by what payonce answered (executor.callbacks)."),
    "key_page_fetches": ("outcome", ("ok", "failed"),
                         "Fetches of a provider's webhook key page (fal's JWKS), by outcome: at most one per 30 s "
                         "per web process, whatever the outcome (executor.providers.fal.webhooks)."),
    "polls": ("outcome", ("running", "succeeded", "failed", "cancelled", "error"),
              "Polls of an accepted attempt, by what the provider said (error: the poll itself failed)."),
    "models_file": ("outcome", ("loaded", "rejected"),
                    "A models file changed at run time: loaded (valid, now in force), or rejected (wrong or unreadable: "
                    "the last good one stays in force, and the log line names every problem)."),
    "price_drifts": ("seen", ("first", "again"),
                     "Attempts that settled above their reservation (a price drift: the rate card says less than the "
                     "provider charges): the first of a model's drift, or again while it holds (billing.services)."),
    "sweep_errors": ("sweep", ("stuck_jobs", "cancelled_attempts", "fold", "deliveries"),
                     "Rows a periodic sweep could not act on: each is logged and skipped, and the pass goes on."),
    "lease_takeovers": ("kind", ("media", "report"),
                        "Steps taken over from another holder whose lease ran out (its worker died or stalled), "
                        "by job kind: the logs' step.taken_over lines (jobs.engine.steps._log_claim)."),
}
HASH_KEY = "payonce:metrics:counters"
# A counter is never worth a stall: a Redis that does not answer at once is left alone this long.
SOCKET_TIMEOUT_S = 0.25
PAUSE_AFTER_ERROR_S = 5.0

_client: tuple[str, redis.Redis] | None = None
_paused_until = 0.0


def _redis() -> redis.Redis | None:
    """The counters' Redis (METRICS_REDIS_URL), one connection pool per process; None when counters are
    not kept, or for a few seconds after an error."""
    global _client
    url = settings.METRICS_REDIS_URL
    if not url or time.monotonic() < _paused_until:
        return None
    if _client is None or _client[0] != url:
        # No retries: a counter lost with a Redis outage is cheaper than a provider call held up by it.
        _client = (url, redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT_S,
                                             socket_connect_timeout=SOCKET_TIMEOUT_S, retry=Retry(NoBackoff(), 0)))
    return _client[1]


def _pause(exc: Exception) -> None:
    global _paused_until
    _paused_until = time.monotonic() + PAUSE_AFTER_ERROR_S
    logger.debug("metrics: Redis unavailable, counters paused for %s s: %s", PAUSE_AFTER_ERROR_S, exc)


def _field(name: str, labels: dict) -> str:
    label, values, _ = COUNTERS[name]
    value = labels.get(label)
    return f"{name}|{value if value in values else OTHER}"


def count(name: str, **labels) -> None:
    """Add one to an event counter (HINCRBY on one hash). Never raises: it runs on the paths that spend
    money, and a metric must not be why one fails. One round trip, with short socket timeouts."""
    try:
        client = _redis()
        if client is not None:
            client.hincrby(HASH_KEY, _field(name, labels), 1)
    except Exception as exc:  # a metric never stops paid work
        _pause(exc)


def counters() -> dict[str, int] | None:
    """Every counter's value (field -> count), or None when they are not kept or Redis did not answer."""
    client = _redis()
    if client is None:
        return None
    try:
        stored = client.hgetall(HASH_KEY)
    except Exception as exc:  # a scrape without the counters beats no scrape
        _pause(exc)
        return None
    return {field.decode(): int(value) for field, value in stored.items()}
