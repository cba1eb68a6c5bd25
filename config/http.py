"""The `web` process's HTTP protocol: uvicorn's httptools protocol, bounded before a request exists.

uvicorn's httptools protocol puts no bound on what comes before a request: httptools' parser joins each
header's name and value with `+=` as their pieces arrive (httptools/parser/parser.pyx, _on_header_value),
uvicorn joins the request line's URL the same way (HttpToolsProtocol.on_url), and llhttp itself has no
header size limit (Node enforces its 16 KiB outside llhttp). So a single 256 MiB header was read whole
(`401` after 92.9 s, the worker 108 -> 633 MB), and nothing timed a connection out before its request:
3,000 connections sending one header line every 5 s, or none at all, were held for ever, each an fd.

This subclass (the Procfile's `--http config.http:BoundedHttpToolsProtocol`) bounds, per connection:

1. size: the bytes of a request line and header block are counted as they are handed to the parser, which
   is fed at most what is left of WEB_MAX_HEADER_BYTES (16 KiB, h11's default); one byte more is
   `431 HEADERS_TOO_LARGE` at once. Nothing past the limit reaches the parser, so memory stays bounded.
2. time: a header block must be complete within WEB_HEADER_TIMEOUT_S of its first byte, or the
   connection is closed. Before that first byte, a connection is idle: closed after uvicorn's
   `--timeout-keep-alive` (5 s), a fresh connection that never sends a request included (uvicorn arms that
   timer only after a response).
3. count: at most WEB_MAX_CONNECTIONS connections per process (and never more than its fd limit leaves
   room for). One more closes the connection that has waited longest for its request's headers (idle or
   slow), so a flood of slow connections cannot keep a client that sends a request at once from being
   served; when every connection has a request in progress, the new one is closed at once.

None of it applies once a request's headers are complete: a response in progress (an event stream that
lasts minutes) is bounded by the application (config.limits bounds bodies, SSE_MAX_S streams).

The count starts again with each request of a keep-alive connection. A request pipelined behind another
in the same read (after the first one's body) reaches the parser with that read uncounted: at most one
read of the socket (256 KiB with uvloop) more than the limit. This class overrides uvicorn's
data_received and hooks its parser callbacks and on_response_complete, uvicorn's own API rather than a
public one: requirements.txt pins uvicorn, and tests/config/test_http_bounds.py fails if an upgrade
changes what they do.
"""

from __future__ import annotations

import json
import logging
import resource

import httptools
from django.conf import settings
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

logger = logging.getLogger("uvicorn.error")

# fds a web process needs besides its clients' connections: the listening socket, PostgreSQL and Redis
# connections, the event loop's own, log files, a temporary file.
RESERVED_FDS = 64
# After a 431 the rest of the header is read and dropped for this long before the socket is closed:
# closing with unread data would reset the connection, and the client could lose the 431 it was sent.
LINGER_S = 2.0

_max_connections: int | None = None
# This process's connections waiting for a request's headers (idle, or headers still arriving), oldest
# first (a dict keeps insertion order): the first one is closed when a new connection needs its place.
_waiting: dict[BoundedHttpToolsProtocol, None] = {}


def max_connections() -> int:
    """WEB_MAX_CONNECTIONS, lowered to what the fd limit leaves room for (raised to its hard limit first):
    past the limit, accept() fails and a waiting client could not even connect."""
    global _max_connections
    if _max_connections is None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
                soft = hard
            except (ValueError, OSError):
                pass
        room = soft - RESERVED_FDS if soft != resource.RLIM_INFINITY else settings.WEB_MAX_CONNECTIONS
        _max_connections = max(1, min(settings.WEB_MAX_CONNECTIONS, room))
        if _max_connections < settings.WEB_MAX_CONNECTIONS:
            logger.warning("WEB_MAX_CONNECTIONS=%d lowered to %d: the fd limit (ulimit -n) is %d",
                           settings.WEB_MAX_CONNECTIONS, _max_connections, soft)
    return _max_connections


def _error_response(status: int, code: str, message: str) -> bytes:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    return b"".join([STATUS_LINE[status], b"content-type: application/json\r\n",
                     b"content-length: ", str(len(body)).encode(), b"\r\n", b"connection: close\r\n\r\n", body])


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.max_header_bytes = settings.WEB_MAX_HEADER_BYTES
        self.header_timeout = settings.WEB_HEADER_TIMEOUT_S
        self.header_bytes = 0  # of the header block being read
        self.in_headers = True  # between requests, or a request line and headers arriving
        self.header_timer = None
        self.refused = False  # a 431 was sent: what follows is dropped

    # -- a connection's life -----------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > max_connections():
            victim = next((other for other in _waiting if other is not self), None)
            if victim is None:  # every other connection has a request in progress: this one waits its turn
                transport.abort()
                return
            del _waiting[victim]  # (its connection_lost, a moment later, takes it out of `connections`)
            victim.transport.abort()
        _waiting[self] = None
        # Idle until its first byte: closed like an idle keep-alive connection.
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc) -> None:
        _waiting.pop(self, None)
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _cancel_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _header_timeout(self) -> None:
        self.header_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            # A client that pipelines its next request during a long response (an event stream): the
            # response is not cut; the next request's headers get their time once it has ended.
            self.header_timer = self.loop.call_later(self.header_timeout, self._header_timeout)
        elif not self.transport.is_closing():
            self.transport.close()

    # -- reading -----------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        self._unset_keepalive_if_required()
        try:
            while data:
                if not self.in_headers:  # a body, bounded by the application (config.limits)
                    self.parser.feed_data(data)
                    return
                if self.header_timer is None:  # the header block's first byte: its clock starts
                    self.header_timer = self.loop.call_later(self.header_timeout, self._header_timeout)
                # No more than the block may still hold: past the limit, nothing reaches the parser.
                room = self.max_header_bytes - self.header_bytes
                part, data = data[:room], data[room:]
                self.header_bytes += len(part)
                self.parser.feed_data(part)
                if self.in_headers and self.header_bytes >= self.max_header_bytes:
                    self._refuse_headers()
                    return
        except httptools.HttpParserError:
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    def _refuse_headers(self) -> None:
        self.refused = True
        self._cancel_header_timer()
        self.transport.write(_error_response(
            431, "HEADERS_TOO_LARGE",
            f"The request line and headers exceed {self.max_header_bytes} bytes (WEB_MAX_HEADER_BYTES)."))
        # Answer, then read and drop the rest for a moment before closing (see LINGER_S).
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)

    # -- parser callbacks ----------------------------------------------------------------------------

    def on_headers_complete(self) -> None:
        self.in_headers = False
        self._cancel_header_timer()
        _waiting.pop(self, None)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # The next bytes are the next request's: its header block starts from nothing.
        self.in_headers = True
        self.header_bytes = 0

    def on_response_complete(self) -> None:
        idle = not self.pipeline  # else super() starts the next request, whose headers are complete
        super().on_response_complete()
        if idle and not self.transport.is_closing():
            _waiting[self] = None  # idle again (keep-alive), oldest-waiting from now
