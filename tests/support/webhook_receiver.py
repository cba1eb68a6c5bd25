"""A webhook receiver on loopback, as a client would run one: it records every request, verifies it with
the standardwebhooks library, and answers from a script (status codes, delays, headers)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


@dataclass
class Received:
    webhook_id: str
    timestamp: str
    signature: str
    body: bytes
    headers: dict
    arrived: float
    verified: bool
    overlapped: bool  # another request with the same webhook-id was in flight at the same moment
    peer: tuple = ()  # the client's address: one per TCP connection
    path: str = ""
    status: int = 0  # what the receiver answered


@dataclass
class Answer:
    status: int = 200
    delay_s: float = 0.0
    headers: dict = field(default_factory=dict)
    body: bytes = b'{"ok": true}'


class WebhookReceiver:
    """`answers` is consumed in order, one per request; `default` answers the rest. `on_request(received)`
    runs before the answer is written (a test can crash a dispatcher there)."""

    def __init__(self, secret: str | None = None, *, default: Answer | None = None, hold_s: float = 0.0,
                 host: str = "127.0.0.1"):
        self.secrets = [secret] if secret else []
        self.default = default or Answer()
        self.answers: list[Answer] = []
        self.requests: list[Received] = []
        self.hold_s = hold_s  # keep each request in flight a little, so overlapping sends would show
        self.on_request = None
        self._lock = threading.Lock()
        self._in_flight: dict[str, int] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                expected = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(expected)
                if len(body) < expected:
                    # The sender went away mid-body (a webhooks worker killed while sending): like any
                    # HTTP server, take no request from it; the sender never got an answer and tries again.
                    self.close_connection = True
                    return
                headers = {key.lower(): value for key, value in self.headers.items()}
                receiver._handle(self, body, headers, self.client_address, self.path)

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.server.request_queue_size = 256
        self.url = f"http://{host}:{self.server.server_address[1]}/hooks"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "WebhookReceiver":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def verify(self, body: bytes, headers: dict, secret: str | None = None) -> bool:
        for candidate in ([secret] if secret else self.secrets):
            try:
                Webhook(candidate).verify(body, headers)
                return True
            except WebhookVerificationError:
                continue
        return False

    def _handle(self, handler, body: bytes, headers: dict, peer: tuple = (), path: str = "") -> None:
        webhook_id = headers.get("webhook-id", "")
        with self._lock:
            overlapped = self._in_flight.get(webhook_id, 0) > 0
            self._in_flight[webhook_id] = self._in_flight.get(webhook_id, 0) + 1
            answer = self.answers.pop(0) if self.answers else self.default
        try:
            received = Received(webhook_id, headers.get("webhook-timestamp", ""), headers.get("webhook-signature", ""),
                                body, headers, time.time(), self.verify(body, headers), overlapped, peer, path,
                                answer.status)
            with self._lock:
                self.requests.append(received)
            if self.on_request is not None:
                self.on_request(received)
            time.sleep(max(self.hold_s, answer.delay_s))
            handler.send_response(answer.status)
            for key, value in answer.headers.items():
                handler.send_header(key, value)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(answer.body)))
            handler.end_headers()
            handler.wfile.write(answer.body)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with self._lock:
                self._in_flight[webhook_id] -= 1

    def for_id(self, webhook_id: str) -> list[Received]:
        with self._lock:
            return [r for r in self.requests if r.webhook_id == webhook_id]

    def wait_for(self, predicate, timeout: float = 20.0, message: str = "the receiver's condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.05)
        raise AssertionError(f"{message} not met within {timeout}s; received {len(self.requests)} requests")
