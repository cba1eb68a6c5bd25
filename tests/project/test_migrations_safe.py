"""Migrations that are safe while the release before serves (docs/operating.md, "Migrations: expand, then
contract"): django-migration-linter over every migration this checkout has and the previous release
(deploy/previous-release) did not, committed or not. A backward-incompatible operation (a column or table
dropped or renamed, a NOT NULL column the old code does not fill, a column's type altered, a unique
constraint added) or one that locks an existing table while it works (an index built or dropped without
CONCURRENTLY, a CHECK constraint added without NOT VALID) fails, naming the migration and the problem,
unless the migration carries a deliberate exception: `linter_exceptions = {"<check>": "<why it is safe>"}`
on its Migration class.

The planted migrations below, in an app of the test's own under a temporary directory, are each of those
kinds: the linter must fail on every one, and pass the expand-then-contract way of doing the same."""

import contextlib
import importlib
import io
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.conf import settings
from django.db.migrations.loader import MigrationLoader
from django.test import override_settings
from django_migration_linter import IgnoreMigration, MigrationLinter
from django_migration_linter.constants import DJANGO_APPS_WITH_MIGRATIONS
from django_migration_linter.sql_analyser import PostgresqlAnalyser
from django_migration_linter.sql_analyser.base import Check, CheckMode, CheckType

from tests.support.previous_release import Release, previous
from tests.support.procs import REPO_ROOT

# The linter's own warnings that fail here: each holds a lock on a table the serving release uses for as
# long as the statement runs. Its other warnings (a data migration without a reverse, a model variable
# named unlike its model) are style, and rolling back a release redeploys the old code without migrating
# backwards.
LOCKING = ["CREATE_INDEX", "CREATE_INDEX_EXCLUSIVE", "DROP_INDEX", "REINDEX"]
# The codes of the linter's checks of data migrations (RunPython and RunSQL), which are not in its
# analyser's table.
DATA_MIGRATION_CHECKS = {"RUNPYTHON_REVERSIBLE", "RUNPYTHON_ARGS_NAMING_CONVENTION", "RUNPYTHON_MODEL_IMPORT",
                         "RUNPYTHON_MODEL_VARIABLE_NAME", "RUNSQL_REVERSIBLE"}
EXCEPTIONS = "linter_exceptions"
INSTALLED = Path(sys.prefix).resolve()  # the virtualenv: make install puts it in the checkout (.venv)


def _check_scans_existing_rows(sql_statements: list[str], **kwargs) -> bool:
    """ALTER TABLE ... ADD CONSTRAINT ... CHECK without NOT VALID on a table this migration did not create:
    PostgreSQL reads every row under an ACCESS EXCLUSIVE lock."""
    for sql in sql_statements:
        added = re.search(r"ALTER TABLE (\S+) ADD CONSTRAINT \S+ CHECK", sql)
        if added and "NOT VALID" not in sql and not any(
                earlier.startswith(f"CREATE TABLE {added[1]}") for earlier in sql_statements):
            return True
    return False


def _adds_unique(sql_statements: list[str], **kwargs) -> bool:
    """The linter's ADD_UNIQUE, which also sees a unique index on a table named without quotes (as a
    hand-written RunSQL names it): its own looks only for a quoted name."""
    for sql in sql_statements:
        added = (re.search(r"ALTER TABLE (\S+) ADD CONSTRAINT .* UNIQUE", sql)
                 or re.search(r"CREATE UNIQUE INDEX .*ON (?:ONLY )?(\S+)", sql))
        if added and not any(earlier.startswith(f"CREATE TABLE {added[1]}") for earlier in sql_statements):
            return True
    return False


class PayonceAnalyser(PostgresqlAnalyser):
    """The linter's PostgreSQL checks, one of them widened (ADD_UNIQUE), and one it lacks: a CHECK
    constraint validated as it is added."""
    migration_checks = [*PostgresqlAnalyser.migration_checks, Check(
        code="ADD_UNIQUE",
        fn=_adds_unique,
        message="ADDING unique constraint",
        mode=CheckMode.TRANSACTION,
        type=CheckType.ERROR,
    ), Check(
        code="ADD_CHECK_CONSTRAINT",
        fn=_check_scans_existing_rows,
        message="ADD CONSTRAINT ... CHECK reads every row under the table's lock: add it NOT VALID, "
                "then VALIDATE CONSTRAINT in a migration of its own",
        mode=CheckMode.TRANSACTION,
        type=CheckType.ERROR,
    )]


KNOWN_CHECKS = {check.code for check in PayonceAnalyser(None).migration_checks} | DATA_MIGRATION_CHECKS


def lint(keys: list[tuple[str, str]]) -> tuple[int, list[str]]:
    """Lints the migrations named (app label, name): how many it judged, and one line per failing
    migration naming it and each problem (the linter's own words)."""
    linter = MigrationLinter(warnings_as_errors_tests=LOCKING, no_cache=True)
    # The analyser is chosen from a fixed table in the linter's constructor; ours adds one check to it.
    linter.sql_analyser_class = PayonceAnalyser
    failures, refused = [], 0
    for key in keys:
        migration = linter.migration_loader.disk_migrations[key]
        label = ".".join(key)
        exceptions = getattr(migration, EXCEPTIONS, {})
        malformed = _malformed(exceptions)
        if malformed:
            failures.append(f"{label}: {EXCEPTIONS} {malformed}")
            refused += 1
            continue
        if any(isinstance(operation, IgnoreMigration) for operation in migration.operations):
            # It would silence every check, and migrate would need the linter (a test package) installed
            # in production to import the migration.
            failures.append(f"{label}: uses IgnoreMigration; name the checks in {EXCEPTIONS} instead")
            refused += 1
            continue
        linter.exclude_migration_tests = list(exceptions)  # this migration's exceptions, none other's
        erroneous, said = linter.nb_erroneous, io.StringIO()
        with contextlib.redirect_stdout(said):
            linter.lint_migration(migration)
        if linter.nb_erroneous > erroneous:
            problems = [line.strip() for line in said.getvalue().splitlines() if line.startswith("\t")]
            failures.append(f"{label}: " + "; ".join(problems))
    return linter.nb_total + refused, failures


def _malformed(exceptions) -> str | None:
    if not isinstance(exceptions, dict):
        return f"is a {type(exceptions).__name__}, not a dict of check -> why it is safe"
    unknown = sorted(set(exceptions) - KNOWN_CHECKS)
    if unknown:
        return f"names checks the linter does not have: {unknown} (it has {sorted(KNOWN_CHECKS)})"
    unexplained = sorted(code for code, why in exceptions.items() if not (isinstance(why, str) and why.strip()))
    if unexplained:
        return f"says nothing of why {unexplained} is safe"
    return None


def new_since(release: Release) -> list[tuple[str, str]]:
    """The migrations of this checkout's apps on disk (committed or not) whose file the release did not
    have."""
    loader, released, new = MigrationLoader(None, ignore_no_migrations=True), {}, []
    for key, migration in loader.disk_migrations.items():
        path = Path(sys.modules[migration.__module__].__file__).resolve()
        if (key[0] in DJANGO_APPS_WITH_MIGRATIONS or not path.is_relative_to(REPO_ROOT)
                or path.is_relative_to(INSTALLED)):
            continue  # Django's apps and installed packages (the virtualenv may be inside the checkout): not ours
        folder = str(path.parent.relative_to(REPO_ROOT))
        if folder not in released:
            released[folder] = set(release.files(folder))
        if str(path.relative_to(REPO_ROOT)) not in released[folder]:
            new.append(key)
    return sorted(new)


@pytest.mark.django_db  # the linter's loader reads which migrations are applied
def test_every_migration_since_the_previous_release_is_safe_while_it_serves():
    release = previous()
    since = new_since(release)
    judged, failures = lint(since)
    assert judged == len(since)
    assert not failures, (
        f"migrations since {release.version} that break {release.version} while it serves, or lock its tables "
        "(docs/operating.md, 'Migrations: expand, then contract'; a deliberate exception is "
        f"`{EXCEPTIONS} = {{'<check>': '<why it is safe>'}}` on the Migration):\n" + "\n".join(failures))


def test_a_migration_the_release_did_not_have_is_linted():
    # Given a release just before jobs 0012 was added (it came in 0.41.0)
    added = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--",
                            "jobs/migrations/0012_fair_dispatch_first_start.py"],
                           cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.split()[-1]
    before = Release("before jobs 0012", f"{added}^")
    # then it is among the migrations since, and jobs 0011, which that release had, is not
    since = new_since(before)
    assert ("jobs", "0012_fair_dispatch_first_start") in since
    assert ("jobs", "0011_fair_dispatch") not in since


# The planted app: one table, created by its first migration, which every planted migration follows.
INITIAL = """
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    operations = [migrations.CreateModel("Ledger", [
        ("id", models.BigAutoField(primary_key=True)),
        ("amount", models.IntegerField()),
        ("note", models.TextField(null=True)),
    ])]
"""

PLANTED_HEAD = """
from django.db import migrations, models
from django.contrib.postgres.operations import AddIndexConcurrently
from django_migration_linter import IgnoreMigration


class Migration(migrations.Migration):
    dependencies = [("planted", "0001_initial")]
"""


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """Writes a migration (the body of its Migration class) into the planted app and lints it."""
    app = tmp_path / "planted"
    (app / "migrations").mkdir(parents=True)
    (app / "__init__.py").write_text("")
    (app / "migrations" / "__init__.py").write_text("")
    (app / "migrations" / "0001_initial.py").write_text(INITIAL)
    monkeypatch.syspath_prepend(str(tmp_path))

    def plant(body: str) -> list[str]:
        body = textwrap.indent(textwrap.dedent(body), "    ")
        (app / "migrations" / "0002_planted.py").write_text(PLANTED_HEAD + body)
        importlib.invalidate_caches()
        judged, failures = lint([("planted", "0002_planted")])
        assert judged == 1
        return failures

    with override_settings(INSTALLED_APPS=[*settings.INSTALLED_APPS, "planted"]):
        yield plant
    for module in [name for name in sys.modules if name == "planted" or name.startswith("planted.")]:
        del sys.modules[module]  # the next test's planted app is another directory


UNSAFE = {
    "dropped column": ('operations = [migrations.RemoveField("ledger", "note")]',
                       "DROPPING columns (table: planted_ledger, column: note)"),
    "NOT NULL column without a default": (
        'operations = [migrations.AddField("ledger", "currency", models.CharField(max_length=3))]',
        "NOT NULL constraint on columns"),
    # makemigrations' way: the default fills the rows there are, then is dropped; the old code's INSERT
    # names no currency and fails.
    "NOT NULL column with a Python default only": (
        'operations = [migrations.AddField("ledger", "currency", models.CharField(max_length=3, default="EUR"))]',
        "NOT NULL constraint on columns"),
    # The contract step of a new column: PostgreSQL reads every row under the table's lock, and the
    # linter cannot know that every row is filled (an exception says so).
    "NOT NULL set on an existing column": (
        'operations = [migrations.AlterField("ledger", "note", models.TextField())]',
        "NOT NULL constraint on columns"),
    # Concurrently or not, the old code may write what the new constraint refuses (an exception says why
    # it cannot).
    "unique index built concurrently": (
        'atomic = False\n'
        'operations = [migrations.RunSQL(\n'
        '    "CREATE UNIQUE INDEX CONCURRENTLY planted_amount ON planted_ledger (amount)",\n'
        '    "DROP INDEX CONCURRENTLY planted_amount")]',
        "ADDING unique constraint"),
    "unique constraint": (
        'operations = [migrations.AddConstraint("ledger", models.UniqueConstraint('
        'fields=["amount"], name="planted_amount_unique"))]',
        "ADDING unique constraint"),
    "renamed column": ('operations = [migrations.RenameField("ledger", "note", "memo")]',
                       "RENAMING columns (table: planted_ledger, column: note)"),
    "renamed table": ('operations = [migrations.AlterModelTable("ledger", "planted_book")]',
                      "RENAMING tables (table: planted_ledger)"),
    "dropped table": ('operations = [migrations.DeleteModel("ledger")]', "DROPPING table (table: planted_ledger)"),
    "altered type": ('operations = [migrations.AlterField("ledger", "amount", models.BigIntegerField())]',
                     "ALTERING columns"),
    "non-concurrent index on an existing table": (
        'operations = [migrations.AddIndex("ledger", models.Index(fields=["amount"], name="planted_amount"))]',
        "CREATE INDEX locks table"),
    "check constraint validated as it is added": (
        'operations = [migrations.AddConstraint("ledger", models.CheckConstraint('
        'condition=models.Q(amount__gte=0), name="planted_amount_not_negative"))]',
        "ADD CONSTRAINT ... CHECK reads every row"),
    "exception with no reason": (
        'linter_exceptions = {"DROP_COLUMN": " "}\noperations = [migrations.RemoveField("ledger", "note")]',
        "says nothing of why ['DROP_COLUMN'] is safe"),
    "exception naming no check the linter has": (
        'linter_exceptions = {"DROP_COLUMNS": "typo"}\noperations = [migrations.RemoveField("ledger", "note")]',
        "names checks the linter does not have: ['DROP_COLUMNS']"),
    "exception for another check": (
        'linter_exceptions = {"RENAME_COLUMN": "not this one"}\n'
        'operations = [migrations.RemoveField("ledger", "note")]',
        "DROPPING columns"),
    "IgnoreMigration": ('operations = [IgnoreMigration(), migrations.RemoveField("ledger", "note")]',
                        "uses IgnoreMigration"),
}


@pytest.mark.django_db
@pytest.mark.parametrize("kind", UNSAFE)
def test_an_unsafe_migration_fails_the_linter(planted, kind):
    body, problem = UNSAFE[kind]
    failures = planted(body)
    assert len(failures) == 1 and failures[0].startswith("planted.0002_planted: "), failures
    assert problem in failures[0], failures


SAFE = {
    "nullable column": (
        'operations = [migrations.AddField("ledger", "currency", models.CharField(max_length=3, null=True))]'),
    "NOT NULL column with a database default": (
        'operations = [migrations.AddField("ledger", "currency", models.CharField(max_length=3, db_default="EUR"))]'),
    "concurrent index in a non-atomic migration": (
        'atomic = False\n'
        'operations = [AddIndexConcurrently("ledger", models.Index(fields=["amount"], name="planted_amount"))]'),
    "check constraint NOT VALID, validated later": """
        operations = [migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(
                "ALTER TABLE planted_ledger ADD CONSTRAINT planted_amount_not_negative CHECK (amount >= 0) NOT VALID",
                "ALTER TABLE planted_ledger DROP CONSTRAINT planted_amount_not_negative")],
            state_operations=[migrations.AddConstraint("ledger", models.CheckConstraint(
                condition=models.Q(amount__gte=0), name="planted_amount_not_negative"))])]
        """,
    "NOT NULL set with a deliberate exception": """
        linter_exceptions = {
            "NOT_NULL": "0.41.0 writes a note on every row, and 0042_fill_notes filled the rows before it",
        }
        operations = [migrations.AlterField("ledger", "note", models.TextField())]
        """,
    "dropped column with a deliberate exception": """
        linter_exceptions = {
            "DROP_COLUMN": "Ledger.note left the model in the release before, and no released code reads it",
        }
        operations = [migrations.RemoveField("ledger", "note")]
        """,
}


@pytest.mark.parametrize("kind", [
    # sqlmigrate refuses to render a concurrent index inside a transaction, which django_db's rollback is
    pytest.param(kind, marks=pytest.mark.django_db(transaction="concurrent" in kind)) for kind in SAFE])
def test_a_safe_migration_passes_the_linter(planted, kind):
    assert planted(SAFE[kind]) == []
