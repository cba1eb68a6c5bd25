"""The storm's own PostgreSQL: a server of its own (`initdb` into a temporary directory, a free port on
127.0.0.1), so the storm can restart it and cut its connections without touching the machine's cluster,
which other checkouts and other test runs use at the same time.

The binaries are the machine's: `pg_config --bindir`, then /usr/lib/postgresql/<version>/bin (Debian,
Ubuntu; newest first), then whatever `initdb` PATH finds (Homebrew, Postgres.app, other Linux).
PostgreSQL refuses to run as root: as root the server runs as the `postgres` system user (else `nobody`),
the data directory handed to it; as anyone else, as that user.

`stop()` shuts the server down by its PID (the postmaster this process started) and removes the
directory; it runs at interpreter exit too (atexit) if the caller never gets to it. A storm killed with
SIGKILL leaves the server running: its data directory (payonce-chaos-pg-* in the temporary directory)
and its postmaster.pid say which one.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

CHECKER = "payonce-chaos-checker"  # the application_name of the storm's own connections (never cut)
USER = "postgres"  # the superuser initdb makes; every URL names it


def _has_server(bindir: str | os.PathLike) -> bool:
    return all((Path(bindir) / name).is_file() for name in ("initdb", "postgres"))


def find_bindir() -> Path:
    """Where this machine's PostgreSQL server binaries are."""
    candidates = []
    try:
        candidates.append(subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                                         check=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        pass

    def version(path: str) -> tuple:
        name = Path(path).parent.name
        return tuple(int(part) for part in name.split(".") if part.isdigit())

    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).resolve().parent))
    for candidate in candidates:
        if candidate and _has_server(candidate):
            return Path(candidate)
    raise RuntimeError("no PostgreSQL server binaries (initdb, postgres) found: tried "
                       + (", ".join(c for c in candidates if c) or "pg_config, /usr/lib/postgresql/*/bin, PATH"))


def _run_as() -> pwd.struct_passwd | None:
    """The account the server runs as: None (this process's own) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root, and there is neither a postgres nor a nobody account to run PostgreSQL as")


class PrivateServer:
    """One throw-away PostgreSQL server: `start()`, `restart()`, `stop()` (idempotent)."""

    def __init__(self, port: int, host: str = "127.0.0.1"):
        self.port, self.host = port, host
        self.bindir = find_bindir()
        self.account = _run_as()
        self.dir = Path(tempfile.mkdtemp(prefix="payonce-chaos-pg-"))
        self.data = self.dir / "data"
        self.log_path = self.dir / "postgres.log"
        self.proc: subprocess.Popen | None = None
        self._stopped = False
        atexit.register(self.stop)
        if self.account is not None:
            os.chown(self.dir, self.account.pw_uid, self.account.pw_gid)

    # -- processes ---------------------------------------------------------------------------------

    def _popen_kwargs(self) -> dict:
        if self.account is None:
            return {}
        # Drop to the account before exec: no runuser, su or sudo needed (and none prompts).
        return {"user": self.account.pw_uid, "group": self.account.pw_gid, "extra_groups": []}

    def url(self, database: str, address: str | None = None) -> str:
        return f"postgres://{USER}@{address or f'{self.host}:{self.port}'}/{database}"

    def start(self) -> "PrivateServer":
        if not self.data.exists():
            subprocess.run([str(self.bindir / "initdb"), "-D", str(self.data), "-U", USER, "-A", "trust",
                            "-E", "UTF8", "--locale=C", "--no-sync"], cwd=self.dir, check=True,
                           capture_output=True, **self._popen_kwargs())
        return self._launch()

    def _launch(self) -> "PrivateServer":
        settings = {
            "listen_addresses": self.host, "port": str(self.port),
            "unix_socket_directories": str(self.dir),  # not /var/run/postgresql: the machine's cluster's
            "max_connections": "200", "shared_buffers": "32MB",
            # A throw-away server: its durability is not what the storm tests (payonce's is), so no fsync.
            "fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
            "log_min_messages": "warning",
        }
        argv = [str(self.bindir / "postgres"), "-D", str(self.data)]
        for name, value in settings.items():
            argv += ["-c", f"{name}={value}"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, cwd=self.dir, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True, **self._popen_kwargs())
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the storm's PostgreSQL exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                with psycopg.connect(host=self.host, port=self.port, user=USER, dbname="postgres", connect_timeout=2,
                                     application_name=CHECKER):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the storm's PostgreSQL did not answer within {timeout} s:\n{self.log()[-3000:]}")
                time.sleep(0.1)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def _shutdown(self, sig: int, timeout: float) -> None:
        """Signal the postmaster (SIGINT: fast shutdown, every connection cut; SIGQUIT: immediate) and wait
        for it to exit; SIGKILL after `timeout`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.kill(self.proc.pid, sig)
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # A postmaster killed outright leaves its backends: they exit when they notice (the
            # postmaster's death pipe), at the latest at their next query.
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass

    def restart(self) -> float:
        """Fast shutdown (every connection cut), then start again; returns when it answers."""
        self._shutdown(signal.SIGINT, timeout=60)
        self._launch()
        return time.time()

    def create_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(host=self.host, port=self.port, user=USER, dbname="postgres", autocommit=True,
                             application_name=CHECKER) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

    def terminate_backends(self, database: str) -> int:
        """Cut every connection to `database` (web's, the workers', beat's, the webhook worker's) but the
        storm's own (application_name CHECKER); returns how many were cut."""
        import psycopg

        with psycopg.connect(host=self.host, port=self.port, user=USER, dbname="postgres", autocommit=True,
                             application_name=CHECKER, connect_timeout=3) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                "AND pid <> pg_backend_pid() AND application_name IS DISTINCT FROM %s",
                (database, CHECKER)).fetchall()
        return sum(1 for (cut,) in rows if cut)

    def stop(self) -> None:
        """Shut the server down by its PID and remove its directory (idempotent; also at exit)."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self._shutdown(signal.SIGQUIT, timeout=15)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
            atexit.unregister(self.stop)
