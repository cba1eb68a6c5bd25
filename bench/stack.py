"""What every benchmark needs: payonce processes started exactly as the Procfile starts them, on a
database and a Redis database of the benchmark's own, so a benchmark never leaves work for a
development stack (and a development stack never disturbs a benchmark)."""

import http.client
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.procs import free_port  # noqa: F401 (bench/webhooks.py takes it from here)

ROOT = Path(__file__).resolve().parent.parent
BENCH_DATABASE_URL = "postgres://localhost:5432/payonce_bench"
BENCH_BROKER_URL = "redis://127.0.0.1:6379/14"


def procfile_command(name: str) -> str:
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return line.split(":", 1)[1].strip()
    raise SystemExit(f"no {name!r} process in the Procfile")


class Stack:
    """Start Procfile processes with one shared environment; stop them all (by process group) at exit."""

    def __init__(self, **env):
        self.workdir = Path(tempfile.mkdtemp(prefix="payonce-bench-"))
        self.port = free_port()
        self.sandbox_port = free_port()
        self.env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": BENCH_DATABASE_URL,
            "BROKER_URL": BENCH_BROKER_URL,
            "PORT": str(self.port),
            "SANDBOX_PORT": str(self.sandbox_port),
            "SANDBOX_URL": f"http://127.0.0.1:{self.sandbox_port}",
            "SANDBOX_STATE_DIR": str(self.workdir / "sandbox"),
            "OUTPUT_STORE_URL": f"file://{self.workdir / 'outputs'}",
            "PAYONCE_VAR_DIR": str(self.workdir / "var"),
            "PYTHONUNBUFFERED": "1",
            # Every process refuses the repository's development key with DEBUG off (config.startup).
            "SECRET_KEY": os.environ.get("SECRET_KEY") or secrets.token_urlsafe(50),
            **{key: str(value) for key, value in env.items()},
        }
        self.processes: dict[str, subprocess.Popen] = {}

    def configure_this_process(self) -> None:
        """Point this process's Django (and Celery) at the benchmark's database and broker."""
        for key in ("DATABASE_URL", "BROKER_URL", "SANDBOX_URL", "OUTPUT_STORE_URL", "PAYONCE_VAR_DIR", "SECRET_KEY"):
            os.environ[key] = self.env[key]
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()

    def manage(self, *args: str) -> str:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, check=True,
                              capture_output=True, text=True).stdout

    def prepare(self) -> dict:
        """Migrate the benchmark database, empty the broker, and make a client; returns its credentials."""
        self.manage("migrate", "--noinput")
        self.manage("shell", "-c", "from config.celery import app; app.control.purge()")
        # A benchmark pays for thousands of renders: its client's cap must not be what it measures.
        return json.loads(self.manage("create_client", f"bench-{int(time.time())}", "--monthly-cap-usd", "999999"))

    def start(self, name: str, command: str | None = None, ready: str | None = None, timeout: float = 30) -> None:
        log = open(self.workdir / f"{name}.log", "ab")
        self.processes[name] = subprocess.Popen(
            ["bash", "-c", f"exec {command or procfile_command(name)}"], cwd=ROOT, env=self.env,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.processes[name].poll() is not None:
                raise SystemExit(f"{name} exited:\n{self.log(name)[-3000:]}")
            if ready is None or ready in self.log(name):
                if name != "web" or self._web_answers():
                    return
            time.sleep(0.1)
        raise SystemExit(f"{name} not ready after {timeout}s:\n{self.log(name)[-3000:]}")

    def _web_answers(self) -> bool:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
            conn.request("GET", "/v1/schema")
            return conn.getresponse().status == 200
        except OSError:
            return False

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_bytes().decode(errors="replace")

    def stop(self) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.processes.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.manage("shell", "-c", "from config.celery import app; app.control.purge()")
        if os.environ.get("BENCH_KEEP_LOGS"):
            print(f"logs kept in {self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)
