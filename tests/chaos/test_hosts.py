"""tests.chaos.hosts: hosts in network namespaces reach each other, the root namespace and its loopback
services through forwarders, and leave nothing behind. Runs the module's self-test as the storm runs it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_hosts_selftest_links_hosts_forwards_services_and_leaves_nothing():
    # Never a skip: CI runs as root, and a run that is not root must say why this cannot pass.
    assert os.geteuid() == 0, "tests/chaos/test_hosts.py requires root (network namespaces, veths, a bridge)"

    result = subprocess.run(
        [sys.executable, "-m", "tests.chaos.hosts", "--selftest"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )

    assert result.returncode == 0, f"self-test failed:\n{result.stdout}\n{result.stderr}"
    assert "FAIL" not in result.stdout
    assert "selftest passed" in result.stdout
