"""The `e2e` mark kept true by the suite itself (a pytest plugin, loaded by tests/conftest.py).

A test is `e2e` when it starts a process: a worker, `web`, a sandbox of its own, `make run`, a client or a
command as a subprocess, PgBouncer, a browser. `make test-quick` leaves the e2e tests out, and the
parallel run is planned by them, so a test that starts processes without the mark slows the inner loop
and hides from it what it costs. This plugin fails such a test, naming what it started:

- a test without the mark during whose set-up or call a subprocess was started (subprocess.Popen, which
  subprocess.run, asyncio and playwright go through too);
- a test without the mark that uses a fixture which started a process when it was set up, for whichever
  test (a module's or the session's `web`, a moto server): otherwise only the first test to ask for a
  shared process would be caught, and whether a test is caught would depend on the order of the tests.

Left out: the session's sandbox and SMTP server (tests/conftest.py), each one process started once and
shared like PostgreSQL and Redis (the engine and money tests that drive the runner in this process,
tests/support/engine.py, talk to that sandbox without being end to end); `git`, which only reads
the repository; and `ps`, with which a sandbox started or restarted checks that the server answering on its
port is its own (tests/support/sandbox.py).
"""

from __future__ import annotations

import os
import subprocess
import threading

import pytest

SHARED_SERVICES = frozenset({"sandbox", "smtp_server"})  # session-scoped fixtures of tests/conftest.py
NOT_A_PROCESS_OF_PAYONCE = frozenset({"git", "ps"})

_lock = threading.Lock()
_item = None
_fixtures: list = []  # the fixtures being set up now, innermost last
_started: list[str] = []  # what was started during the current test's set-up or call
_starters: set = set()  # fixture definitions whose set-up started a process
_popen_init = subprocess.Popen.__init__


def _watching_init(self, args, *rest, **kwargs):
    argv = [os.fspath(arg) if not isinstance(arg, str) else arg for arg in args] \
        if isinstance(args, (list, tuple)) else [os.fspath(args)]
    with _lock:
        inner = _fixtures[-1] if _fixtures else None
        shared = inner is not None and inner.scope == "session" and inner.argname in SHARED_SERVICES
        if _item is not None and not shared and os.path.basename(str(argv[0])) not in NOT_A_PROCESS_OF_PAYONCE:
            _started.append(" ".join(map(str, argv))[:120])
            if inner is not None:
                _starters.add(inner)
    return _popen_init(self, args, *rest, **kwargs)


def pytest_configure(config):
    subprocess.Popen.__init__ = _watching_init


def pytest_unconfigure(config):
    subprocess.Popen.__init__ = _popen_init


def _check(item) -> None:
    global _started
    with _lock:
        started, _started = _started, []
    if item.get_closest_marker("e2e") is not None:
        return
    if started:
        pytest.fail(f"{item.nodeid} starts processes but is not marked e2e (tests/support/e2e_mark.py): "
                    + "; ".join(started[:3]), pytrace=False)
    # The fixtures the test was set up with, those asked for by getfixturevalue() too (pytest's own record).
    used_defs = getattr(getattr(item, "_request", None), "_fixture_defs", None) or {}
    used = sorted(name for name, fixturedef in used_defs.items() if fixturedef in _starters)
    if used:
        pytest.fail(f"{item.nodeid} uses {', '.join(used)}, which started a process, but is not marked e2e "
                    "(tests/support/e2e_mark.py)", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    global _item, _started
    with _lock:
        _item, _started = item, []
    result = yield
    _check(item)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    _check(item)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    global _item
    with _lock:
        _item = None  # what a teardown starts is the fixture's business, not the next test's
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    with _lock:
        _fixtures.append(fixturedef)
    try:
        return (yield)
    finally:
        with _lock:
            _fixtures.pop()
