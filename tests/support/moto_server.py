"""moto's standalone S3 server as a real process for tests, spoken to over HTTP with boto3.

    with MotoServer() as moto:
        boto3.client("s3", endpoint_url=moto.url, ...)

Started as `python -m moto.server -H 127.0.0.1 -p PORT` on a free loopback port, in its own process
group, and stopped by its PID. All state lives in the process, so stopping it drops every bucket.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from tests.support.procs import free_port


class MotoServer:
    def __init__(self, host: str = "127.0.0.1", port: int | None = None):
        self.host = host
        self.port = port
        self.proc: subprocess.Popen | None = None
        self.log_path = Path(tempfile.mkdtemp(prefix="payonce-moto-")) / "moto.log"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0, tries: int = 3) -> "MotoServer":
        # The free port is bound and released before the server binds it; if something else took it in
        # between, the server exits at once and we try another port.
        for attempt in range(tries):
            port = self.port if self.port and attempt == 0 else free_port()
            try:
                self._start_on(port, timeout)
                return self
            except _ExitedEarly:
                if attempt == tries - 1:
                    raise
        return self

    def _start_on(self, port: int, timeout: float) -> None:
        self.port = port
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "MOTO_PORT": str(port)}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(port)],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise _ExitedEarly(f"moto exited with {self.proc.returncode}:\n{self.output()[-4000:]}")
            if self.answers():
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto not answering on {self.url} after {timeout}s:\n{self.output()[-4000:]}")

    def answers(self) -> bool:
        try:
            # Any HTTP answer means the server is up; moto's own API answers 200 without credentials.
            return requests.get(f"{self.url}/moto-api/", timeout=1).status_code < 500
        except requests.RequestException:
            return False

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM by PID (moto exits on it), SIGKILL if it has not gone after `timeout`."""
        if not self.alive:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=timeout)

    def __enter__(self) -> "MotoServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class _ExitedEarly(RuntimeError):
    pass
