"""How many event streams (GET /v1/jobs/{id}/events) may be open at once: SSE_MAX_PER_CLIENT per client
across every `web` process, and SSE_MAX_PER_PROCESS in each process. A stream holds a `StreamSlot` from
its 200 until it ends; the next one over either bound is `429 TOO_MANY_STREAMS`.

The per-client count is shared by all web processes (uvicorn runs WEB_CONCURRENCY of them) through one
Redis sorted set per client in CACHE_URL: a member per open stream, scored with the moment its lease
runs out. A live stream renews its lease every RENEW_EVERY_S and removes it when it ends; the lease of a
stream whose process was killed runs out after LEASE_S and stops counting, so no slot leaks for ever.
Leases are timed by the Redis server's clock (TIME inside the scripts), never by a web machine's.

Without a Redis (CACHE_URL empty: a non-Redis broker and no CACHE_URL set), and for a few seconds after
Redis failed to answer, the per-client count is each process's own: a client may then hold up to
SSE_MAX_PER_CLIENT streams on each web process. A stream is a read of the client's own job, so a Redis
outage narrows the bound to a per-process one rather than refusing every stream; SSE_MAX_PER_PROCESS
still holds.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
import weakref
from collections import Counter

import redis
import redis.asyncio as aioredis
from django.conf import settings

from jobs.api.errors import TooManyStreams

logger = logging.getLogger(__name__)

LEASE_S = 30
RENEW_EVERY_S = LEASE_S / 3
# What a refused client is told to wait: a slot frees when one of its streams ends, which nothing here
# can predict; a third of a lease is about as long as a killed process's slot may still count for.
RETRY_AFTER_S = 10
KEY_PREFIX = "payonce:sse:"
SOCKET_TIMEOUT_S = 0.25  # a bound is never worth a stalled request: Redis answers at once or not at all
PAUSE_AFTER_ERROR_S = 5.0
POOL_CONNECTIONS = 16
POOL_WAIT_S = 2.0

# KEYS[1]: the client's set. ARGV: the bound, the lease's length, the stream's id. 1 if taken, else 0.
# One script, so two processes that count at the same moment cannot both take the last slot.
_TAKE = """
local now = redis.call('TIME')
local at = tonumber(now[1]) + tonumber(now[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', at)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], at + tonumber(ARGV[2]), ARGV[3])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]) + 1)
return 1
"""
# Renewing writes the lease again even if it ran out meanwhile (Redis was away longer than a lease): the
# stream is open, so it counts.
_RENEW = """
local now = redis.call('TIME')
local at = tonumber(now[1]) + tonumber(now[2]) / 1000000
redis.call('ZADD', KEYS[1], at + tonumber(ARGV[1]), ARGV[2])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[1]) + 1)
return 1
"""


class _Here:
    """This process's counts: every stream, and each client's (used when Redis is not). A lock, because a
    slot that was never released is released by the garbage collector, from whichever thread runs it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.open = 0
        self.by_client: Counter = Counter()


_here = _Here()
_paused_until = 0.0
_clients: dict = {}  # (url, event loop) -> its client: a redis.asyncio pool belongs to one loop


def _redis() -> aioredis.Redis | None:
    url = settings.CACHE_URL
    if not url or time.monotonic() < _paused_until:
        return None
    loop = asyncio.get_running_loop()
    client = _clients.get((url, loop))
    if client is None:
        _clients.clear()  # a client of a loop that is gone (a test's) is never used again
        # A bounded pool that makes a burst of streams wait their turn (each script takes well under a
        # millisecond) rather than open a connection each, or fail past the pool's size.
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=POOL_CONNECTIONS, timeout=POOL_WAIT_S,
            socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=SOCKET_TIMEOUT_S)
        client = _clients[(url, loop)] = aioredis.Redis(connection_pool=pool)
    return client


def _pause(exc: Exception) -> None:
    global _paused_until
    _paused_until = time.monotonic() + PAUSE_AFTER_ERROR_S
    logger.warning("event streams: Redis unavailable, streams counted per process for %s s: %s",
                   PAUSE_AFTER_ERROR_S, exc)


def _refused(scope: str, limit: int) -> TooManyStreams:
    where = "This client" if scope == "client" else "This web process"
    return TooManyStreams(f"{where} has {limit} event streams open; close one or try again later.",
                          scope=scope, limit=limit)


def _release_here(client_key: str, counted_by_client: bool) -> None:
    with _here.lock:
        _here.open -= 1
        if counted_by_client:
            _here.by_client[client_key] -= 1
            if _here.by_client[client_key] <= 0:
                del _here.by_client[client_key]


class StreamSlot:
    """One open stream's place in both counts. `release()` is idempotent; a slot dropped without it (a
    response cancelled before its stream started) gives its process's place back when it is collected,
    and its Redis lease runs out by itself."""

    def __init__(self, client_key: str, lease_id: str | None, counted_by_client: bool):
        self.client_key = client_key
        self.lease_id = lease_id  # None: not counted in Redis
        self.renewed_at = time.monotonic()
        self._finalizer = weakref.finalize(self, _release_here, client_key, counted_by_client)

    async def renew_if_due(self) -> None:
        if self.lease_id is None or time.monotonic() - self.renewed_at < RENEW_EVERY_S:
            return
        self.renewed_at = time.monotonic()
        client = _redis()
        if client is None:
            return
        try:
            await client.eval(_RENEW, 1, KEY_PREFIX + self.client_key, LEASE_S, self.lease_id)
        except (redis.RedisError, OSError) as exc:
            _pause(exc)

    async def release(self) -> None:
        if not self._finalizer.alive:
            return
        self._finalizer()  # this process's counts, at once
        if self.lease_id is None:
            return
        client = _redis()
        if client is None:
            return  # the lease runs out by itself
        try:
            await client.zrem(KEY_PREFIX + self.client_key, self.lease_id)
        except (redis.RedisError, OSError) as exc:
            _pause(exc)


async def stream_slot_take(*, client_id) -> StreamSlot:
    """A slot for one more stream of the client, or raises TooManyStreams. Steps: 1. this process's bound,
    counted here (one event loop, and the lock); 2. the client's bound, in Redis (one script: the count
    and the add cannot interleave with another process's), else counted here."""
    client_key = str(client_id)
    with _here.lock:
        if _here.open >= settings.SSE_MAX_PER_PROCESS:
            raise _refused("process", settings.SSE_MAX_PER_PROCESS)
        _here.open += 1
    limit = settings.SSE_MAX_PER_CLIENT
    client = _redis()
    if client is not None:
        lease_id = uuid.uuid4().hex
        try:
            taken = await client.eval(_TAKE, 1, KEY_PREFIX + client_key, limit, LEASE_S, lease_id)
        except (redis.RedisError, OSError) as exc:
            _pause(exc)
        except BaseException:  # cancelled (the client went away): no slot, and a lease taken runs out
            _release_here(client_key, False)
            raise
        else:
            if not taken:
                _release_here(client_key, False)
                raise _refused("client", limit)
            return StreamSlot(client_key, lease_id, counted_by_client=False)
    with _here.lock:
        if _here.by_client[client_key] >= limit:
            _here.open -= 1
            raise _refused("client", limit)
        _here.by_client[client_key] += 1
    return StreamSlot(client_key, None, counted_by_client=True)
