"""The `web` process as the Procfile starts it bounds what comes before a request (config.http): a header
block over WEB_MAX_HEADER_BYTES is `431` at once with the worker's memory unchanged, a header block that
drips is closed WEB_HEADER_TIMEOUT_S after its first byte, an idle connection after uvicorn's keep-alive
timeout (5 s), and thousands of slow connections leave a plain request its way in; a request with
normal headers, and an event stream that outlives every one of those timeouts, are served as before."""

import json
import resource
import selectors
import socket
import threading
import time

import pytest
import requests

from jobs.services import client_create
from tests.conftest import WEB_STACK_ENV
from tests.support.http_api import HttpApi
from tests.support.procs import ProcfileProcess, free_port

pytestmark = pytest.mark.e2e

HEADER_TIMEOUT_S = 2
MAX_HEADER_BYTES = 16 * 1024  # the default


@pytest.fixture(scope="module", autouse=True)
def many_fds():
    """3,000 sockets of our own: the test process's fd limit up to its hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard != resource.RLIM_INFINITY and hard < 4000:
        pytest.fail(f"the test needs 4,000 fds; the hard limit is {hard}")
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def start_web(django_db_blocker, wrap=None, **env) -> ProcfileProcess:
    with django_db_blocker.unblock():
        web = ProcfileProcess("web", {**WEB_STACK_ENV, "PORT": free_port(), "SSE_MAX_S": 30,
                                      "WEB_HEADER_TIMEOUT_S": HEADER_TIMEOUT_S, **env}, wrap=wrap).start()
    return web


@pytest.fixture(scope="module")
def web(django_db_setup, django_db_blocker):
    process = start_web(django_db_blocker)
    yield process
    process.stop()


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def read_answer(sock: socket.socket) -> tuple[int, dict, bytes]:
    """One whole answer with a Content-Length (status, headers, body)."""
    seen = b""
    while b"\r\n\r\n" not in seen:
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer: {seen!r}"
        seen += chunk
    head, _, body = seen.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        assert chunk, "closed in the middle of an answer"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def is_closed(sock: socket.socket) -> bool:
    """The server closed it (EOF or reset); False while it is open with nothing to read."""
    sock.setblocking(False)
    try:
        return sock.recv(65536, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """How long until the server closed it (reading and dropping what it sends), or None."""
    start = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except socket.timeout:
        return None
    except ConnectionError:
        pass
    return time.monotonic() - start


# -- size ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mib", [32, 256])
def test_a_huge_header_is_431_at_once_and_memory_stays_put(web, mib):
    workers = web.children()
    before = {pid: rss_mb(pid) for pid in workers}
    sock = socket.create_connection(("127.0.0.1", web.port))
    chunk = b"a" * (1 << 20)

    def send() -> None:  # the probe: one header of `mib` MiB in one stream, as fast as the socket takes it
        try:
            sock.sendall(f"GET /v1/whoami HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ".encode())
            for _ in range(mib):
                sock.sendall(chunk)
            sock.sendall(b"\r\n\r\n")
        except OSError:
            pass  # the server stopped reading: what we expect

    sender = threading.Thread(target=send, daemon=True)
    started = time.monotonic()
    sender.start()
    sock.settimeout(10)
    status, headers, body = read_answer(sock)
    took = time.monotonic() - started
    assert status == 431, body
    assert json.loads(body)["error"]["code"] == "HEADERS_TOO_LARGE"
    assert headers["connection"] == "close"
    assert took < 1.0, f"431 after {took:.2f}s"
    sender.join(timeout=10)
    sock.close()
    after = {pid: rss_mb(pid) for pid in workers}
    grew = {pid: after[pid] - before[pid] for pid in workers}
    assert max(grew.values()) < 30, f"worker RSS grew by {grew} MB for a {mib} MiB header"
    # The process is still serving.
    assert requests.get(f"{web.url}/v1/schema", timeout=5).status_code == 200


def _request_of(size: int, port: int) -> bytes:
    """A GET whose request line and header block are exactly `size` bytes."""
    head = f"GET /v1/schema HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Pad: ".encode()
    return head + b"p" * (size - len(head) - 4) + b"\r\n\r\n"


def test_the_limit_is_the_header_block_exactly(web):
    for size, expected in ((MAX_HEADER_BYTES, 200), (MAX_HEADER_BYTES + 1, 431)):
        with socket.create_connection(("127.0.0.1", web.port), timeout=5) as sock:
            request = _request_of(size, web.port)
            assert len(request) == size
            sock.sendall(request)
            assert read_answer(sock)[0] == expected, size


def test_each_request_of_a_keep_alive_connection_has_its_own_limit(web):
    # Three requests of 10 KiB of headers on one connection (30 KiB in all) are each served; a fourth
    # over the limit on the same connection is 431.
    with socket.create_connection(("127.0.0.1", web.port), timeout=5) as sock:
        for _ in range(3):
            sock.sendall(_request_of(10 * 1024, web.port))
            assert read_answer(sock)[0] == 200
        sock.sendall(_request_of(MAX_HEADER_BYTES + 100, web.port))
        status, _, body = read_answer(sock)
        assert status == 431 and json.loads(body)["error"]["code"] == "HEADERS_TOO_LARGE"


def test_a_body_in_the_same_write_is_not_counted_as_headers(web):
    # A POST whose headers and 40 KiB body arrive in one write: only the header block counts.
    body = json.dumps({"pad": "x" * 40_000}).encode()
    with socket.create_connection(("127.0.0.1", web.port), timeout=5) as sock:
        sock.sendall(f"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        status, _, answer = read_answer(sock)
    assert status == 401, answer  # reached the API (no key), not 431


def test_normal_headers_with_a_10_kib_cookie_still_work(web, transactional_db):
    api = HttpApi(web.url, client_create(name="cookie"))
    response = requests.get(f"{web.url}/v1/whoami", timeout=5, headers={
        "Authorization": f"Bearer {api.api_key}", "Cookie": "session=" + "c" * 10 * 1024})
    assert response.status_code == 200, response.text


# -- time ------------------------------------------------------------------------------------------------

def test_idle_connections_are_closed(web):
    fresh = socket.create_connection(("127.0.0.1", web.port))  # never sends a byte
    kept = socket.create_connection(("127.0.0.1", web.port))  # keep-alive after one answer
    kept.sendall(f"GET /v1/schema HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    kept.settimeout(5)
    assert read_answer(kept)[0] == 200
    dripping = socket.create_connection(("127.0.0.1", web.port))  # a request line, then nothing
    dripping.sendall(b"GET /v1/schema HTTP/1.1\r\n")
    # uvicorn's --timeout-keep-alive is 5 s; the header deadline WEB_HEADER_TIMEOUT_S (2 s here).
    assert (took := closed_within(dripping, HEADER_TIMEOUT_S + 2)) is not None
    assert took > HEADER_TIMEOUT_S - 0.5, took
    for sock in (fresh, kept):
        assert closed_within(sock, 5 + 2) is not None
        sock.close()
    dripping.close()


def test_an_event_stream_outlives_every_timeout(web, transactional_db):
    api = HttpApi(web.url, client_create(name="stream"))
    created = api.create({"kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": "p", "render_s": 0}},
                         key="stream-1")
    assert created.status_code == 201, created.text  # no worker: the job stays queued, its stream open
    with socket.create_connection(("127.0.0.1", web.port), timeout=5) as sock:
        sock.sendall((f"GET /v1/jobs/{created.json()['id']}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      f"Authorization: Bearer {api.api_key}\r\nAccept: text/event-stream\r\n\r\n").encode())
        seen = b""
        while b"\ndata: " not in seen:
            chunk = sock.recv(65536)
            assert chunk, seen
            seen += chunk
        assert b" 200 " in seen.split(b"\r\n", 1)[0]
        time.sleep(5 + 2)  # past the header deadline (2 s) and the idle timeout (5 s)
        assert not is_closed(sock), "the event stream was cut by a timeout meant for headers"


# -- count -----------------------------------------------------------------------------------------------

@pytest.mark.alone  # three thousand connections and a deadline for the request that gets through
def test_three_thousand_slow_connections_are_closed_and_a_request_gets_through(django_db_setup, django_db_blocker):
    # As the probe: one web process under `ulimit -n 1024` (a common default), where 1,100 slow
    # connections used to make a plain GET fail to connect.
    web = start_web(django_db_blocker, WEB_CONCURRENCY=1,
                    wrap=lambda argv: ["bash", "-c", 'ulimit -n 1024 && exec "$@"', "bash", *argv])
    try:
        assert "WEB_MAX_CONNECTIONS=1000 lowered to 960" in web.output()
        selector = selectors.DefaultSelector()
        opened = {}
        closed: dict[socket.socket, float] = {}
        for n in range(3000):
            sock = socket.create_connection(("127.0.0.1", web.port), timeout=5)
            sock.setblocking(False)
            opened[sock] = time.monotonic()
            try:
                sock.send(b"GET /v1/schema HTTP/1.1\r\n")  # its first byte: the header clock starts
            except OSError:  # already closed to make room (see config.http)
                closed[sock] = time.monotonic()
                continue
            selector.register(sock, selectors.EVENT_READ)

        def drip_and_watch(until: float, every: float = 1.0) -> None:
            """Each open connection sends one more header line every `every` s; EOFs and resets are noted."""
            next_drip = time.monotonic()
            line = 1
            while time.monotonic() < until and len(closed) < len(opened):
                if time.monotonic() >= next_drip:
                    data = f"X-Slow-{line}: 1\r\n".encode()
                    for sock in opened:
                        if sock not in closed:
                            try:
                                sock.send(data)
                            except (BlockingIOError, InterruptedError):
                                pass
                            except OSError:
                                closed[sock] = time.monotonic()
                                selector.unregister(sock)
                    line += 1
                    next_drip += every
                for key, _ in selector.select(timeout=0.05):
                    if is_closed(key.fileobj):
                        closed[key.fileobj] = time.monotonic()
                        selector.unregister(key.fileobj)

        drip_and_watch(until=time.monotonic() + 1.0)
        # Meanwhile a plain request gets in and is answered, more than once.
        for _ in range(3):
            started = time.monotonic()
            assert requests.get(f"{web.url}/v1/schema", timeout=5).status_code == 200
            assert time.monotonic() - started < 2.0
            drip_and_watch(until=time.monotonic() + 0.3)
        # Every slow connection is closed within the header deadline of its first byte (plus slack for
        # 3,000 sockets on a shared machine), none lingers.
        drip_and_watch(until=max(opened.values()) + HEADER_TIMEOUT_S + 4)
        assert len(closed) == len(opened), f"{len(opened) - len(closed)} of 3,000 slow connections still open"
        late = max(closed[sock] - opened[sock] for sock in opened)
        assert late < HEADER_TIMEOUT_S + 4, late
        assert requests.get(f"{web.url}/v1/schema", timeout=5).status_code == 200
    finally:
        for sock in list(opened):
            sock.close()
        web.stop()


# -- settings --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,value", [("WEB_MAX_HEADER_BYTES", "16k"), ("WEB_HEADER_TIMEOUT_S", "0"),
                                        ("WEB_MAX_CONNECTIONS", "0")])
def test_a_bad_setting_refuses_to_start(django_db_setup, django_db_blocker, name, value):
    with pytest.raises(RuntimeError) as refused:
        start_web(django_db_blocker, **{name: value})
    assert "exited with" in str(refused.value) and name in str(refused.value)
