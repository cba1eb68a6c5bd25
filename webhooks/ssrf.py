"""The SSRF guard: vet a client's webhook URL, then POST to exactly the address that was vetted.

A webhook URL is chosen by a client, and the webhooks worker sits inside our network. Without a guard a
client could make us send requests (with our signature on them) to the cloud metadata service
(169.254.169.254), to Redis or PostgreSQL on loopback, or to anything else reachable only from inside.
Every rule here closes one way of doing that:

- **Scheme**: only `http` and `https`. Other schemes (`file:`, `gopher:`, `ftp:` ...) talk to things
  that are not webhook receivers.
- **No `user:password@`**: credentials in a URL leak into logs and admin pages, and the `@` is the
  classic trick for making a URL look like it goes to one host while it goes to another
  (`http://hooks.example.com@10.0.0.1/`).
- **Port 1..65535**: port 0 and out-of-range ports are not something a receiver listens on; parsers
  disagree about them.
- **Every address, after resolution**: the host is resolved once and EVERY A and AAAA record is
  checked. If ANY of them is loopback, private, link-local, CGNAT, unique-local, multicast,
  unspecified, reserved or broadcast, the URL is refused: a name with one public and one private
  record would otherwise reach the private one whenever the public one does not answer.
  IPv4-mapped IPv6 (`::ffff:127.0.0.1`), NAT64 (`64:ff9b::/96`) and 6to4 (`2002::/16`) addresses are
  judged by the IPv4 address they embed. IP literals are checked the same way, including the legacy
  forms every resolver still accepts (`2130706433`, `0x7f.1`, `0177.0.0.1`, `127.1`).
- **DNS rebinding**: a name can resolve to a public address when we check it and to 127.0.0.1 a
  second later when the HTTP client resolves it again. So `post` resolves once, vets those
  addresses, and connects to the vetted address itself (no second resolution anywhere, not even in
  urllib3). The request still carries `Host:` the original name, and for https the TLS SNI and the
  certificate check use the original name too, so a real receiver sees an ordinary request.
- **No redirects**: a public receiver could answer `302 Location: http://169.254.169.254/` and a
  client that follows redirects would go there without any check. A 3xx is returned as the answer.
- **Response size**: at most `max_body` bytes (64 kB) of the response are read; the rest is dropped
  with the connection, so a receiver cannot fill our memory. The body is read raw, never
  decompressed (no decompression bombs).
- **Timeouts**: 5 s to connect, and the whole exchange after connecting (sending, the status line and
  headers, the body) must finish within the read timeout (15 s). A per-read timeout alone does not
  stop a slow-loris receiver that sends one byte every few seconds; a watchdog cuts the socket when
  the deadline passes.

`settings.WEBHOOK_ALLOW_PRIVATE` (or `allow_private=True`) lifts ONLY the address-range check, so that
development and tests can deliver to receivers on loopback. It never lifts the scheme, userinfo, port
or syntax checks, and the address is still resolved once and pinned.

API: `check_url(url)` raises `Refused` (used at job submit, answered 422); `post(url, body, headers)`
vets like `check_url`, sends, and returns an `Answer` whatever the HTTP status, or raises `Refused`
(not sent) or `SendError` (sent or tried, and the transport failed).
"""

from __future__ import annotations

import http.client
import ipaddress
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit

import urllib3.connection
import urllib3.exceptions
from urllib3.util.ssl_match_hostname import CertificateError
from urllib3.util.timeout import Timeout

try:  # the same trust store requests uses; None means the system's default store
    import certifi

    CA_CERTS: str | None = certifi.where()
except ImportError:  # pragma: no cover
    CA_CERTS = None

# The stable reason codes of Refused.
REASONS = ("syntax", "scheme", "no_host", "userinfo", "port", "resolve_failed", "private_address")

MAX_BODY = 65536
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 15.0


class Refused(Exception):
    """The target may not be contacted. `reason` is one of REASONS (a stable code); `detail` and str()
    say why in words (without repeating the code)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(detail or reason)
        self.reason = reason
        self.detail = detail


class SendError(Exception):
    """The target was vetted, but connecting, sending or reading failed (timeout, refused, TLS, protocol)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Answer:
    """What the receiver answered, whatever the status. Header names are lower-case (repeats joined by
    ", "); `body` is at most max_body bytes, raw (not decompressed)."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    elapsed_ms: int = 0


# --- addresses -----------------------------------------------------------------------------------

_V4_FORBIDDEN = tuple(
    ipaddress.IPv4Network(net)
    for net in (
        "0.0.0.0/8",  # "this network", 0.0.0.0 unspecified
        "10.0.0.0/8",  # private
        "100.64.0.0/10",  # carrier-grade NAT
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link-local, cloud metadata
        "172.16.0.0/12",  # private
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",  # documentation
        "192.88.99.0/24",  # 6to4 relay anycast
        "192.168.0.0/16",  # private
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # documentation
        "203.0.113.0/24",  # documentation
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, 255.255.255.255 broadcast
    )
)
_V6_FORBIDDEN = tuple(
    ipaddress.IPv6Network(net)
    for net in (
        "::/96",  # unspecified, loopback, deprecated IPv4-compatible (::a.b.c.d)
        "64:ff9b:1::/48",  # local-use NAT64
        "100::/64",  # discard
        "2001::/23",  # IETF protocol assignments (Teredo, ...)
        "2001:db8::/32",  # documentation
        "fc00::/7",  # unique-local
        "fe80::/10",  # link-local
        "fec0::/10",  # deprecated site-local
        "ff00::/8",  # multicast
    )
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def forbidden(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """True if `ip` is not an ordinary public unicast address (the address-range check)."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:
            return True  # only link-local addresses carry a zone
        if ip.ipv4_mapped is not None:  # ::ffff:a.b.c.d is a.b.c.d on a dual-stack socket
            return forbidden(ip.ipv4_mapped)
        if ip in _NAT64:  # 64:ff9b::a.b.c.d is a.b.c.d through the NAT64 gateway
            return forbidden(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        if ip.sixtofour is not None:  # 2002:aabb:ccdd:: is a.b.c.d through 6to4
            return forbidden(ip.sixtofour)
        if any(ip in net for net in _V6_FORBIDDEN):
            return True
        return not ip.is_global or ip.is_multicast or ip.is_site_local or ip.is_reserved or ip.is_private
    if any(ip in net for net in _V4_FORBIDDEN):
        return True
    return (
        not ip.is_global
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_unspecified
    )


_V4_PART = re.compile(r"0[xX][0-9a-fA-F]*|0[0-7]*|[1-9][0-9]*")


def parse_ipv4_literal(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address `host` denotes in inet_aton's forms (`127.0.0.1`, `127.1`, `2130706433`,
    `0x7f.1`, `0177.0.0.1`), or None if it is not an IPv4 literal. Resolvers accept these forms, so they
    are checked as the address they are, without asking DNS."""
    if host.endswith("."):
        host = host[:-1]
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or not all(_V4_PART.fullmatch(p) for p in parts):
        return None
    values = []
    for p in parts:
        if p[:2] in ("0x", "0X"):
            values.append(int(p[2:] or "0", 16))
        elif len(p) > 1 and p[0] == "0":
            values.append(int(p, 8))
        else:
            values.append(int(p))
    *head, last = values
    if any(v > 255 for v in head) or last >= 1 << (8 * (4 - len(head))):
        return None
    number = last
    for i, v in enumerate(head):
        number |= v << (8 * (3 - i))
    return ipaddress.IPv4Address(number)


# --- vetting -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Address:
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    family: int
    sockaddr: tuple


@dataclass(frozen=True)
class _Target:
    scheme: str
    host: str  # ASCII (IDNA) host name or IP literal without brackets: Host header, SNI, certificate
    port: int
    request_target: str  # path and query to send
    addresses: tuple[_Address, ...]  # vetted, in resolver order


_HOST_CHARS = re.compile(r"[a-z0-9_.-]+")


def _allow_private(allow_private: bool | None) -> bool:
    if allow_private is not None:
        return allow_private
    from django.conf import settings

    return bool(getattr(settings, "WEBHOOK_ALLOW_PRIVATE", False))


def _literal_address(ip, port: int) -> _Address:
    if isinstance(ip, ipaddress.IPv4Address):
        return _Address(ip, socket.AF_INET, (str(ip), port))
    scope = 0
    if ip.scope_id:
        try:
            scope = int(ip.scope_id) if ip.scope_id.isdigit() else socket.if_nametoindex(ip.scope_id)
        except OSError:
            raise Refused("syntax", f"unknown IPv6 zone {ip.scope_id!r}") from None
    return _Address(ip, socket.AF_INET6, (str(ip).split("%")[0], port, 0, scope))


def _resolve(host: str, port: int) -> tuple[_Address, ...]:
    """Every A and AAAA record of `host`, in the resolver's order, duplicates dropped. One call."""
    try:
        infos = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise Refused("resolve_failed", f"{host} does not resolve: {exc}") from None
    found: dict = {}
    for family, _type, _proto, _canon, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        try:
            ip = ipaddress.ip_address(sockaddr[0])
        except ValueError:
            raise Refused("resolve_failed", f"{host} resolves to {sockaddr[0]!r}, not an address") from None
        found.setdefault((family, sockaddr), _Address(ip, family, (sockaddr[0], port, *sockaddr[2:])))
    if not found:
        raise Refused("resolve_failed", f"{host} has no A or AAAA record")
    return tuple(found.values())


def _vet(url: str, allow_private: bool | None, vetted: tuple | None = None) -> _Target:
    """Check `url` and resolve its host once. `vetted`: the addresses of this host and port, vetted
    earlier in the same session (the syntax is still checked; nothing is resolved again)."""
    if not isinstance(url, str) or not url:
        raise Refused("syntax", "the URL is empty or not a string")
    if any(c <= " " or c == "\x7f" for c in url):
        raise Refused("syntax", "the URL contains whitespace or control characters")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise Refused("syntax", str(exc)) from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise Refused("scheme", f"only http and https are allowed, not {parts.scheme or 'no scheme'!r}")
    if "@" in parts.netloc:
        raise Refused("userinfo", "user names and passwords in the URL are not allowed")
    hostname = parts.hostname
    if not hostname:
        raise Refused("no_host", "the URL has no host")
    try:
        port = parts.port
    except ValueError as exc:
        raise Refused("port", str(exc)) from None
    if port is None:
        port = 443 if scheme == "https" else 80
    if not 1 <= port <= 65535:
        raise Refused("port", f"port {port} is out of range 1..65535")

    literal: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    if parts.netloc.startswith("["):
        try:
            literal = ipaddress.IPv6Address(hostname)
        except ValueError:
            raise Refused("syntax", f"{hostname!r} is not an IPv6 address") from None
        host = hostname.split("%")[0]
    else:
        try:
            host = hostname.encode("idna").decode("ascii").lower()
        except UnicodeError:
            raise Refused("syntax", f"{hostname!r} is not a valid host name") from None
        if not _HOST_CHARS.fullmatch(host) or host.strip(".") == "":
            raise Refused("syntax", f"{hostname!r} is not a valid host name")
        literal = parse_ipv4_literal(host)

    if vetted is not None:
        addresses: tuple[_Address, ...] = vetted
    elif literal is not None:
        addresses = (_literal_address(literal, port),)
    else:
        addresses = _resolve(host, port)

    if not _allow_private(allow_private):
        for address in addresses:
            if forbidden(address.ip):
                shown = host if literal is None else "the URL"
                raise Refused("private_address", f"{shown} points at {address.ip}, which is not a public address")

    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    target = "".join(c if ord(c) < 128 else quote(c) for c in target)
    return _Target(scheme, host, port, target, addresses)


def check_url(url: str, *, allow_private: bool | None = None) -> None:
    """Raise Refused if `url` may not be used as a webhook target; resolves its host once.

    allow_private None means settings.WEBHOOK_ALLOW_PRIVATE; it lifts only the address-range check."""
    _vet(url, allow_private)


# --- sending -------------------------------------------------------------------------------------


class _PinnedMixin:
    """A urllib3 connection that connects to one given socket address instead of resolving `host`.

    `host` stays the original name, so http.client writes it into `Host:` and urllib3 uses it for SNI
    and certificate verification."""

    pinned: _Address

    def _new_conn(self) -> socket.socket:
        sock = socket.socket(self.pinned.family, socket.SOCK_STREAM)
        try:
            for option in self.socket_options or ():
                sock.setsockopt(*option)
            sock.settimeout(self.timeout)
            sock.connect(self.pinned.sockaddr)
        except TimeoutError as exc:
            sock.close()
            raise urllib3.exceptions.ConnectTimeoutError(
                self, f"connecting to {self.pinned.ip} timed out (connect timeout={self.timeout})"
            ) from exc
        except OSError as exc:
            sock.close()
            raise urllib3.exceptions.NewConnectionError(self, f"connecting to {self.pinned.ip} failed: {exc}") from exc
        return sock


class _PinnedHTTPConnection(_PinnedMixin, urllib3.connection.HTTPConnection):
    pass


class _PinnedHTTPSConnection(_PinnedMixin, urllib3.connection.HTTPSConnection):
    pass


def _connect(target: _Target, connect_timeout: float):
    """Connect to the first vetted address that accepts (TCP); TLS failures are final."""
    errors = []
    for address in target.addresses:
        if target.scheme == "https":
            conn = _PinnedHTTPSConnection(
                target.host,
                target.port,
                timeout=connect_timeout,
                server_hostname=target.host,
                assert_hostname=target.host,
                cert_reqs="CERT_REQUIRED",
                ca_certs=CA_CERTS,
            )
        else:
            conn = _PinnedHTTPConnection(target.host, target.port, timeout=connect_timeout)
        conn.pinned = address
        try:
            conn.connect()
        except (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError) as exc:
            conn.close()
            errors.append(str(exc.args[-1] if exc.args else exc))
            continue
        except (OSError, CertificateError, urllib3.exceptions.HTTPError, http.client.HTTPException) as exc:
            conn.close()
            raise SendError(f"TLS with {target.host} at {address.ip} failed: {exc}") from exc
        return conn
    raise SendError("; ".join(errors) or "no address to connect to")


def post(
    url: str,
    body: bytes,
    headers: dict[str, str],
    *,
    allow_private: bool | None = None,
    connect_timeout: float = CONNECT_TIMEOUT,
    read_timeout: float = READ_TIMEOUT,
    max_body: int = MAX_BODY,
) -> Answer:
    """Vet `url` as check_url does, then POST `body` with `headers` to the vetted address.

    Raises Refused (nothing was sent) or SendError (transport failure). Never raises for an HTTP status
    and follows no redirect. `Host:` always names the URL's host (a caller's Host header is ignored).
    The whole exchange after connecting must finish within read_timeout seconds."""
    with Session(allow_private=allow_private, connect_timeout=connect_timeout, read_timeout=read_timeout,
                 max_body=max_body) as session:
        return session.post(url, body, headers)


class Session:
    """Several POSTs (a batch of deliveries) under the same rules as `post`, reusing one kept-alive
    connection per origin. A URL is vetted (resolved once, checked, pinned) the first time its origin
    is seen in the session; the connection goes to that vetted address and is dropped after any error,
    a `Connection: close`, or a response body larger than `max_body`. Close the session when done."""

    def __init__(self, *, allow_private: bool | None = None, connect_timeout: float = CONNECT_TIMEOUT,
                 read_timeout: float = READ_TIMEOUT, max_body: int = MAX_BODY):
        self.allow_private = allow_private
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_body = max_body
        self._targets: dict[tuple, _Target] = {}
        self._conns: dict[tuple, object] = {}

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    def post(self, url: str, body: bytes, headers: dict[str, str]) -> Answer:
        try:
            parts = urlsplit(url)
        except ValueError:
            _vet(url, self.allow_private)  # refuses it, with the reason
            raise
        origin = (parts.scheme.lower(), parts.netloc.lower())
        known = self._targets.get(origin)
        target = _vet(url, self.allow_private, vetted=known.addresses if known else None)
        self._targets.setdefault(origin, target)
        started = time.monotonic()
        conn = self._conns.pop(origin, None) or _connect(target, self.connect_timeout)
        answer, reusable = _exchange(conn, target, body, headers, self.read_timeout, self.max_body, started)
        if reusable:
            self._conns[origin] = conn
        else:
            conn.close()
        return answer


def _exchange(conn, target: _Target, body: bytes, headers: dict[str, str], read_timeout: float, max_body: int,
              started: float) -> tuple[Answer, bool]:
    """One request and its answer on a connected, pinned connection. Returns the answer and whether the
    connection can carry another request."""
    cut = threading.Event()

    def watchdog() -> None:  # the slow-loris deadline: unblock any read by shutting the socket
        cut.set()
        sock = conn.sock
        if sock is not None:
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(read_timeout, watchdog)
    timer.daemon = True
    timer.start()
    response = None
    reusable = False
    try:
        conn.timeout = Timeout.resolve_default_timeout(read_timeout)  # per read, applied by request()
        send_headers = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length")}
        send_headers["Content-Length"] = str(len(body))
        conn.request(
            "POST", target.request_target, body=body, headers=send_headers, preload_content=False, decode_content=False
        )
        response = conn.getresponse()
        chunks, size = [], 0
        while size < max_body:
            chunk = response.read(min(max_body - size, 16384), decode_content=False)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if cut.is_set():
            raise SendError(f"{target.host} did not finish answering within {read_timeout} s")
        # Reusable only when the answer was read to its end and the receiver keeps the connection.
        reusable = (size < max_body and response.version == 11 and response.length_remaining == 0
                    and "close" not in response.headers.get("connection", "").lower())
        answer = Answer(
            status=response.status,
            headers={name.lower(): value for name, value in response.headers.itermerged()},
            body=b"".join(chunks),
            elapsed_ms=int((time.monotonic() - started) * 1000),
        )
        return answer, reusable
    except (OSError, urllib3.exceptions.HTTPError, http.client.HTTPException) as exc:
        if cut.is_set():
            raise SendError(f"{target.host} did not finish answering within {read_timeout} s") from exc
        raise SendError(f"sending to {target.host} failed: {exc.__class__.__name__}: {exc}") from exc
    finally:
        timer.cancel()
        if response is not None and not reusable:
            response.close()  # drop whatever is left unread, never drain it
