"""Releases that can be named (CHANGELOG.md): one version for the server and both client libraries, the
changelog's newest entry that version, the release before it named with its commit, and every answer of the
real web process naming the version (config.version), the probes' and a refused body's included."""

import json
import re
from pathlib import Path

import pytest
import requests

import payonce
from tests.support import previous_release
from tests.support.procs import REPO_ROOT

ROOT = Path(REPO_ROOT)


def _found(path: str, pattern: str) -> str:
    match = re.search(pattern, (ROOT / path).read_text(), re.MULTILINE)
    assert match, f"{path}: no version ({pattern})"
    return match.group(1)


def test_the_server_and_both_client_libraries_carry_one_version():
    assert re.fullmatch(r"\d+\.\d+\.\d+", payonce.__version__)
    assert {
        "clients/python/payonce_client/_version.py": _found("clients/python/payonce_client/_version.py",
                                                            r'^__version__ = "([^"]+)"'),
        "clients/python/pyproject.toml": _found("clients/python/pyproject.toml", r'^version = "([^"]+)"'),
        "clients/typescript/package.json": json.loads((ROOT / "clients/typescript/package.json").read_text())["version"],
        "clients/typescript/src/version.ts": _found("clients/typescript/src/version.ts",
                                                    r'^export const VERSION = "([^"]+)"'),
    } == dict.fromkeys(["clients/python/payonce_client/_version.py", "clients/python/pyproject.toml",
                        "clients/typescript/package.json", "clients/typescript/src/version.ts"],
                       payonce.__version__)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_the_changelog_leads_with_this_version_and_names_the_release_before():
    releases = re.findall(r"^## (\d+\.\d+\.\d+)", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert releases and releases[0] == payonce.__version__, releases
    assert releases == sorted(releases, key=_version, reverse=True)  # newest first, each once
    assert len(set(releases)) == len(releases)
    lines = previous_release.named()
    assert len(lines) == 1, lines
    version, commit = lines[0].split()
    assert re.fullmatch(r"[0-9a-f]{40}", commit)
    assert version in releases[1:] and _version(version) < _version(payonce.__version__)


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_every_answer_of_the_web_process_names_the_version(web_stack):
    answers = [
        requests.get(f"{web_stack.url}/healthz", timeout=10),  # a probe, in front of Django
        requests.get(f"{web_stack.url}/v1/whoami", timeout=10),  # refused: no key
        requests.get(f"{web_stack.url}/v1/schema", timeout=10),
        requests.post(f"{web_stack.url}/v1/jobs", data=b"x" * (1 << 20), timeout=10,  # refused before Django
                      headers={"Content-Type": "application/json", "Authorization": "Bearer nope.nope"}),
    ]
    assert [answer.status_code for answer in answers] == [200, 401, 200, 413]
    assert {answer.headers.get("Payonce-Version") for answer in answers} == {payonce.__version__}
