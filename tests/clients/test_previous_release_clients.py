"""No client broken by a release (issue 42): the previous release's client libraries (deploy/previous-release,
checked out by tests/support/previous_release.py) pass their own integration tests against this checkout's
server, started by this checkout's fixtures.

TypeScript: the old package is built in its checkout and its test/integration run there, exactly as this
release's are (tests/support/typescript_client.py).

Python: the old release's tests/clients/test_python_client.py, read from git, runs in a pytest of its own
with the old `payonce_client` first on PYTHONPATH. The old module is copied into tests/clients/
previous_release/ (ignored by git) rather than run from the old checkout, so that THIS checkout's
tests/conftest.py and tests/clients/conftest.py set it up: the web, worker, webhooks and sandbox processes
they start are this release's code, which is what is on trial. The copy's name does not start with `test_`,
so the suite never collects it by itself (the inner pytest is handed its path), and it is removed after
the run. The inner pytest has a test database of its own (`<this one's>_previous_client`) and, named as an
xdist worker of its own, a private Redis (tests/support/redis_server.py), so it shares nothing with this
run. The venv holds this checkout's client as an editable install (a path in a .pth, after PYTHONPATH):
that the old package is the one imported is checked, not assumed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings

from tests.support.previous_release import previous, worktree
from tests.support.procs import REPO_ROOT, per_worker
from tests.support.typescript_client import run_against_stack

# alone: each starts a whole stack and runs a release's client suite against it (minutes of two cores), which
# made timing-sensitive tests beside it fail on a machine at half speed.
pytestmark = [pytest.mark.e2e, pytest.mark.alone]

COPIES = Path(REPO_ROOT) / "tests" / "clients" / "previous_release"
INNER_TIMEOUT_S = 900
# What the caller set for this run that would steer the inner one into this run's services or tests.
NOT_PASSED_ON = ("PYTEST_ADDOPTS", "TEST_SANDBOX_PORT", "TEST_WEB_BROKER_URL", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT",
                 "PYTEST_CURRENT_TEST")


@pytest.mark.django_db(transaction=True)
def test_the_previous_typescript_clients_integration_tests_pass_against_this_server(account, ledger, flaky_proxy,
                                                                                      hooks):
    package = worktree() / "clients" / "typescript"

    run_against_stack(package, ["npx", "vitest", "run", "test/integration"], account=account, ledger=ledger,
                      flaky_proxy=flaky_proxy, hooks=hooks)


def test_the_previous_python_clients_integration_tests_pass_against_this_server():
    release = previous()
    client = worktree() / "clients" / "python"
    env = inner_environment(client)
    imported = subprocess.run([sys.executable, "-c", "import payonce_client; print(payonce_client.__file__)"],
                              cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=True)
    assert Path(imported.stdout.strip()).resolve().is_relative_to(client.resolve()), (
        f"the inner pytest would import payonce_client from {imported.stdout.strip()}, not from the previous "
        f"release's {client}: something on sys.path comes before PYTHONPATH")

    COPIES.mkdir(exist_ok=True)
    (COPIES / "__init__.py").touch()
    copy = COPIES / f"python_client_{release.version.replace('.', '_')}_{per_worker('serial')}.py"
    copy.write_text(release.show("tests/clients/test_python_client.py"))
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "--ds=tests.settings", "-p", "no:cacheprovider",
                               "-q", str(copy.relative_to(REPO_ROOT))],
                              cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=INNER_TIMEOUT_S)
    finally:
        copy.unlink(missing_ok=True)
    print(done.stdout[-4000:])
    if done.returncode != 0:
        pytest.fail(f"the Python client of {release.version} ({release.commit[:7]}) fails its own integration "
                    f"tests against this server (exit {done.returncode}):\n{done.stdout[-12000:]}\n"
                    f"{done.stderr[-4000:]}", pytrace=False)


def inner_environment(client: Path) -> dict:
    env = {name: value for name, value in os.environ.items() if name not in NOT_PASSED_ON}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(client), os.environ.get("PYTHONPATH")]))
    database = urlsplit(settings.DATABASE_URL)
    env["DATABASE_URL"] = urlunsplit(database._replace(
        path=f"{per_worker(database.path.lstrip('/'))}_previous_client"))
    env["PYTEST_XDIST_WORKER"] = f"{per_worker('serial')}_previous_client"  # its own Redis server
    return env
