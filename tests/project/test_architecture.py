"""The apps form a one-way stack (docs/architecture.md): an app imports only the apps below it, the one
port of an upper app a lower one may import is the runner's vocabulary (jobs/outcomes.py, which imports
nothing of payonce's), and an import inside a function says on its line why it is there. An `ast` walk of
every module of every app, migrations included."""

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# app -> the apps it may import (besides itself). Drawn in docs/architecture.md.
STACK = {
    "operators": {"orders", "jobs", "executor", "webhooks", "billing", "config"},
    "orders": {"jobs", "executor", "webhooks", "billing", "config"},
    "jobs": {"executor", "webhooks", "billing", "config"},
    "executor": {"billing", "config", "sandbox"},  # its sandbox adapter knows the simulator's constants
    "webhooks": {"config"},
    "billing": {"config"},
    "config": set(),
}
# Modules of an upper app that a lower app may import: each imports nothing of payonce's, so no cycle
# can pass through it.
PORTS = {"jobs.outcomes"}
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
                # `from jobs import outcomes` imports the module jobs.outcomes
                names = [f"{child.module}.{alias.name}" if child.module in OURS else child.module
                         for alias in child.names]
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
    assert arrows_back(executor, "from jobs.outcomes import StepRetry\nfrom jobs import outcomes\n") == []
    assert arrows_back(executor, "from jobs import services\n") == ["executor/attempts.py:1 imports jobs.services"]


def test_no_invariant_is_an_assert_statement():
    # `python -O` removes assert statements: an invariant of the apps is an explicit raise.
    modules = app_modules() + sorted((REPO_ROOT / "sandbox").rglob("*.py"))
    found = [f"{path.relative_to(REPO_ROOT)}:{node.lineno}" for path in modules
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Assert)]
    assert found == []
