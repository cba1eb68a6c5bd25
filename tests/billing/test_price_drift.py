"""The cap holds whatever the price says (issue 37, finding 2): a settle above its reservation is a price drift,
recorded in the settle's own statement and said at once; from then on the model is reserved at no less than the
highest cost seen, so a wrong price (or a wrong `free`) lets a client's spend past its cap by at most what the
attempts already in flight at the first drift overshoot. And a price is changed only with billing's permission.

The repros: `{"name": "sandbox/video-keyed", "price": {"free": "false"}}` passed the start check, and a client
capped at $2 spent $4.00 (ten renders quoted at $0.40); a staff user holding only executor.change_modelconfig
set $0.01 per render, and a $1-capped client spent $2.40. The sandbox quotes $0.40 for every render whatever
payonce's card says: its ledger is what was paid."""

import logging
import threading
from decimal import Decimal as D

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connections

from accounts.models import Client
from billing import rates
from billing.models import BudgetMonth, ModelPrice, PriceDrift, Reservation
from billing.selectors import month_totals
from executor.models import Attempt
from operators.metrics import REGISTRY
from operators.models import OperatorAction
from prometheus_client.exposition import generate_latest
from tests.support.books import assert_books_balance
from tests.support.engine import media_job

pytestmark = pytest.mark.django_db(transaction=True)

KEYED = "sandbox/video-keyed"
QUOTE = D("0.400000")  # what the sandbox charges for a render, whatever the card says


def priced(model: str = KEYED, **price) -> None:
    """A rate card override, as the admin's Models page writes it, read at once by this process."""
    ModelPrice.objects.update_or_create(model=model, defaults=price)
    rates.forget_overrides()


def capped(cap: str) -> Client:
    return Client.objects.create(name=f"capped at {cap}", monthly_cap_usd=D(cap))


def spent(client: Client) -> D:
    """What GET /v1/spend says the client spent this month."""
    return month_totals(BudgetMonth.objects.filter(client=client).first())[0]


def renders(engine, client: Client, n: int) -> list:
    jobs = [media_job(client.id, input={"prompt": f"render {i}", "render_s": 0}) for i in range(n)]
    for job in jobs:
        engine.run_job(job)
        job.refresh_from_db()
    return jobs


def test_a_wrong_price_drifts_once_and_the_cap_holds_after_it(engine, ledger, fresh_catalog, caplog):
    priced(per_unit_usd=D("0.01"), unit="render")  # the card says $0.01; the provider charges $0.40
    client = capped("1.00")

    with caplog.at_level(logging.ERROR, logger="billing.services"):
        jobs = renders(engine, client, 6)

    # The first render reserved $0.01 and settled $0.40: the drift. The next ones reserved $0.40 each, and
    # the third found no room: spent $0.80, under the $1 cap (without the floor: 6 x $0.40 = $2.40).
    assert [job.status for job in jobs] == ["succeeded", "succeeded"] + ["failed"] * 4, [j.error for j in jobs]
    assert {job.error["code"] for job in jobs[2:]} == {"BUDGET_EXCEEDED"}
    assert spent(client) == D("0.800000") <= client.monthly_cap_usd
    drift = PriceDrift.objects.get(model=KEYED)
    assert (drift.reserved_usd, drift.cost_usd, drift.highest_cost_usd, drift.drifts) == (
        D("0.010000"), QUOTE, QUOTE, 1)
    assert sorted(Reservation.objects.values_list("amount", "spent")) == [(D("0.010000"), QUOTE), (QUOTE, QUOTE)]
    [said] = [r for r in caplog.records if r.getMessage().startswith("price.drift")]
    assert "sandbox/video-keyed settled at $0.400000 over its reservation of $0.010000" in said.getMessage()
    assert sum(D(c["amount_usd"]) for c in assert_books_balance(ledger)) == D("0.80")


def test_a_model_wrongly_free_drifts_and_is_then_reserved_at_what_it_costs(engine, ledger, fresh_catalog):
    priced(free=True)  # what `"free": "false"` used to mean (the string is refused now: tests/executor/test_catalog.py)
    client = capped("2.00")

    jobs = renders(engine, client, 10)

    assert sum(job.status == "succeeded" for job in jobs) == 5  # $0 reserved once, then $0.40 each: 5 fit
    assert spent(client) == D("2.000000")
    assert PriceDrift.objects.get(model=KEYED).reserved_usd == D("0.000000")
    assert sum(D(c["amount_usd"]) for c in assert_books_balance(ledger)) == D("2.00")


def test_the_overshoot_is_at_most_what_was_in_flight_when_the_drift_was_first_seen(engine, ledger, fresh_catalog):
    # Five renders go out at once under a $0.01 price (all five reservations fit a $1 cap), then ten more
    # after them. Spend may pass the cap only by what those five overshoot their reservations.
    priced(per_unit_usd=D("0.01"), unit="render")
    client = capped("1.00")
    first = [media_job(client.id, input={"prompt": f"early {i}", "render_s": 0.5}) for i in range(5)]
    barrier = threading.Barrier(len(first))

    def out(job):
        try:
            barrier.wait()
            engine.run_job(job)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=out, args=(job,)) for job in first]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    renders(engine, client, 10)

    in_flight = len(first)
    margin = in_flight * (QUOTE - D("0.01"))
    assert spent(client) <= client.monthly_cap_usd + margin, (spent(client), margin)
    assert spent(client) == in_flight * QUOTE  # the later ten found no room: the floor holds from the drift on
    assert Attempt.objects.filter(job__client=client).count() == in_flight
    assert sum(D(c["amount_usd"]) for c in assert_books_balance(ledger)) == spent(client)


def test_a_price_lowered_mid_run_raises_no_cap_above_the_floor(engine, ledger, fresh_catalog):
    client = capped("2.00")
    renders(engine, client, 2)  # at the card's $0.40
    priced(per_unit_usd=D("0.05"), unit="render")  # lowered (wrongly) while work goes on
    jobs = renders(engine, client, 10)

    assert spent(client) <= client.monthly_cap_usd + QUOTE - D("0.05")  # one in flight at the first drift
    assert sum(job.status == "succeeded" for job in jobs) == 3
    assert sum(D(c["amount_usd"]) for c in assert_books_balance(ledger)) == spent(client)


def test_a_drift_is_on_the_metrics_and_the_models_page_and_an_operator_clears_it(engine, ledger, fresh_catalog, admin_client):
    priced(per_unit_usd=D("0.01"), unit="render")
    renders(engine, capped("5.00"), 1)

    scraped = generate_latest(REGISTRY).decode()
    assert 'payonce_price_drift_highest_cost_usd{model="sandbox/video-keyed"} 0.4' in scraped
    assert 'payonce_price_drift_reserved_usd{model="sandbox/video-keyed"} 0.01' in scraped
    from executor.models import ModelConfig

    row = ModelConfig.objects.create(name=KEYED)
    page = admin_client.get(f"/admin/executor/modelconfig/{row.id}/change/").content.decode()
    assert "Attempts settle above their reservation" in page and "$0.400000" in page
    assert "up to $0.400000" in admin_client.get("/admin/executor/modelconfig/").content.decode()

    drift = PriceDrift.objects.get(model=KEYED)
    confirm = {"action": "clear", "_selected_action": [str(drift.id)], "select_across": "0", "index": "0"}
    assert b"Clear price drifts" in admin_client.post("/admin/billing/pricedrift/", confirm).content
    done = admin_client.post("/admin/billing/pricedrift/", {**confirm, "confirm": "yes", "reason": "price fixed"})
    assert done.status_code == 302, done.content.decode()[-2000:]
    drift.refresh_from_db()
    assert drift.cleared_at is not None and not drift.holds
    assert OperatorAction.objects.get(action="drift_clear").reason == "price fixed"
    assert "payonce_price_drift_highest_cost_usd{" not in generate_latest(REGISTRY).decode()
    assert rates.worst_case(KEYED) == D("0.010000")  # the card's again, until the next drift


def test_a_price_is_changed_only_with_the_billing_permission_and_is_audited(client, fresh_catalog, db):
    # The repro: a staff user holding only executor.change_modelconfig set $0.01 per render.
    from executor.models import ModelConfig

    row = ModelConfig.objects.create(name=KEYED, note="the sandbox's keyed model")
    editor = User.objects.create_user("editor", password="pw", is_staff=True)
    editor.user_permissions.add(*Permission.objects.filter(codename__in=["change_modelconfig", "view_modelconfig"]))
    client.force_login(editor)
    form = {"name": KEYED, "enabled": "on", "note": "cheaper", "price_override": "on", "per_unit_usd": "0.01",
            "unit": "render", "price_reason": "cheaper"}
    saved = client.post(f"/admin/executor/modelconfig/{row.id}/change/", form)
    assert saved.status_code == 302, saved.content.decode()[-2000:]
    assert ModelConfig.objects.get(id=row.id).note == "cheaper"  # the model's own fields: its permission
    assert not ModelPrice.objects.exists() and not OperatorAction.objects.exists()  # the price: not changed
    assert rates.worst_case(KEYED) == QUOTE

    editor.user_permissions.add(Permission.objects.get(codename="change_modelprice"))
    editor = User.objects.get(id=editor.id)  # permissions are cached on the user
    client.force_login(editor)
    unexplained = client.post(f"/admin/executor/modelconfig/{row.id}/change/", {**form, "price_reason": ""})
    assert unexplained.status_code == 200 and "A price change is audited: say why." in unexplained.content.decode()
    assert not ModelPrice.objects.exists()

    saved = client.post(f"/admin/executor/modelconfig/{row.id}/change/", form)
    assert saved.status_code == 302, saved.content.decode()[-2000:]
    assert ModelPrice.objects.get(model=KEYED).per_unit_usd == D("0.01")
    audit = OperatorAction.objects.get(action="price")
    assert (audit.who, audit.via, audit.target, audit.reason) == ("editor", "admin", f"model {KEYED}", "cheaper")
    assert audit.detail["before"] is None and audit.detail["after"]["per_unit_usd"] == "0.010000"

    client.post(f"/admin/executor/modelconfig/{row.id}/change/", form)  # saved again, unchanged: nothing audited
    assert OperatorAction.objects.filter(action="price").count() == 1


def test_the_one_statement_settle_records_a_drift_too(api, fresh_catalog, settings):
    # A synchronous provider's answer carries the finished work: the attempt's end, its settle and the
    # wait step's mark are one statement (executor.render.finish_answered). The drift rides it as well.
    from billing import services

    client = capped("5.00")
    job = media_job(client.id)
    services.reserve(client_id=client.id, job_id=job.id, key="k-1", model=KEYED, amount=D("0.01"), guard="true")
    sql, params = services.settle_cte(key="k-1", cost=QUOTE, when="true")
    with connections["default"].cursor() as cursor:
        cursor.execute(f"WITH {sql} SELECT {', '.join(services.SETTLE_DRIFT_COLUMNS)}", params)
        row = cursor.fetchone()
    assert row[1:] == (KEYED, D("0.010000"), QUOTE, True)
    assert PriceDrift.objects.get(model=KEYED).highest_cost_usd == QUOTE
    assert services.reservation_floor(KEYED) == QUOTE
    assert BudgetMonth.objects.get(client=client).reserved == D("0.010000")  # the fold moves it later
