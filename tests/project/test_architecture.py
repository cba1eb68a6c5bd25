"""The apps form a one-way stack (docs/architecture.md): an app imports only the apps below it, the one
port of an upper app a lower one may import is the runner's vocabulary (jobs/engine/outcomes.py, which imports
nothing of payonce's), and an import inside a function says on its line why it is there. An `ast` walk of
every module of every app, migrations included.

The data follows the same stack: a foreign key, a migration's dependency and a table named in raw SQL each
point down the stack or within the app, but for the deliberate exceptions listed below, each with why."""

import ast
import re
from pathlib import Path

from django.apps import apps
from django.conf import settings
from django.db.migrations.loader import MigrationLoader

from sandbox import callbacks as sandbox_callbacks
from sandbox import catalog as sandbox_catalog

REPO_ROOT = Path(__file__).resolve().parents[2]

# app -> the apps it may import (besides itself). Drawn in docs/architecture.md.
STACK = {
    "operators": {"orders", "jobs", "executor", "webhooks", "billing", "accounts", "config"},
    "orders": {"jobs", "executor", "webhooks", "billing", "accounts", "config"},
    "jobs": {"executor", "webhooks", "billing", "accounts", "config"},
    "executor": {"billing", "accounts", "config"},
    "webhooks": {"accounts", "config"},
    "billing": {"accounts", "config"},
    "accounts": {"config"},
    "config": set(),
}
# Modules of an upper app that a lower app may import: each imports nothing of payonce's, so no cycle
# can pass through it.
PORTS = {"jobs.engine.outcomes"}
OURS = set(STACK) | {"sandbox"}


def imports(path: Path, source: str | None = None) -> list[tuple[str, int, bool, str]]:
    """(module imported, line, inside a function, the import's first source line) of every import of one
    of payonce's packages in the file."""
    source = source if source is not None else path.read_text()
    tree = ast.parse(source)
    lines = source.splitlines()
    found = []

    def walk(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                # `from jobs.engine import outcomes` imports the module jobs.engine.outcomes: from one of
                # payonce's packages, the names imported are taken for its modules
                package = child.module.split(".")[0] in OURS and (REPO_ROOT / child.module.replace(".", "/")).is_dir()
                names = [f"{child.module}.{alias.name}" if package else child.module for alias in child.names]
            else:
                names = []
            for name in names:
                if name.split(".")[0] in OURS:
                    found.append((name, child.lineno, in_function, lines[child.lineno - 1]))
            walk(child, inside)

    walk(tree, False)
    return found


def app_of(path: Path) -> str:
    return path.relative_to(REPO_ROOT).parts[0]


def module_of(path: Path) -> str:
    return ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__")


def arrows_back(path: Path, source: str | None = None) -> list[str]:
    """Every import in the file against the stack's direction, as `file:line imports module`."""
    app = app_of(path)
    wrong = []
    for name, line, _, _ in imports(path, source):
        other = name.split(".")[0]
        if other == app or other in STACK[app]:
            continue
        if any(name == port or name.startswith(port + ".") for port in PORTS):
            continue
        wrong.append(f"{path.relative_to(REPO_ROOT)}:{line} imports {name}")
    return wrong


def unexplained_inner_imports(path: Path, source: str | None = None) -> list[str]:
    """Imports of payonce's modules inside a function with no comment on their line saying why."""
    return [f"{path.relative_to(REPO_ROOT)}:{line} imports {name} inside a function, without a reason"
            for name, line, inside, text in imports(path, source) if inside and "#" not in text]


def app_modules() -> list[Path]:
    return sorted(path for app in STACK for path in (REPO_ROOT / app).rglob("*.py"))


def test_no_app_imports_an_app_above_it_or_beside_it():
    modules = app_modules()
    assert len(modules) > 100  # the walk found the apps
    assert [arrow for path in modules for arrow in arrows_back(path)] == []


def test_the_ports_handed_down_import_nothing_of_payonces():
    for port in PORTS:
        path = REPO_ROOT / (port.replace(".", "/") + ".py")
        assert imports(path) == [], f"{port} is imported from below: it may import none of payonce's modules"


def test_the_sandbox_imports_none_of_payonces_apps():
    # It stands for a provider outside payonce: what it knows of payonce is what a provider would.
    sandbox = sorted((REPO_ROOT / "sandbox").rglob("*.py"))
    assert sandbox and [f"{path}: {name}" for path in sandbox for name, *_ in imports(path)
                        if name.split(".")[0] != "sandbox"] == []


def test_an_import_inside_a_function_says_why_on_its_line():
    assert [line for path in app_modules() for line in unexplained_inner_imports(path)] == []


def test_the_walk_finds_an_arrow_back_and_an_unexplained_import_planted_in_a_module():
    # The checks above would pass on a walk that found nothing: this one plants each kind of fault.
    billing = REPO_ROOT / "billing" / "services.py"
    planted = "from jobs.models import Job\n\ndef f():\n    from executor import services\n    return services\n"
    assert arrows_back(billing, planted) == ["billing/services.py:1 imports jobs.models",
                                             "billing/services.py:4 imports executor.services"]
    assert unexplained_inner_imports(billing, planted) == [
        "billing/services.py:4 imports executor.services inside a function, without a reason"]
    executor = REPO_ROOT / "executor" / "attempts.py"
    assert arrows_back(executor, "from jobs.engine.outcomes import StepRetry\nfrom jobs.engine import outcomes\n") == []
    assert arrows_back(executor, "from jobs import services\n") == ["executor/attempts.py:1 imports jobs.services"]
    assert arrows_back(executor, "from jobs.engine import runner\n") == ["executor/attempts.py:1 imports jobs.engine.runner"]


def test_no_invariant_is_an_assert_statement():
    # `python -O` removes assert statements: an invariant of the apps is an explicit raise.
    modules = app_modules() + sorted((REPO_ROOT / "sandbox").rglob("*.py"))
    found = [f"{path.relative_to(REPO_ROOT)}:{node.lineno}" for path in modules
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Assert)]
    assert found == []


# --- The data: foreign keys, migrations and raw SQL point down the stack too ---------------------------


def points_down(app: str, other: str) -> bool:
    """Whether `app`'s rows, migrations or SQL may name `other`'s: its own, or an app below it. Apps
    outside payonce (Django's, the libraries') are below every app."""
    return other == app or other not in STACK or other in STACK[app]


# Foreign keys up the stack, each deliberate. The lower app names the model by its label and never
# imports it (the runner hands the executor and billing the job they work for); what the key buys is
# said beside it.
ALLOWED_UP_KEYS = {
    "executor.Attempt.job": "an attempt is paid for one job's step: the constraint keeps no attempt without its job,"
                            " and a job's answer embeds its attempts by it (executor.selectors.attempts_json_sql)",
    "billing.Reservation.job": "money held for one job: a key without a constraint (db_constraint=False), so the"
                               " ORM can join a job's reservations while the money outlives the job's row",
    "webhooks.Delivery.job": "a delivery reports one job's event: the constraint keeps no delivery without its job,"
                             " and the job's timeline lists its deliveries by it",
}


def foreign_keys() -> list[tuple[str, str]]:
    """(`app.Model.field`, `app.Model` it points at) of every foreign key, one-to-one and many-to-many
    field of payonce's models (a proxy's are its concrete model's, and are counted there)."""
    return [(f"{model._meta.label}.{field.name}", field.related_model._meta.label)
            for model in apps.get_models() if model._meta.app_label in STACK and not model._meta.proxy
            for field in model._meta.get_fields()
            if field.concrete and field.is_relation and field.related_model is not None]


def keys_up(keys) -> list[str]:
    """Every foreign key in `keys` (as foreign_keys() gives them) that points up the stack or beside it,
    unless listed in ALLOWED_UP_KEYS."""
    return [f"{field} -> {target}" for field, target in keys
            if not points_down(field.split(".")[0], target.split(".")[0]) and field not in ALLOWED_UP_KEYS]


# Migrations that depend on an app above or beside their own: history, as Django wrote it or as a move
# between apps needs it. A new one points down; a model moving between apps leaves a pair that name
# each other, listed here with the move.
_HELD_A_KEY_UP = "made while its app held a foreign key to jobs' rows (the client, then jobs', or a job)"
_MOVE = "a model's move between apps by state alone: the two halves of the move name each other"
ALLOWED_UP_MIGRATIONS = {
    ("billing", "0001_initial", "jobs"): _HELD_A_KEY_UP,
    ("billing", "0003_orders", "jobs"): _HELD_A_KEY_UP,
    ("billing", "0006_order_moves_to_orders", "orders"): _MOVE + " (billing's Order -> orders)",
    ("executor", "0001_initial", "jobs"): _HELD_A_KEY_UP,
    ("executor", "0002_attempt_invariants", "jobs"): _HELD_A_KEY_UP,
    ("executor", "0003_attempt_step", "jobs"): _HELD_A_KEY_UP,
    ("executor", "0005_attempt_expected_s", "jobs"): _HELD_A_KEY_UP,
    ("executor", "0009_attempt_spec", "jobs"): _HELD_A_KEY_UP,
    ("webhooks", "0001_initial", "jobs"): _HELD_A_KEY_UP,
    ("webhooks", "0002_delivery_outbox", "jobs"): _HELD_A_KEY_UP,
    ("webhooks", "0003_deliveries_tries_and_disabled_endpoints", "jobs"): _HELD_A_KEY_UP,
    ("jobs", "0007_operatoraction_moves_to_operators", "operators"): _MOVE + " (jobs' OperatorAction -> operators)",
    ("accounts", "0001_initial", "jobs"): _MOVE + " (jobs' Client and ClientAPIKey -> accounts): it takes the"
                                                  " tables jobs 0001 made",
    ("jobs", "0008_client_moves_to_accounts", "orders"): _MOVE + " (jobs' Client -> accounts): jobs lets go of the"
                                                                 " client once orders' key points at accounts'",
}


def migration_dependencies() -> list[tuple[str, str, str]]:
    """(app, migration, the app it depends on) of every dependency of payonce's migrations, read from the
    files (a swappable dependency, `__setting__`, is Django's and left out)."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    return [(app, name, dependency[0])
            for (app, name), migration in sorted(loader.disk_migrations.items()) if app in STACK
            for dependency in migration.dependencies if dependency[0] != "__setting__"]


def migrations_up(dependencies) -> list[str]:
    """Every dependency in `dependencies` (as migration_dependencies() gives them) on an app above or
    beside the migration's own, unless listed in ALLOWED_UP_MIGRATIONS."""
    return [f"{app}.{name} depends on {other}" for app, name, other in dependencies
            if not points_down(app, other) and (app, name, other) not in ALLOWED_UP_MIGRATIONS]


# Tables of another app read in our raw SQL on purpose, against the stack (a read down the stack needs no
# entry): (file, table) -> why. None today: the executor's attempts of many jobs (executor.selectors
# attempts_for) number the ids given (unnest) instead of reading jobs_job.
ALLOWED_CROSS_READS: dict[tuple[str, str], str] = {}


def table_owners() -> dict[str, str]:
    """{table: the app whose model it is} for every table of payonce's models, by the model's db_table
    (a moved model keeps its old table name: jobs_client is accounts')."""
    return {model._meta.db_table: model._meta.app_label
            for model in apps.get_models(include_auto_created=True) if model._meta.app_label in STACK}


_WORD = re.compile(r"\b[a-z][a-z0-9_]*\b")


def tables_named(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, table) of every table of payonce's named in a string of the file's code (an f-string's
    literal parts included; a docstring, or a string standing alone as a statement, is prose and left out)."""
    tree = ast.parse(source if source is not None else path.read_text())
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    owners = table_owners()
    return [(node.lineno, word) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
            for word in _WORD.findall(node.value) if word in owners]


def reads_across(path: Path, source: str | None = None) -> list[str]:
    """Every table in the file's SQL owned by an app above or beside the file's own, as `file:line names
    table, a table of app`, unless listed in ALLOWED_CROSS_READS."""
    app, owners, where = app_of(path), table_owners(), str(path.relative_to(REPO_ROOT))
    return [f"{where}:{line} names {table}, a table of {owners[table]}"
            for line, table in tables_named(path, source)
            if not points_down(app, owners[table]) and (where, table) not in ALLOWED_CROSS_READS]


def test_foreign_keys_point_down_the_stack():
    keys = foreign_keys()
    assert ("billing.BudgetMonth.client", "accounts.Client") in keys  # the walk found the keys
    assert keys_up(keys) == []
    # An allowed key that no longer exists is an entry to remove.
    assert set(ALLOWED_UP_KEYS) <= {field for field, _ in keys}


def test_migrations_depend_only_on_migrations_down_the_stack():
    dependencies = migration_dependencies()
    assert ("jobs", "0008_client_moves_to_accounts", "accounts") in dependencies
    assert migrations_up(dependencies) == []
    assert set(ALLOWED_UP_MIGRATIONS) <= set(dependencies)


def test_raw_sql_names_only_tables_of_the_app_or_below_it():
    modules = app_modules()
    assert ("billing/services.py", "jobs_client") in {(str(path.relative_to(REPO_ROOT)), table)
                                                      for path in modules for _, table in tables_named(path)}
    assert [read for path in modules for read in reads_across(path)] == []


def test_the_data_checks_find_a_key_a_migration_and_a_read_planted_up_the_stack():
    # As for imports: the checks above would pass on walks that found nothing. Each kind of fault planted.
    assert keys_up([("billing.Reservation.order", "orders.Order"), ("jobs.Job.client", "accounts.Client"),
                    ("executor.Attempt.job", "jobs.Job")]) == ["billing.Reservation.order -> orders.Order"]
    planted_migration = [("webhooks", "0007_planted", "executor"), ("webhooks", "0007_planted", "accounts"),
                         ("webhooks", "0007_planted", "contenttypes")]
    assert migrations_up(planted_migration) == ["webhooks.0007_planted depends on executor"]
    billing = REPO_ROOT / "billing" / "services.py"
    planted = ('"""Reads jobs_job in its docstring: prose."""\n'
               'SQL = "SELECT 1 FROM jobs_job j JOIN jobs_client c ON c.id = j.client_id"\n'
               'def f(t):\n    return f"UPDATE executor_attempt SET x = 1 WHERE {t}"\n')
    assert reads_across(billing, planted) == ["billing/services.py:2 names jobs_job, a table of jobs",
                                              "billing/services.py:4 names executor_attempt, a table of executor"]
    # The same reads from the top of the stack are reads down it.
    assert reads_across(REPO_ROOT / "operators" / "operations.py", planted) == []


def test_the_settings_copies_of_the_sandboxs_constants_are_the_sandboxs():
    # The executor imports nothing of the sandbox (STACK): it reads these two from settings, whose
    # defaults copy the sandbox's own constants.
    assert settings.SANDBOX_MAX_SIZE_BYTES == sandbox_catalog.MAX_SIZE_BYTES
    assert settings.SANDBOX_DEFAULT_CALLBACK_SECRET == sandbox_callbacks.DEFAULT_SECRET
