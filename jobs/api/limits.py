"""Creates per second, per client (docs/api.md, "Limits"): a token bucket each, in CACHE_URL's Redis so every
`web` process of a deployment draws from the same one.

A client's bucket holds up to its burst (Client.create_burst, else CLIENT_CREATE_BURST) and fills at its rate
(Client.creates_per_s, else CLIENT_CREATES_PER_S; 0: no limit). Each POST /v1/jobs takes one token before its
body is read; none left is `429 RATE_LIMITED` with Retry-After, the seconds until one is there, and nothing
is written. The take is one Lua script, so two web processes taking the last token at once cannot both have
it (Redis runs a script alone), and its clock is Redis's own (TIME), the same for every process.

Without Redis (a non-Redis broker and no CACHE_URL), each web process keeps its own buckets: a client then
has its rate per process. With Redis unreachable the create is let through and the failure logged: a limit
that could not be read must not take the API down with it (the cap and the idempotency key still hold).
"""

import logging
import math
import threading
import time

import redis
from django.conf import settings

from jobs.api.errors import RateLimited

logger = logging.getLogger(__name__)

SOCKET_TIMEOUT_S = 0.5
KEY_PREFIX = "payonce:creates:"

# KEYS[1]: the client's bucket. ARGV: the rate per second, the burst. 0 if a token was taken, else the
# milliseconds until one is there.
_TAKE = """
local now = redis.call('TIME')
local ms = now[1] * 1000 + math.floor(now[2] / 1000)
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local held = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens, at = tonumber(held[1]), tonumber(held[2])
if tokens == nil then tokens, at = burst, ms end
tokens = math.min(burst, tokens + math.max(0, ms - at) * rate / 1000)
local wait = 0
if tokens >= 1 then tokens = tokens - 1 else wait = math.ceil((1 - tokens) * 1000 / rate) end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', ms)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 1000)
return wait
"""

_client: tuple[str, redis.Redis] | None = None
_local: dict[str, tuple[float, float]] = {}
_local_lock = threading.Lock()


def limit_of(client) -> tuple[float, int]:
    """(creates per second, burst) for the client: its own, else the settings'. A rate of 0 is no limit."""
    rate = float(client.creates_per_s) if client.creates_per_s is not None else settings.CLIENT_CREATES_PER_S
    burst = client.create_burst if client.create_burst is not None else settings.CLIENT_CREATE_BURST
    return rate, max(1, burst)


def take_create(client) -> None:
    """Take one create token of the client's, or raise RateLimited (nothing else done)."""
    rate, burst = limit_of(client)
    if rate <= 0:
        return
    wait_ms = _take_redis(str(client.id), rate, burst) if settings.CACHE_URL else _take_here(str(client.id), rate, burst)
    if wait_ms:
        seconds = max(1, math.ceil(wait_ms / 1000))
        raise RateLimited(f"More than {rate:g} creates per second (a burst of {burst}); send it again in "
                          f"{seconds} s under the same Idempotency-Key.", retry_after=seconds)


def _redis() -> redis.Redis:
    global _client
    if _client is None or _client[0] != settings.CACHE_URL:
        _client = (settings.CACHE_URL, redis.Redis.from_url(settings.CACHE_URL, socket_timeout=SOCKET_TIMEOUT_S,
                                                            socket_connect_timeout=SOCKET_TIMEOUT_S))
    return _client[1]


def _take_redis(client_key: str, rate: float, burst: int) -> int | None:
    try:
        return int(_redis().eval(_TAKE, 1, KEY_PREFIX + client_key, rate, burst))
    except redis.RedisError:
        logger.warning("creates per second not checked: the limit's Redis did not answer", exc_info=True)
        return 0  # let it through (the module's docstring says why)


def _take_here(client_key: str, rate: float, burst: int) -> int:
    """The same bucket in this process's memory (no Redis configured)."""
    with _local_lock:
        now = time.monotonic()
        tokens, at = _local.get(client_key, (float(burst), now))
        tokens = min(burst, tokens + (now - at) * rate)
        if tokens >= 1:
            _local[client_key] = (tokens - 1, now)
            return 0
        _local[client_key] = (tokens, now)
        return math.ceil((1 - tokens) * 1000 / rate)
