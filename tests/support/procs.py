"""Real payonce processes for end-to-end tests, started exactly as the Procfile starts them, pointed at
the test database, a test broker and the test sandbox, and stopped or killed by their PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import requests

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A loopback port nobody listens on right now (bound, then closed). Its one definition: the tests,
    tests/settings.py (before Django is set up), the storm and the benchmarks take their ports here."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def procfile_command(name: str) -> str:
    for line in (REPO_ROOT / "Procfile").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return line.split(":", 1)[1].strip()
    raise KeyError(name)


def process_env(**overrides) -> dict:
    """The environment of a payonce process started by the tests: the test session's settings, with the
    database the test runner created (test_<name>), not the development one."""
    import sys

    from django.conf import settings
    from django.db import connection

    db = connection.settings_dict
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "") + "@" if db["USER"] else ""
    host = db["HOST"] or "localhost"
    port = db["PORT"] or "5432"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": f"postgres://{auth}{host}:{port}/{db['NAME']}",
        "BROKER_URL": settings.CELERY_BROKER_URL,
        "OUTPUT_STORE_URL": settings.OUTPUT_STORE_URL,
        "SANDBOX_URL": settings.SANDBOX_URL,
        "POLL_INTERVAL_S": str(settings.POLL_INTERVAL_S),
        "PAYONCE_VAR_DIR": str(settings.VAR_DIR),
        # The test session's key (tests/settings.py): a process signs the links the tests read, and with
        # DEBUG off it refuses the repository's development key (config.startup).
        "SECRET_KEY": settings.SECRET_KEY,
        "PYTHONUNBUFFERED": "1",
    }
    env.update({key: str(value) for key, value in overrides.items()})
    return env


class ProcfileProcess:
    """One Procfile process (web, worker, webhooks, beat) as a real process in its own process group."""

    READY = {"worker": " ready.", "webhooks": " ready.", "beat": "beat: Starting"}

    def __init__(self, name: str, env: dict | None = None, command: str | None = None):
        self.name = name
        self.env = env or {}
        self.command = command or procfile_command(name)
        self.proc: subprocess.Popen | None = None
        self.log_path = Path(tempfile.mkdtemp(prefix=f"payonce-{name}-")) / f"{name}.log"
        self.port = self.env.get("PORT")

    def start(self, timeout: float = 30.0) -> "ProcfileProcess":
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                ["bash", "-c", f"exec {self.command}"], cwd=REPO_ROOT, env=process_env(**self.env),
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.output()[-4000:]}")
            if self._ready(offset):
                return self
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready after {timeout}s:\n{self.output()[-4000:]}")

    def _ready(self, offset: int) -> bool:
        if self.name == "web":
            try:
                return requests.get(f"http://127.0.0.1:{self.port}/v1/schema", timeout=1).status_code == 200
            except requests.RequestException:
                return False
        return self.READY[self.name] in self.output(offset)

    def output(self, offset: int = 0) -> str:
        return read_log(self.log_path, offset)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def children(self) -> list[int]:
        """PIDs of the process's children (prefork pool processes)."""
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as handle:
                return [int(pid) for pid in handle.read().split()]
        except FileNotFoundError:
            return []

    def kill(self) -> None:
        """SIGKILL the whole process group: no shutdown, no acknowledgements, as a crash."""
        if self.alive:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._reap_group()

    def stop(self) -> None:
        if self.alive:
            os.killpg(self.proc.pid, signal.SIGTERM)  # warm shutdown: finish the running tasks
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reap_group()

    def _reap_group(self, timeout: float = 10.0) -> None:
        if self.proc is not None:
            reap_group(self.proc.pid, timeout)


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

    FAST_RECOVERY = {"SWEEP_INTERVAL_S": 1, "STEP_LEASE_S": 3, "ENQUEUE_LEASE_S": 4, "POLL_INTERVAL_S": 0.5,
                     "WORKER_CONCURRENCY": 8}

    def __init__(self, broker_url: str, worker_command: str | None = None, *, webhooks: bool = False, **env):
        from kombu import Connection

        from config.celery import app

        self.broker_url = broker_url
        with Connection(broker_url) as conn:  # messages left by an earlier run would skew the test
            conn.ensure_connection(max_retries=3)
            queue = app.amqp.queues["jobs"](conn.default_channel)
            queue.declare()  # exactly as the workers declare it
            queue.purge()
        env = {**self.FAST_RECOVERY, "BROKER_URL": broker_url, "PORT": free_port(), **env}
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
