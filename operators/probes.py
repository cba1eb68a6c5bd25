"""The probes a load balancer or an orchestrator asks (docs/operating.md, "Probes"): `GET /healthz`, the
process answers; `GET /readyz`, PostgreSQL accepts a write and the broker answers, else `503`. An ASGI
middleware in front of everything else of `web` (config.asgi), answered on the event loop.

Why there, and not as Django views:

- /healthz says only that the process answers. Behind Django it would wait for a web thread
  (WEB_THREADS), and those are the threads a hanging database holds: an orchestrator would restart every
  `web` process for the database's outage, which no restart mends. Nothing of Django's middleware
  (sessions, authentication, the login throttle) runs for either probe, so neither needs a key nor
  touches a table it does not mean to.
- /readyz runs its two checks as coroutines under one deadline (READYZ_TIMEOUT_S): a database or a
  broker that hangs is a `503` within it, and holds no thread.

Neither answer says why: a stranger learns nothing of what is down. The reason is in the log line, which
is written when readiness changes (and once a minute while it stays lost), never for a probe that passes.
The probes never reach Django, so no request metric or log line of Django's counts them. They are not in
/v1/schema: like /metrics and /admin/ they are the operators', and no client library calls them.
"""

import asyncio
import json
import logging
import math
import os
import socket
import time
import zlib

import psycopg
import redis.asyncio as redis_async
from django.conf import settings
from django.db import connections
from kombu import Connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from config.db import connect_kwargs
from operators.models import ReadinessMark

logger = logging.getLogger(__name__)

HEALTHZ, READYZ = "/healthz", "/readyz"
# The slots of ReadinessMark a process writes one of: the table never holds more rows than this.
SLOTS = 64
# A finished check answers the probes of the next half second too: a stranger asking /readyz in a loop
# costs PostgreSQL two connections and two writes a second per `web` process, not one per request. Every
# probe period (HAProxy's default 2 s, Kubernetes' 1 s at least) still gets a check of its own, so a
# database turned read-only fails the first probe after it.
REUSE_S = 0.5
# While readiness stays lost, its log line is written again this often (and whenever the reason changes).
RELOG_S = 60.0

_MARK = (f"INSERT INTO {ReadinessMark._meta.db_table} (slot, marked_at) VALUES (%s, now()) "
         "ON CONFLICT (slot) DO UPDATE SET marked_at = EXCLUDED.marked_at")


def _slot() -> int:
    """This process's row of ReadinessMark (host and pid hashed): different processes rarely share one."""
    return zlib.crc32(f"{socket.gethostname()}:{os.getpid()}".encode()) % SLOTS


async def database_accepts_a_write(timeout_s: float) -> None:
    """Raises unless PostgreSQL takes a write now: an upsert of this process's ReadinessMark row,
    autocommitted (so the commit's WAL flush, and a synchronous standby if one is configured, are part of
    it).

    On a connection of its own, opened for the check and closed after it, not one of the app's pool: a
    database turned read-only (`default_transaction_read_only`, set by ALTER DATABASE, reaches new
    sessions only) or a primary demoted to a standby is what the *next* connection meets, and the pool's
    may still hold an older session's settings. A full server (max_connections) is not ready either.

    A real write, because nothing lighter sees a read-only database: `SELECT 1` and
    `pg_is_in_recovery()` do not, `txid_current()` assigns an id in a read-only transaction too (checked
    on PostgreSQL 15), and a TEMP table is writable in one."""
    params = connect_kwargs(connections["default"].settings_dict, connections["default"].settings_dict["NAME"])
    # libpq's unit is whole seconds, 2 at least; the caller's deadline is the real bound.
    params["connect_timeout"] = max(2, math.ceil(timeout_s))
    async with await psycopg.AsyncConnection.connect(**params) as conn:
        # Server-side too: when the caller gives up at its deadline, psycopg sends a cancel request, but
        # if that does not arrive a statement waiting on a lock (a table locked by a migration) would hold
        # its backend until the lock goes, one more for every probe. Not a startup `options`: PgBouncer
        # refuses those.
        await conn.execute("SELECT set_config('statement_timeout', %s, false)", [str(math.ceil(timeout_s * 1000))])
        await conn.execute(_MARK, [_slot()])


async def broker_answers(timeout_s: float) -> None:
    """Raises unless the broker answers now: Redis's PING, or for another broker (amqp://) a connection
    kombu opens and closes."""
    url = settings.CELERY_BROKER_URL
    if url.startswith(("redis://", "rediss://", "unix://")):
        client = redis_async.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                            retry=Retry(NoBackoff(), 0))
        try:
            await client.ping()
        finally:
            await client.aclose()
        return
    await asyncio.to_thread(_kombu_connects, url, timeout_s)


def _kombu_connects(url: str, timeout_s: float) -> None:
    with Connection(url, connect_timeout=timeout_s, transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS) as conn:
        # No retry of kombu's own (connect() retries once, after a pause): one try, within the timeout.
        conn.ensure_connection(max_retries=0)


CHECKS = {"database": database_accepts_a_write, "broker": broker_answers}


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


class ProbesMiddleware:
    """/healthz and /readyz in front of `app` (every other path goes to it unchanged).

    At most one readiness check runs per process: probes that arrive while one runs wait for its answer
    (many load balancers asking at once cost one check), and a check that outlived its deadline is left
    to end on its own (its connection's timeouts bound it) while every probe meanwhile is `503` at once."""

    def __init__(self, app):
        self.app = app
        self._running: dict[str, asyncio.Task] | None = None  # the check in progress, by name
        self._started = 0.0
        self._answer: tuple[float, bool] | None = None  # (when it finished, ready) of the last check
        self._failure: str | None = None  # the last logged reason, None while ready
        self._logged_at = 0.0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] not in (HEALTHZ, READYZ):
            return await self.app(scope, receive, send)
        if scope["method"] not in ("GET", "HEAD"):
            return await _answer(send, scope, 405, {"error": {"code": "METHOD_NOT_ALLOWED",
                                                              "message": "this path takes GET or HEAD"}},
                                 [(b"allow", b"GET, HEAD")])
        if scope["path"] == HEALTHZ:
            return await _answer(send, scope, 200, {"status": "ok"})
        ready = await self.ready()
        await _answer(send, scope, 200 if ready else 503, {"status": "ready" if ready else "unavailable"})

    async def ready(self) -> bool:
        now = time.monotonic()
        if self._answer is not None and now - self._answer[0] < REUSE_S:
            return self._answer[1]
        timeout_s = settings.READYZ_TIMEOUT_S
        if self._running is None:
            self._running = {name: asyncio.ensure_future(check(timeout_s)) for name, check in CHECKS.items()}
            self._started = now
        elif self._started + timeout_s <= now:
            # An earlier check is past its deadline and still ending: not ready, for the reason already
            # logged (no new line every other probe), and no second check.
            return self._finish(self._failure or "an earlier check past its deadline has not ended yet")
        running = self._running
        await asyncio.wait(running.values(), timeout=max(0.0, self._started + timeout_s - now))
        if self._running is running and all(task.done() for task in running.values()):
            self._running = None
        failures = []
        for name, task in running.items():
            if not task.done():
                task.cancel()  # its clean-up ends it; self._running keeps it until then
                task.add_done_callback(lambda _, running=running: self._forget(running))
                failures.append(f"{name}: no answer within {timeout_s} s")
            elif task.cancelled():
                failures.append(f"{name}: cancelled")
            elif task.exception() is not None:
                failures.append(f"{name}: {_why(task.exception())}")
        return self._finish("; ".join(failures) if failures else None)

    def _forget(self, running: dict) -> None:
        """A check given up on has ended: the next probe may start another."""
        if self._running is running and all(task.done() for task in running.values()):
            self._running = None
            for task in running.values():  # its late error is of no use now, and asyncio would log it
                if not task.cancelled():
                    task.exception()

    def _finish(self, failure: str | None) -> bool:
        now = time.monotonic()
        self._answer = (now, failure is None)
        if failure is None:
            if self._failure is not None:
                logger.info("readyz: ready again (PostgreSQL accepts a write, the broker answers)")
            self._failure = None
        elif failure != self._failure or now - self._logged_at >= RELOG_S:
            logger.warning("readyz: not ready: %s", failure)
            self._failure, self._logged_at = failure, now
        return failure is None


async def _answer(send, scope, status: int, document: dict, headers: list | None = None) -> None:
    body = json.dumps(document).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"), (b"x-content-type-options", b"nosniff"), *(headers or []),
    ]})
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})
