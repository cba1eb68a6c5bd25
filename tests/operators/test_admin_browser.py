"""The operators' admin in a real browser (Debian's chromium under playwright, no browser download),
after a real end-to-end run on real processes (web, worker, webhooks, beat, the sandbox): a render that
succeeds, one the provider refuses, and a paid order whose report lost a chapter, all with their webhooks
failing until they are dead. An operator logs in on a 1366 x 768 laptop screen, opens every page, replays
the dead deliveries in bulk over a filter and re-runs the order, each through its confirmation; the test
checks what changed, in the database and on the provider's ledger, that the job and order lists show every
column on that screen, and that each job page's summary and a report's link, recipient and chapters say
what the database and the ledger say. Screenshots land in $TEST_ARTIFACTS_DIR (default
var/test-artifacts/admin)."""

import os
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

import pytest
import requests

from tests.conftest import WEBHOOK_TEST_ENV, media_body
from tests.support import redis_server
from tests.support.http_receiver import Receiver
from tests.support.browser import chromium
from tests.support.reports import report_body

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.django_db(transaction=True)]
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS_DIR") or Path(__file__).resolve().parents[2] / "var/test-artifacts/admin")
PASSWORD = "browser-test-password"
LAPTOP = {"width": 1366, "height": 768}  # the admin is read on a laptop's screen


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
    processes = Stack(redis_server.url(10), webhooks=True, EMAIL_URL=mailbox.url, WEBHOOK_DRAIN_INTERVAL_S=0.5,
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
        client_create(name="idle")  # a client with no job: no filter lists it
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

        from jobs.models import Report
        from webhooks.models import Delivery

        wait_for("three dead deliveries", lambda: Delivery.objects.filter(status="dead").count() == 3)
        charges_before = len(ledger.ledger()["charges"])
        tries_before = len(receiver.requests)
        assert tries_before >= 12  # each event tried 4 times (WEBHOOK_RETRY_SCHEDULE 1,1,1) and refused

        with chromium() as browser:
            page = browser.new_page(viewport=LAPTOP)
            fetched = []
            page.on("request", lambda request: fetched.append(request.url))
            operator_reads_every_page(page, ops_stack.url, ok, refused, order, ledger)
            receiver.status = 200  # the receiver is fixed
            operator_replays_in_bulk(page, ops_stack.url, shop["client_id"])
            operator_re_runs_the_order(page, ops_stack.url, order)
            wait_for("the re-run report mailed", lambda: _job_status(order["job_id"]) == ("succeeded", 2) and
                     Report.objects.filter(job_id=order["job_id"], delivered_at__isnull=False).exists(), timeout=90)
            support_opens_the_report_a_customer_says_never_arrived(page, ops_stack.url, order, ledger)
        assert all(url.startswith(ops_stack.url) for url in fetched), "the admin fetched something elsewhere"

        # Then: the replay resent the stored envelopes under their webhook-ids, and paid nothing.
        wait_for("the replayed deliveries delivered", lambda: Delivery.objects.filter(
            job_id__in=ends, status="delivered").count() >= 3)
        resent = {r.headers["webhook-id"] for r in receiver.requests[tries_before:]}
        assert {f"{ok['id']}:1:generation.succeeded", f"{refused['id']}:1:generation.failed",
                f"{order['job_id']}:1:generation.failed"} <= resent
        # The re-run paid for the missing chapter alone: the synthesis and the seven written chapters are
        # read back, never sent again.
        charges = ledger.ledger()["charges"]
        new = charges[charges_before:]
        assert len(new) == 1 and new[0]["model"] == "llm", new
        in_db(lambda: assert_books_balance(ledger))

        from operators.models import OperatorAction

        audit = in_db(lambda: list(OperatorAction.objects.order_by("started_at").values(
            "action", "who", "via", "matched", "acted", "reason")))
        assert [(a["action"], a["who"], a["via"], a["acted"]) for a in audit] == [
            ("replay", "ops", "admin", 3), ("rerun", "ops", "admin", 1)], audit
        assert all(a["reason"] for a in audit)


def _job_status(job_id):
    from jobs.models import Job

    job = Job.objects.get(id=job_id)
    return job.status, job.run


# Every cell of a list's table, in the browser: whether its right edge is past the screen's, and whether
# its text takes more than one line (the text's own boxes, padding aside: one line is under 1.8 times the
# font size, two are over 2.2; a header's sort marks aside); and whether the table's box (Django's
# div.results, overflow-x: auto) or the page scrolls sideways.
LIST_FITS_JS = """table => {
  const screen = document.documentElement.clientWidth;
  const box = table.closest('.results') || table.parentElement;
  const name = cell => (cell.className || cell.tagName) + ': ' + cell.innerText.trim().slice(0, 40);
  const textHeight = element => {
    const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
    let top = Infinity, bottom = -Infinity;
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      if (!node.textContent.trim()) continue;
      const range = document.createRange();
      range.selectNodeContents(node);
      for (const rect of range.getClientRects()) {
        if (rect.width > 0) { top = Math.min(top, rect.top); bottom = Math.max(bottom, rect.bottom); }
      }
    }
    return bottom > top ? bottom - top : 0;
  };
  const cut = [], wrapped = [];
  const cells = [...table.querySelectorAll('thead th, tbody th, tbody td')];
  for (const cell of cells) {
    if (cell.getBoundingClientRect().right > screen) cut.push(name(cell));
    const text = (cell.closest('thead') && cell.querySelector('div.text')) || cell;
    if (textHeight(text) > 1.8 * parseFloat(getComputedStyle(text).fontSize)) wrapped.push(name(cell));
  }
  return {screen, cells: cells.length, cut, wrapped, scrollWidth: box.scrollWidth, clientWidth: box.clientWidth,
          pageScrollWidth: document.documentElement.scrollWidth};
}"""


def assert_every_column_shows(page, columns: list[str]) -> None:
    """On this screen, every column of the list is there and whole: no cell past the screen's right edge,
    none wrapped onto a second line, no sideways scroll in the table's box or the page."""
    table = page.locator("#result_list")
    headers = [text.strip().lower() for text in table.locator("thead th div.text").all_inner_texts()]
    assert [h for h in headers if h] == columns, headers
    fits = table.evaluate(LIST_FITS_JS)
    assert fits["cells"] > 2 * len(columns), fits  # the rows are measured too, not the header alone
    assert fits["cut"] == [], f"cut off at {fits['screen']} px: {fits['cut']}"
    assert fits["scrollWidth"] <= fits["clientWidth"], f"the table scrolls sideways: {fits}"
    assert fits["pageScrollWidth"] <= fits["screen"], f"the page scrolls sideways: {fits}"
    assert fits["wrapped"] == [], f"cells on more than one line: {fits['wrapped']}"


def runs_on_record(job_id, ledger) -> list[dict]:
    """Per run, as the database and the provider's ledger say: attempts (rows), paid (the ledger's charges
    for the job's upstream keys) and cost (what the ledger charged)."""
    from collections import defaultdict

    from executor.models import Attempt
    from jobs.models import Job

    job_run = in_db(lambda: Job.objects.get(id=job_id).run)
    runs_of = in_db(lambda: dict(Attempt.objects.filter(job_id=job_id).values_list("upstream_key", "run")))
    attempts, paid, cost = defaultdict(int), defaultdict(int), defaultdict(Decimal)
    for run in runs_of.values():
        attempts[run] += 1
    for charge in ledger.ledger()["charges"]:
        key = (charge.get("metadata") or {}).get("upstream_key")
        if key in runs_of:
            paid[runs_of[key]] += 1
            cost[runs_of[key]] += Decimal(charge["amount_usd"])
    return [{"run": str(run), "attempts": str(attempts[run]), "paid": str(paid[run]),
             "cost": str(cost[run].quantize(Decimal("0.000001")))} for run in range(1, job_run + 1)]


def assert_summary_says_what_the_record_says(page, job_id, ledger) -> list[dict]:
    """The job page opens with its runs' summary, above the timeline and on the first screen, and each
    run's line (and the total) is what the database and the ledger say."""
    record = runs_on_record(job_id, ledger)
    runs = page.locator("[data-testid=runs]")
    shown = runs.locator("tbody tr").evaluate_all(
        "rows => rows.map(r => ({run: r.dataset.run, attempts: r.dataset.attempts, paid: r.dataset.paid,"
        " cost: r.dataset.cost}))")
    assert shown == record, (shown, record)
    total = runs.locator("[data-testid=runs-total]")
    assert total.get_attribute("data-runs") == str(len(record))
    assert total.get_attribute("data-attempts") == str(sum(int(line["attempts"]) for line in record))
    assert total.get_attribute("data-paid") == str(sum(int(line["paid"]) for line in record))
    assert Decimal(total.get_attribute("data-cost")) == sum(Decimal(line["cost"]) for line in record)
    assert runs.bounding_box()["y"] < LAPTOP["height"], "the summary is below the first screen"
    assert runs.bounding_box()["y"] < page.locator("[data-testid=timeline]").bounding_box()["y"]
    return record


def assert_report_says_what_the_record_says(page, url, job_id) -> dict:
    """A report job's page: the link its buyer gets (naming this report), the recipient (the order's
    email), and its chapters done of total, as the database has them."""
    from jobs.models import ReportChapter
    from jobs.kinds.report.reports import report_from_token
    from orders.models import Order

    link = page.locator("[data-testid=report-link]").get_attribute("href")
    assert link.startswith(f"{url}/r/"), link
    assert str(in_db(lambda: report_from_token(link.removeprefix(f"{url}/r/")).job_id)) == job_id
    assert page.locator("[data-testid=recipient]").inner_text() == in_db(lambda: Order.objects.get(job_id=job_id).email)
    done = in_db(lambda: ReportChapter.objects.filter(report_id=job_id, status="done").count())
    total = in_db(lambda: ReportChapter.objects.filter(report_id=job_id).count())
    chapters = page.locator("[data-testid=chapters]")
    assert (chapters.get_attribute("data-done"), chapters.get_attribute("data-total")) == (str(done), str(total))
    assert chapters.inner_text().startswith(f"{done} of {total} done")
    return {"link": link, "done": done, "total": total,
            "mail": page.locator("[data-testid=mail]").get_attribute("data-state")}


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def operator_reads_every_page(page, url, ok, refused, order, ledger):
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
    assert_every_column_shows(page, ["job", "client", "status", "cost (usd)", "kind", "models", "run", "created",
                                     "completed"])
    assert rows.first.locator("td.field-client_name").inner_text() == "shop"  # by name; its id in the title
    # The filters list what is in use: the three models the jobs name (not the rate card's 33), and no client
    # without a job (with one client left, Django shows no client filter at all).
    filters = page.locator("#changelist-filter")
    assert filters.locator("a[href*='model=']").all_inner_texts() == [
        "sandbox/image-blind", "sandbox/llm", "sandbox/video-keyed"]
    assert "idle" not in filters.inner_text()
    shot(page, "02-jobs")

    page.goto(f"{url}/admin/jobs/job/?status__exact=failed")
    assert page.locator("#result_list tbody tr").count() == 2
    page.goto(f"{url}/admin/jobs/job/?q=payonce-{refused['id']}-1")
    assert page.locator("#result_list tbody tr").count() == 1
    short = page.locator("#result_list tbody tr th a")  # the job's short id, whole in its title and link
    assert short.inner_text() == refused["id"][:8]
    assert page.locator(f"#result_list [title='{refused['id']}']").count() == 1
    assert refused["id"] in short.get_attribute("href")

    page.goto(f"{url}/admin/jobs/job/{ok['id']}/change/")
    assert_summary_says_what_the_record_says(page, ok["id"], ledger)
    timeline = page.locator("[data-testid=timeline]")
    kinds = set(timeline.locator("tbody tr").evaluate_all("rows => rows.map(r => r.dataset.kind)"))
    assert {"job", "step", "reservation", "attempt", "output", "delivery", "try"} <= kinds, kinds
    assert f"payonce-{ok['id']}-1" in timeline.inner_text()
    assert page.locator("[data-testid=output-link]").is_visible()
    shot(page, "03-job-succeeded")

    page.goto(f"{url}/admin/jobs/job/{refused['id']}/change/")
    assert "prompt not allowed" in page.locator("[data-testid=timeline]").inner_text()  # the provider's words
    [line] = assert_summary_says_what_the_record_says(page, refused["id"], ledger)
    assert (line["attempts"], line["paid"]) == ("1", "0")  # refused before it was accepted: nothing paid
    shot(page, "04-job-refused")

    page.goto(f"{url}/admin/jobs/job/{order['job_id']}/change/")
    assert "CHAPTER_FAILED" in page.locator("[data-testid=status]").inner_text()
    assert_summary_says_what_the_record_says(page, order["job_id"], ledger)
    report = assert_report_says_what_the_record_says(page, url, order["job_id"])
    assert report["done"] == report["total"] - 1 and report["mail"] != "ok"  # a chapter lost: nothing mailed
    shot(page, "05-job-report-failed")

    page.goto(f"{url}/admin/billing/spend/")
    spend = page.locator("#content").inner_text()
    assert "shop" in spend
    assert page.locator("svg rect").count() >= 12  # the last 12 months' bars, drawn on the server
    shot(page, "06-spend")

    page.goto(f"{url}/admin/orders/order/")
    assert "pi_browser" in page.locator("#result_list").inner_text()
    assert_every_column_shows(page, ["payment id", "client", "status", "job", "cost (usd)", "unpriced", "product",
                                     "run id", "created"])
    shown_cost = page.locator("#result_list td.field-cost_usd").inner_text()
    assert Decimal(shown_cost) == sum(Decimal(line["cost"]) for line in runs_on_record(order["job_id"], ledger))
    shot(page, "07-orders")

    page.goto(f"{url}/admin/webhooks/deadletter/")
    assert page.locator("#result_list tbody tr").count() == 3
    # On the laptop's 1366 px the status and the error were past the screen's edge: every column shows now,
    # the error clipped to its column (whole in its title and on the dead letter's page).
    assert_every_column_shows(page, ["webhook-id", "client", "job", "event", "tries", "status", "last error",
                                     "created"])
    for column in ("status_code", "error_start"):
        for cell in (page.locator(f"#result_list th.column-{column}"),
                     page.locator(f"#result_list td.field-{column}").first):
            box = cell.bounding_box()
            assert box and box["width"] > 0 and box["x"] + box["width"] <= LAPTOP["width"], (column, box)
    error = page.locator("#result_list td.field-error_start .clip").first
    assert error.inner_text() and error.get_attribute("title").startswith(error.inner_text().rstrip("…")[:20])
    shot(page, "08-dead-letters")
    page.locator("#result_list tbody tr th a").first.click()
    assert "generation." in page.locator("#content").inner_text()  # the stored envelope
    shot(page, "09-dead-letter")

    operator_reads_the_models_page(page, url)


def operator_reads_the_models_page(page, url):
    """Every model the code names is listed (before: "0 models", the admin's own rows alone), each with its
    provider, kind, source and price, on the laptop's screen without sideways scroll."""
    from executor import registry

    page.goto(f"{url}/admin/executor/modelconfig/")
    rows = page.locator("[data-testid=live-models] tbody tr")
    shown = rows.evaluate_all("rows => rows.map(r => ({name: r.dataset.model, source: r.dataset.source,"
                              " cells: Array.from(r.cells).map(c => c.innerText.trim())}))")
    names = {row["name"] for row in shown}
    assert set(registry.code_model_names()) <= names, set(registry.code_model_names()) - names
    for row in shown:
        name, provider, kind, source, enabled, price, price_from, _ = row["cells"]
        assert name == row["name"] and provider == name.split("/")[0] and kind in ("text", "image", "video"), row
        assert source == row["source"] and "code catalog" in source and enabled == "yes", row
        assert price.startswith(("$", "free")) and "None" not in price and price_from == "code catalog", row
    video = next(row for row in shown if row["name"] == "sandbox/video-keyed")
    assert video["cells"][5] == "$0.40 per render"
    assert page.evaluate("document.documentElement.scrollWidth") <= LAPTOP["width"], "the page scrolls sideways"
    table = page.locator("[data-testid=live-models]").bounding_box()
    assert table["x"] + table["width"] <= LAPTOP["width"], table
    shot(page, "15-models")


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
    page.goto(f"{url}/admin/orders/order/")
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


def support_opens_the_report_a_customer_says_never_arrived(page, url, order, ledger):
    """The re-run report sealed and mailed: its page says where the link went and when, with every chapter
    done, and the link opens the report."""
    from jobs.models import Report

    page.goto(f"{url}/admin/jobs/job/{order['job_id']}/change/")
    record = assert_summary_says_what_the_record_says(page, order["job_id"], ledger)
    assert [line["run"] for line in record] == ["1", "2"]
    report = assert_report_says_what_the_record_says(page, url, order["job_id"])
    assert report["done"] == report["total"] and report["mail"] == "ok"
    delivered_at = in_db(lambda: Report.objects.get(job_id=order["job_id"]).delivered_at)
    assert f"{delivered_at:%Y-%m-%d %H:%M:%S}" in page.locator("[data-testid=mail]").inner_text()
    assert page.locator("details.run").count() == 2
    assert page.locator("details.run[open]").get_attribute("data-run") == "2"  # the earlier run folded
    shot(page, "14-job-report-re-run")
    response = page.goto(report["link"])
    assert response.status == 200 and page.locator("section[data-chapter]").count() == report["total"]
