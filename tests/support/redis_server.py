"""The Redis every test talks to: `url(db)` is the one way a test names a Redis database.

Run serially (plain `pytest`), the suite uses the machine's Redis on 127.0.0.1:6379, as it always did,
each kind of test on a database number of its own (15 the session's broker, 11 the web stack's, ...).
Run in parallel (`pytest -n N`, pytest-xdist), two workers on the same numbers would consume and flush
each other's messages: so each worker (PYTEST_XDIST_WORKER=gw0, gw1, ...) starts a `redis-server` of its
own on a free port, on first use, and the same database numbers name that server's databases. The
server is stopped by its PID when the worker's session ends (tests/conftest.py), or at the latest when
the worker's Python exits; on Linux the kernel also kills it if the worker dies without either.

TEST_REDIS_URL (e.g. redis://127.0.0.1:6385) names the server instead, serially or not: the database
numbers are then taken on it, so two parallel workers given one TEST_REDIS_URL share them again.

Standard library only (with tests/support/procs.py): tests/settings.py calls it before Django is set up.
Not named redis.py: tests/support/budget_load.py runs as a script, with this folder first on sys.path,
where such a file would stand in for the redis package itself.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from urllib.parse import urlsplit

from tests.support.procs import free_port

MACHINE = "127.0.0.1:6379"

_server: subprocess.Popen | None = None
_address: str | None = None


def url(db: int) -> str:
    """redis://<this test process's Redis>/<db>."""
    return f"redis://{address()}/{db}"


def address() -> str:
    """host:port of the Redis this test process uses (see the module's docstring)."""
    given = os.environ.get("TEST_REDIS_URL")
    if given:
        return urlsplit(given).netloc
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return MACHINE
    return _private()


def _private() -> str:
    global _server, _address
    if _address is None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        # free_port() can lose a race with another process binding the same port: try again on a new one.
        for _ in range(3):
            port = free_port()
            log = open(os.path.join(tempfile.gettempdir(), f"payonce-test-redis-{port}.log"), "ab")
            server = subprocess.Popen(
                [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", tempfile.gettempdir(), "--databases", "16"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
            log.close()
            if _answers(server, port):
                _server, _address = server, f"127.0.0.1:{port}"
                atexit.register(stop)
                break
            server.kill()
            server.wait()
        else:
            raise RuntimeError(f"could not start a private {binary} for xdist worker "
                               f"{os.environ.get('PYTEST_XDIST_WORKER')}")
    return _address


def _answers(server: subprocess.Popen, port: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return True
        except OSError:
            time.sleep(0.05)
    return False


def _die_with_parent() -> None:
    """In the child before exec: on Linux, SIGTERM when the worker that started it dies (even by SIGKILL),
    so no private Redis outlives its test run."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def stop() -> None:
    """Stop this worker's private Redis, if it started one (by its PID: never any other)."""
    global _server, _address
    if _server is not None:
        _server.terminate()
        try:
            _server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _server.kill()
            _server.wait()
        _server = _address = None
