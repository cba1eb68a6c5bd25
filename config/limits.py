"""The web process's guard on request bodies, in front of Django (ASGI middleware, config.asgi).

Django's ASGI handler reads a whole body before any view runs (to a temporary file past 2.5 MB), and
only then can a view refuse it. Here, for every path:

1. a declared Content-Length over the path's limit is `413 PAYLOAD_TOO_LARGE` at once, before a byte of
   the body is read;
2. a body that streams past the limit (chunked, or longer than declared) is cut at the limit with 413;
3. a body that stops arriving is dropped with `408 REQUEST_TIMEOUT` once REQUEST_BODY_TIMEOUT_S passed;
4. an accepted body is handed to Django from memory (it is at most the limit), so nothing of a refused
   body ever touches the disk, and a client that went away frees everything at once.

Refusals carry `Connection: close`: the server stops reading the rest of the body and drops the socket.
The limit is JOB_BODY_MAX_BYTES for the endpoints that take a job (POST /v1/jobs, /v1/orders) and
REQUEST_BODY_MAX_BYTES (small) for every other path.
"""

import asyncio
import json

from django.conf import settings

LARGE_BODY_PATHS = frozenset({"/v1/jobs", "/v1/orders"})


def body_limit(method: str, path: str) -> int:
    if method == "POST" and path.rstrip("/") in LARGE_BODY_PATHS:
        return settings.JOB_BODY_MAX_BYTES
    return settings.REQUEST_BODY_MAX_BYTES


async def _refuse(send, status: int, code: str, message: str, **extra) -> None:
    body = json.dumps({"error": {"code": code, "message": message, **extra}}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]})
    await send({"type": "http.response.body", "body": body})


def _declared_length(scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            return int(value) if value.isdigit() else None  # the server refuses a malformed one itself
    return None


class BodyLimitMiddleware:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = body_limit(scope.get("method", ""), scope.get("path", ""))
        too_large = f"The request body is larger than {limit} bytes."
        declared = _declared_length(scope)
        if declared is not None and declared > limit:
            return await _refuse(send, 413, "PAYLOAD_TOO_LARGE", too_large, limit_bytes=limit)

        loop = asyncio.get_running_loop()
        deadline = loop.time() + settings.REQUEST_BODY_TIMEOUT_S
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), timeout=max(deadline - loop.time(), 0.001))
            except asyncio.TimeoutError:
                return await _refuse(send, 408, "REQUEST_TIMEOUT",
                                     f"The request body did not arrive within {settings.REQUEST_BODY_TIMEOUT_S:g} s.")
            if message["type"] == "http.disconnect":
                return None  # the client went away: nothing to answer, nothing kept
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return await _refuse(send, 413, "PAYLOAD_TOO_LARGE", too_large, limit_bytes=limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break

        body, handed = b"".join(chunks), False

        async def replay():
            # The body once, as one message; then the server's own messages (a disconnect, which event
            # streams wait for).
            nonlocal handed
            if not handed:
                handed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)
