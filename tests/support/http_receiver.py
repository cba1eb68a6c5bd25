"""Small local servers for webhook-sending tests, all on loopback, each on a free port.

    with Receiver(status=302, headers={"Location": "http://..."}) as receiver:
        ...  # POST to receiver.url
        receiver.requests[0].headers["host"]

- `Receiver`: a threaded HTTP server that records every request (method, target, lower-cased headers,
  body) and answers with a fixed status, headers and body (optionally over TLS with a given context).
- `Listener`: a listening socket that never accepts and never answers. The kernel still completes TCP
  handshakes into its backlog, so `connections()` tells whether anything connected at all (a test proves
  "no connection was attempted") and a client that sends to it waits for an answer forever (read timeout).
- `Trickler`: accepts, then sends a valid response one byte at a time with a pause between bytes, so no
  single read ever times out (a slow-loris receiver).
"""

from __future__ import annotations

import socket
import ssl
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]  # lower-case names
    body: bytes


class Receiver:
    def __init__(
        self,
        status: int = 200,
        headers: dict[str, str] | None = None,
        body: bytes = b"ok",
        *,
        ssl_context: ssl.SSLContext | None = None,
        host: str = "127.0.0.1",
    ):
        self.status, self.headers, self.body = status, dict(headers or {}), body
        self.requests: list[Request] = []
        server_class = _ThreadingHTTPServer6 if ":" in host else ThreadingHTTPServer
        self._server = server_class((host, 0), _handler(self))
        self._server.daemon_threads = True
        self._server.block_on_close = False
        if ssl_context is not None:
            self._server.socket = ssl_context.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"{'https' if ssl_context else 'http'}://{shown}:{self.port}/"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> "Receiver":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


class _ThreadingHTTPServer6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def _handler(receiver: Receiver):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # keep test output quiet
            pass

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            receiver.requests.append(
                Request(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
            self.send_response(receiver.status)
            for name, value in receiver.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(receiver.body)))
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                self.wfile.write(receiver.body)
            except OSError:  # the client stopped reading (a body cut at max_body)
                pass

        do_GET = do_PUT = do_POST

    return Handler


class Listener:
    def __init__(self, host: str = "127.0.0.1", family: int = socket.AF_INET):
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]

    def connections(self) -> int:
        """How many connections reached the backlog (accepting them now, without blocking)."""
        count = 0
        self.sock.setblocking(False)
        try:
            while True:
                conn, _ = self.sock.accept()
                conn.close()
                count += 1
        except BlockingIOError:
            return count
        finally:
            self.sock.setblocking(True)

    def __enter__(self) -> "Listener":
        return self

    def __exit__(self, *exc) -> None:
        self.sock.close()


class Trickler:
    RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Padding: " + b"x" * 200 + b"\r\n\r\nok"

    def __init__(self, pause: float = 0.1):
        self.pause = pause
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        self.sock.settimeout(0.05)
        while True:
            try:
                conn, _ = self.sock.accept()
                break
            except TimeoutError:
                if self._stop.is_set():
                    return
            except OSError:
                return
        with conn:
            for byte in self.RESPONSE:
                if self._stop.wait(self.pause):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    def __enter__(self) -> "Trickler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()
