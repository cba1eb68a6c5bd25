"""The TypeScript client's integration tests (clients/typescript/test/integration, vitest) run against a
real stack, for whichever checkout of the package: this one's (tests/clients/test_typescript_client.py)
or the previous release's (tests/clients/test_previous_release_clients.py).

`npm run build`, then vitest on the built package, with the stack named in PAYONCE_TEST_* variables:
`web` and a `worker` (tests/conftest.py), the sandbox, a FlakyProxy that loses the first create's answer
and one that answers it 503, and a real signed webhook delivery. Then what the library did is checked
from the inside: through each flaky proxy exactly one job, one charge for it in the sandbox's ledger, and
that charge is the job's one attempt, under its upstream key."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import requests

from jobs.models import Job, ReportTemplate
from jobs.services import client_create
from tests.support.books import assert_books_balance

BUILD_TIMEOUT_S = 120
VITEST_TIMEOUT_S = 120


def node_ready(package: Path) -> None:
    if shutil.which("npm") is None or shutil.which("node") is None:
        pytest.fail("node and npm are needed for the TypeScript client's tests (Node 20 or newer)")
    if not (package / "node_modules" / ".bin" / "vitest").exists():
        pytest.fail(f"{package}/node_modules is missing: run `npm ci` in clients/typescript")


def run(cmd: list[str], *, cwd: Path, timeout: float, env: dict | None = None, what: str) -> str:
    try:
        done = subprocess.run(cmd, cwd=cwd, env={**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "0", **(env or {})},
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        pytest.fail(f"{what} did not finish within {timeout}s ({' '.join(cmd)} in {cwd}):\n{out}\n{err}")
    if done.returncode != 0:
        pytest.fail(f"{what} failed with exit code {done.returncode} ({' '.join(cmd)} in {cwd}):\n"
                    f"{done.stdout}\n{done.stderr}")
    return done.stdout


def run_against_stack(package: Path, vitest: list[str], *, account, ledger, flaky_proxy, hooks) -> None:
    """Build the package at `package` and run `vitest` there against the stack, then check from the inside
    what its retries did. The fixtures are tests/clients/conftest.py's."""
    node_ready(package)
    # A real, signed delivery first (the job runs while the package builds).
    hook_job = requests.post(
        f"{hooks.account.url}/v1/jobs",
        headers={"Authorization": f"Bearer {hooks.account.api_key}", "Idempotency-Key": "ts-webhook"},
        json={"kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": "a signed delivery", "render_s": 0}},
        timeout=10,
    )
    assert hook_job.status_code == 201, hook_job.text
    hook_job_id = hook_job.json()["id"]

    lose, answer_503 = flaky_proxy("lose_answer"), flaky_proxy("answer_503")
    accounts = {"main": {"api_key": account.api_key, "client_id": account.client_id,
                         "webhook_secret": account.webhook_secret}}
    for name in ("lose", "answer503", "render", "report", "stream", "streams", "errors", "list", "orders",
                 "templates", "templates-other"):
        accounts[name] = client_create(name=f"ts-{name}")

    started = time.monotonic()
    run(["npm", "run", "build"], cwd=package, timeout=BUILD_TIMEOUT_S, what="npm run build")
    built_s = time.monotonic() - started

    hooks.receiver.wait_for(lambda: any(r.verified for r in hooks.receiver.requests), timeout=30,
                            message="a verified delivery of the webhook job")
    received = next(r for r in hooks.receiver.requests if r.verified)
    delivery = {"body": received.body.decode("utf-8"), "headers": received.headers,
                "secret": hooks.account.webhook_secret, "job_id": hook_job_id}

    env = {
        "PAYONCE_TEST_URL": account.url,
        "PAYONCE_TEST_ACCOUNTS": json.dumps(accounts),
        "PAYONCE_TEST_PROXY_LOSE_URL": lose.url,
        "PAYONCE_TEST_PROXY_503_URL": answer_503.url,
        "PAYONCE_TEST_SANDBOX_URL": ledger.url,
        "PAYONCE_TEST_DELIVERY": json.dumps(delivery),
    }
    started = time.monotonic()
    output = run(vitest, cwd=package, timeout=VITEST_TIMEOUT_S, env=env, what=" ".join(vitest))
    print(f"npm run build: {built_s:.1f}s; vitest: {time.monotonic() - started:.1f}s\n{output}")

    # From the inside: the library's retries made one job each, paid once.
    charges = assert_books_balance(ledger)  # every charge maps to one attempt row, at its recorded cost
    for name, proxy in (("lose", lose), ("answer503", answer_503)):
        job = job_of(accounts[name]["client_id"])
        assert job.status == "succeeded", (name, job.status)
        one_charge(job, charges)
        assert len(proxy.spoiled) == 1 and len(proxy.seen) == 2, (name, proxy.seen, proxy.spoiled)
    # The templates the library wrote, as payonce holds them, and the report job pinned to one.
    template = ReportTemplate.objects.get(client_id=accounts["templates"]["client_id"], name="garden-plan")
    assert template.live == 2 and sorted(template.versions.values_list("number", flat=True)) == [1, 2]
    assert not ReportTemplate.objects.filter(client_id=accounts["templates-other"]["client_id"]).exists()
    pinned = job_of(accounts["templates"]["client_id"])
    assert pinned.status == "succeeded" and pinned.input["template"] == {"name": "garden-plan", "version": 2}
    assert answer_503.seen[1] - answer_503.seen[0] >= 1.0, (
        f"the retry after 503 came {answer_503.seen[1] - answer_503.seen[0]:.3f}s after the first try, "
        "sooner than its Retry-After: 1")


def job_of(client_id: str) -> Job:
    jobs = list(Job.objects.filter(client_id=client_id))
    assert len(jobs) == 1, f"expected exactly one job for client {client_id}, found {len(jobs)}"
    return jobs[0]


def one_charge(job: Job, charges: list[dict]) -> None:
    """The job was charged once (that each charge maps to one attempt row is assert_books_balance's)."""
    mine = [c for c in charges if (c.get("metadata") or {}).get("payonce_job") == str(job.id)]
    assert len(mine) == 1, f"job {job.id}: expected one charge, found {mine}"
    assert mine[0]["request_id"] == mine[0]["metadata"]["upstream_key"] == f"payonce-{job.id}-1"
