"""The TypeScript client (clients/typescript, `@payonce/client`) against a real stack.

`npm run build`, then `npx vitest run` (its unit, type and integration tests) on the built package,
against a real stack, checked from the inside afterwards (tests/support/typescript_client.py, which runs
the previous release's package the same way).

And the drift checks: clients/openapi.json is what the code describes today, and src/schema.ts is what
openapi-typescript makes of it; each failure names the command that fixes it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import REPO_ROOT
from tests.support.typescript_client import node_ready, run, run_against_stack

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

ROOT = Path(REPO_ROOT)
TS_DIR = ROOT / "clients" / "typescript"
OPENAPI = ROOT / "clients" / "openapi.json"
SCHEMA_TS = TS_DIR / "src" / "schema.ts"
SPECTACULAR = ".venv/bin/python manage.py spectacular --format openapi-json --file clients/openapi.json"


def _spectacular(path: Path, hash_seed: str) -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "PYTHONHASHSEED": hash_seed}
    done = subprocess.run([sys.executable, "manage.py", "spectacular", "--format", "openapi-json", "--file", str(path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"manage.py spectacular failed:\n{done.stdout}\n{done.stderr}"


def test_openapi_document_is_current(tmp_path):
    """clients/openapi.json is what the code describes now, and generating it is deterministic."""
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    _spectacular(first, "1")
    _spectacular(second, "2")
    assert first.read_bytes() == second.read_bytes(), (
        "manage.py spectacular gives two different documents for the same code (ordering depends on hashing?): "
        "the drift check cannot compare them")
    assert OPENAPI.exists(), f"clients/openapi.json is missing: run `{SPECTACULAR}`"
    assert OPENAPI.read_bytes() == first.read_bytes(), (
        f"clients/openapi.json is not what the code describes: run `{SPECTACULAR}`, "
        "then `cd clients/typescript && npm run gen:types`")


def test_typescript_types_are_current(tmp_path):
    """src/schema.ts is what openapi-typescript makes of the document the code describes now."""
    node_ready(TS_DIR)
    document, types = tmp_path / "openapi.json", tmp_path / "schema.ts"
    _spectacular(document, "0")
    run(["node", "scripts/gen-types.mjs", str(document), str(types)], cwd=TS_DIR, timeout=60, what="openapi-typescript")
    assert SCHEMA_TS.exists() and SCHEMA_TS.read_text() == types.read_text(), (
        f"clients/typescript/src/schema.ts is not what openapi-typescript makes of the current document: run "
        f"`{SPECTACULAR}` and then `cd clients/typescript && npm run gen:types`")


# One xdist worker runs every test that runs `npm run build`: they all write clients/typescript/dist.
@pytest.mark.xdist_group("typescript-dist")
def test_typescript_client(account, ledger, flaky_proxy, hooks):
    run_against_stack(TS_DIR, ["npx", "vitest", "run"], account=account, ledger=ledger, flaky_proxy=flaky_proxy,
                      hooks=hooks)
