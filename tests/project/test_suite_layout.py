"""The suite's own layout rules (docs/testing.md, "Running in parallel"): a test module imports no other
test module (a helper two modules share lives in tests/support/), and no test names a Redis database by
a literal address (tests.support.redis_server.url(db) does, so parallel workers never share one)."""

import re

from tests.support.procs import REPO_ROOT

TESTS = REPO_ROOT / "tests"
IMPORTS_A_TEST_MODULE = re.compile(r"^\s*(?:from|import)\s+tests\.[\w.]*\btest_\w+", re.M)
LOCAL_REDIS = re.compile(r"redis://127\.0\.0\.1:6379\b")
# Text only, never connected to: the log redaction tests' sample settings.
MAY_NAME_THE_MACHINES_REDIS = {"tests/config/test_logs.py"}


def python_files():
    for path in sorted(TESTS.rglob("*.py")):
        yield str(path.relative_to(REPO_ROOT)), path.read_text()


def test_no_test_module_imports_another():
    importing = [name for name, text in python_files() if IMPORTS_A_TEST_MODULE.search(text)]
    assert importing == [], f"move the shared helper into tests/support/: {importing}"


def test_no_test_names_a_redis_database_by_its_address():
    literal = [name for name, text in python_files()
               if name not in MAY_NAME_THE_MACHINES_REDIS and LOCAL_REDIS.search(text)]
    assert literal == [], f"use tests.support.redis_server.url(db): {literal}"
