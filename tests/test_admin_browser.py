"""The operators' admin in a real browser (Debian's chromium under playwright, no browser download),
after a real end-to-end run on real processes (web, worker, webhooks, beat, the sandbox): a render that
succeeds, one the provider refuses, and a paid order whose report lost a chapter, all with their webhooks
failing until they are dead. An operator logs in, opens every page, replays the dead deliveries in bulk
over a filter and re-runs the order, each through its confirmation; the test checks what changed, in the
database and on the provider's ledger. Screenshots land in $TEST_ARTIFACTS_DIR (default
var/test-artifacts/admin)."""

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.conftest import WEBHOOK_TEST_ENV, media_body
from tests.support.http_receiver import Receiver
from tests.test_report_page_browser import chromium
from tests.test_reports import report_body

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS_DIR") or Path(__file__).resolve().parents[1] / "var/test-artifacts/admin")
PASSWORD = "browser-test-password"


def in_db(fn):
    """Run a database read in a thread of its own: playwright's sync API keeps an event loop in the test's
    thread, where Django refuses database calls."""
    def call():
        from django.db import connections

        try:
            return fn()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


def wait_for(what: str, check, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = in_db(check)
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


@pytest.fixture
def ops_stack(transactional_db, ledger, mailbox):
    from tests.support.procs import Stack

    # A broker of its own (db 10 is free while this test runs: the suite runs one file at a time).
    # The drainer every half second: the failing webhooks use up their tries (1 s apart) in seconds.
    processes = Stack("redis://127.0.0.1:6379/10", webhooks=True, EMAIL_URL=mailbox.url, WEBHOOK_DRAIN_INTERVAL_S=0.5,
                      **WEBHOOK_TEST_ENV)
    try:
        yield processes.start()
    finally:
        processes.stop()


def test_an_operator_reads_every_page_replays_dead_deliveries_in_bulk_and_re_runs_an_order(
        ops_stack, ledger, settings):
    from django.contrib.auth import get_user_model

    from jobs.services import client_create
    from tests.support.books import assert_books_balance

    settings.WEBHOOK_ALLOW_PRIVATE = True
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with Receiver(status=500) as receiver:
        shop = client_create(name="shop", webhook_url=receiver.url)
        get_user_model().objects.create_superuser("ops", "ops@example.com", PASSWORD)
        http = requests.Session()
        http.headers["Authorization"] = f"Bearer {shop['api_key']}"

        # Given: a render that succeeds, one the provider refuses, a paid report that loses a chapter.
        ledger.faults([{"model": "image-blind", "action": "status_400", "message": "prompt not allowed"},
                       {"model": "llm", "action": "delay", "seconds": 0},  # the synthesis, unharmed
                       {"model": "llm", "action": "empty"}])  # the first chapter comes back empty
        ok = http.post(f"{ops_stack.url}/v1/jobs", json=media_body(), headers={"Idempotency-Key": "ok"}).json()
        refused = http.post(f"{ops_stack.url}/v1/jobs", json=media_body(models=["sandbox/image-blind"]),
                            headers={"Idempotency-Key": "refused"}).json()
        order = http.post(f"{ops_stack.url}/v1/orders", json={
            "payment_id": "pi_browser", "run_id": "run-7", "product": "natal-chart",
            "input": {name: value for name, value in report_body()["input"].items() if name != "email"},
            "email": "ada@example.com"}).json()  # an order's email is its own field, never inside input
        assert order["status"] == "paid", order
        ends = {ok["id"]: "succeeded", refused["id"]: "failed", order["job_id"]: "failed"}
        for job_id, status in ends.items():
            deadline = time.monotonic() + 90
            while (job := http.get(f"{ops_stack.url}/v1/jobs/{job_id}").json())["status"] != status:
                assert time.monotonic() < deadline and job["status"] not in {"succeeded", "failed"} - {status}, job
                time.sleep(0.3)
        assert http.get(f"{ops_stack.url}/v1/jobs/{order['job_id']}").json()["error"]["code"] == "CHAPTER_FAILED"

        from webhooks.models import Delivery

        wait_for("three dead deliveries", lambda: Delivery.objects.filter(status="dead").count() == 3)
        charges_before = len(ledger.ledger()["charges"])
        tries_before = len(receiver.requests)
        assert tries_before >= 12  # each event tried 4 times (WEBHOOK_RETRY_SCHEDULE 1,1,1) and refused

        with chromium() as browser:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            fetched = []
            page.on("request", lambda request: fetched.append(request.url))
            operator_reads_every_page(page, ops_stack.url, ok, refused, order)
            receiver.status = 200  # the receiver is fixed
            operator_replays_in_bulk(page, ops_stack.url, shop["client_id"])
            operator_re_runs_the_order(page, ops_stack.url, order)
        assert all(url.startswith(ops_stack.url) for url in fetched), "the admin fetched something elsewhere"

        # Then: the replay resent the stored envelopes under their webhook-ids, and paid nothing.
        wait_for("the replayed deliveries delivered", lambda: Delivery.objects.filter(
            job_id__in=ends, status="delivered").count() >= 3)
        resent = {r.headers["webhook-id"] for r in receiver.requests[tries_before:]}
        assert {f"{ok['id']}:1:generation.succeeded", f"{refused['id']}:1:generation.failed",
                f"{order['job_id']}:1:generation.failed"} <= resent
        # The re-run paid for the missing chapter alone: the synthesis and the seven written chapters are
        # read back, never sent again.
        wait_for("the re-run report sealed", lambda: _job_status(order["job_id"]) == ("succeeded", 2), timeout=90)
        charges = ledger.ledger()["charges"]
        new = charges[charges_before:]
        assert len(new) == 1 and new[0]["model"] == "llm", new
        in_db(lambda: assert_books_balance(ledger))

        from jobs.models import OperatorAction

        audit = in_db(lambda: list(OperatorAction.objects.order_by("started_at").values(
            "action", "who", "via", "matched", "acted", "reason")))
        assert [(a["action"], a["who"], a["via"], a["acted"]) for a in audit] == [
            ("replay", "ops", "admin", 3), ("rerun", "ops", "admin", 1)], audit
        assert all(a["reason"] for a in audit)


def _job_status(job_id):
    from jobs.models import Job

    job = Job.objects.get(id=job_id)
    return job.status, job.run


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def operator_reads_every_page(page, url, ok, refused, order):
    page.goto(f"{url}/admin/login/")
    page.fill("#id_username", "ops")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")
    shot(page, "01-index")

    page.goto(f"{url}/admin/jobs/job/")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 3
    assert page.locator("#changelist-filter").is_visible()
    shot(page, "02-jobs")

    page.goto(f"{url}/admin/jobs/job/?status__exact=failed")
    assert page.locator("#result_list tbody tr").count() == 2
    page.goto(f"{url}/admin/jobs/job/?q=payonce-{refused['id']}-1")
    assert page.locator("#result_list tbody tr").count() == 1
    assert refused["id"] in page.locator("#result_list").inner_text()

    page.goto(f"{url}/admin/jobs/job/{ok['id']}/change/")
    timeline = page.locator("[data-testid=timeline]")
    kinds = set(timeline.locator("tbody tr").evaluate_all("rows => rows.map(r => r.dataset.kind)"))
    assert {"job", "step", "reservation", "attempt", "output", "delivery", "try"} <= kinds, kinds
    assert f"payonce-{ok['id']}-1" in timeline.inner_text()
    assert page.locator("[data-testid=output-link]").is_visible()
    shot(page, "03-job-succeeded")

    page.goto(f"{url}/admin/jobs/job/{refused['id']}/change/")
    assert "prompt not allowed" in page.locator("[data-testid=timeline]").inner_text()  # the provider's words
    shot(page, "04-job-refused")

    page.goto(f"{url}/admin/jobs/job/{order['job_id']}/change/")
    assert "CHAPTER_FAILED" in page.locator("[data-testid=status]").inner_text()
    shot(page, "05-job-report-failed")

    page.goto(f"{url}/admin/billing/spend/")
    spend = page.locator("#content").inner_text()
    assert "shop" in spend
    assert page.locator("svg rect").count() >= 12  # the last 12 months' bars, drawn on the server
    shot(page, "06-spend")

    page.goto(f"{url}/admin/billing/order/")
    assert "pi_browser" in page.locator("#result_list").inner_text()
    shot(page, "07-orders")

    page.goto(f"{url}/admin/webhooks/deadletter/")
    assert page.locator("#result_list tbody tr").count() == 3
    shot(page, "08-dead-letters")
    page.locator("#result_list tbody tr th a").first.click()
    assert "generation." in page.locator("#content").inner_text()  # the stored envelope
    shot(page, "09-dead-letter")


def operator_replays_in_bulk(page, url, client_id):
    page.goto(f"{url}/admin/jobs/job/?client__id__exact={client_id}")
    page.click("text=Replay the deliveries of every job matching this filter")
    confirm = page.locator("#confirm")
    assert confirm.get_attribute("data-matched") == "3"
    assert page.locator("[data-testid=deliveries]").inner_text() == "3"
    shot(page, "10-replay-preview")
    page.fill("#reason", "the receiver was down from 10:00 to 10:20")
    page.click("#confirm input[type=submit]")
    assert "3 deliveries sent again, over 3 jobs" in page.locator(".messagelist").inner_text()
    shot(page, "11-replayed")


def operator_re_runs_the_order(page, url, order):
    page.goto(f"{url}/admin/billing/order/")
    page.check(f"#result_list input[type=checkbox][value='{order['id']}']")
    page.select_option("select[name=action]", "rerun")
    page.click("button[name=index]")
    assert page.locator("[data-testid=pays-again]").is_visible()
    assert page.locator("[data-testid=acting]").inner_text() == "1"
    shot(page, "12-rerun-preview")
    page.fill("#reason", "the chapter came back empty; customer waiting")
    page.click("#confirm input[type=submit]")
    assert "1 of 1 changed" in page.locator(".messagelist").inner_text()
    shot(page, "13-rerun-done")
