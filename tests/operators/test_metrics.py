"""GET /metrics (operators.metrics): after a real run (the `web` process, a `worker`, the `webhooks` worker and
the sandbox with faults), every figure a scrape over HTTP shows is checked against the database, the
sandbox's own call log, and billing's selectors; then the protection, the bounded labels and the Grafana
dashboard's expressions."""

import json
import re
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import requests
import yaml
from django.conf import settings
from django.db.models import Count, F, Sum
from django.test import Client as DjangoClient
from django.utils import timezone
from kombu import Connection
from prometheus_client.parser import text_string_to_metric_families

from accounts.models import Client
from billing.models import BudgetMonth
from billing.months import month_of
from billing.selectors import month_spend
from config import metrics
from config.celery import app
from executor.models import Attempt
from jobs.kinds import KINDS
from jobs.models import Job, JobStatus, Step, StepStatus
from jobs.services import client_create
from operators import metrics as collector
from tests.conftest import WEB_STACK_ENV, WEBHOOK_TEST_ENV, purge_queue
from tests.support.books import assert_books_balance
from tests.support.http_api import HttpApi
from tests.support.procs import ProcfileProcess
from tests.support.webhook_receiver import Answer, WebhookReceiver
from webhooks.models import Delivery, DeliveryStatus, Endpoint

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "payonce.json"
UUID = re.compile(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}", re.I)
ENDED = {"succeeded", "failed", "waiting"}


def parse(text: str) -> dict[tuple, float]:
    """{(sample name, ((label, value), ...)): value} of an exposition."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def exported_names(text: str) -> set[str]:
    """The metric names an exposition declares (its # TYPE lines), samples or not."""
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def queried_as(text: str) -> dict[str, str]:
    """Each name a query may read -> the metric it belongs to: a declared metric's own name, and a
    histogram's samples (_bucket, _sum, _count)."""
    names = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            names[name] = name
            if kind == "histogram":
                names.update({f"{name}{suffix}": name for suffix in ("_bucket", "_sum", "_count")})
    return names


def scrape_http(url: str) -> str:
    headers = {"Authorization": f"Bearer {settings.METRICS_TOKEN}"} if settings.METRICS_TOKEN else {}
    response = requests.get(f"{url}/metrics", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return response.text


def of(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def series(samples: dict, name: str) -> dict[tuple, float]:
    return {labels: value for (sample, labels), value in samples.items() if sample == name}


def events(samples: dict, name: str, label: str) -> dict[str, float]:
    return {dict(labels)[label]: value for labels, value in series(samples, name).items()}


def stuck_job(client_id) -> Job:
    """A media job whose worker died holding the submit step's lease, and whose message is gone: only the
    sweeper finds it, and the step is taken over (Step.attempts 2)."""
    past = timezone.now() - timedelta(minutes=5)
    job_id = uuid.uuid4()
    job = Job.objects.create(
        id=job_id, client_id=client_id, idempotency_key=f"stuck-{job_id}", request_hash="0" * 64, kind="media",
        model_chain=["sandbox/video-keyed"], input={"prompt": "a lost render", "render_s": 1},
        policy={"attempts_per_model": 3, "fallback_on": []}, output_key=f"metrics/{job_id}.mp4",
        status=JobStatus.RUNNING, started_at=past, lease_until=past,
    )
    Step.objects.create(job=job, run=1, name="mark_running", status=StepStatus.DONE, finished_at=past)
    Step.objects.create(job=job, run=1, name="submit", status=StepStatus.RUNNING, lease_owner="a-dead-worker",
                        lease_until=past)
    return job


def media(api: HttpApi, key: str, model: str, **input_) -> str:
    body = {"kind": "media", "models": [model], "input": {"prompt": f"metrics {key}", **input_}}
    created = api.create(body, key=key)
    assert created.status_code == 201, created.text
    return created.json()["id"]


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not after {timeout} s"
        time.sleep(0.2)


@pytest.fixture
def stack_worker(transactional_db, web_stack):
    """conftest's `web_worker`, with the webhook test timings: a delivery whose first try's message is not
    taken (no `webhooks` worker on this broker) is due for the drainer after a second, not 30."""
    purge_queue(WEB_STACK_ENV["BROKER_URL"], "jobs")
    purge_queue(WEB_STACK_ENV["BROKER_URL"], "webhooks")
    worker = ProcfileProcess("worker", {**WEB_STACK_ENV, **WEBHOOK_TEST_ENV,
                                        "PROVIDER_CALLBACK_BASE_URL": web_stack.url}).start()
    yield worker
    worker.stop()
    purge_queue(WEB_STACK_ENV["BROKER_URL"], "webhooks")


@pytest.fixture
def receivers():
    with WebhookReceiver() as ok, WebhookReceiver(default=Answer(status=500)) as failing:
        yield ok, failing


def test_every_figure_of_a_scrape_matches_the_database_after_a_real_run(
        web_stack, stack_worker, webhooks_worker, drainer, ledger, receivers):
    ok, failing = receivers
    alpha = HttpApi(web_stack.url, client_create(name="metrics-alpha", webhook_url=ok.url))
    beta = HttpApi(web_stack.url, client_create(name="metrics-beta", webhook_url=failing.url))
    gamma = HttpApi(web_stack.url, client_create(name="metrics-gamma", webhook_url=ok.url))
    Endpoint.objects.filter(client_id=gamma.client_id).update(disabled_at=timezone.now(), disabled_reason="test")
    before = parse(scrape_http(web_stack.url))

    # Given a run with faults: a success polled and called back, a 422, a blind submit whose answer is
    # lost (held for a person), a job only the sweeper can find, then a 429 retried.
    ledger.faults([{"model": "image-lookup", "action": "status_422", "message": "no such size"},
                   {"model": "image-blind", "action": "accept_then_drop"}])
    jobs = [(alpha, media(alpha, "ok", "sandbox/video-keyed", render_s=1)),
            (alpha, media(alpha, "refused", "sandbox/image-lookup", render_s=0)),
            (beta, media(beta, "lost", "sandbox/image-blind", render_s=0)),
            (gamma, media(gamma, "quiet", "sandbox/video-keyed", render_s=1))]
    lost = stuck_job(alpha.client_id)
    with Connection(WEB_STACK_ENV["BROKER_URL"]) as conn:
        app.send_task("jobs.sweep", connection=conn)  # what beat does every SWEEP_INTERVAL_S
    ended = [api.wait(job_id, statuses=ENDED, timeout=60)["status"] for api, job_id in [*jobs, (alpha, str(lost.id))]]
    assert ended == ["succeeded", "failed", "waiting", "succeeded", "succeeded"]
    ledger.faults([{"model": "video-keyed", "action": "status_429"}])
    assert beta.wait(media(beta, "busy", "sandbox/video-keyed", render_s=1), ENDED, 60)["status"] == "succeeded"
    # A forged callback, answered by the web process.
    forged = requests.post(f"{web_stack.url}/v1/callbacks/sandbox", data=b'{"id": "gen_x"}', timeout=10, headers={
        "Content-Type": "application/json", "webhook-id": "msg_forged", "webhook-timestamp": str(int(time.time())),
        "webhook-signature": "v1,Zm9yZ2Vk"})
    assert forged.status_code == 400

    # The run settles: every callback answered (or out of tries), every delivery but the disabled
    # endpoint's ended, and no worker polls any more.
    calls = {"callbacks": 0}

    def callbacks_settled() -> bool:
        log = ledger.callbacks()
        settled = all(entry["status"] is not None and entry["status"] < 300 or entry["try"] >= 3
                      for entry in _last_tries(log))
        calls["callbacks"] = len(log)
        return settled and len(log) > 0

    wait_until(callbacks_settled, 30, "the sandbox's callbacks answered")
    wait_until(lambda: not Delivery.objects.filter(status=DeliveryStatus.PENDING)
               .exclude(client_id=gamma.client_id).exists(), 60, "deliveries delivered or dead")
    stack_worker.stop()
    time.sleep(0.5)
    assert ledger.callbacks() and len(ledger.callbacks()) == calls["callbacks"]

    # When Prometheus scrapes the web process over HTTP ...
    started = time.monotonic()
    text = scrape_http(web_stack.url)
    took = time.monotonic() - started
    after = parse(text)
    assert took < 5, took

    # ... then jobs by status and kind are the rows', every status and kind present.
    rows = {(r["status"], r["kind"]): r["n"] for r in Job.objects.values("status", "kind").annotate(n=Count("id"))}
    for status in JobStatus.values:
        for kind in KINDS:
            assert of(after, "payonce_jobs", status=status, kind=kind) == rows.get((status, kind), 0), (status, kind)
    assert rows[("succeeded", "media")] == 4 and rows[("failed", "media")] == 1 and rows[("waiting", "media")] == 1

    # Attempts by model, state and error class ("" for none) are exactly the rows'.
    grouped = Attempt.objects.values("provider", "model", "state", "error_class").annotate(n=Count("id"))
    by_row = {(("error_class", r["error_class"] or ""), ("model", f"{r['provider']}/{r['model']}"),
               ("state", r["state"])): float(r["n"]) for r in grouped}
    assert series(after, "payonce_attempts") == by_row
    assert of(after, "payonce_attempts", model="sandbox/image-lookup", state="failed", error_class="invalid_input") == 1
    assert of(after, "payonce_attempts", model="sandbox/video-keyed", state="failed", error_class="rate_limited") == 1
    assert sum(value for labels, value in series(after, "payonce_attempts").items()
               if ("model", "sandbox/image-blind") in labels and ("state", "uncertain") in labels) == 1

    # Spend is billing's own figure for every client with a month row, to the micro-dollar.
    month = month_of(timezone.now())
    clients = Client.objects.filter(budget_months__month=month)
    assert {dict(labels)["client_id"] for labels in series(after, "payonce_cap_usd")} == {str(c.id) for c in clients}
    for client in clients:
        figures = month_spend(client, month)
        labels = {"client": client.name, "client_id": str(client.id)}
        assert of(after, "payonce_spent_usd", **labels) == float(figures["spent_usd"])
        assert of(after, "payonce_reserved_usd", **labels) == float(figures["reserved_usd"])
        assert of(after, "payonce_cap_usd", **labels) == float(figures["cap_usd"])
        assert of(after, "payonce_unpriced_attempts", **labels) == figures["unpriced_attempts"]
    named = {c.name: c for c in clients}
    assert of(after, "payonce_spent_usd", client="metrics-alpha", client_id=str(named["metrics-alpha"].id)) == 0.8
    assert of(after, "payonce_reserved_usd", client="metrics-beta", client_id=str(named["metrics-beta"].id)) == 0.04
    assert of(after, "payonce_unpriced_attempts", client="metrics-beta", client_id=str(named["metrics-beta"].id)) == 1

    # Deliveries by status: every status present; the disabled endpoint's wait, the 500s went dead.
    deliveries = dict(Delivery.objects.values_list("status").annotate(n=Count("id")))
    for status in DeliveryStatus.values:
        assert of(after, "payonce_deliveries", status=status) == deliveries.get(status, 0), status
    assert all(deliveries.get(status) for status in DeliveryStatus.values), deliveries

    # Re-claims are the step rows' claims beyond the first: the lost job's submit, at least.
    claims = Step.objects.filter(attempts__gt=1).aggregate(n=Sum(F("attempts") - 1))["n"] or 0
    assert of(after, "payonce_step_reclaims_total") == claims >= 1
    assert Step.objects.get(job=lost, name="submit").attempts == 2

    # The Redis counters moved by what happened, across processes: polls (the worker) are the sandbox's
    # poll calls, callbacks (the web process) are the sandbox's callbacks plus the forged one.
    delta = {name: {key: value - events(before, name, key_label).get(key, 0)
                    for key, value in events(after, name, key_label).items()}
             for name, key_label in (("payonce_polls_total", "outcome"), ("payonce_callbacks_total", "outcome"),
                                     ("payonce_sweeper_recoveries_total", "what"),
                                     ("payonce_lease_takeovers_total", "kind"))}
    poll_calls = [c for c in ledger.calls() if c["kind"] == "poll"]
    assert sum(delta["payonce_polls_total"].values()) == len(poll_calls) > 0
    assert delta["payonce_polls_total"]["succeeded"] >= 1
    answered = ledger.callbacks()
    assert sum(delta["payonce_callbacks_total"].values()) == len(answered) + 1
    assert delta["payonce_callbacks_total"]["rung"] == sum(1 for c in answered if c["status"] == 202) >= 1
    assert delta["payonce_callbacks_total"]["bad_signature"] == 1
    assert delta["payonce_sweeper_recoveries_total"]["stuck_job"] == 1
    assert delta["payonce_sweeper_recoveries_total"]["other"] == 0
    # The one true takeover: the lost job's submit, taken from "a-dead-worker" (the other re-claims are
    # workers taking their own leases back, which are no takeover).
    assert delta["payonce_lease_takeovers_total"] == {"media": 1, "report": 0, "other": 0}

    # The histograms too: the web process timed each answer under its route (five creates, the polls of
    # api.wait, the forged callback), and the worker kept each job's end once it committed.
    def observed(name: str, **labels) -> float:
        return of(after, f"{name}_count", **labels) - of(before, f"{name}_count", **labels)

    assert observed("payonce_api_request_seconds", route="v1/jobs", method="POST", status="2xx") == 5
    assert observed("payonce_api_request_seconds", route="v1/jobs/<uuid:job_id>", method="GET", status="2xx") >= 5
    assert observed("payonce_api_request_seconds", route="v1/callbacks/<slug:provider>", method="POST",
                    status="4xx") == 1
    assert observed("payonce_job_end_seconds", kind="media", status="succeeded") == 4
    assert observed("payonce_job_end_seconds", kind="media", status="failed") == 1

    # No label value is a job id, an upstream key or a generation id: only client_id is an id, one per client.
    job_ids = {str(job_id) for job_id in Job.objects.values_list("id", flat=True)}
    for (name, labels), _ in after.items():
        for label, value in labels:
            assert value not in job_ids and not value.startswith(("payonce-", "gen_")), (name, label, value)
            if label != "client_id":
                assert not UUID.search(value), (name, label, value)
    assert len(assert_books_balance(ledger)) == 5


def _last_tries(log: list[dict]) -> list[dict]:
    last = {}
    for entry in log:
        key = (entry["generation_id"], entry["status_of_generation"])
        if key not in last or entry["try"] >= last[key]["try"]:
            last[key] = entry
    return list(last.values())


# --- protection --------------------------------------------------------------------------------------


def test_without_a_token_only_loopback_may_scrape(settings):
    settings.METRICS_TOKEN = ""
    http = DjangoClient()
    for address in ("127.0.0.1", "127.10.0.3", "::1", "::ffff:127.0.0.1"):
        answer = http.get("/metrics", REMOTE_ADDR=address)
        assert answer.status_code == 200, (address, answer.content)
        assert b"# TYPE payonce_jobs gauge" in answer.content
    for address in ("10.0.0.8", "203.0.113.7", "2001:db8::1", "::ffff:10.0.0.8", ""):
        answer = http.get("/metrics", REMOTE_ADDR=address)
        assert answer.status_code == 403, address
        assert answer.json()["error"]["code"] == "METRICS_FORBIDDEN"
    assert http.post("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 405


def test_with_a_token_a_scrape_needs_it_from_anywhere(settings):
    settings.METRICS_TOKEN = "s3cret-scrape-token"
    http = DjangoClient()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-scrape-token"},
                    {"Authorization": "Basic s3cret-scrape-token"}):
        answer = http.get("/metrics", REMOTE_ADDR="127.0.0.1", headers=headers)
        assert answer.status_code == 401, headers
        assert answer.json()["error"]["code"] == "METRICS_UNAUTHORIZED"
        assert answer["WWW-Authenticate"].startswith("Bearer")
        assert b"s3cret" not in answer.content
    answer = http.get("/metrics", REMOTE_ADDR="203.0.113.7", headers={"Authorization": "Bearer s3cret-scrape-token"})
    assert answer.status_code == 200
    assert b"payonce_deliveries" in answer.content


# --- the Redis counters ----------------------------------------------------------------------------------


@pytest.fixture
def counters_fresh():
    metrics._paused_until = 0.0
    yield
    metrics._paused_until = 0.0


def local_scrape() -> dict:
    answer = DjangoClient().get("/metrics", REMOTE_ADDR="127.0.0.1",
                                headers={"Authorization": f"Bearer {settings.METRICS_TOKEN}"})
    assert answer.status_code == 200, answer.content
    return parse(answer.content.decode())


def test_count_adds_one_per_event_and_keeps_values_bounded(counters_fresh):
    before = local_scrape()
    metrics.count("polls", outcome="succeeded")
    metrics.count("polls", outcome="succeeded")
    metrics.count("polls", outcome=f"weird-{uuid.uuid4()}")  # anything unplanned is "other", never a new series
    after = local_scrape()
    moved = {outcome: of(after, "payonce_polls_total", outcome=outcome) - of(before, "payonce_polls_total", outcome=outcome)
             for outcome in (*metrics.COUNTERS["polls"][1], "other")}
    assert moved == {"running": 0, "succeeded": 2, "failed": 0, "cancelled": 0, "error": 0, "other": 1}
    assert {dict(labels)["outcome"] for labels in series(after, "payonce_polls_total")} == {
        *metrics.COUNTERS["polls"][1], "other"}


def test_a_counter_never_raises_nor_stalls_when_redis_is_gone(settings, counters_fresh):
    settings.METRICS_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    started = time.monotonic()
    for _ in range(50):
        metrics.count("callbacks", outcome="rung")
    assert time.monotonic() - started < 1.0  # one short timeout, then paused: no stall per call
    samples = local_scrape()  # the database's figures still come; the counters are absent, not zero
    assert ("payonce_jobs", (("kind", "media"), ("status", "queued"))) in samples
    assert not series(samples, "payonce_callbacks_total")


def test_without_a_counters_url_the_counters_are_not_exported(settings, counters_fresh):
    settings.METRICS_REDIS_URL = ""
    metrics.count("polls", outcome="running")  # not kept: does nothing, raises nothing
    text = DjangoClient().get("/metrics", REMOTE_ADDR="127.0.0.1",
                              headers={"Authorization": f"Bearer {settings.METRICS_TOKEN}"}).content.decode()
    names = exported_names(text)
    assert "payonce_jobs" in names and "payonce_step_reclaims_total" in names
    assert not names & {"payonce_polls_total", "payonce_callbacks_total", "payonce_sweeper_recoveries_total",
                         "payonce_lease_takeovers_total"}


def test_many_models_are_summed_under_other_beyond_the_bound(settings):
    client = Client.objects.create(name="many-models")
    job = Job.objects.create(client=client, idempotency_key="many", request_hash="0" * 64, kind="media",
                             model_chain=["openai/m"], input={}, policy={}, output_key="many.bin")
    Attempt.objects.bulk_create([
        Attempt(job=job, run=1, number=n, provider="openai", model=f"model-{n:04d}", upstream_key=f"k-{n}",
                state="failed", error_class="made_up_class" if n == 1 else "refused")
        for n in range(1, collector.MAX_MODELS + 11)])
    samples = series(local_scrape(), "payonce_attempts")
    models = {dict(labels)["model"] for labels in samples}
    assert len(models) == collector.MAX_MODELS + 1 and "other" in models
    assert sum(samples.values()) == collector.MAX_MODELS + 10
    assert {dict(labels)["error_class"] for labels in samples} == {"refused", "other"}


# --- the Grafana dashboard -------------------------------------------------------------------------------

_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or",
                 "unless", "inf", "nan"}


def metric_names_in(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are not functions, keywords, label
    names of by/without/on clauses, label matchers, strings, ranges or Grafana variables."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\$\w+", "", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", expr):
        if not match.group(2) and match.group(1).lower() not in _PROMQL_WORDS:
            names.add(match.group(1))
    return names


def test_the_grafana_dashboard_reads_only_exported_metrics_and_shows_each(settings):
    client = Client.objects.create(name="dashboard")  # a client with a month, so its labels are on show
    BudgetMonth.objects.create(client=client, month=month_of(timezone.now()))
    text = DjangoClient().get("/metrics", REMOTE_ADDR="127.0.0.1",
                              headers={"Authorization": f"Bearer {settings.METRICS_TOKEN}"}).content.decode()
    exported, queried = exported_names(text), queried_as(text)
    dashboard = json.loads(DASHBOARD.read_text())
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    assert all(p["datasource"]["uid"] == "${DS_PROMETHEUS}" for p in panels)
    used = set()
    for variable in dashboard["templating"]["list"]:  # Grafana's label_values(metric, label), not PromQL
        metric, label = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variable["definition"]).groups()
        assert metric in exported and f'{label}="' in text, variable
    for expr in exprs:
        names = metric_names_in(expr)
        assert names, expr
        assert names <= set(queried), (expr, names - set(queried))
        used |= {queried[name] for name in names}
    assert used == exported  # a panel for every metric /metrics exports
    assert metric_names_in('sum by (client) (rate(x_total{a="b"}[5m])) / on(client) y') == {"x_total", "y"}


ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus-alerts.yml"


def test_the_alert_rules_read_only_exported_metrics(settings):
    text = DjangoClient().get("/metrics", REMOTE_ADDR="127.0.0.1",
                              headers={"Authorization": f"Bearer {settings.METRICS_TOKEN}"}).content.decode()
    queried = set(queried_as(text))
    rules = [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]
    assert {rule["alert"] for rule in rules} >= {"PayonceJobRunningPastItsBound", "PayonceQueueNotMoving"}
    for rule in rules:
        names = metric_names_in(rule["expr"])
        assert names and names <= queried, (rule["alert"], names - queried)


def test_queues_per_client_and_the_oldest_queued_jobs_age(settings):
    busy, idle = Client.objects.create(name="busy"), Client.objects.create(name="idle")
    base = {"kind": "media", "model_chain": ["sandbox/video-keyed"], "input": {}, "policy": {}, "request_hash": "0"}
    for n in range(3):
        Job.objects.create(client=busy, idempotency_key=f"q{n}", output_key=f"q{n}", **base,
                           created_at=timezone.now() - timedelta(seconds=90 * n))
    Job.objects.create(client=busy, idempotency_key="r", output_key="r", status=JobStatus.RUNNING, holds_slot=True,
                       **base)
    Job.objects.create(client=idle, idempotency_key="w", output_key="w", status=JobStatus.RUNNING, **base)  # waits
    samples = parse(DjangoClient().get("/metrics", REMOTE_ADDR="127.0.0.1",
                                       headers={"Authorization": f"Bearer {settings.METRICS_TOKEN}"}).content.decode())
    labels = {"client": "busy", "client_id": str(busy.id)}
    assert (of(samples, "payonce_jobs_queued", **labels), of(samples, "payonce_jobs_in_progress", **labels)) == (3, 1)
    assert not [labels for labels in series(samples, "payonce_jobs_queued") if ("client", "idle") in labels]
    assert 180 <= of(samples, "payonce_oldest_queued_job_age_seconds") < 240
