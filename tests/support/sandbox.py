"""Run the sandbox provider (`python -m sandbox`, the supervisor) as a real process for tests.

    with SandboxProcess() as sandbox:
        requests.post(f"{sandbox.url}/v1/generations", json={...})
        assert len(sandbox.ledger()["charges"]) == 1
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import requests

from tests.support.procs import REPO_ROOT, free_port


class SandboxPortTaken(RuntimeError):
    """Another sandbox answers on the port this one was given."""


class SandboxProcess:
    """The sandbox supervisor on its own loopback port and its own state directory."""

    def __init__(self, port: int | None = None, state_dir: str | None = None, env: dict | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._workdir = tempfile.mkdtemp(prefix="payonce-sandbox-")
        self.state_dir = state_dir or os.path.join(self._workdir, "state")
        self.log_path = os.path.join(self._workdir, "sandbox.log")
        self.extra_env = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self._log = None

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, timeout: float = 15.0) -> "SandboxProcess":
        env = {
            **os.environ,
            "SANDBOX_HOST": "127.0.0.1",
            "SANDBOX_PORT": str(self.port),
            "SANDBOX_STATE_DIR": self.state_dir,
            **self.extra_env,
        }
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sandbox"],
            cwd=REPO_ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        try:
            self.wait_healthy(timeout)
        except Exception:
            self.stop()
            raise
        return self

    def wait_healthy(self, timeout: float = 15.0) -> dict:
        """Wait until /healthz answers; raise with the process's output if it does not."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"sandbox exited with {self.proc.returncode} before answering:\n{self.output()}"
                )
            try:
                health = self.health(timeout=1)
            except requests.RequestException:
                pass
            else:
                if not self._answered_by_ours(health):
                    raise SandboxPortTaken(f"another sandbox (pid {health.get('pid')}) answers on port {self.port}")
                return health
            if time.monotonic() > deadline:
                raise RuntimeError(f"sandbox did not answer /healthz within {timeout}s:\n{self.output()}")
            time.sleep(0.05)

    def _answered_by_ours(self, health: dict) -> bool:
        """Whether the server that answered /healthz is this supervisor's child. A port free when it was
        chosen can be taken before the server binds it (by another test worker's sandbox, say): our server
        then dies at once, the supervisor starts it again, and the other sandbox answers in its place, so
        two workers would share one ledger without a word."""
        pid = health.get("pid")
        if self.proc is None or pid is None:
            return True
        try:  # Linux says it in /proc; elsewhere (macOS) `ps` does
            with open(f"/proc/{pid}/stat") as stat:
                parent = stat.read().rsplit(")", 1)[1].split()[1]
        except OSError:
            try:
                parent = subprocess.run(["ps", "-o", "ppid=", "-p", str(pid)], capture_output=True, text=True,
                                        timeout=5).stdout.strip()
            except (OSError, subprocess.TimeoutExpired):
                return True  # no `ps` to ask: the answer is taken as ours, as before this check
        return parent == str(self.proc.pid)

    def stop(self) -> int | None:
        """SIGTERM the supervisor (it stops its server), SIGKILL after 5 s; returns the exit code."""
        code = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                code = self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def cleanup(self) -> None:
        shutil.rmtree(self._workdir, ignore_errors=True)

    def output(self) -> str:
        if self._log is not None:
            self._log.flush()
        try:
            with open(self.log_path, "rb") as fh:
                return fh.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> "SandboxProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self.cleanup()

    # -- helpers (a fresh connection each: a crash fault must not leave a dead pooled socket) ------

    def _get(self, path: str, timeout: float = 5) -> dict:
        response = requests.get(self.url + path, timeout=timeout)
        response.raise_for_status()
        return response.json()

    def _post(self, path: str, body: dict | None = None) -> dict:
        response = requests.post(self.url + path, json=body or {}, timeout=5)
        response.raise_for_status()
        return response.json()

    def health(self, timeout: float = 5) -> dict:
        return self._get("/healthz", timeout=timeout)

    def reset(self) -> None:
        self._post("/control/reset")

    def ledger(self) -> dict:
        return self._get("/ledger")

    def calls(self) -> list[dict]:
        return self._get("/control/calls")["calls"]

    def faults(self, faults: list[dict], *, first: bool = False) -> list[dict]:
        """Append faults (or, `first`, put them before the pending ones); returns every pending fault."""
        return self._post("/control/faults", {"faults": faults, "first": first})["faults"]

    def cache_ttl(self, seconds: float) -> float:
        """How long the sandbox's prompt cache entries live from now on (a reset restores its default)."""
        return self._post("/control/cache", {"ttl_s": seconds})["ttl_s"]

    def pending_faults(self) -> list[dict]:
        return self._get("/control/faults")["faults"]

    def callbacks(self) -> list[dict]:
        """The callbacks the sandbox has sent (each try, with the status it got back)."""
        return self._get("/control/callbacks")["callbacks"]
