"""The time of every request the web process answers (`payonce_api_request_seconds`, config.metrics): an
ASGI layer behind the probes (config.asgi), so a body refused before Django and a static file are timed,
and a probe is not (operators.probes says why).

A request's time runs from its arrival at this layer until its answer's status and headers go out: an
event stream is timed until it starts, not for its whole life. It is kept by route (Django's URL
pattern, `v1/jobs/<uuid:job_id>`, or `unmatched`), method and status class.

The event loop only notes each answer. One thread per process (`Writer`, started with the process, so
the set of the process's threads stays the same under load) resolves the routes and writes what has
gathered, in one round trip to Redis per batch: no answer waits for Redis, the loop is never held by
it, and under load many requests share a round trip.
"""

import logging
import threading
import time
from collections import deque

from config.metrics import observe_many, route_of

logger = logging.getLogger(__name__)


class Writer:
    """Writes the requests' observations on a thread of its own."""

    # Answers noted and not written yet, at most: past it the oldest are dropped, so a Redis far behind
    # costs figures, never the process's memory.
    MAX_PENDING = 10_000

    def __init__(self):
        self._pending: deque = deque(maxlen=self.MAX_PENDING)
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="web-request-metrics", daemon=True)
        self._thread.start()

    def note(self, path: str, method: str, status: int, seconds: float) -> None:
        """On the event loop: a deque's append and an event's set, nothing that waits."""
        self._pending.append((path, method, status, seconds))
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()  # an answer noted from here on sets it again: none is left behind
            batch = []
            while self._pending:
                batch.append(self._pending.popleft())
            try:
                observe_many([("api_request_seconds", seconds,
                               {"route": route_of(path), "method": method, "status": f"{status // 100}xx"})
                              for path, method, status, seconds in batch])
            except Exception:  # observe_many never raises; this thread must outlive anything that would
                logger.exception("request metrics: a batch of %d not written", len(batch))


class RequestMetricsMiddleware:
    def __init__(self, app):
        self.app = app
        self.writer = Writer()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.monotonic()
        answered: tuple[int, float] | None = None  # (status, seconds) once the answer starts

        async def send_timed(message):
            nonlocal answered
            if message["type"] == "http.response.start" and answered is None:
                answered = (message["status"], time.monotonic() - started)
            await send(message)

        try:
            return await self.app(scope, receive, send_timed)
        except Exception:
            if answered is None:  # the server answers 500 for it
                answered = (500, time.monotonic() - started)
            raise
        finally:
            if answered is not None:  # a client gone before any answer is no request answered
                self.writer.note(scope["path"].removeprefix(scope.get("root_path", "")), scope["method"], *answered)
