"""Strings where types belong: a model's kind is compared with executor.models.ModelKind, never with its
value written out ("text"), so a kind renamed or misspelt fails at import instead of silently taking
the other branch. An `ast` walk of every app module."""

import ast
from pathlib import Path

from executor.models import ModelKind

REPO_ROOT = Path(__file__).resolve().parents[2]
APPS = ("operators", "orders", "jobs", "executor", "webhooks", "billing", "config")


def _kind(node) -> bool:
    return ((isinstance(node, ast.Name) and node.id == "kind")
            or (isinstance(node, ast.Attribute) and node.attr == "kind"))


def kinds_compared_with_strings(source: str) -> list[int]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_kind(side) for side in sides) and any(
                    isinstance(side, ast.Constant) and side.value in ModelKind.values for side in sides):
                found.append(node.lineno)
    return found


def test_no_model_kind_is_compared_with_a_string():
    modules = sorted(path for app in APPS for path in (REPO_ROOT / app).rglob("*.py"))
    assert len(modules) > 100  # the walk found the apps
    assert [f"{path.relative_to(REPO_ROOT)}:{line}" for path in modules
            for line in kinds_compared_with_strings(path.read_text())] == []


def test_the_walk_finds_a_planted_comparison():
    assert kinds_compared_with_strings('if spec.kind == "text":\n    pass\nok = kind != ModelKind.TEXT\n') == [1]
