"""Real payonce processes for end-to-end tests: Celery workers started as the Procfile starts them,
pointed at the test database, the test broker and the test sandbox."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def process_env(**overrides) -> dict:
    """The environment of a payonce process started by the tests: the test session's settings, with the
    database the test runner created (test_<name>), not the development one."""
    from django.conf import settings
    from django.db import connection

    db = connection.settings_dict
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "") + "@" if db["USER"] else ""
    host = db["HOST"] or "localhost"
    port = db["PORT"] or "5432"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": f"postgres://{auth}{host}:{port}/{db['NAME']}",
        "BROKER_URL": settings.CELERY_BROKER_URL,
        "OUTPUT_STORE_URL": settings.OUTPUT_STORE_URL,
        "SANDBOX_URL": settings.SANDBOX_URL,
        "POLL_INTERVAL_S": str(settings.POLL_INTERVAL_S),
        "PAYONCE_VAR_DIR": str(settings.VAR_DIR),
        "PYTHONUNBUFFERED": "1",
    }
    env.update({key: str(value) for key, value in overrides.items()})
    return env


class WorkerProcess:
    """`celery -A config worker` on one queue, as a real process, stopped or killed by its PID."""

    def __init__(self, queue: str = "jobs", concurrency: int = 8, pool: str = "threads", env: dict | None = None):
        self.queue = queue
        self.concurrency = concurrency
        self.pool = pool
        self.env = env or {}
        self.proc: subprocess.Popen | None = None
        self.log_path = Path(tempfile.mkdtemp(prefix="payonce-worker-")) / "worker.log"
        self.starts = 0

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", "config", "worker",
            "-Q", self.queue, "--pool", self.pool, "--concurrency", str(self.concurrency),
            "--hostname", f"test-{self.queue}-{os.getpid()}-{self.starts}@%h",
            "--without-gossip", "--without-mingle", "--loglevel", "INFO",
        ]

    def start(self, timeout: float = 30.0) -> "WorkerProcess":
        self.starts += 1
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.command(), cwd=REPO_ROOT, env=process_env(**self.env), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}:\n{self.output()[-4000:]}")
            if " ready." in self.output(offset):
                return self
            time.sleep(0.1)
        raise RuntimeError(f"worker not ready after {timeout}s:\n{self.output()[-4000:]}")

    def output(self, offset: int = 0) -> str:
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(offset)
                return handle.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        """SIGKILL the whole worker (its process group): no shutdown, no acks, as a crash."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # warm shutdown: finish the running tasks
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
