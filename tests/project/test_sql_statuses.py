"""Status strings in raw SQL come from the models' TextChoices, so the SQL and the ORM can never disagree
on what a state is called. This test reads the source of every app and fails on a status written by hand
into SQL; and it renders the SQL the modules build and checks that every quoted word in a status
comparison is a status that exists."""

import ast
import re
from pathlib import Path

from executor.models import AttemptState
from jobs.models import JobStatus, StepStatus
from webhooks.models import DeliveryStatus

ROOT = Path(__file__).resolve().parents[2]
APPS = ("jobs", "executor", "webhooks", "billing", "accounts", "config")
CHOICES = (JobStatus, StepStatus, AttemptState, DeliveryStatus)
STATUS_WORDS = {str(value) for choices in CHOICES for value in choices.values}
SQL = re.compile(r"\b(SELECT|UPDATE|INSERT|DELETE)\b")
QUOTED = re.compile(r"'([a-z_]+)'")
# `status = 'x'`, `state IN ('x', 'y')`: the comparisons a status takes part in.
COMPARED = re.compile(r"\b(?:status|state)\s*(?:=|<>|IN\s*\()\s*([^)\n]*)", re.IGNORECASE)


def sql_literals_in_source():
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL.search(node.value):
                    yield path, node.lineno, node.value


def test_no_status_is_written_by_hand_into_sql():
    offending = [
        f"{path.relative_to(ROOT)}:{line}: '{word}'"
        for path, line, text in sql_literals_in_source()
        for word in QUOTED.findall(text)
        if word in STATUS_WORDS
    ]
    assert offending == [], "write these from the TextChoices (f\"'{JobStatus.RUNNING}'\"):\n" + "\n".join(offending)


def test_every_status_the_built_sql_compares_with_exists():
    from executor import selectors as executor_selectors
    from jobs import selectors as jobs_selectors
    from jobs import services as jobs_services
    from jobs.engine import steps
    from webhooks import services as webhooks_services

    built = [
        jobs_services._FINISH_SQL, jobs_selectors._STUCK_SQL, executor_selectors.ATTEMPTS_JSON_SQL,
        steps._CLAIM_SQL, steps._LEASED_MARK_SQL, steps._FRESH_MARK_SQL, steps._END_FAILED_SQL, webhooks_services._CLAIM_TRIES_SQL,
    ]
    compared = {word for sql in built for clause in COMPARED.findall(sql) for word in QUOTED.findall(clause)}
    assert compared  # the check reads something
    assert compared <= STATUS_WORDS, compared - STATUS_WORDS
