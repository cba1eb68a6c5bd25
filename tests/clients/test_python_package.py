"""clients/python installs as a package of its own: into a fresh virtualenv with plain `pip install`,
from the repository, with its dependencies from PyPI; and there, away from the repository's code, a
three-line first job runs against the real stack."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.support.procs import REPO_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

FIRST_JOB = textwrap.dedent("""
    from payonce_client import Payonce
    po = Payonce()  # PAYONCE_BASE_URL and PAYONCE_API_KEY
    print(po.jobs.wait(po.jobs.create(kind="media", models=["sandbox/video-keyed"], input={"prompt": "a lighthouse", "render_s": 0}).id).status)
""")


def run(command: list, **options) -> str:
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=300, **options)
    assert done.returncode == 0, f"{command} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def oldest_python() -> str:
    """The oldest Python the package says it takes (requires-python >=3.9) where this machine has one
    that runs (pyenv's, or on PATH: a pyenv shim may name a version it will not run), so that the claim
    is tried rather than assumed; else the suite's own Python."""
    found = [*sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python"))), shutil.which("python3.9")]
    for path in filter(None, found):
        check = subprocess.run([path, "-c", "import sys; assert sys.version_info[:2] == (3, 9)"],
                               check=False, capture_output=True, timeout=30)
        if check.returncode == 0:
            return path
    return sys.executable


def test_pip_install_into_a_fresh_venv_and_run_a_first_job(tmp_path, account):
    venv = tmp_path / "venv"
    run([oldest_python(), "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    run([python, "-m", "pip", "install", "--disable-pip-version-check", "-q", "./clients/python"], cwd=REPO_ROOT)

    # From tmp_path, so that nothing is imported from the repository by accident.
    where = run([python, "-c", "import pathlib, payonce_client; print(pathlib.Path(payonce_client.__file__).parent)"],
                cwd=tmp_path).strip()
    assert where.startswith(str(venv)) and "site-packages" in where
    assert (venv.joinpath(where).joinpath("py.typed")).is_file()

    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "PAYONCE_BASE_URL": account.url, "PAYONCE_API_KEY": account.api_key}
    assert run([python, "-c", FIRST_JOB], cwd=tmp_path, env=env).strip() == "succeeded"
