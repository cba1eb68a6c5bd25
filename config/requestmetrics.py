"""The time of every request the web process answers (`payonce_api_request_seconds`, config.metrics): an
ASGI layer behind the probes (config.asgi), so a body refused before Django and a static file are timed,
and a probe is not (operators.probes says why).

A request's time runs from its arrival at this layer until its answer's status and headers go out: an
event stream is timed until it starts, not for its whole life. It is kept by route (Django's URL
pattern, `v1/jobs/<uuid:job_id>`, or `unmatched`), method and status class.

The event loop only notes each answer. One thread per process (config.metrics.Gathered, started with the
process, so the set of the process's threads stays the same under load) resolves the routes and writes
what has gathered over GATHER_S, in one round trip to Redis: no answer waits for Redis, the loop is never
held by it, and under load a process pays about two round trips a second for all of its requests.
"""

import time

from config.metrics import Gathered, route_of



def _observation(answer) -> tuple:
    path, method, status, seconds = answer
    return "api_request_seconds", seconds, {"route": route_of(path), "method": method, "status": f"{status // 100}xx"}


class RequestMetricsMiddleware:
    def __init__(self, app):
        self.app = app
        # Started with the process, so the set of its threads stays the same under load.
        self.writer = Gathered(_observation)
        self.writer.start()

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
                self.writer.note((scope["path"].removeprefix(scope.get("root_path", "")), scope["method"], *answered))
