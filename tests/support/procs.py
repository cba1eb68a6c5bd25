"""The process harness of the tests, the storm (tests/chaos) and the benchmarks (bench/): payonce's
Procfile processes started exactly as the Procfile starts them, each as a real process in a session of
its own, waited for until it is up, and stopped or killed by its process group; the environment every
such process runs with; and free ports.

Its top-level imports are the standard library and requests only: the storm and the benchmarks import
it without the test session's Django, and tests/settings.py imports `free_port` before Django is set up.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

import requests

REPO_ROOT = Path(__file__).resolve().parents[2]

# Recovery in seconds, not minutes: sweeps, leases and polls short enough that a stack whose workers are
# killed recovers within a test or a storm.
FAST_RECOVERY = {"SWEEP_INTERVAL_S": 1, "STEP_LEASE_S": 3, "ENQUEUE_LEASE_S": 4, "POLL_INTERVAL_S": 0.5,
                 "WORKER_CONCURRENCY": 8}


def free_port() -> int:
    """A loopback port nobody listens on right now (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def per_worker(name: str) -> str:
    """`name` made the xdist worker's own (payonce_make_run_gw1) when the suite runs in parallel, as
    pytest-django names each worker's test database (test_payonce_gw1); `name` itself when run serially."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return f"{name}_{worker}" if worker else name


def procfile_command(name: str, root: Path = REPO_ROOT) -> str:
    for line in (root / "Procfile").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return line.split(":", 1)[1].strip()
    raise KeyError(f"no {name!r} process in the Procfile")


def payonce_env(**overrides) -> dict:
    """The environment of a payonce process, whoever starts it: this one's, with this virtualenv's commands
    first on PATH (the Procfile runs `celery`, `uvicorn` and `python` by name), the real settings, output
    unbuffered (its log is read while it runs), and a SECRET_KEY, since with DEBUG off every process
    refuses the repository's development key (config.startup). The caller adds its own database, broker,
    ports and directories as `overrides`, and builds the environment of a stack once, so that all its
    processes share one key."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "PYTHONUNBUFFERED": "1",
        "SECRET_KEY": os.environ.get("SECRET_KEY") or secrets.token_urlsafe(50),
    }
    env.update({key: str(value) for key, value in overrides.items()})
    return env


def process_env(**overrides) -> dict:
    """The environment of a payonce process started by the tests: the test session's settings, with the
    database the test runner created (test_<name>), not the development one."""
    # Imported here, not at the top: only the tests have a Django set up (see the module's docstring).
    from django.conf import settings
    from django.db import connection

    db = connection.settings_dict
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "") + "@" if db["USER"] else ""
    host = db["HOST"] or "localhost"
    port = db["PORT"] or "5432"
    return payonce_env(**{
        "DATABASE_URL": f"postgres://{auth}{host}:{port}/{db['NAME']}",
        "BROKER_URL": settings.CELERY_BROKER_URL,
        "OUTPUT_STORE_URL": settings.OUTPUT_STORE_URL,
        "SANDBOX_URL": settings.SANDBOX_URL,
        "POLL_INTERVAL_S": settings.POLL_INTERVAL_S,
        "PAYONCE_VAR_DIR": settings.VAR_DIR,
        # The test session's key (tests/settings.py): a process signs the links the tests read.
        "SECRET_KEY": settings.SECRET_KEY,
        # A test's `worker` is one Celery worker, whatever the machine's cores (config.workers): what a test
        # kills, signals or counts is that one process. tests/config/test_workers.py starts more.
        "WORKER_PROCESSES": 1,
        **overrides,
    })


class ProcfileProcess:
    """One Procfile process (web, worker, webhooks, beat, sandbox) as a real process in a session of its
    own, so that a signal to its process group reaches everything it forked (uvicorn's workers, prefork
    children). It can be started again and again under the same name, appending to the same log.

    `env` goes on top of `base`, the environment of a stack (payonce_env), or, without one, of the test
    session (process_env); either is read at each start. `command` replaces the Procfile's, `wrap` turns
    the argv into one run elsewhere (a network namespace of the storm's), and `ready` is the log line that
    says the process is up, for a process that serves no HTTP. `root` is the checkout whose code it runs
    (this one, or the previous release's: tests/support/previous_release.py), read at each start, so a
    process can be started again on another release's code."""

    READY = {"worker": " ready.", "webhooks": " ready.", "beat": "beat: Starting"}

    def __init__(self, name: str, env: dict | None = None, command: str | Callable[[Path], str] | None = None, *,
                 base: dict | None = None, log_dir: Path | None = None,
                 wrap: Callable[[list[str]], list[str]] | None = None, ready: str | None = None,
                 start_timeout: float = 30.0, root: Path = REPO_ROOT):
        self.name = name
        self.root = root
        self.env = dict(env or {})
        self.base = base
        # The Procfile's line of the release it starts on (read at each start: a process started again on
        # another release's code runs that release's line), or `command`: a line, or a function of the root.
        self.command = command
        self.wrap = wrap
        self.ready = ready if ready is not None else self.READY.get(name)
        self.start_timeout = start_timeout
        self.log_path = Path(log_dir or tempfile.mkdtemp(prefix=f"payonce-{name}-")) / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self.offset = 0  # where this start's lines begin in the log
        self.ready_url: str | None = None

    @property
    def port(self):
        return self.env.get("PORT", (self.base or {}).get("PORT"))

    @property
    def url(self) -> str:
        """Where a `web` started on loopback with its own PORT answers."""
        return f"http://127.0.0.1:{self.port}"

    def environment(self) -> dict:
        if self.base is None:
            return process_env(**self.env)
        return {**self.base, **{key: str(value) for key, value in self.env.items()}}

    # -- starting ----------------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> "ProcfileProcess":
        return self.launch().ready_within(timeout or self.start_timeout)

    def launch(self) -> "ProcfileProcess":
        """Start the process and return at once (several started together come up in one start-up's time)."""
        if self.alive:  # a second start would orphan the first process, still consuming and writing
            raise RuntimeError(f"{self.name} is already running (pid {self.proc.pid})")
        environ = self.environment()
        self.ready_url = self._ready_url(environ)
        self.offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        command = (procfile_command(self.name, self.root) if self.command is None
                   else self.command(self.root) if callable(self.command) else self.command)
        argv = ["bash", "-c", f"exec {command}"]  # exec: the shell becomes the process, same PID
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.wrap(argv) if self.wrap else argv, cwd=self.root, env=environ,
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        return self

    def _ready_url(self, environ: dict) -> str | None:
        """Where a process that serves HTTP answers once it is up (the Procfile's defaults where the
        environment names no address)."""
        if self.name == "web":
            return f"http://{environ.get('HOST', '127.0.0.1')}:{environ.get('PORT', '8000')}/v1/schema"
        if self.name == "sandbox":
            # Not its "started server" line: the supervisor prints it before its server listens.
            return f"http://{environ.get('SANDBOX_HOST', '127.0.0.1')}:{environ.get('SANDBOX_PORT', '8100')}/healthz"
        return None

    def ready_within(self, timeout: float) -> "ProcfileProcess":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                failure = f"exited with {self.proc.returncode}"
                break
            if self._ready():
                return self
            time.sleep(0.1)
        else:
            failure = f"not ready after {timeout}s"
        # Killed with what it forked: the caller never gets a process to stop (a fixture that raised is
        # not torn down).
        self.kill()
        raise RuntimeError(f"{self.name} {failure}:\n{self.output(self.offset)[-4000:]}")

    def _ready(self) -> bool:
        if self.ready is not None and self.ready not in self.output(self.offset):
            return False
        if self.ready_url is None:
            return True
        try:
            return requests.get(self.ready_url, timeout=1).status_code == 200
        except requests.RequestException:
            return False

    # -- looking -----------------------------------------------------------------------------------

    def output(self, offset: int = 0) -> str:
        """The log from `offset` on: by default every start's lines."""
        return read_log(self.log_path, offset)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def children(self) -> list[int]:
        """PIDs of the process's children (prefork pool processes, the sandbox's server)."""
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as handle:
                return [int(pid) for pid in handle.read().split()]
        except FileNotFoundError:
            return []

    # -- stopping ----------------------------------------------------------------------------------

    def stop(self, timeout: float = 20.0) -> None:
        """Warm shutdown: SIGTERM to the group (a worker finishes its running tasks), SIGKILL after `timeout`."""
        self.terminate()
        self.wait_or_kill(timeout)

    def terminate(self) -> None:
        """SIGTERM to the group, without waiting (stop_all stops a stack in its slowest process's time)."""
        if self.alive:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def wait_or_kill(self, timeout: float) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return
        reap_group(self.proc.pid)

    def kill(self) -> None:
        """SIGKILL the whole group: no shutdown, no acknowledgements, as a crash."""
        if self.proc is None:
            return
        try:  # also when the leader is gone: what it forked may still be running
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        reap_group(self.proc.pid)


def stop_all(processes: Iterable[ProcfileProcess], timeout: float = 20.0) -> None:
    """Stop every process at once: each group gets its SIGTERM, then each is waited for."""
    processes = list(processes)
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait_or_kill(timeout)


def read_log(path: Path, offset: int = 0) -> str:
    """A process's log from `offset` on ("" before it exists)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def reap_group(pgid: int, timeout: float = 10.0) -> None:
    """Wait until every process of the group is gone (uvicorn's workers, prefork children), SIGKILLing what
    is left after `timeout`: none may still hold a database connection when the suite drops a database."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Stack:
    """web, worker and beat as the Procfile starts them, on a broker of their own (so no worker started
    by another test takes their messages), with short leases so recovery fits in a test."""

    def __init__(self, broker_url: str, worker_command: str | None = None, *, webhooks: bool = False, **env):
        # Imported here: only the tests have a Django set up (see the module's docstring).
        from kombu import Connection

        from config.celery import app

        self.broker_url = broker_url
        with Connection(broker_url) as conn:  # messages left by an earlier run would skew the test
            conn.ensure_connection(max_retries=3)
            queue = app.amqp.queues["jobs"](conn.default_channel)
            queue.declare()  # exactly as the workers declare it
            queue.purge()
        env = {**FAST_RECOVERY, "BROKER_URL": broker_url, "PORT": free_port(), **env}
        self.processes = {
            "web": ProcfileProcess("web", env),
            "worker": ProcfileProcess("worker", env, command=worker_command),
            "beat": ProcfileProcess("beat", env),
        }
        if webhooks:
            self.processes["webhooks"] = ProcfileProcess("webhooks", env)

    def __getitem__(self, name: str) -> ProcfileProcess:
        return self.processes[name]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.processes['web'].port}"

    def start(self) -> "Stack":
        for process in self.processes.values():
            process.start()
        return self

    def stop(self) -> None:
        for process in self.processes.values():
            process.stop()
