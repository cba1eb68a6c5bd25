"""One request through the web process's ASGI application (config.asgi: the request id, the version header,
the probes, the request's time, the body limit, static files and Django), in the test process, without a
server: for what needs the whole stack but no socket."""

from __future__ import annotations

import asyncio


def serve(method: str, path: str, headers=(), body: bytes = b"") -> tuple[int, list[tuple[str, str]]]:
    """(status, headers lower-cased) of one request, served on an event loop of its own. The request's
    observation (config.requestmetrics) is written by the application's own thread, shortly after."""
    from config.asgi import application  # at call time: importing it builds the web threads

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"host", b"localhost"), *headers], "client": ("127.0.0.1", 40000),
             "server": ("127.0.0.1", 8000)}
    received, sent = [], []

    async def receive():
        if not received:
            received.append(True)
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays until the answer is out

    async def send(message):
        sent.append(message)

    asyncio.run(application(scope, receive, send))
    start = next(message for message in sent if message["type"] == "http.response.start")
    return start["status"], [(name.decode().lower(), value.decode("latin-1")) for name, value in start["headers"]]
