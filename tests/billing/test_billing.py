"""Billing against real PostgreSQL and the sandbox over HTTP: the rate card (priced exactly once per
vendor, to the 6th decimal), the budget guard's reserve / settle / release, the fan-out pre-flight,
month rollover, GET /v1/spend and the cap on the command line."""

import dataclasses
import json
import uuid
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from decimal import Decimal
from types import SimpleNamespace

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from accounts.models import Client
from billing import months, rates, services
from billing.models import BudgetMonth, ModelPrice, Reservation
from billing.selectors import month_totals
from executor import llm, render
from executor.models import Attempt
from executor.providers import openai_compat
from executor.providers.anthropic import adapter as anthropic
from executor.providers.sandbox.adapter import SandboxProvider
from jobs.engine import runner
from jobs.engine.outcomes import Done, FanOut, JobFailure, Resume, StepRetry, Stop
from jobs.engine.workflow import Effect, FanOutSpec, Recipe, Stage, StepSpec
from jobs.kinds import KINDS
from jobs.models import Job
from tests.conftest import media_body
from tests.support.books import assert_books_balance

# Under rollback: the reservation rules need no second connection (the intent's guard lets the test case's
# own block pass, executor.record.intend); the tests of many processes are test_budget_concurrency's.
pytestmark = pytest.mark.django_db
D = Decimal


@pytest.fixture(autouse=True)
def fresh_rate_card():
    rates.forget_overrides()
    yield
    rates.forget_overrides()


# --- the rate card: every fixture hand-computed to the 6th decimal ------------------------------------------


def anthropic_usage(**raw):
    return anthropic.parse_usage(raw).as_dict()


def openai_usage(**raw):
    return openai_compat.parse_usage(raw).as_dict()


PRICING = [
    # (what, model, usage as the adapter normalises the vendor's report, expected USD)
    ("anthropic plain", "anthropic/claude-sonnet-4-5", anthropic_usage(input_tokens=1000, output_tokens=500),
     D("0.010500")),  # 1000 x 3 + 500 x 15 = 10,500 per million
    ("anthropic cache writes and reads, each once", "anthropic/claude-sonnet-4-5",
     anthropic_usage(input_tokens=200, cache_creation_input_tokens=10000, cache_read_input_tokens=50000,
                     output_tokens=800),
     D("0.065100")),  # 200 x 3 + 10,000 x 3.75 + 50,000 x 0.30 + 800 x 15 = 600 + 37,500 + 15,000 + 12,000
    ("anthropic dated snapshot", "anthropic/claude-opus-4-1-20250805",
     anthropic_usage(input_tokens=1234, output_tokens=567), D("0.061035")),  # 18,510 + 42,525
    ("anthropic cache reads only", "anthropic/claude-haiku-4-5",
     anthropic_usage(input_tokens=3, cache_read_input_tokens=120000, output_tokens=250),
     D("0.013253")),  # 3 + 12,000 + 1,250
    ("openai cached prompt tokens are part of prompt_tokens", "openai/gpt-4.1-mini",
     openai_usage(prompt_tokens=10000, completion_tokens=2000, prompt_tokens_details={"cached_tokens": 6000}),
     D("0.005400")),  # 4,000 x 0.40 + 6,000 x 0.10 + 2,000 x 1.60 = 1,600 + 600 + 3,200
    ("openai reasoning tokens are part of completion_tokens", "openai/o4-mini",
     openai_usage(prompt_tokens=500, completion_tokens=3000, completion_tokens_details={"reasoning_tokens": 2500}),
     D("0.013750")),  # 500 x 1.10 + 3,000 x 4.40 = 550 + 13,200
    ("openai cached and reasoning together, dated", "openai/gpt-5-2025-08-07",
     openai_usage(prompt_tokens=20000, completion_tokens=4000, prompt_tokens_details={"cached_tokens": 16000},
                  completion_tokens_details={"reasoning_tokens": 3000}),
     D("0.047000")),  # 4,000 x 1.25 + 16,000 x 0.125 + 4,000 x 10 = 5,000 + 2,000 + 40,000
    ("sandbox llm", "sandbox/llm", {"input_tokens": 37, "output_tokens": 201}, D("0.003126")),  # 111 + 3,015
    ("half a micro-dollar rounds up", "openai/gpt-4o-mini", openai_usage(prompt_tokens=7, completion_tokens=0),
     D("0.000001")),  # 7 x 0.15 = 1.05 per million
    ("sandbox video, per render", "sandbox/video-keyed", None, D("0.400000")),
    ("sandbox image, per image", "sandbox/image-lookup", None, D("0.040000")),
    ("unknown model: unpriced, never free", "anthropic/claude-sonet-4-5", anthropic_usage(input_tokens=10, output_tokens=10),
     None),
    ("known token model with no usage reported: unpriced", "openai/gpt-4.1", None, None),
    ("media the card cannot price: unpriced", "replicate/someone/some-model", {"units": 1.5}, None),
    ("media priced per image: its predict time is not what it is billed by", "replicate/black-forest-labs/flux-schnell",
     {"units": 1.5}, D("0.003000")),
    ("an image priced by its size and quality, billed by the tokens its answer reports", "openai-images/gpt-image-1",
     {"input_tokens": 17, "output_tokens": 1056, "units": 1}, D("0.042325")),
]


@pytest.mark.parametrize("model,usage,expected", [row[1:] for row in PRICING], ids=[row[0] for row in PRICING])
def test_the_cost_of_a_call(model, usage, expected):
    assert rates.cost_of(model, usage) == expected


def test_an_image_price_follows_its_parameters_and_an_unknown_one_is_the_dearest(db):
    image = "openai-images/gpt-image-1"
    assert rates.worst_case(image, params={"quality": "low", "size": "1024x1024"}) == D("0.010880")
    assert rates.worst_case(image, params={"quality": "auto", "size": "1024x1024"}) == D("0.166400")  # high, at most
    assert rates.worst_case(image, params={}) == rates.worst_case(image) == D("0.249600")  # both default to auto
    assert rates.worst_case(image, params={"quality": "low", "size": "1024x1024"}, input_tokens=1000) == D("0.015880")
    # A value the table does not know is a mistake: the penalty tier reserves more, and nobody can price it.
    assert rates.worst_case(image, params={"quality": "ultra"}) == rates.PENALTY_MEDIA_PER_UNIT
    assert rates.cost_of("openai-images/dall-e-3", {"units": 1}, params={"quality": "ultra"}) is None
    assert rates.cost_of("openai-images/dall-e-3", {"units": 1}, params={"quality": "hd", "size": "1792x1024"}) == D(
        "0.120000")
    assert rates.cost_of("fal/fal-ai/flux/dev", {"units": 3.2}, params={}) == D("0.025000")  # landscape_4_3


def test_a_model_marked_free_costs_zero_and_only_it(db):
    usage = openai_usage(prompt_tokens=1000, completion_tokens=1000)
    assert rates.cost_of("openai/llama-3.1-8b-local", usage) is None  # unknown: unpriced
    ModelPrice.objects.create(model="openai/llama-3.1-8b-local", free=True)
    rates.forget_overrides()
    assert rates.cost_of("openai/llama-3.1-8b-local", usage) == D("0.000000")
    assert rates.worst_case("openai/llama-3.1-8b-local", max_tokens=8000, input_tokens=1000) == D("0.000000")


def test_an_override_in_the_database_wins_over_the_default(db):
    usage = openai_usage(prompt_tokens=1_000_000, completion_tokens=0)
    assert rates.cost_of("openai/gpt-4.1-mini", usage) == D("0.400000")
    ModelPrice.objects.create(model="openai/gpt-4.1-mini", input_per_mtok_usd=D("0.5"), output_per_mtok_usd=D("2"))
    rates.forget_overrides()
    assert rates.cost_of("openai/gpt-4.1-mini", usage) == D("0.500000")


def test_a_typo_in_a_model_name_reserves_more_than_the_real_model_would():
    real = rates.worst_case("anthropic/claude-sonnet-4-5", max_tokens=8000, input_tokens=20000)
    typo = rates.worst_case("anthropic/claude-sonet-4-5", max_tokens=8000, input_tokens=20000)
    assert real == D("0.195000")  # 20,000 x 3.75 (cache write, the dearest input) + 8,000 x 15
    assert typo == D("0.900000") and typo > real  # 20,000 x 15 + 8,000 x 75
    assert rates.worst_case("replicate/some-owner/some-typo") > rates.worst_case("sandbox/video-keyed")


@pytest.mark.parametrize("content", ["a chart of the sky", "x" * 5000, "é" * 900])
def test_the_sandbox_llm_charges_what_the_rate_card_derives_to_the_cent(ledger, content):
    completion = SandboxProvider().complete(
        "llm", system="You write horoscopes.", messages=[{"role": "user", "content": content}], max_tokens=300,
        upstream_key=f"payonce-price-{uuid.uuid4()}", metadata={})
    [charge] = ledger.ledger()["charges"]
    assert "cost_usd" not in completion.raw  # usage only, like Anthropic's Messages API
    assert rates.cost_of("sandbox/llm", completion.usage.as_dict()) == D(charge["amount_usd"])
    worst = rates.worst_case("sandbox/llm", max_tokens=300, input_tokens=rates.input_tokens_bound(
        "You write horoscopes.", [{"role": "user", "content": content}]))
    assert worst >= D(charge["amount_usd"])  # the reservation covers what was charged


# --- the guard: reserve, settle, release, exactly once ----------------------------------------------------


def client_with_cap(cap: str | None) -> Client:
    return Client.objects.create(name="capped", monthly_cap_usd=D(cap) if cap is not None else None)


def job_of(client, **overrides) -> Job:
    body = media_body(**overrides)
    job_id = uuid.uuid4()
    return Job.objects.create(
        id=job_id, client=client, idempotency_key=f"k-{job_id}", request_hash="0" * 64, kind=body["kind"],
        model_chain=body["models"], input=body["input"], policy={"attempts_per_model": 3, "fallback_on": []},
        output_key=f"outputs/{job_id}/o.mp4", metadata={}, lease_until=timezone.now() + timedelta(minutes=10))


def reserve(job, key, amount, at=None) -> bool:
    return services.reserve(client_id=job.client_id, job_id=job.id, key=key, model="sandbox/video-keyed",
                            amount=D(amount), guard=Job.NOT_CANCELLED_SQL, at=at)


def month_row(client, at=None) -> SimpleNamespace:
    """The month as it is now (the counters plus what is not folded yet: billing.selectors.month_totals)."""
    budget = BudgetMonth.objects.get(client=client, month=services.month_of(at or timezone.now()))
    spent, reserved = month_totals(budget)
    return SimpleNamespace(spent=spent, reserved=reserved)


def test_a_reservation_that_does_not_fit_is_refused_and_reserves_nothing(db):
    client = client_with_cap("1.00")
    job = job_of(client)
    assert reserve(job, "a", "0.40") and reserve(job, "b", "0.40")
    assert not reserve(job, "c", "0.40")  # 0.80 + 0.40 > 1.00
    row = month_row(client)
    assert (row.spent, row.reserved) == (D("0"), D("0.80"))
    assert not Reservation.objects.filter(key="c").exists()


def test_settle_and_release_move_the_money_exactly_once(db):
    client = client_with_cap("1.00")
    job = job_of(client)
    for key in ("a", "b", "c"):
        reserve(job, key, "0.30")
    assert services.settle(key="a", cost=D("0.25")) and not services.settle(key="a", cost=D("0.25"))
    assert services.release(key="b") and not services.release(key="b") and not services.settle(key="b", cost=D("1"))
    assert services.settle(key="c", cost=None)  # unpriced: all of it stays spent
    row = month_row(client)
    assert (row.spent, row.reserved) == (D("0.55"), D("0"))
    assert Reservation.objects.get(key="c").unpriced
    # The headroom came back: 0.45 fits now.
    assert reserve(job, "d", "0.45") and not reserve(job, "e", "0.01")


def test_the_default_cap_applies_to_a_client_without_one(db, settings):
    settings.BUDGET_MONTHLY_CAP_USD = D("0.50")
    job = job_of(client_with_cap(None))
    assert reserve(job, "a", "0.50") and not reserve(job, "b", "0.000001")


def test_spend_at_the_last_second_of_a_month_and_the_first_of_the_next_land_in_different_months(db):
    client = client_with_cap("1.00")
    job = job_of(client)
    last = datetime(2026, 11, 30, 23, 59, 59, tzinfo=dt_timezone.utc)
    first = datetime(2026, 12, 1, 0, 0, 1, tzinfo=dt_timezone.utc)
    assert reserve(job, "late", "0.90", at=last) and reserve(job, "early", "0.90", at=first)
    services.settle(key="late", cost=D("0.90"))
    services.settle(key="early", cost=D("0.70"))
    months = {row.month.isoformat(): month_totals(row)[0] for row in BudgetMonth.objects.filter(client=client)}
    assert months == {"2026-11-01": D("0.90"), "2026-12-01": D("0.70")}


def test_the_counters_stay_conservative_until_a_fold_moves_each_reservation_once(db):
    client = client_with_cap("1.00")
    job = job_of(client)
    reserve(job, "a", "0.60")
    services.settle(key="a", cost=D("0.10"))
    raw = BudgetMonth.objects.get(client=client)
    assert (raw.spent, raw.reserved) == (D("0"), D("0.60"))  # the whole reservation, until folded
    assert (month_row(client).spent, month_row(client).reserved) == (D("0.10"), D("0"))
    assert reserve(job, "b", "0.80")  # refused on the counters, folded, then it fits: 0.10 + 0.80
    raw.refresh_from_db()
    assert (raw.spent, raw.reserved) == (D("0.10"), D("0.80"))
    assert not services.fold(client_id=client.id, month=raw.month)  # folded once: nothing left to move
    services.release(key="b")
    assert services.fold_all() == 1
    raw.refresh_from_db()
    assert (raw.spent, raw.reserved) == (D("0.10"), D("0"))


# Committed: the statement that loses on the constraint aborts the transaction it runs in, which under
# rollback is the test's own; the intent runs in autocommit, where it aborts nothing but itself.
@pytest.mark.django_db(transaction=True)
def test_an_intent_that_loses_its_race_leaves_no_reservation(ledger, db):
    client = client_with_cap("1.00")
    job = job_of(client)
    Attempt.objects.create(job=job, run=1, number=1, provider="sandbox", model="video-keyed",
                           upstream_key=f"payonce-{job.id}-1", state="running", sends=1)
    with pytest.raises(StepRetry, match="attempt_one_out_per_run"):
        render.intend(job, "sandbox/video-keyed")  # the INSERT fails, and with it the reservation
    assert not Reservation.objects.exists() and not BudgetMonth.objects.filter(reserved__gt=0).exists()


# --- through the executor: what each outcome does to the reservation ------------------------------------------


def reservations(job) -> list[tuple]:
    return list(Reservation.objects.filter(job=job).order_by("key").values_list("state", "amount", "spent", "unpriced"))


def test_a_keyed_resend_after_a_lost_answer_reserves_once_and_settles_the_quote(engine, ledger, db):
    client = client_with_cap("1.00")
    job = job_of(client, input={"prompt": "resent", "render_s": 0})
    ledger.faults([{"model": "video-keyed", "action": "accept_then_drop"}])
    engine.run_job(job)
    job.refresh_from_db()
    assert job.status == "succeeded"
    assert reservations(job) == [("settled", D("0.40"), D("0.40"), False)]
    assert (month_row(client).spent, month_row(client).reserved) == (D("0.40"), D("0"))
    assert len(assert_books_balance(ledger)) == 1


def test_a_503_declared_unpaid_releases_its_reservation_and_the_next_attempt_settles(engine, ledger, db):
    client = client_with_cap("1.00")
    job = job_of(client, input={"prompt": "refused then paid", "render_s": 0})
    ledger.faults([{"model": "video-keyed", "action": "status_503"}])
    engine.run_job(job)
    job.refresh_from_db()
    assert job.status == "succeeded"
    assert reservations(job) == [("released", D("0.40"), None, False), ("settled", D("0.40"), D("0.40"), False)]
    assert (month_row(client).spent, month_row(client).reserved) == (D("0.40"), D("0"))
    assert len(assert_books_balance(ledger)) == 1


def test_a_422_refusal_releases(engine, ledger, db):
    client = client_with_cap("1.00")
    job = job_of(client, input={"prompt": "refused", "render_s": 0})
    ledger.faults([{"model": "video-keyed", "action": "status_422"}])
    job = engine.run_job(job)
    assert (job.status, job.error["code"]) == ("failed", "INVALID_INPUT")
    assert reservations(job) == [("released", D("0.40"), None, False)]
    assert (month_row(client).spent, month_row(client).reserved) == (D("0"), D("0"))
    assert assert_books_balance(ledger) == []


def test_a_blind_uncertain_attempt_keeps_its_reservation_until_a_person_decides(engine, ledger, db):
    from jobs.services import job_retry

    client = client_with_cap("1.00")
    job = job_of(client, models=["sandbox/image-blind"], input={"prompt": "lost", "render_s": 0})
    ledger.faults([{"model": "image-blind", "action": "accept_then_drop"}])
    job = engine.run_job(job)
    assert (job.status, job.error["code"]) == ("waiting", "UNCERTAIN_SUBMIT")
    assert reservations(job) == [("held", D("0.04"), None, True)]  # held, and counted unpriced meanwhile
    assert month_row(client).reserved == D("0.04")
    job.refresh_from_db()
    job_retry(job=job)  # a person decides to pay again: the uncertain one may have been paid
    assert reservations(job) == [("settled", D("0.04"), D("0.04"), True)]
    assert (month_row(client).spent, month_row(client).reserved) == (D("0.04"), D("0"))
    assert len(assert_books_balance(ledger)) == 1


def test_an_unpriced_call_keeps_its_reservation_as_spent_and_shows_as_unpriced(ledger, api):
    # sandbox/video-keyed with its price taken off the card (an override with no price) and a provider
    # that quotes nothing would be unpriced; here: an LLM model the card does not know, on the sandbox.
    client = Client.objects.get(id=api.client_id)
    job = job_of(client)
    # An override the form would refuse (written by hand): the card no longer knows the model. (An override
    # with no amount at all is refused by the table: model_price_states_amount.)
    ModelPrice.objects.create(model="sandbox/llm", variants={"not": "a table"}, note="price unknown for this test")
    rates.forget_overrides()
    result = llm.llm_call(job, step="chapter-a", model_name="sandbox/llm", system="s",
                               messages=[{"role": "user", "content": "hello"}], max_tokens=100)
    [attempt] = Attempt.objects.filter(job=job)
    assert result["cost_usd"] is None and attempt.cost_usd is None
    [(state, amount, spent, unpriced)] = reservations(job)
    assert (state, spent, unpriced) == ("settled", amount, True) and amount > 0
    answer = api.get("/v1/spend").json()
    assert answer["unpriced_attempts"] == 1 and answer["spent_usd"] == str(amount)
    assert answer["by_model"] == [{"model": "sandbox/llm", "spent_usd": str(amount), "attempts": 1,
                                   "unpriced_attempts": 1}]


# --- the fan-out pre-flight ---------------------------------------------------------------------------------


UNITS = ["a", "b", "c"]
UNIT_MESSAGES = [{"role": "user", "content": "write one chapter"}]


def unit_worst_case() -> Decimal:
    return rates.worst_case("sandbox/llm", max_tokens=200, input_tokens=rates.input_tokens_bound("s", UNIT_MESSAGES))


def fanout_recipe() -> Recipe:
    def preflight(ctx):
        if not services.fanout_reserve(client_id=ctx.job.client_id, job_id=ctx.job.id, key=f"fanout-{ctx.job.id}",
                                       units=len(UNITS), unit_worst_case=unit_worst_case(),
                                       guard=ctx.job.NOT_CANCELLED_SQL):
            raise JobFailure("BUDGET_EXCEEDED", "the fan-out's worst case does not fit")
        return {"reserved": True}

    def unit(ctx, key):
        return llm.llm_call(ctx.job, step=f"unit-{key}", model_name="sandbox/llm", system="s",
                                 messages=UNIT_MESSAGES, max_tokens=200, pool=f"fanout-{ctx.job.id}")

    def join(ctx):
        services.fanout_release(key=f"fanout-{ctx.job.id}")
        return {"released": True}

    return Recipe((
        Stage("preflight", (StepSpec("preflight", preflight, Effect.DB),)),
        Stage("units", fanout=FanOutSpec("unit", keys=lambda ctx: UNITS, fn=unit)),
        Stage("join", (StepSpec("join", join, Effect.DB),)),
    ))


def fanout_job(monkeypatch, client) -> Job:
    monkeypatch.setitem(KINDS, "report", dataclasses.replace(KINDS["report"], recipe=fanout_recipe()))
    job = job_of(client)
    Job.objects.filter(id=job.id).update(kind="report")
    job.refresh_from_db()
    return job


def test_a_fan_out_too_big_for_the_budget_is_refused_before_any_provider_call(ledger, monkeypatch, db):
    client = client_with_cap(str(unit_worst_case() * 2))  # room for two units, three planned
    job = fanout_job(monkeypatch, client)
    assert runner.run_stage(job_id=job.id, run=1, stage="preflight", owner="t") == Stop("failed: BUDGET_EXCEEDED")
    assert ledger.calls() == [] and Attempt.objects.filter(job=job).count() == 0
    assert not BudgetMonth.objects.filter(client=client, reserved__gt=0).exists()


def test_a_fan_out_that_fits_runs_every_unit_and_releases_the_rest(ledger, monkeypatch, db):
    worst = unit_worst_case()
    client = client_with_cap(str(worst * 3 + D("0.05")))
    job = fanout_job(monkeypatch, client)
    assert runner.run_stage(job_id=job.id, run=1, stage="preflight", owner="t") == FanOut("units", UNITS)
    # Another job of the client takes what is left of the month meanwhile: the units are not refused.
    other = job_of(client)
    assert reserve(other, "other", "0.05") and not reserve(other, "more", "0.000001")
    outcomes = [runner.run_substep(job_id=job.id, run=1, stage="units", key=key, owner=f"u{key}") for key in UNITS]
    assert outcomes[-1] == Resume("report", 2)
    assert runner.run_stage(job_id=job.id, run=1, stage="join", owner="t") == Done()

    charges = assert_books_balance(ledger)
    assert len(charges) == 3
    paid = sum(D(c["amount_usd"]) for c in charges)
    row = month_row(client)
    assert row.spent == paid and row.reserved == D("0.05")  # only the other job's reservation is left
    assert Reservation.objects.get(key=f"fanout-{job.id}").state == "released"
    assert {r.parent_id for r in Reservation.objects.filter(job=job, kind="attempt")} == {
        Reservation.objects.get(key=f"fanout-{job.id}").id}


# --- telemetry ---------------------------------------------------------------------------------------------


# --- GET /v1/spend and the command line ---------------------------------------------------------------------


def test_spend_answers_the_month_as_the_contract_says(api):
    client = Client.objects.get(id=api.client_id)
    job = job_of(client)
    reserve(job, "a", "0.40")
    services.settle(key="a", cost=D("0.40"))
    reserve(job, "b", "0.04")
    answer = api.get("/v1/spend").json()
    month = timezone.now()
    assert answer == {
        "month": f"{month:%Y-%m}",
        "resets_at": f"{months.next_month(months.month_of(month)):%Y-%m-%d}T00:00:00Z",
        "cap_usd": "20.000000", "spent_usd": "0.400000", "reserved_usd": "0.040000", "headroom_usd": "19.560000",
        "unpriced_attempts": 0,
        "by_model": [{"model": "sandbox/video-keyed", "spent_usd": "0.400000", "attempts": 2, "unpriced_attempts": 0}],
    }
    empty = api.get("/v1/spend", month="2020-02").json()
    assert (empty["spent_usd"], empty["by_model"], empty["resets_at"]) == ("0.000000", [], "2020-03-01T00:00:00Z")


@pytest.mark.parametrize("month", ["2026-13", "2026-00", "26-01", "2026-1", "abcd-ef", "1999-12", "2026-01-01", "\x00"])
def test_a_malformed_or_out_of_range_month_is_422(api, month):
    response = api.get("/v1/spend", month=month)
    assert response.status_code == 422 and response.json()["error"]["code"] == "INVALID_REQUEST"
    assert "month" in response.json()["error"]["fields"]


@pytest.mark.parametrize("cap", ["-1", "abc", "NaN", "1e9", "Infinity"])
def test_create_client_refuses_a_cap_that_is_not_an_amount(db, cap):
    with pytest.raises(CommandError, match="monthly-cap-usd"):
        call_command("create_client", "acme", "--monthly-cap-usd", cap)
    assert Client.objects.count() == 0


def test_create_client_takes_a_cap(db, capsys):
    call_command("create_client", "acme", "--monthly-cap-usd", "12.5")
    created = json.loads(capsys.readouterr().out)
    assert Client.objects.get(id=created["client_id"]).monthly_cap_usd == D("12.5")


# --- the admin ---------------------------------------------------------------------------------------------


def test_the_admin_shows_spend_per_client_month_the_rate_card_and_each_attempts_cost(engine, admin_client, ledger, db):
    client = client_with_cap("3.00")
    job = job_of(client, input={"prompt": "priced", "render_s": 0})
    engine.run_job(job)
    # The rate card's override is edited on the model's own admin page (the Models page).
    added = admin_client.post("/admin/executor/modelconfig/add/", {
        "name": "openai/gpt-4.1-mini", "enabled": "on", "price_override": "on", "input_per_mtok_usd": "0.5",
        "output_per_mtok_usd": "2", "price_reason": "the published price"})
    assert added.status_code == 302, added.content.decode()[:2000]
    assert ModelPrice.objects.get(model="openai/gpt-4.1-mini").input_per_mtok_usd == D("0.5")

    months = admin_client.get("/admin/billing/budgetmonth/").content.decode()
    assert "0.400000" in months and "2.600000" in months  # spent, and the headroom under the $3 cap
    card = admin_client.get("/admin/executor/modelconfig/").content.decode()
    assert "openai/gpt-4.1-mini" in card and "$0.500000 in / $2.000000 out per Mtok" in card
    page = admin_client.get(f"/admin/jobs/job/{job.id}/change/").content.decode()
    assert f"payonce-{job.id}-1" in page and "0.400000" in page and "quoted" in page
