"""ASGI entry point: `uvicorn config.asgi:application` (the `web` process).

Every answer carries an X-Request-Id (config.requestid) and every request but the probes is timed
(config.requestmetrics). Request bodies are bounded before anything reads them (config.limits). Static files
(/static/: the admin and the API docs) are answered before Django's middleware, from the installed apps, by
Django's own ASGI static files handler.
"""

import os
import time
from concurrent.futures import ThreadPoolExecutor

import django
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.utils.module_loading import import_string

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup(set_prefix=False)  # what django.core.asgi.get_asgi_application does before its handler


# A request in flight longer than this is taken to block its thread (tests/executor/test_key_page_outage.py).
STALLED_S = 0.5


class PooledThreadsASGIHandler(ASGIHandler):
    """Django's ASGI handler, with each request's sync code (middleware, view, ORM) on one of a few
    long-lived threads instead of a thread made and joined for every request.

    Django enters a fresh ThreadSensitiveContext per request, and asgiref gives each one a new
    ThreadPoolExecutor: a thread started and joined per request, which was about 40% of a trivial
    request's CPU (bench/README.md). Here a request takes the least busy of `threads` single-thread
    executors for its whole life, so all of its sync code still runs on one thread (what thread_sensitive
    promises: a connection is never used from two threads), and that many requests of one process can wait
    on I/O at once. Requests that share a thread run their sync calls one after the other, each with its
    own connection (Django keeps connections per request context, not per thread).

    The middleware chain and the view run sync, in one hop to that thread. Django's async chain would
    run each MiddlewareMixin middleware's process_request and process_response through sync_to_async of
    its own: fourteen hops between the event loop and the thread for the seven of settings.MIDDLEWARE, a
    fifth of a POST's CPU (bench/README.md, issue 26). An async view (the event stream) is still called
    as one: Django runs it on the event loop from the sync chain (async_to_sync), and its body streams from
    the loop after the chain has returned."""

    def __init__(self, threads: int):
        super().__init__()
        self.load_middleware(is_async=False)
        self._executors = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"web-sync-{i}")
                           for i in range(threads)]
        # When each executor's requests in flight started (monotonic): touched only on the event loop's
        # thread, so no lock.
        self._started: list[list[float]] = [[] for _ in range(threads)]
        for executor in self._executors:  # start the threads now, not at a request
            executor.submit(int).result()

    async def get_response_async(self, request):
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)

    def _least_busy(self, now: float) -> int:
        """The executor to queue on: one whose requests all started within STALLED_S, fewest first; only
        when every one holds a stalled request, the fewest of those. A count alone would send a request
        behind one that blocks its thread (a key page fetch waiting out its timeout) as soon as the other
        threads each had one more request queued: waiting seconds where it could have waited milliseconds."""
        def load(index: int) -> tuple[bool, int]:
            started = self._started[index]
            return (bool(started) and now - min(started) > STALLED_S, len(started))
        return min(range(len(self._started)), key=load)

    async def __call__(self, scope, receive, send):
        now = time.monotonic()
        index = self._least_busy(now)
        self._started[index].append(now)
        try:
            # Django's own __call__ enters a ThreadSensitiveContext too; inside this one it is a no-op
            # (only the outermost context without an executor takes effect), so its thread is ours.
            async with ThreadSensitiveContext(executor=self._executors[index]):
                await super().__call__(scope, receive, send)
        finally:
            self._started[index].remove(now)


from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from config.limits import BodyLimitMiddleware  # noqa: E402 (after Django is set up)
from config.requestid import RequestIdMiddleware  # noqa: E402
from config.requestmetrics import RequestMetricsMiddleware  # noqa: E402
from config.tracing import setup as setup_tracing  # noqa: E402
from config.version import VersionHeaderMiddleware  # noqa: E402
from config.startup import refuse_to_serve_with_development_settings  # noqa: E402

# Before serving anything: never with the repository's SECRET_KEY when DEBUG is off (config.startup).
refuse_to_serve_with_development_settings(settings)

# Traces (config.tracing), when configured: before the handler loads Django's middleware, which the Django
# instrumentation adds to.
setup_tracing("web")

django_application = PooledThreadsASGIHandler(threads=settings.WEB_THREADS)

# From the outside in: the request id (every answer carries it, and every line logged serving it), the
# version header, /healthz and /readyz in front of everything else (operators.probes says why; named by
# string as config.urls names the apps: config imports no app), the request's time (every request but the
# probes), then the body limit.
application = RequestIdMiddleware(VersionHeaderMiddleware(import_string("operators.probes.ProbesMiddleware")(
    RequestMetricsMiddleware(BodyLimitMiddleware(ASGIStaticFilesHandler(django_application))))))
