"""The Procfile's `worker` line: WORKER_PROCESSES Celery workers under one command, each a pool of threads.

A worker is one interpreter, held to about one core by the GIL however many threads it runs: its provider
calls wait side by side, its Python does not. So one command starts one worker per core that `web` leaves
(docs/operating.md, "How many workers"):

    python -m config.workers celery -A config worker -Q jobs --pool threads ... --hostname jobs@%h ...

runs the Celery command WORKER_PROCESSES times, the n-th named `jobs<n>@%h` (Celery's node names must differ
on one machine: its remote control and the release drain address nodes by name). With one process (a machine
of one or two cores, or WORKER_PROCESSES=1) it *is* the Celery command (exec): nothing stands between the
process manager and the worker.

With more, this process is their supervisor, and does as little as it can:
- a signal to it reaches every worker: SIGTERM (and SIGINT, sent on as SIGTERM: a terminal's Ctrl-C has
  already reached them as SIGINT, and a second SIGINT is Celery's cold shutdown) is the warm shutdown, each
  worker finishing its calls in flight; SIGQUIT the cold one. It exits when they all have, with the first
  non-zero status among them.
- a worker that dies on its own (the OOM killer, a crash) is started again under its name, so the machine
  keeps its cores at work; its unacknowledged messages come back from the broker as after any crash. One
  that dies within MIN_UPTIME_S of its start cannot start (a wrong setting, the database down): the others
  are stopped and this process exits with its status, for the process manager to see and report.
- the workers are in its process group (a signal to the group, as systemd's KillMode and the tests send,
  reaches them all) and, on Linux, are sent SIGTERM by the kernel if this process dies without stopping
  them.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

MIN_UPTIME_S = 10.0
MAX_PROCESSES = 256
_FORWARDED = {signal.SIGTERM: signal.SIGTERM, signal.SIGINT: signal.SIGTERM, signal.SIGQUIT: signal.SIGQUIT,
              signal.SIGUSR1: signal.SIGUSR1}


class SettingError(Exception):
    """WORKER_PROCESSES (or WEB_CONCURRENCY, which the default reads) cannot be read."""


def cores() -> int:
    """The cores this process may run on (its CPU affinity on Linux, as a container's cpuset sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def processes(environ=os.environ) -> int:
    """WORKER_PROCESSES, or the cores left after `web`'s WEB_CONCURRENCY processes (at least one)."""
    raw = environ.get("WORKER_PROCESSES", "").strip()
    if not raw:
        return max(1, cores() - _integer(environ, "WEB_CONCURRENCY", "2"))
    return _integer(environ, "WORKER_PROCESSES", raw)


def _integer(environ, name: str, default: str) -> int:
    raw = environ.get(name, "").strip() or default
    try:
        value = int(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r}: expected a whole number of processes") from None
    if not 1 <= value <= MAX_PROCESSES:
        raise SettingError(f"{name}={raw!r}: expected 1 to {MAX_PROCESSES} processes")
    return value


def named(command: list[str], n: int) -> list[str]:
    """The command with its node named `<name><n>@<host>` (`--hostname`, `--hostname=` or `-n`; Celery's
    own default name, celery@%h, when it gives none)."""
    command = list(command)
    for index, arg in enumerate(command):
        if arg in ("--hostname", "-n") and index + 1 < len(command):
            command[index + 1] = _numbered(command[index + 1], n)
            return command
        if arg.startswith("--hostname="):
            command[index] = "--hostname=" + _numbered(arg.partition("=")[2], n)
            return command
    return [*command, "--hostname", f"celery{n}@%h"]


def _numbered(node: str, n: int) -> str:
    name, at, host = node.partition("@")
    return f"{name}{n}{at}{host}"


def _die_with_parent() -> None:
    """In the worker, before exec: SIGTERM when the supervisor dies (Linux's PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def say(message: str) -> None:
    print(f"workers: {message}", file=sys.stderr, flush=True)


class Supervisor:
    def __init__(self, command: list[str], count: int):
        self.command = command
        self.count = count
        self.workers: dict[int, tuple[subprocess.Popen, float]] = {}  # n -> (process, started)
        self.stopping = False
        self.status = 0

    def start(self, n: int) -> None:
        preexec = _die_with_parent if sys.platform.startswith("linux") else None
        process = subprocess.Popen(named(self.command, n), preexec_fn=preexec)
        self.workers[n] = (process, time.monotonic())

    def signal(self, signum, frame=None) -> None:
        self.stopping = True
        for process, _ in self.workers.values():
            if process.poll() is None:
                process.send_signal(_FORWARDED[signum])

    def run(self) -> int:
        for signum in _FORWARDED:
            signal.signal(signum, self.signal)
        for n in range(1, self.count + 1):
            if not self.stopping:  # a stop that came while the first ones started
                self.start(n)
        say(f"{self.count} workers started: {', '.join(str(p.pid) for p, _ in self.workers.values())}")
        while self.workers:
            try:
                pid, wait_status = os.wait()
            except ChildProcessError:
                break
            n = next((n for n, (p, _) in self.workers.items() if p.pid == pid), None)
            if n is None:
                continue
            process, started = self.workers.pop(n)
            process.returncode = code = os.waitstatus_to_exitcode(wait_status)
            if code and not self.status:
                self.status = code if code > 0 else 128 - code
            if self.stopping:
                continue
            if time.monotonic() - started < MIN_UPTIME_S:
                say(f"worker {n} (pid {pid}) exited with {code} within {MIN_UPTIME_S:.0f} s of its start: stopping")
                self.signal(signal.SIGTERM)
                continue
            say(f"worker {n} (pid {pid}) exited with {code}: starting it again")
            self.status = 0
            self.start(n)
        return self.status


def main(argv: list[str]) -> int:
    command = argv[1:]
    if not command:
        say("usage: python -m config.workers CELERY-WORKER-COMMAND...")
        return 64
    try:
        count = processes()
    except SettingError as error:
        say(f"refusing to start: {error}")
        return 2
    if count == 1:
        os.execvp(command[0], command)
    return Supervisor(command, count).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
