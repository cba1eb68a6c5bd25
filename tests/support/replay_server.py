"""A local HTTP server that stands in for a real provider in adapter tests: it replays a scripted sequence
of recorded responses (status, headers, body) per route and records every request it received.

    server = ReplayServer().start()
    server.script("POST", "/v1/messages", "anthropic/error_529_overloaded", "anthropic/message")
    ...  # point an adapter at server.url
    server.requests[0].json["model"]

A response is a fixture name (`<package>/<stem>`: executor/providers/<package>/fixtures/<stem>.json), a `{"status", "headers", "body"}`
dict, `DROP` (read the request, then close the connection without a word: the request arrived, the answer
was lost), or `Delayed(seconds, response)`. Each request on a route takes the next response; a request with
nothing scripted for it answers 599 and is listed in `unexpected`, so a test sees it.
"""

import json
import socket
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from requests.structures import CaseInsensitiveDict

from executor.providers.replay import fixture

DROP = "drop-connection"


@dataclass
class Delayed:
    seconds: float
    response: object


@dataclass
class Recorded:
    method: str
    path: str  # without the query
    query: str
    headers: CaseInsensitiveDict
    body: bytes
    json: object = field(default=None)


class ReplayServer:
    def __init__(self):
        self._routes: dict[tuple[str, str], deque] = {}
        self._lock = threading.Lock()
        self.requests: list[Recorded] = []
        self.unexpected: list[str] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> "ReplayServer":
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))  # port 0: a free one
        server.daemon_threads = True
        server.block_on_close = False
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- script ----------------------------------------------------------------------------------------

    def script(self, method: str, path: str, *responses) -> None:
        """Queue responses for `method path` (path without query), answered in order."""
        with self._lock:
            self._routes.setdefault((method.upper(), path), deque()).extend(responses)

    def received(self, method: str | None = None, path: str | None = None) -> list[Recorded]:
        return [r for r in self.requests if (method is None or r.method == method) and (path is None or r.path == path)]

    def _next(self, method: str, path: str):
        with self._lock:
            queue = self._routes.get((method, path))
            if queue:
                return queue.popleft()
            self.unexpected.append(f"{method} {path}")
            return {"status": 599, "headers": {"content-type": "text/plain"},
                    "body": f"replay server: nothing scripted for {method} {path}"}

    def _record(self, recorded: Recorded) -> None:
        with self._lock:
            self.requests.append(recorded)


def _resolve(response) -> dict:
    if isinstance(response, str):
        return fixture(response)
    return response


def _handler(owner: ReplayServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # one request per connection: a dropped one never poisons the next

        def log_message(self, format, *args):  # quiet test output
            pass

        def _serve(self):
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            try:
                parsed = json.loads(body) if body and "json" in (self.headers.get("Content-Type") or "") else None
            except ValueError:
                parsed = None
            owner._record(Recorded(self.command, parts.path, parts.query,
                                   CaseInsensitiveDict(dict(self.headers.items())), body, parsed))
            response = owner._next(self.command, parts.path)
            if isinstance(response, Delayed):
                threading.Event().wait(response.seconds)
                response = response.response
            if response == DROP:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)  # no status line, no headers: the answer is lost
                return
            response = _resolve(response)
            payload = response.get("body")
            if isinstance(payload, (bytes, bytearray)):
                data = bytes(payload)
            elif isinstance(payload, str):
                data = payload.encode()
            else:
                data = json.dumps(payload).encode()
            try:
                self.send_response(response["status"])
                for name, value in (response.get("headers") or {}).items():
                    if name.lower() != "content-length":
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up first (a timeout test)

        do_GET = do_POST = do_PUT = do_DELETE = _serve

    return Handler
