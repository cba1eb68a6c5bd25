"""The operators' spend pages and dead letters in the Django admin, logged in as a superuser, on the real
test database: the spend page per client (the figures GET /v1/spend gives), per product, and the 12 month
SVG chart; the budget month and order lists; an order's re-run and the dead letters' replay through the
shared confirmation page (a required reason, a count preview, one audit row)."""

import json
import re
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from decimal import Decimal
from html import unescape
from html.parser import HTMLParser
from urllib.parse import urlencode

import pytest
from django.contrib.admin.utils import quote
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from accounts.models import Client
from billing import services
from billing.selectors import month_spend
from executor.models import Attempt, AttemptState
from jobs.models import Job, JobStatus
from jobs.kinds.report.reports import report_load
from operators.models import OperatorAction
from operators.operations import preview_jobs
from orders.models import Order
from orders.services import order_create
from tests.support.admin import make_client, media_job
from tests.support.orders import order_data
from webhooks.models import Delivery, DeliveryAttempt
from webhooks.services import delivery_create

# No worker runs here: each test is one transaction, so what a service enqueues on commit is never sent.
pytestmark = pytest.mark.django_db
D = Decimal
SPEND = "/admin/billing/spend/"


# --- rows, made through the services ------------------------------------------------------------------------


def spend(job: Job, key: str, amount: str, cost: str | None | bool = False, at: datetime | None = None) -> None:
    """Reserve `amount`; then settle at `cost` (None: unpriced), or leave it held (cost False)."""
    assert services.reserve(client_id=job.client_id, job_id=job.id, key=key, model="sandbox/video-keyed",
                            amount=D(amount), guard="true", at=at)
    if cost is not False:
        assert services.settle(key=key, cost=None if cost is None else D(cost))


def month_text(at: datetime) -> str:
    return f"{at:%Y-%m}"


def months_back(count: int) -> datetime:
    """The 15th of the month `count` months before this one, noon UTC."""
    year, month = timezone.now().year, timezone.now().month - count
    while month < 1:
        year, month = year - 1, month + 12
    return datetime(year, month, 15, 12, tzinfo=dt_timezone.utc)


class Tables(HTMLParser):
    """The page's tables as {table id: {row key: {field: text}}}: rows are <tr data-client|data-product>,
    cells <td data-field>."""

    def __init__(self, html: str):
        super().__init__()
        self.tables, self._table, self._row, self._field = {}, None, None, None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table" and attrs.get("id"):
            self._table = self.tables.setdefault(attrs["id"], {})
        elif tag == "tr" and self._table is not None:
            key = attrs.get("data-client") or attrs.get("data-product")
            self._row = self._table.setdefault(key, {}) if key else None
        elif tag == "td" and self._row is not None and attrs.get("data-field"):
            self._field = attrs["data-field"]
            self._row[self._field] = ""
        elif tag == "a" and self._row is not None and "href" in attrs and "href" not in self._row:
            self._row["href"] = attrs["href"]

    def handle_endtag(self, tag):
        if tag == "td":
            self._field = None
        elif tag == "table":
            self._table = self._row = None

    def handle_data(self, data):
        if self._field is not None:
            self._row[self._field] += data.strip()


BAR = re.compile(r'<rect class="bar[^"]*" data-month="(?P<month>[^"]+)" data-spent="(?P<spent>[^"]+)" '
                 r'x="[^"]+" y="(?P<y>[^"]+)" width="[^"]+" height="(?P<height>[^"]+)"')


def bars(html: str) -> list[dict]:
    return [{"month": m["month"], "spent": D(m["spent"]), "y": float(m["y"]), "height": float(m["height"])}
            for m in BAR.finditer(html)]


# --- spend per client ----------------------------------------------------------------------------------------


def test_the_spend_page_shows_each_clients_month_as_get_v1_spend_gives_it(admin_client):
    acme, globex = make_client("acme", cap="3.00"), make_client("globex")
    job = media_job(acme, "a-1")
    spend(job, "a-settled", "0.40", "0.40")
    spend(job, "a-held", "0.04")
    spend(job, "a-unpriced", "0.10", None)  # nobody could price it: spent at its whole reservation
    uncertain = Attempt.objects.create(job=job, run=1, number=9, provider="sandbox", model="video-keyed",
                                       upstream_key=f"payonce-{job.id}-9", state=AttemptState.UNCERTAIN, sends=1)
    spend(job, uncertain.upstream_key, "0.40")  # held for an attempt whose outcome nobody knows ...
    services.hold_unpriced(key=uncertain.upstream_key)  # ... marked so with the attempt's end, as the executor does
    other = media_job(globex, "g-1")
    spend(other, "g-1", "1.00", "0.70")
    services.fold(client_id=globex.id, month=services.month_of(timezone.now()))  # globex's counters are folded
    spend(other, "g-2", "0.20", "0.05")  # ... and this one is not yet

    page = admin_client.get(SPEND)

    assert page.status_code == 200
    rows = Tables(page.content.decode()).tables["spend"]
    month = services.month_of(timezone.now())
    for client in (acme, globex):
        expected = month_spend(client, month)
        row = rows[str(client.id)]
        assert (row["spent"], row["reserved"], row["cap"], row["headroom"], int(row["unpriced"])) == (
            expected["spent_usd"], expected["reserved_usd"], expected["cap_usd"], expected["headroom_usd"],
            expected["unpriced_attempts"])
        assert unescape(row["href"]) == "/admin/jobs/job/?" + urlencode(
            {"client__id__exact": client.id, "month": month_text(timezone.now())})
    assert (rows[str(acme.id)]["spent"], rows[str(acme.id)]["unpriced"]) == ("0.500000", "2")
    assert rows[str(globex.id)]["spent"] == "0.750000"


def test_the_spend_page_reads_a_chosen_month_and_client_in_as_many_statements_for_six_clients_as_for_two(
        admin_client):
    last_month = months_back(1)
    clients = [make_client(f"client-{n}") for n in range(6)]
    for n, client in enumerate(clients[:2]):
        spend(media_job(client, f"k-{n}"), f"r-{n}", "0.30", "0.25", at=last_month)

    with CaptureQueriesContext(connection) as two:
        page = admin_client.get(SPEND, {"month": month_text(last_month)})
    rows = Tables(page.content.decode()).tables["spend"]
    assert set(rows) == {str(clients[0].id), str(clients[1].id)}
    assert rows[str(clients[0].id)]["spent"] == "0.250000"
    assert "Nothing was reserved" in admin_client.get(SPEND).content.decode()  # this month: no spend yet

    for n, client in enumerate(clients[2:], start=2):
        spend(media_job(client, f"k-{n}"), f"r-{n}", "0.30", "0.25", at=last_month)
    with CaptureQueriesContext(connection) as six:
        page = admin_client.get(SPEND, {"month": month_text(last_month)})
    assert len(Tables(page.content.decode()).tables["spend"]) == 6
    assert len(six) == len(two)  # no statement per client

    one = admin_client.get(SPEND, {"month": month_text(last_month), "client": clients[3].id}).content.decode()
    assert set(Tables(one).tables["spend"]) == {str(clients[3].id)}


def test_a_malformed_month_or_unknown_client_is_said_and_the_page_still_answers(admin_client):
    assert "a month from 2000-01 to 9999-11" in admin_client.get(SPEND, {"month": "1999-12"}).content.decode()
    page = admin_client.get(SPEND, {"month": "2026-13", "client": "not-an-id"}, follow=True)
    assert page.status_code == 200
    text = page.content.decode()
    assert "Month must be YYYY-MM" in text and "No client has the id" in text
    assert f'data-month="{month_text(timezone.now())}"' in text


# --- the chart ---------------------------------------------------------------------------------------------------


def test_the_chart_has_twelve_bars_whose_heights_follow_the_spend_and_the_cap_line_for_one_client(admin_client):
    acme, globex = make_client("acme", cap="3.00"), make_client("globex")
    job, other = media_job(acme, "a"), media_job(globex, "g")
    spent_in = {0: "0.40", 2: "1.20", 5: "0.10", 11: "0.70"}  # months back -> acme's spend
    for back, cost in spent_in.items():
        spend(job, f"a-{back}", cost, cost, at=months_back(back))
    spend(job, "a-too-old", "2.00", "2.00", at=months_back(12))  # 13 months ago: off the chart
    spend(other, "g-2", "0.50", "0.50", at=months_back(2))

    everyone = bars(admin_client.get(SPEND).content.decode())
    assert [bar["month"] for bar in everyone] == [month_text(months_back(back)) for back in range(11, -1, -1)]
    by_month = {bar["month"]: bar for bar in everyone}
    assert by_month[month_text(months_back(2))]["spent"] == D("1.700000")  # both clients
    assert by_month[month_text(months_back(0))]["spent"] == D("0.400000")
    assert by_month[month_text(months_back(3))]["height"] == 0.0
    highest = max(everyone, key=lambda bar: bar["height"])
    assert highest["month"] == month_text(months_back(2)) and highest["height"] > 0

    page = admin_client.get(SPEND, {"client": acme.id}).content.decode()
    ones = bars(page)
    assert len(ones) == 12
    expected = {month_text(months_back(back)): D(cost) for back, cost in spent_in.items()}
    assert {bar["month"]: bar["spent"] for bar in ones} == {
        bar["month"]: expected.get(bar["month"], D(0)) for bar in ones}
    # Heights in the order of the amounts, in proportion to the cap (the line's height) ...
    assert [bar["month"] for bar in sorted(ones, key=lambda bar: (bar["height"], bar["month"]))] == [
        bar["month"] for bar in sorted(ones, key=lambda bar: (bar["spent"], bar["month"]))]
    cap_y = float(re.search(r'<line class="cap" data-testid="cap-line" data-cap="3.000000" x1="[^"]+" y1="([^"]+)"',
                            page).group(1))
    baseline = ones[0]["y"] + ones[0]["height"]
    tallest = max(ones, key=lambda bar: bar["height"])
    assert tallest["spent"] == D("1.20")
    assert tallest["height"] == pytest.approx((baseline - cap_y) * 1.20 / 3.00, abs=0.02)
    # ... labelled with the month and the amount, with no script anywhere.
    assert f">{month_text(months_back(2))}</text>" in page and ">$1.20</text>" in page and ">$0.40</text>" in page
    assert "<script" not in page.split('data-testid="spend-chart"')[1].split("</svg>")[0]


# --- per product, and the lists ------------------------------------------------------------------------------


def attempt(job: Job, number: int, cost: str | None, *, accepted: bool = True,
            state: str = AttemptState.SUCCEEDED) -> Attempt:
    return Attempt.objects.create(job=job, run=1, number=number, step=f"chapter-{number}", provider="sandbox",
                                  model="llm", upstream_key=f"payonce-{job.id}-{number}", state=state, sends=1,
                                  cost_usd=None if cost is None else D(cost),
                                  accepted_at=timezone.now() if accepted else None)


def test_the_spend_page_shows_orders_per_product_with_what_their_reports_cost(admin_client):
    client = make_client("shop")
    natal, _ = order_create(client=client, data=order_data("pi_1"))
    duplicate, _ = order_create(client=client, data=order_data("pi_2"))  # same run and product: no report
    synastry, _ = order_create(client=client, data=order_data("pi_3", run="run-2", product="synastry"))
    old, _ = order_create(client=client, data=order_data("pi_4", run="run-3"))
    Order.objects.filter(id=old.id).update(created_at=months_back(1))
    attempt(natal.job, 1, "0.003126")
    attempt(natal.job, 2, "0.002000")
    attempt(natal.job, 3, None)  # accepted, nobody could price it: counted
    attempt(natal.job, 4, None, accepted=False, state=AttemptState.FAILED)  # refused: never paid, not counted
    attempt(synastry.job, 1, "0.010000")
    attempt(old.job, 1, "0.500000")
    assert duplicate.status == "duplicate" and duplicate.job_id is None

    products = Tables(admin_client.get(SPEND).content.decode()).tables["products"]
    assert products == {
        "natal-chart": {"href": products["natal-chart"]["href"], "orders": "2", "paid": "1", "duplicate": "1",
                        "cost": "0.005126", "unpriced": "1"},
        "synastry": {"href": products["synastry"]["href"], "orders": "1", "paid": "1", "duplicate": "0",
                     "cost": "0.010000", "unpriced": "0"},
    }
    orders = admin_client.get(unescape(products["natal-chart"]["href"])).content.decode()
    assert "pi_1" in orders and "pi_2" in orders and "pi_3" not in orders and "pi_4" not in orders
    other = make_client("another shop")
    order_create(client=other, data=order_data("pi_9", run="run-9"))
    mine = Tables(admin_client.get(SPEND, {"client": other.id}).content.decode()).tables["products"]
    assert (mine["natal-chart"]["orders"], mine["natal-chart"]["cost"]) == ("1", "0.000000")
    theirs = admin_client.get(unescape(mine["natal-chart"]["href"])).content.decode()
    assert "pi_9" in theirs and "pi_1" not in theirs
    before = Tables(admin_client.get(SPEND, {"month": month_text(months_back(1))}).content.decode()).tables["products"]
    assert (before["natal-chart"]["orders"], before["natal-chart"]["cost"]) == ("1", "0.500000")


def test_the_order_list_shows_each_orders_cost_in_the_same_statements_for_any_number_of_orders(admin_client):
    client = make_client("shop")
    first, _ = order_create(client=client, data=order_data("pi_1"))
    attempt(first.job, 1, "0.003126")
    attempt(first.job, 2, None)
    with CaptureQueriesContext(connection) as one:
        listing = admin_client.get("/admin/orders/order/").content.decode()
    assert "0.003126" in listing

    for n in range(2, 6):
        order, _ = order_create(client=client, data=order_data(f"pi_{n}", run=f"run-{n}"))
        attempt(order.job, 1, "0.001000")
    with CaptureQueriesContext(connection) as five:
        listing = admin_client.get("/admin/orders/order/").content.decode()
    assert listing.count("0.001000") == 4 and "0.003126" in listing
    assert len(five) == len(one)


def test_the_budget_month_list_adds_unpriced_attempts_and_links_the_spend_page(admin_client):
    client = make_client("acme", cap="3.00")
    job = media_job(client, "a")
    spend(job, "priced", "0.40", "0.40")
    spend(job, "unpriced-1", "0.10", None)
    spend(job, "unpriced-2", "0.20", None)

    listing = admin_client.get("/admin/billing/budgetmonth/").content.decode()
    assert "unpriced attempts" in listing.lower()
    assert re.search(r'<td class="field-unpriced_attempts">2</td>', listing)
    assert '<td class="field-spent_now">0.700000</td>' in listing  # what month_spend says: 0.40 + 0.10 + 0.20
    assert '<td class="field-headroom">2.300000</td>' in listing
    assert f'href="{SPEND}"' in listing
    index = admin_client.get("/admin/").content.decode()
    assert f'href="{SPEND}"' in index and 'href="/admin/webhooks/deadletter/"' in index


# --- an order's re-run through the confirmation page --------------------------------------------------------


def report_order(client, payment: str, run: str, status: str) -> Order:
    order, _ = order_create(client=client, data=order_data(payment, run=run))
    report_load(job=order.job)  # the report's first step (load), as a worker runs it
    Job.objects.filter(id=order.job_id).update(status=status)
    return Order.objects.select_related("job").get(id=order.id)


def test_an_order_re_run_asks_for_a_reason_then_re_runs_only_failed_or_waiting_reports_with_one_audit_row(
        admin_client):
    client = make_client("shop")
    failed = report_order(client, "pi_1", "run-1", JobStatus.FAILED)
    waiting = report_order(client, "pi_2", "run-2", JobStatus.WAITING)
    succeeded = report_order(client, "pi_3", "run-3", JobStatus.SUCCEEDED)
    duplicate, _ = order_create(client=client, data=order_data("pi_4", run="run-1"))
    chosen = {"action": "rerun", "_selected_action": [str(o.id) for o in (failed, waiting, succeeded, duplicate)]}

    asked = admin_client.post("/admin/orders/order/", chosen)
    text = asked.content.decode()
    assert asked.status_code == 200 and 'data-testid="pays-again"' in text
    assert 'data-acting="2"' in text and 'data-matched="3"' in text  # the duplicate has no report
    worst = preview_jobs(action="rerun", jobs=Job.objects.filter(id__in=[failed.job_id, waiting.job_id]), target="")
    assert worst.worst_case_usd > 0 and f"${worst.worst_case_usd}" in text

    refused = admin_client.post("/admin/orders/order/", {**chosen, "index": "0", "confirm": "yes", "reason": " "})
    assert refused.status_code == 200 and "a reason is required" in refused.content.decode()
    assert set(Job.objects.values_list("run", flat=True)) == {1} and not OperatorAction.objects.exists()

    done = admin_client.post("/admin/orders/order/", {**chosen, "index": "0", "confirm": "yes",
                                                        "reason": "the provider was down on the 1st"})
    assert done.status_code == 302
    runs = dict(Job.objects.values_list("id", "run"))
    assert (runs[failed.job_id], runs[waiting.job_id], runs[succeeded.job_id]) == (2, 2, 1)
    assert Job.objects.get(id=failed.job_id).status == JobStatus.QUEUED
    assert Job.objects.get(id=succeeded.job_id).status == JobStatus.SUCCEEDED
    [entry] = OperatorAction.objects.all()
    assert (entry.action, entry.who, entry.via, entry.matched, entry.acted, entry.reason) == (
        "rerun", "admin", "admin", 3, 2, "the provider was down on the 1st")
    shown = admin_client.get("/admin/orders/order/", follow=True).content.decode()
    assert reverse("admin:operators_operatoraction_change", args=[entry.id]) in shown


def test_one_orders_page_has_a_re_run_button_through_the_same_confirmation(admin_client):
    client = make_client("shop")
    failed = report_order(client, "pi_1", "run-1", JobStatus.FAILED)
    succeeded = report_order(client, "pi_2", "run-2", JobStatus.SUCCEEDED)
    rerun_url = reverse("admin:orders_order_rerun", args=[failed.id])
    assert rerun_url in admin_client.get(f"/admin/orders/order/{failed.id}/change/").content.decode()
    ended = admin_client.get(f"/admin/orders/order/{succeeded.id}/change/").content.decode()
    assert 'data-testid="rerun"' not in ended and "pi_2" in ended

    asked = admin_client.get(rerun_url).content.decode()
    assert 'data-acting="1"' in asked and 'data-testid="pays-again"' in asked
    assert Job.objects.get(id=failed.job_id).run == 1
    done = admin_client.post(rerun_url, {"confirm": "yes", "reason": "customer asked"})
    assert done.status_code == 302 and done["Location"] == f"/admin/orders/order/{failed.id}/change/"
    assert Job.objects.get(id=failed.job_id).run == 2
    [entry] = OperatorAction.objects.all()
    assert (entry.action, entry.acted, entry.matched) == ("rerun", 1, 1) and str(failed.id) in entry.target


# --- dead letters -------------------------------------------------------------------------------------------------


def outbox(job: Job, event: str, **dead) -> Delivery:
    """The job's event in the outbox (delivery_create, in this test's transaction), then, with `dead`
    fields, as the dispatcher leaves it after its last try."""
    assert delivery_create(job=job, event=event, data={"id": str(job.id), "event": event})
    delivery = Delivery.objects.get(job=job, event=event)
    if dead:
        Delivery.objects.filter(id=delivery.id).update(**{
            "status": "dead", "attempts": 8, "schedule_position": 8, "last_status_code": 500,
            "next_attempt_at": timezone.now() - timedelta(days=3), "last_error": "HTTP 500", **dead})
    delivery.refresh_from_db()
    return delivery


@pytest.fixture
def letters():
    client = make_client("acme")
    jobs = [media_job(client, f"job-{n}") for n in range(3)]
    made = {
        "a": outbox(jobs[0], "generation.failed", status="dead"),
        "b": outbox(jobs[1], "generation.failed", status="dead"),
        "c": outbox(jobs[2], "generation.needs_review", status="dead", last_status_code=None,
                    last_error="send failed: connection refused"),
        "delivered": outbox(jobs[0], "generation.succeeded", status="delivered", delivered_at=timezone.now()),
        "pending": outbox(jobs[1], "generation.cancelled"),
    }
    for number, (code, body, error) in enumerate([(500, "receiver broke", ""), (None, "", "timed out"),
                                                  (502, "y" * 2000, "")], start=1):
        DeliveryAttempt.objects.create(delivery_id=made["a"].id, number=number, webhook_timestamp=1_700_000_000,
                                       url="https://hooks.example.com/in", status_code=code, duration_ms=40 * number,
                                       response_body=body, error=error)
    return made


DEAD_LETTERS = "/admin/webhooks/deadletter/"


def test_the_dead_letters_list_shows_only_dead_rows_filtered_by_event_and_searched_by_job(admin_client, letters):
    listing = admin_client.get(DEAD_LETTERS).content.decode()
    for name in ("a", "b", "c"):
        assert letters[name].id in listing
    assert letters["delivered"].id not in listing and letters["pending"].id not in listing
    assert f'href="/admin/jobs/job/{letters["a"].job_id}/change/"' in listing
    assert "send failed: connection refused" in listing

    review = admin_client.get(DEAD_LETTERS, {"event": "generation.needs_review"}).content.decode()
    assert letters["c"].id in review and letters["a"].id not in review
    found = admin_client.get(DEAD_LETTERS, {"q": str(letters["b"].job_id)}).content.decode()
    assert letters["b"].id in found and letters["a"].id not in found
    by_webhook_id = admin_client.get(DEAD_LETTERS, {"q": letters["a"].id}).content.decode()
    assert letters["a"].id in by_webhook_id and letters["b"].id not in by_webhook_id


def test_a_dead_letters_page_shows_its_envelope_and_every_try(admin_client, letters):
    page = admin_client.get(f"{DEAD_LETTERS}{quote(letters['a'].id)}/change/").content.decode()
    pretty = json.dumps(json.loads(letters["a"].envelope), indent=2, ensure_ascii=False)
    assert f'<pre class="envelope" data-testid="envelope">{escape(pretty)}</pre>' in page
    tries = page.split('data-testid="tries"')[1]
    assert [int(n) for n in re.findall(r'<tr data-number="(\d+)">', tries)] == [1, 2, 3]
    assert "receiver broke" in tries and "timed out" in tries and "https://hooks.example.com/in" in tries
    assert "y" * 500 in tries and "y" * 501 not in tries and "2000 characters in all" in tries
    assert "80 ms" in tries and reverse("admin:webhooks_deadletter_replay", args=[quote(letters["a"].id)]) in page


def test_a_replay_without_a_reason_is_refused_and_with_one_replays_exactly_the_chosen_dead_letters(
        admin_client, letters):
    chosen = {"action": "replay_selected", "index": "0", "select_across": "0",
              "_selected_action": [letters["a"].id, letters["b"].id]}
    asked = admin_client.post(DEAD_LETTERS, chosen).content.decode()
    assert 'data-acting="2"' in asked and "Nothing is paid" in asked and "pays-again" not in asked

    refused = admin_client.post(DEAD_LETTERS, {**chosen, "confirm": "yes", "reason": ""})
    assert refused.status_code == 200 and "a reason is required" in refused.content.decode()
    assert set(Delivery.objects.filter(status="dead").values_list("id", flat=True)) == {
        letters["a"].id, letters["b"].id, letters["c"].id}
    assert not OperatorAction.objects.exists()

    before = timezone.now()
    done = admin_client.post(DEAD_LETTERS, {**chosen, "confirm": "yes", "reason": "receiver fixed its TLS"})
    assert done.status_code == 302
    for name in ("a", "b"):
        replayed = Delivery.objects.get(id=letters[name].id)
        assert (replayed.status, replayed.schedule_position, replayed.last_error) == ("pending", 0, "")
        assert replayed.next_attempt_at >= before and replayed.envelope == letters[name].envelope
    assert Delivery.objects.get(id=letters["c"].id).status == "dead"
    assert Delivery.objects.get(id=letters["delivered"].id).status == "delivered"
    [entry] = OperatorAction.objects.all()
    assert (entry.action, entry.matched, entry.acted, entry.reason, entry.who) == (
        "replay_dead", 2, 2, "receiver fixed its TLS", "admin")
    assert letters["a"].id not in admin_client.get(DEAD_LETTERS).content.decode()


def test_select_all_matching_replays_every_dead_letter_of_the_filter_and_no_other(admin_client, letters):
    url = f"{DEAD_LETTERS}?{urlencode({'event': 'generation.failed'})}"
    done = admin_client.post(url, {"action": "replay_selected", "index": "0", "select_across": "1",
                                   "_selected_action": [letters["a"].id], "confirm": "yes", "reason": "outage"})
    assert done.status_code == 302
    assert {d.id: d.status for d in Delivery.objects.filter(id__in=[letters[n].id for n in "abc"])} == {
        letters["a"].id: "pending", letters["b"].id: "pending", letters["c"].id: "dead"}
    [entry] = OperatorAction.objects.all()
    assert entry.acted == 2 and "event=generation.failed" in entry.target

    matching = reverse("admin:webhooks_deadletter_replay_matching") + "?event=generation.needs_review"
    listing = admin_client.get(DEAD_LETTERS, {"event": "generation.needs_review"}).content.decode()
    assert f'href="{escape(matching)}"' in listing
    asked = admin_client.get(matching).content.decode()
    assert 'data-acting="1"' in asked and 'data-matched="1"' in asked
    assert admin_client.post(matching, {"confirm": "yes", "reason": "second outage"}).status_code == 302
    assert Delivery.objects.get(id=letters["c"].id).status == "pending"
    assert OperatorAction.objects.count() == 2


def test_one_dead_letter_is_replayed_from_its_page(admin_client, letters):
    replay = reverse("admin:webhooks_deadletter_replay", args=[quote(letters["c"].id)])
    asked = admin_client.get(replay).content.decode()
    assert 'data-acting="1"' in asked and letters["c"].id in asked
    done = admin_client.post(replay, {"confirm": "yes", "reason": "endpoint back up"})
    assert done.status_code == 302 and done["Location"] == DEAD_LETTERS
    assert Delivery.objects.get(id=letters["c"].id).status == "pending"
    page = admin_client.get(f"{DEAD_LETTERS}{quote(letters['c'].id)}/change/").content.decode()
    assert 'data-testid="not-dead"' in page and 'data-testid="replay"' not in page
    again = admin_client.post(replay, {"confirm": "yes", "reason": "twice"})  # no longer dead: nothing to do
    assert again.status_code == 302 and OperatorAction.objects.order_by("started_at").last().acted == 0


def test_the_delivery_lists_replay_asks_for_a_reason_and_leaves_an_audit_row(admin_client, letters):
    chosen = {"action": "replay", "index": "0", "select_across": "0", "_selected_action": [letters["delivered"].id]}
    asked = admin_client.post("/admin/webhooks/delivery/", chosen)
    assert asked.status_code == 200 and 'data-acting="1"' in asked.content.decode()
    assert Delivery.objects.get(id=letters["delivered"].id).status == "delivered"

    done = admin_client.post("/admin/webhooks/delivery/", {**chosen, "confirm": "yes", "reason": "receiver lost it"},
                             follow=True)
    assert "Replay: 1 of 1 deliveries sent again" in done.content.decode()
    assert Delivery.objects.get(id=letters["delivered"].id).status == "pending"
    [entry] = OperatorAction.objects.all()
    assert (entry.action, entry.acted, entry.reason) == ("replay", 1, "receiver lost it")
