"""GET /v1/jobs/{id}/events: the job's progress as server-sent events, served by the ASGI `web` process
without a thread per stream (docs/api.md, "Progress: GET /v1/jobs/{id}/events").

The stream is an async generator: between reads it sleeps on the event loop, and each read (one
statement: jobs.selectors.job_snapshot) borrows a thread of the executor only for that statement. It
reads the job about every SSE_INTERVAL_S and sends a frame only when the snapshot changed. Frames are
numbered by the snapshot's version (the latest moment anything in it changed), so a client reconnecting
with `Last-Event-ID` is sent nothing it already has. After the frame that shows a terminal status (or at
once, when the client already has that frame) it sends `event: end` and closes; otherwise it closes after
SSE_MAX_S (the client reconnects). A client that goes away ends it at once (Django cancels the response
when the connection drops).

Every open stream holds a slot (jobs.api.streams): at most SSE_MAX_PER_CLIENT per client across the web
processes and SSE_MAX_PER_PROCESS per process; one more is `429 TOO_MANY_STREAMS`. The slot is given
back however the stream ends: the generator's `finally`, and `_Stream.close` for a stream Django stopped
while a frame was being sent.
"""

import asyncio
import json

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions

from jobs import selectors

from jobs.api import streams
from jobs.api.auth import BearerAPIKeyAuthentication
from jobs.api.errors import TooManyStreams, answers_database_outage, error_body, method_not_allowed
from jobs.models import TERMINAL_STATUSES

KEEPALIVE_S = 15.0
# Frame ids are versions in microseconds (a bigint: at most 19 digits).
LAST_EVENT_ID_MAX_DIGITS = 19


def _authenticate(request):
    """The client of the request's API key (the same check as every API view), or the error answer."""
    try:
        found = BearerAPIKeyAuthentication().authenticate(request)
    except exceptions.AuthenticationFailed as failed:
        found, detail = None, str(failed.detail)
    else:
        detail = "Authentication credentials were not provided."
    if found is None:
        answer = JsonResponse(error_body("UNAUTHENTICATED", detail), status=401)
        answer["WWW-Authenticate"] = 'Bearer realm="payonce"'
        return None, answer
    return found[0], None


def _read(client_id, job_id):
    return selectors.job_snapshot(client_id=client_id, job_id=job_id)


def last_event_id(raw: str) -> int | None:
    """The frame id the client says it has, or None. A value that is not a frame id of ours (not ASCII
    digits, or longer than a frame id can be) is ignored rather than refused: the stream then starts from
    the current snapshot, as a first connection does, which is always a correct answer; and a browser's
    EventSource reconnects with whatever id it last saw, so refusing would leave it retrying for ever."""
    if raw.isascii() and raw.isdigit() and len(raw) <= LAST_EVENT_ID_MAX_DIGITS:
        return int(raw)
    return None


def _frame(version: int, snapshot: dict) -> str:
    return f"id: {version}\ndata: {json.dumps(snapshot, separators=(',', ':'))}\n\n"


def _end(snapshot: dict) -> str:
    # With data: an EventSource dispatches no event whose data is empty. No id: the client's last id stays
    # the terminal frame's, so a reconnect is answered with this end alone.
    return f"event: end\ndata: {json.dumps({'status': snapshot['status']}, separators=(',', ':'))}\n\n"


class _Stream:
    """The frames, with the close() Django calls once the response is over. When the client went away while
    a frame was being sent, Django stops reading the generator where it stands (at a `yield`) and closes
    only its own wrapper; close() then closes the generator on its event loop, so its `finally` gives the
    slot back now rather than when the garbage collector finds it. Closing a finished generator is a no-op."""

    def __init__(self, frames):
        self._frames = frames
        self._loop = asyncio.get_running_loop()

    def __aiter__(self):
        return self._frames

    def close(self):  # called from one of Django's sync threads
        self._loop.call_soon_threadsafe(self._close_now)

    def _close_now(self):
        if not self._frames.ag_running:
            self._loop.create_task(self._frames.aclose())


def _too_many(refused: TooManyStreams) -> JsonResponse:
    answer = JsonResponse(error_body(refused.code, refused.message, **refused.extra), status=refused.status_code)
    answer["Retry-After"] = str(streams.RETRY_AFTER_S)
    return answer


@csrf_exempt  # authenticated by API key, never by a cookie: a POST is a 405 below, not the CSRF page
@answers_database_outage  # the key or the first snapshot unreadable: 503 with Retry-After, not a 500
async def job_events(request, job_id):
    if request.method != "GET":
        return method_not_allowed("GET", f'Method "{request.method}" not allowed.')
    client, refused = await sync_to_async(_authenticate, thread_sensitive=False)(request)
    if refused is not None:
        return refused
    # The slot before the first read: a refused stream costs no snapshot.
    try:
        slot = await streams.stream_slot_take(client_id=client.id)
    except TooManyStreams as too_many:
        return _too_many(too_many)
    read = sync_to_async(_read, thread_sensitive=False)
    try:
        first = await read(client.id, job_id)
    except BaseException:
        await slot.release()
        raise
    if first is None:
        await slot.release()
        return JsonResponse(error_body("NOT_FOUND", "Not found."), status=404)
    last_sent = last_event_id(request.headers.get("Last-Event-ID", ""))

    async def frames():
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + settings.SSE_MAX_S
            sent_id, shown, quiet_since = last_sent, None, loop.time()
            found = first
            while found is not None:
                version, snapshot = found
                if snapshot != shown and (sent_id is None or version > sent_id):
                    yield _frame(version, snapshot)
                    sent_id, quiet_since = version, loop.time()
                shown = snapshot
                if snapshot["status"] in TERMINAL_STATUSES:
                    yield _end(snapshot)
                    return
                if loop.time() - quiet_since >= KEEPALIVE_S:
                    yield ": keep-alive\n\n"  # proxies drop a silent connection
                    quiet_since = loop.time()
                left = deadline - loop.time()
                if left <= 0:
                    return
                await asyncio.sleep(min(settings.SSE_INTERVAL_S, left))
                await slot.renew_if_due()
                found = await read(client.id, job_id)
        finally:  # the terminal frame, SSE_MAX_S, a read that failed, or the client gone (cancelled)
            await slot.release()

    response = StreamingHttpResponse(_Stream(frames()), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
