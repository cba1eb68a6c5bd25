"""The budget cap under concurrency from separate processes (not threads of one), against real
PostgreSQL and the sandbox: no number of parallel paid calls can pass a client month's cap by a cent.
Each paying process runs tests/support/budget_load.py through the executor (intent with its reservation,
the call, the settle), and a separate process samples `spent + reserved` against the cap all along."""

import json
import os
import random
import subprocess
import sys
import uuid
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
import requests
from django.utils import timezone

from accounts.models import Client
from billing.models import BudgetMonth, Reservation
from billing.selectors import month_totals
from jobs.models import Job
from jobs.services import client_create
from tests.support import redis_server
from tests.support.books import assert_books_balance
from tests.support.http_api import HttpApi
from tests.support.procs import REPO_ROOT, process_env

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
PRICE = Decimal("0.40")  # sandbox/video-keyed, worst case and actual alike
LOAD = str(REPO_ROOT / "tests" / "support" / "budget_load.py")
REDIS = redis_server.url(15)


def jobs_for(client: Client, count: int) -> list[str]:
    now = timezone.now()
    jobs = [Job(id=uuid.uuid4(), client=client, idempotency_key=f"b-{uuid.uuid4()}", request_hash="0" * 64,
                kind="media", model_chain=["sandbox/video-keyed"], input={"prompt": "a paid call", "render_s": 0},
                policy={"attempts_per_model": 3, "fallback_on": []}, output_key=f"outputs/{uuid.uuid4()}/o.mp4",
                metadata={}, status="running", started_at=now, lease_until=now + timedelta(hours=1))
            for _ in range(count)]
    Job.objects.bulk_create(jobs)
    return [str(job.id) for job in jobs]


def pay_in_processes(tmp_path: Path, trials: list[list[str]], processes: int) -> tuple[list[list[dict]], dict]:
    """Run the trials from `processes` processes at once, with the sampler beside them."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"processes": processes, "barrier": f"budget-barrier-{uuid.uuid4()}", "redis": REDIS,
                                "trials": trials}))
    env = process_env()
    stop, sampled = tmp_path / "stop", tmp_path / "sampled.json"
    sampler = subprocess.Popen([sys.executable, LOAD, "sample", str(sampled), str(stop)], env=env, cwd=REPO_ROOT)
    payers = [subprocess.Popen([sys.executable, LOAD, "load", str(plan), str(n), str(tmp_path / f"paid-{n}.json")],
                               env=env, cwd=REPO_ROOT) for n in range(processes)]
    try:
        codes = [payer.wait(timeout=600) for payer in payers]
    finally:
        stop.write_text("stop")
        sampler.wait(timeout=30)
    assert codes == [0] * processes, codes
    results = [json.loads((tmp_path / f"paid-{n}.json").read_text()) for n in range(processes)]
    return results, json.loads(sampled.read_text())


def charges_by_client(ledger) -> dict[str, Decimal]:
    owners = {str(job_id): str(client_id) for job_id, client_id in Job.objects.values_list("id", "client_id")}
    totals: dict[str, Decimal] = {}
    for charge in ledger.ledger()["charges"]:
        owner = owners[charge["metadata"]["payonce_job"]]
        totals[owner] = totals.get(owner, Decimal(0)) + Decimal(charge["amount_usd"])
    return totals


def test_a_one_dollar_cap_lets_exactly_two_of_twenty_parallel_calls_through(ledger, tmp_path):
    client = Client.objects.create(name="capped", monthly_cap_usd=Decimal("1.00"))
    results, sampled = pay_in_processes(tmp_path, [jobs_for(client, 20)], processes=4)

    assert sum(r[0]["paid"] for r in results) == 2 and sum(r[0]["refused"] for r in results) == 18
    assert Decimal(ledger.ledger()["total_usd"]) == Decimal("0.80")
    row = BudgetMonth.objects.get(client=client)
    assert row.spent + row.reserved <= Decimal("1.00")
    assert month_totals(row) == (Decimal("0.80"), Decimal("0"))
    assert Decimal(sampled["worst_over_cap_usd"]) <= 0 and sampled["samples"] > 0
    assert len(assert_books_balance(ledger)) == 2


def test_overshoot_is_impossible_over_many_seeded_trials(ledger, tmp_path):
    trials = int(os.environ.get("BUDGET_TRIALS", "50"))
    rng = random.Random(20261201)
    clients, plans = [], []
    for _ in range(trials):
        fits = rng.randint(0, 200)  # how many of the 200 calls the cap leaves room for
        cap = PRICE * fits + Decimal(rng.randint(0, 399)) / 1000  # and a part of one more that does not fit
        client = Client.objects.create(name="trial", monthly_cap_usd=cap)
        clients.append((client, fits))
        plans.append(jobs_for(client, 200))

    results, sampled = pay_in_processes(tmp_path, plans, processes=8)

    assert Decimal(sampled["worst_over_cap_usd"]) <= 0, sampled  # never over the cap, at any sample
    assert sampled["samples"] > trials
    by_client = charges_by_client(ledger)
    for trial, (client, fits) in enumerate(clients):
        paid = sum(r[trial]["paid"] for r in results)
        row = BudgetMonth.objects.filter(client=client).first()
        if row is not None:  # the rows after, as they are (conservative until folded) ...
            assert row.spent + row.reserved <= client.monthly_cap_usd, (trial, row.spent, row.reserved)
        spent, reserved = month_totals(row)  # ... and as they add up
        assert by_client.get(str(client.id), Decimal(0)) <= client.monthly_cap_usd  # the ledger
        assert paid == fits, (trial, paid, fits)  # and every call that fit was made
        assert reserved == 0 and spent == PRICE * fits
    assert not Reservation.objects.filter(state="held").exists()
    assert_books_balance(ledger)


def test_eight_parallel_jobs_on_a_one_dollar_cap_through_http(web_stack, web_worker, ledger):
    credentials = client_create(name="capped-http", monthly_cap_usd=Decimal("1.00"))
    api = HttpApi(web_stack.url, credentials)
    created = [api.create({"kind": "media", "models": ["sandbox/video-keyed"],
                           "input": {"prompt": f"render {n}", "render_s": 0.5}}, key=f"cap-{n}") for n in range(8)]
    assert [r.status_code for r in created] == [201] * 8
    jobs = [api.wait(r.json()["id"], timeout=60) for r in created]

    succeeded = [j for j in jobs if j["status"] == "succeeded"]
    refused = [j for j in jobs if j["status"] == "failed" and j["error"]["code"] == "BUDGET_EXCEEDED"]
    assert len(succeeded) <= 2 and len(succeeded) + len(refused) == 8, [j["status"] for j in jobs]
    assert all(j["attempts"] == [] for j in refused)  # nothing was attempted, nothing sent
    total = Decimal(ledger.ledger()["total_usd"])
    assert total <= Decimal("1.00") and total == PRICE * len(succeeded)
    spend = api.get("/v1/spend").json()
    assert Decimal(spend["spent_usd"]) == total and spend["reserved_usd"] == "0.000000"
    assert Decimal(spend["headroom_usd"]) == Decimal("1.00") - total
    assert requests.get(f"{ledger.url}/healthz", timeout=5).ok
    assert len(assert_books_balance(ledger)) == len(succeeded)
