"""`python -m sandbox`: a supervisor that keeps the sandbox server running.

It starts `python -m sandbox.server` as a child with the same environment and restarts it about 0.2 s
after any exit it did not ask for, so an injected crash (`crash_after_accept`) comes back with its
journal-restored ledger. SIGTERM or SIGINT stop it: the child gets SIGTERM (SIGKILL after 5 s) and the
supervisor exits 0. A child that dies within 1 s of starting 5 times in a row (say, the port is
taken) makes the supervisor give up with a non-zero exit; a crash it was told to make does not count.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from sandbox.server import CRASH_EXIT_CODE

RESTART_DELAY_S = 0.2
QUICK_DEATH_S = 1.0
QUICK_DEATHS_ALLOWED = 5
STOP_GRACE_S = 5.0

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: on Linux, get SIGTERM if the supervisor dies without stopping us."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except Exception:
        pass  # not Linux: an orphaned server keeps running until stopped by hand


class Supervisor:
    def __init__(self) -> None:
        self.stopping = False
        self.child: subprocess.Popen | None = None
        self.host = os.environ.get("SANDBOX_HOST", "127.0.0.1")
        self.port = os.environ.get("SANDBOX_PORT", "8100")

    def _on_signal(self, signum, frame) -> None:
        self.stopping = True
        self._signal_child(signal.SIGTERM)

    def _signal_child(self, signum: int) -> None:
        child = self.child
        if child is not None and child.poll() is None:
            try:
                child.send_signal(signum)
            except ProcessLookupError:
                pass

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        quick_deaths = 0
        while not self.stopping:
            started = time.monotonic()
            self.child = subprocess.Popen(
                [sys.executable, "-m", "sandbox.server"],
                env=os.environ.copy(),
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
            if self.stopping:  # the signal arrived while the child was being started
                self._signal_child(signal.SIGTERM)
                break
            print(
                f"sandbox: started server pid={self.child.pid} on http://{self.host}:{self.port}",
                flush=True,
            )
            code = self.child.wait()
            if self.stopping:
                break
            lived = time.monotonic() - started
            # A crash the sandbox was told to make (crash_after_accept) is not a server that cannot start:
            # a storm of such faults restarts it as often as it asks (the storm once saw five in a row
            # within a second each, and the supervisor gave up for good).
            crashed_on_purpose = code == CRASH_EXIT_CODE
            quick_deaths = quick_deaths + 1 if lived < QUICK_DEATH_S and not crashed_on_purpose else 0
            if quick_deaths >= QUICK_DEATHS_ALLOWED:
                print(
                    f"sandbox: server died within {QUICK_DEATH_S:.0f}s of starting {quick_deaths} times "
                    f"in a row (is port {self.port} on {self.host} already taken?); giving up",
                    file=sys.stderr,
                    flush=True,
                )
                return 1
            print(
                f"sandbox: server pid={self.child.pid} exited with {code} after {lived:.1f}s; restarting",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(RESTART_DELAY_S)
        self._stop_child()
        return 0

    def _stop_child(self) -> None:
        child = self.child
        if child is None:
            return
        try:
            child.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


if __name__ == "__main__":
    sys.exit(Supervisor().run())
