"""payonce's code run as real subprocesses on the test database: a snippet under the real settings, a
management command as an operator runs it, and what a child needs to take Ctrl-C as from a terminal."""

import signal
import subprocess
import sys
import textwrap

from tests.support.procs import REPO_ROOT, process_env


def run_django(code: str, **env) -> subprocess.CompletedProcess:
    """`code` in a fresh process with payonce's real settings (config.settings) and this test's database."""
    environ = process_env(**env)
    environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    script = "import django\ndjango.setup()\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=environ, capture_output=True,
                          text=True, timeout=60)


def manage(*args, timeout: float = 120, **env) -> subprocess.CompletedProcess:
    """`.venv/bin/python manage.py ...` on the test database, as an operator runs it (stdout is a pipe)."""
    return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO_ROOT, env=process_env(**env),
                          capture_output=True, text=True, timeout=timeout)


def ctrl_c_as_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
