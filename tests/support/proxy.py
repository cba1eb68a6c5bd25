"""A TCP proxy on loopback between a client library and the `web` process, which spoils the first
`POST /v1/jobs` (or another route) it carries, the way a real network does:

- `lose_answer`: the request goes through and payonce acts on it (the job is made and committed), then
  the proxy reads payonce's whole answer and closes the client's connection without a byte of it: the
  client never hears, as when a load balancer or a mobile network drops a connection mid-answer. An
  answer without a Content-Length (the event stream) counts as whole once its head arrived: spoiling
  `GET /v1/jobs/{id}/events` drops the stream as it opens;
- `answer_503`: the proxy answers the request itself with `503 DATABASE_UNAVAILABLE` and
  `Retry-After: 1`, as payonce does while PostgreSQL restarts, and payonce never sees it.

Every later request passes untouched. It reads HTTP/1.1 only as far as it must: a request starts a
chunk the client sends (a keep-alive connection sends its next request only after the last answer), and
an answer ends after its `Content-Length`. `seen` records when each request to the spoiled route
arrived, so a test can check the library waited as `Retry-After` asked."""

from __future__ import annotations

import socket
import threading
import time
from typing import Self

from tests.support.http_api import content_length

ANSWER_503 = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
)
BODY_503 = b'{"error": {"code": "DATABASE_UNAVAILABLE", "message": "The database is unavailable; try again shortly."}}'


class FlakyProxy:
    FAULTS = ("lose_answer", "answer_503")

    def __init__(self, upstream_port: int, fault: str, *, method: str = "POST", path: str = "/v1/jobs",
                 times: int = 1):
        if fault not in self.FAULTS:
            raise ValueError(f"fault is one of {self.FAULTS}")
        self.upstream = ("127.0.0.1", upstream_port)
        self.fault = fault
        self.request_line = f"{method} {path} ".encode()
        self.times = times  # how many requests to the route are spoiled, the first ones
        self.seen: list[float] = []  # time.monotonic() of each request to the route
        self.spoiled: list[float] = []  # of each one spoiled
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._open: set[socket.socket] = set()
        self._stopped = False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> Self:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopped = True
        self._listener.close()
        with self._lock:
            for sock in list(self._open):
                _close(sock)

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _spoil_this(self, chunk: bytes) -> bool:
        """Whether the request this chunk starts is one to spoil (counted under the lock: two connections
        sending at once spoil `times` requests between them, not each)."""
        if not chunk.startswith(self.request_line):
            return False
        with self._lock:
            self.seen.append(time.monotonic())
            if len(self.spoiled) < self.times:
                self.spoiled.append(time.monotonic())
                return True
        return False

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=30)
        except OSError:
            _close(client)
            return
        with self._lock:
            self._open.update((client, upstream))
        swallow = threading.Event()  # set: the next answer upstream sends is read and dropped
        threading.Thread(target=self._answers, args=(upstream, client, swallow), daemon=True).start()
        try:
            while True:
                chunk = client.recv(65536)
                if not chunk:
                    break
                if self._spoil_this(chunk):
                    if self.fault == "answer_503":
                        _read_request(client, chunk)
                        client.sendall(ANSWER_503 % (len(BODY_503), BODY_503))
                        break
                    swallow.set()
                upstream.sendall(chunk)
        except OSError:
            pass
        finally:
            if not swallow.is_set():  # a swallowed answer closes both sides itself, once it has been read
                _close(client)
                _close(upstream)

    def _answers(self, upstream: socket.socket, client: socket.socket, swallow: threading.Event) -> None:
        received = b""
        try:
            while True:
                chunk = upstream.recv(65536)
                if not chunk:
                    break
                if swallow.is_set():
                    received += chunk
                    if _answer_complete(received):
                        break  # payonce answered; the client hears nothing of it
                    continue
                client.sendall(chunk)
        except OSError:
            pass
        finally:
            _close(client)
            _close(upstream)


def _read_request(sock: socket.socket, received: bytes) -> bytes:
    """The rest of a request whose first chunk is `received`: its head, then its Content-Length."""
    while b"\r\n\r\n" not in received:
        more = sock.recv(65536)
        if not more:
            return received
        received += more
    head, _, body = received.partition(b"\r\n\r\n")
    length = content_length(head) or 0
    while len(body) < length:
        more = sock.recv(65536)
        if not more:
            break
        body += more
    return received


def _answer_complete(received: bytes) -> bool:
    head, sep, body = received.partition(b"\r\n\r\n")
    return bool(sep) and len(body) >= (content_length(head) or 0)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
