"""The short storm, on every `make test` and so in CI: `python -m tests.chaos` with 100 jobs and a fresh
seed (printed, so a failure replays with `make chaos CHAOS_SEED=<seed> CHAOS_ARGS=--jobs=100`), on Redis,
with every fault of the long one: sandbox faults of every action, workers SIGKILLed at random and at the
dangerous moments, the broker flushed, PostgreSQL restarted, the sandbox crashed, the webhook worker
killed. It checks from the outside (tests/chaos/checks.py) and exits non-zero when any check fails.

Every seed that ever failed is listed in tests/chaos/pinned.py beside the regression test of its bug
(each bug has one, which runs in `make test`); `make chaos-pinned` replays those storms. They are not
replayed here: a storm is about a minute, and CI stays well under 15 minutes.
"""

import os
import random
import subprocess
import sys

import pytest
from django.db import connections

from tests.support.procs import REPO_ROOT

pytestmark = pytest.mark.e2e

def storm(seed: int, jobs: int) -> None:
    # The storm restarts PostgreSQL: this process's own connections would be cut under it.
    connections.close_all()
    print(f"chaos: CHAOS_SEED={seed}", flush=True)
    run = subprocess.run(
        [sys.executable, "-m", "tests.chaos", "--seed", str(seed), "--jobs", str(jobs),
         "--database", "payonce_chaos_ci", "--redis-db", "6"],
        cwd=REPO_ROOT, env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"},
        capture_output=True, text=True, timeout=600,
    )
    print(run.stdout[-8000:], run.stderr[-4000:])
    assert run.returncode == 0, f"the storm with CHAOS_SEED={seed} failed:\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
    assert "RESULT: PASS" in run.stdout


def test_a_short_storm_with_a_fresh_seed_loses_nothing_and_pays_once():
    storm(int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(10**6)), jobs=100)

