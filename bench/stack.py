"""What every benchmark needs: payonce processes started exactly as the Procfile starts them (by the
harness the tests share, tests/support/procs.py), on a database and a Redis database of the benchmark's
own, so a benchmark never leaves work for a development stack (and a development stack never disturbs a
benchmark)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.procs import REPO_ROOT, ProcfileProcess, free_port, payonce_env, stop_all

BENCH_DATABASE_URL = "postgres://localhost:5432/payonce_bench"
BENCH_BROKER_URL = "redis://127.0.0.1:6379/14"


class Stack:
    """Start Procfile processes with one shared environment; stop them all (by process group) at exit."""

    def __init__(self, **env):
        self.workdir = Path(tempfile.mkdtemp(prefix="payonce-bench-"))
        self.port = free_port()
        self.sandbox_port = free_port()
        self.env = payonce_env(**{
            "DATABASE_URL": BENCH_DATABASE_URL,
            "BROKER_URL": BENCH_BROKER_URL,
            "PORT": self.port,
            "SANDBOX_PORT": self.sandbox_port,
            "SANDBOX_URL": f"http://127.0.0.1:{self.sandbox_port}",
            "SANDBOX_STATE_DIR": self.workdir / "sandbox",
            "OUTPUT_STORE_URL": f"file://{self.workdir / 'outputs'}",
            "PAYONCE_VAR_DIR": self.workdir / "var",
            **env,
        })
        self.processes: dict[str, ProcfileProcess] = {}

    def configure_this_process(self) -> None:
        """Point this process's Django (and Celery) at the benchmark's database and broker."""
        for key in ("DATABASE_URL", "BROKER_URL", "SANDBOX_URL", "OUTPUT_STORE_URL", "PAYONCE_VAR_DIR", "SECRET_KEY"):
            os.environ[key] = self.env[key]
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        sys.path.insert(0, str(REPO_ROOT))
        import django

        django.setup()

    def manage(self, *args: str) -> str:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO_ROOT, env=self.env, check=True,
                              capture_output=True, text=True).stdout

    def prepare(self) -> dict:
        """Migrate the benchmark database, empty the broker, and make a client; returns its credentials."""
        self.manage("migrate", "--noinput")
        # The rows earlier runs left dead (each deletes its jobs) vacuumed away, as a deployment's autovacuum
        # would have done between them: this machine's PostgreSQL runs with autovacuum off, and a run
        # should not pay for its predecessors' dead index entries (the queued-jobs index most, jobs.dispatch).
        self.manage("shell", "-c", "from django.db import connection; connection.cursor().execute('VACUUM ANALYZE')")
        self.manage("shell", "-c", "from config.celery import app; app.control.purge()")
        # A benchmark pays for thousands of renders: its client's cap must not be what it measures.
        return json.loads(self.manage("create_client", f"bench-{int(time.time())}", "--monthly-cap-usd", "999999"))

    def start(self, name: str, timeout: float = 30, **env) -> None:
        """Start a Procfile process; `env` on top of the stack's (a start of the same name again replaces it)."""
        process = self.processes[name] = ProcfileProcess(name, env, base=self.env, log_dir=self.workdir)
        try:
            process.start(timeout)
        except RuntimeError as failed:  # a benchmark's failure is one message, not a traceback
            raise SystemExit(str(failed)) from None

    def log(self, name: str) -> str:
        return self.processes[name].output()

    def stop(self) -> None:
        stop_all(self.processes.values(), timeout=30)
        self.manage("shell", "-c", "from config.celery import app; app.control.purge()")
        if os.environ.get("BENCH_KEEP_LOGS"):
            print(f"logs kept in {self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)
