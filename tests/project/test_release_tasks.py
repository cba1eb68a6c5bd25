"""A release's messages are ones the release before can run, and the other way round.

In a rolling deploy, and again in a rollback, workers of two releases consume one queue (docs/operating.md,
"Upgrading with jobs in flight"): a message the new code sends may be taken by an old worker, and one the old code sent by a
new worker. So between two releases a task keeps its name and its parameters (names, order, which have a
default). A change is made over two releases: the new form is added, accepted beside the old, in one
release and first sent in the next. Each deliberate exception is written here, with why it is safe.

Each release's tasks are read from its own code: the previous release's from its checkout
(tests/support/previous_release.py), each in a Python process of its own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e  # each release's tasks are read by a Python process of its own

from tests.support import previous_release
from tests.support.procs import REPO_ROOT, payonce_env

# Task name -> why a change of its parameters (or its being new or gone) is safe for this release pair.
EXCEPTIONS: dict[str, str] = {}

DUMP = """
import inspect, json, django
django.setup()
from config.celery import app
app.loader.import_default_modules()
print(json.dumps({
    name: [[p.name, p.kind.name, p.default is not inspect.Parameter.empty]
           for p in inspect.signature(task.run).parameters.values()]
    for name, task in sorted(app.tasks.items()) if not name.startswith("celery.")
}))
"""


def tasks(root) -> dict[str, list]:
    """Every task a release registers, with its parameters: [name, kind, has a default]."""
    run = subprocess.run([sys.executable, "-c", DUMP], cwd=root, env=payonce_env(), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def both():
    return tasks(previous_release.worktree()), tasks(REPO_ROOT)


def test_every_task_of_either_release_is_known_to_the_other(both):
    before, now = both
    gone = sorted(set(before) - set(now) - set(EXCEPTIONS))  # old messages still queued would be given back forever
    new = sorted(set(now) - set(before) - set(EXCEPTIONS))  # an old worker would give these back until upgraded
    assert not gone, f"tasks of {previous_release.previous().version} this release no longer has: {gone}"
    assert not new, (f"tasks {previous_release.previous().version} does not know: {new}. Register a new task "
                     "one release before anything sends it (or name it in EXCEPTIONS with why that is safe)")


def test_every_task_keeps_its_parameters(both):
    before, now = both
    changed = {name: (before[name], now[name]) for name in set(before) & set(now)
               if before[name] != now[name] and name not in EXCEPTIONS}
    assert not changed, ("a task's parameters changed between releases (previous, now): a message of one "
                         f"release would fail on the other's worker: {changed}")


def test_a_changed_task_is_caught(both):
    """The comparison is not vacuous: a parameter added without a default to a real task is found."""
    before, now = both
    planted = {**now, "jobs.run_stage": [*now["jobs.run_stage"], ["priority", "POSITIONAL_OR_KEYWORD", False]]}
    assert [name for name in set(before) & set(planted) if before[name] != planted[name]] == ["jobs.run_stage"]
    assert {"jobs.run_stage", "jobs.start_next", "webhooks.deliver", "jobs.sweep"} <= set(before)
