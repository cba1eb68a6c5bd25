"""`X-Request-Id` on every answer of the web process (docs/api.md): the caller's own when it sent a valid
one, else a new one (32 hex digits). The outermost ASGI layer (config.asgi), so that the probes, static
files and a body refused before Django carry it too.

The request is served inside `log_context(request_id=...)` (config.logs), so every line logged while
serving it, on the event loop or on Django's thread (asgiref copies the context there), carries
`request_id`; `current()` names it to code that runs for the request (its trace's span).

A caller's value is echoed only if it is 1 to 128 characters of `A-Z a-z 0-9 . _ : / + = -`: anything else
(longer, a space, CR or LF, a byte outside ASCII) is replaced by a new id, never echoed nor logged, so no
header or log line can be injected through it.
"""

import re
import uuid

from config.logs import context_value, log_context

HEADER = b"x-request-id"  # ASGI servers hand header names over lower-cased
_VALID = re.compile(rb"[A-Za-z0-9._:/+=-]{1,128}")


SCOPE_KEY = "payonce.request_id"


def current() -> str | None:
    """The id of the request being served (in the web process, inside the request), else None."""
    return context_value("request_id")


def request_id_of(scope) -> str:
    """The caller's X-Request-Id (its first) if valid, else a new one."""
    for name, value in scope.get("headers", ()):
        if name == HEADER:
            if _VALID.fullmatch(value):
                return value.decode("ascii")
            break
    return uuid.uuid4().hex


class RequestIdMiddleware:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = request_id_of(scope)
        header = (HEADER, request_id.encode("ascii"))

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                headers = [item for item in message.get("headers", ()) if item[0].lower() != HEADER]
                message = {**message, "headers": [*headers, header]}
            await send(message)

        # In the scope too, for what reads the request rather than the log context (its span: config.tracing).
        with log_context(request_id=request_id):
            return await self.app({**scope, SCOPE_KEY: request_id}, receive, send_with_id)
