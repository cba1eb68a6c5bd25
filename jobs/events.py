"""GET /v1/jobs/{id}/events: the job's progress as server-sent events (API.md), served by the ASGI `web`
process without a thread per stream.

The stream is an async generator: between reads it sleeps on the event loop, and each read (one
statement: jobs.selectors.job_snapshot) borrows a thread of the executor only for that statement. It
reads the job about every SSE_INTERVAL_S and sends a frame only when the snapshot changed. Frames are
numbered by the snapshot's version (the latest moment anything in it changed), so a client reconnecting
with `Last-Event-ID` is sent nothing it already has. The stream closes after SSE_MAX_S (the client
reconnects); a client that goes away ends it at once (Django cancels the response when the connection
drops).
"""

import asyncio
import json

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import JsonResponse, StreamingHttpResponse
from rest_framework import exceptions

from jobs import selectors
from jobs.auth import BearerAPIKeyAuthentication
from jobs.errors import error_body

KEEPALIVE_S = 15.0


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


async def job_events(request, job_id):
    if request.method != "GET":
        return JsonResponse(error_body("METHOD_NOT_ALLOWED", "Only GET."), status=405)
    client, refused = await sync_to_async(_authenticate, thread_sensitive=False)(request)
    if refused is not None:
        return refused
    read = sync_to_async(_read, thread_sensitive=False)
    first = await read(client.id, job_id)
    if first is None:
        return JsonResponse(error_body("NOT_FOUND", "Not found."), status=404)
    raw_last = request.headers.get("Last-Event-ID", "")
    last_sent = int(raw_last) if raw_last.isascii() and raw_last.isdigit() else None

    async def frames():
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings.SSE_MAX_S
        sent_id, shown, quiet_since = last_sent, None, loop.time()
        found = first
        while found is not None:
            version, snapshot = found
            if snapshot != shown and (sent_id is None or version > sent_id):
                yield f"id: {version}\ndata: {json.dumps(snapshot, separators=(',', ':'))}\n\n"
                sent_id, quiet_since = version, loop.time()
            shown = snapshot
            if loop.time() - quiet_since >= KEEPALIVE_S:
                yield ": keep-alive\n\n"  # proxies drop a silent connection
                quiet_since = loop.time()
            left = deadline - loop.time()
            if left <= 0:
                return
            await asyncio.sleep(min(settings.SSE_INTERVAL_S, left))
            found = await read(client.id, job_id)

    response = StreamingHttpResponse(frames(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
