"""The upgrade storm's small seeded case, on every `make test`: 50 paid jobs from three clients while
the stack moves from the previous release's code to this checkout's, rolls its workers back and forward
again (tests/chaos/upgrade.py). `make chaos-upgrade` runs the long one."""

import os
import subprocess
import sys

import pytest

from tests.support import redis_server
from tests.support.procs import REPO_ROOT

# alone: the storm loads the machine and times its steps, which other tests' load would skew.
pytestmark = [pytest.mark.e2e, pytest.mark.storm, pytest.mark.alone]

SEED, JOBS = 1, 50
# The jobs go out over 70 s, not the long storm's 90 or more: the ten steps still meet jobs in flight, and
# the case stays near 3 minutes (223 s with 90 s, on a machine at half speed).
SUBMIT_S = 70


def test_an_upgrade_and_a_rollback_mid_storm_lose_nothing_pay_once_and_answer_no_5xx():
    print(f"upgrade: CHAOS_SEED={SEED} jobs={JOBS}", flush=True)
    run = subprocess.run(
        [sys.executable, "-m", "tests.chaos.upgrade", "--seed", str(SEED), "--jobs", str(JOBS), "--submit-s", str(SUBMIT_S),
         "--database", "payonce_upgrade_ci", "--redis", redis_server.address(), "--redis-db", "4"],
        cwd=REPO_ROOT, env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"},
        capture_output=True, text=True, timeout=600,
    )
    print(run.stdout[-8000:], run.stderr[-4000:])
    assert run.returncode == 0, f"the upgrade storm with CHAOS_SEED={SEED} failed:\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
    assert "RESULT: PASS" in run.stdout and "UPGRADE: PASS" in run.stdout
    assert "10 steps of 10" in run.stdout
