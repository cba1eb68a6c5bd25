"""The release before this one (deploy/previous-release): its version, its commit, and its code checked
out beside this one, for the release checks (tests/project/test_release_*.py, tests/chaos/upgrade.py).

The checkout is a `git worktree` of the commit under var/previous-release/<commit> (var/ is ignored by git and
outside pytest's testpaths), made once and shared by every pytest-xdist worker and storm behind a file lock.
It runs on this checkout's virtualenv (a release's requirements only grow) and, for the TypeScript client, on
this checkout's node_modules when the two package-lock.json files name the same dependencies, else on its own
`npm ci`."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.procs import REPO_ROOT

RELEASE_FILE = REPO_ROOT / "deploy" / "previous-release"


@dataclass(frozen=True)
class Release:
    version: str
    commit: str

    def show(self, path: str) -> str:
        """A file of the release, read from git (no checkout needed)."""
        return _git("show", f"{self.commit}:{path}").stdout

    def files(self, under: str) -> list[str]:
        return _git("ls-tree", "-r", "--name-only", self.commit, "--", under).stdout.split()


def named() -> list[str]:
    """deploy/previous-release's lines that are not comments: one, `<version> <commit>`."""
    return [line for line in RELEASE_FILE.read_text().splitlines() if line.strip() and not line.startswith("#")]


def previous() -> Release:
    version, commit = named()[0].split()
    if _git("cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode != 0:
        raise RuntimeError(f"deploy/previous-release names commit {commit} ({version}), which this clone does not "
                           "have: the release checks need the project's history (git fetch --unshallow)")
    return Release(version, commit)


def worktree() -> Path:
    """The previous release's code, checked out (once) with what it needs to run."""
    release = previous()
    root = REPO_ROOT / "var" / "previous-release"
    root.mkdir(parents=True, exist_ok=True)
    path = root / release.commit
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one checkout, whichever worker or storm asks first
        if not (path / ".ready").exists():
            if path.exists():  # a checkout cut short: start again
                _git("worktree", "remove", "--force", str(path), check=False)
                subprocess.run(["rm", "-rf", str(path)], check=True)
            _git("worktree", "prune")
            _git("worktree", "add", "--detach", "--force", str(path), release.commit)
            _link(path / ".venv", REPO_ROOT / ".venv")
            _typescript(path)
            (path / ".ready").write_text(release.version + "\n")
    return path


def _typescript(path: Path) -> None:
    ours, theirs = REPO_ROOT / "clients/typescript", path / "clients/typescript"
    if not theirs.exists():
        return
    if _dependencies(ours) == _dependencies(theirs):
        _link(theirs / "node_modules", ours / "node_modules")
    else:
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=theirs, check=True, capture_output=True)


def _dependencies(package: Path) -> dict:
    """package-lock.json without the package's own version, which every release changes."""
    lock = json.loads((package / "package-lock.json").read_text())
    lock.pop("version", None)
    lock.get("packages", {}).get("", {}).pop("version", None)
    return lock


def _link(link: Path, target: Path) -> None:
    if not link.exists():
        os.symlink(target, link)


def _git(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=check)
