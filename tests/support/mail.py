"""The SMTP server process the suite starts (tests/support/smtp_server.py) and what it received."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.procs import REPO_ROOT, free_port


class SmtpProcess:
    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="payonce-smtp-"))
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"smtp://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> "SmtpProcess":
        self.proc = subprocess.Popen([sys.executable, str(REPO_ROOT / "tests/support/smtp_server.py"), str(self.port),
                                      str(self.directory / "mail")], stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if "smtp ready" in line:
                return self
            if self.proc.poll() is not None:
                break
        raise RuntimeError("the SMTP server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def cleanup(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def clear(self) -> None:
        shutil.rmtree(self.directory / "mail", ignore_errors=True)
        (self.directory / "mail").mkdir(parents=True, exist_ok=True)

    def messages(self) -> list[dict]:
        folder = self.directory / "mail"
        if not folder.exists():
            return []
        return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]

    def wait_for(self, count: int, timeout: float = 30.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while len(self.messages()) < count:
            assert time.monotonic() < deadline, f"{len(self.messages())} of {count} mails after {timeout}s"
            time.sleep(0.1)
        return self.messages()
