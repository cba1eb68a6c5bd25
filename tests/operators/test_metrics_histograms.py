"""The histograms and the broker's queue depth on GET /metrics (config.metrics, operators.metrics): a request
through the web process's ASGI stack is kept under its URL pattern, an observation lands in its bucket
with its sum and count, a label value nobody planned is "other", a job's end is kept once it commits,
`observe` never raises nor stalls without Redis, and the queue depth is the broker's lists' lengths."""

import math
import time
import uuid

import pytest
import redis
from django.db import transaction
from django.test import Client as DjangoClient
from kombu import Connection
from prometheus_client.parser import text_string_to_metric_families

from config import metrics
from jobs.models import Job, JobStatus
from jobs.services import client_create, job_finish
from operators import metrics as collector
from tests.conftest import media_body, purge_queue
from tests.support.asgi import serve

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def metrics_fresh():
    metrics._paused_until = 0.0
    yield
    metrics._paused_until = 0.0


def scrape(settings) -> tuple[str, dict]:
    """The exposition a local scrape answers, and its samples {(name, ((label, value), ...)): value}."""
    answer = DjangoClient().get("/metrics", REMOTE_ADDR="127.0.0.1",
                                headers={"Authorization": f"Bearer {settings.METRICS_TOKEN}"})
    assert answer.status_code == 200, answer.content
    text = answer.content.decode()
    return text, {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                  for family in text_string_to_metric_families(text) for sample in family.samples}


def histogram(samples: dict, name: str, **labels) -> dict:
    """One series of a histogram: {"buckets": {le: cumulative count}, "sum": s, "count": n} (zeros when absent)."""
    found = {"buckets": {}, "sum": samples.get((f"{name}_sum", tuple(sorted(labels.items()))), 0.0),
             "count": samples.get((f"{name}_count", tuple(sorted(labels.items()))), 0.0)}
    for (sample, sample_labels), value in samples.items():
        sample_labels = dict(sample_labels)
        le = sample_labels.pop("le", None)
        if sample == f"{name}_bucket" and sample_labels == labels:
            found["buckets"][float(le)] = value
    return found


def moved(before: dict, after: dict) -> dict:
    keys = set(before["buckets"]) | set(after["buckets"])
    return {"buckets": {le: after["buckets"].get(le, 0) - before["buckets"].get(le, 0) for le in sorted(keys)},
            "sum": after["sum"] - before["sum"], "count": after["count"] - before["count"]}


def label_values(samples: dict, name: str, label: str) -> set[str]:
    return {dict(labels)[label] for (sample, labels), _ in samples.items() if sample == f"{name}_count"}


# --- histograms ------------------------------------------------------------------------------------------


def test_a_request_is_kept_under_its_route_pattern_method_and_status_class(settings):
    name = "payonce_api_request_seconds"
    series = {"whoami": {"route": "v1/whoami", "method": "GET", "status": "4xx"},
              "refused": {"route": "v1/jobs", "method": "POST", "status": "4xx"},
              "unmatched": {"route": "unmatched", "method": "GET", "status": "4xx"}}
    _, samples = scrape(settings)
    before = {key: histogram(samples, name, **labels) for key, labels in series.items()}

    # Through the web process's whole ASGI stack: Django's answers, a body refused before Django, a probe.
    job_id = uuid.uuid4()
    assert serve("GET", "/v1/whoami")[0] == 401
    assert serve("GET", "/v1/whoami", [(b"authorization", b"Bearer nope.nope")])[0] == 401
    assert serve("POST", "/v1/jobs", [(b"content-length", str(10 << 20).encode())])[0] == 413
    assert serve("GET", f"/v1/nope/{job_id}")[0] == 404
    assert serve("GET", "/healthz")[0] == 200  # not counted: a probe

    # Written by the web process's metrics thread, once the answers are out.
    expected, deadline = {"whoami": 2, "refused": 1, "unmatched": 1}, time.monotonic() + 10
    while True:
        _, samples = scrape(settings)
        after = {key: histogram(samples, name, **labels) for key, labels in series.items()}
        counts = {key: moved(before[key], after[key])["count"] for key in series}
        if counts == expected or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert counts == expected
    whoami = moved(before["whoami"], after["whoami"])
    assert whoami["buckets"][math.inf] == 2 and 0 < whoami["sum"] < 5
    assert list(whoami["buckets"]) == [*metrics.HISTOGRAMS["api_request_seconds"].buckets, math.inf]
    # Routes are the URL patterns, never a path: no id, and the probes are nowhere.
    routes = label_values(samples, name, "route")
    assert {"v1/whoami", "v1/jobs", "unmatched"} <= routes
    assert not [route for route in routes if str(job_id) in route or "healthz" in route]


def test_an_observation_lands_in_its_bucket_with_its_sum_and_count(settings):
    labels = {"route": "v1/jobs/<uuid:job_id>", "method": "GET", "status": "2xx"}
    _, samples = scrape(settings)
    before = histogram(samples, "payonce_api_request_seconds", **labels)

    for seconds in (0.03, 0.05, 7.0, 60.0):  # 0.05 is its bucket's bound: le means "at most"
        metrics.observe("api_request_seconds", seconds, **labels)
    _, samples = scrape(settings)
    change = moved(before, histogram(samples, "payonce_api_request_seconds", **labels))

    assert change["count"] == 4
    assert change["sum"] == pytest.approx(67.08)
    assert change["buckets"] == {0.005: 0, 0.01: 0, 0.025: 0, 0.05: 2, 0.1: 2, 0.25: 2, 0.5: 2, 1.0: 2, 2.5: 2,
                                 5.0: 2, 10.0: 3, math.inf: 4}


def test_label_values_nobody_planned_are_other_and_declared_ones_are_kept(settings):
    job_id = str(uuid.uuid4())
    kept_as = [  # (observed with, kept under)
        (("api_request_seconds", {"route": f"v1/jobs/{job_id}", "method": "BREW", "status": "200"}),
         {"route": "other", "method": "other", "status": "other"}),
        (("job_end_seconds", {"kind": job_id, "status": "exploded"}), {"kind": "other", "status": "other"}),
        (("job_first_paid_call_seconds", {"kind": "media"}), {"kind": "media"}),  # declared by jobs.apps
        (("provider_call_seconds", {"provider": "sandbox", "paid": "perhaps"}),  # declared by executor.apps
         {"provider": "sandbox", "paid": "other"}),
        (("llm_time_to_first_token_seconds", {}), {"provider": "other"}),  # a label not given
    ]
    _, samples = scrape(settings)
    before = [histogram(samples, f"payonce_{name}", **kept)["count"] for (name, _), kept in kept_as]
    for (name, labels), _ in kept_as:
        metrics.observe(name, 0.5, **labels)
    _, samples = scrape(settings)
    after = [histogram(samples, f"payonce_{name}", **kept)["count"] for (name, _), kept in kept_as]

    assert [now - then for now, then in zip(after, before)] == [1] * len(kept_as)
    for (sample, labels), _ in samples.items():
        for label, value in labels:
            assert job_id not in value and value not in ("BREW", "200", "exploded", "perhaps"), (sample, label, value)


def test_every_route_django_resolves_is_a_route_the_label_keeps():
    # ROUTES walks the URLconf as Django's resolver joins a route: each route a request resolves to is kept.
    for path in ("/v1/jobs", f"/v1/jobs/{uuid.uuid4()}/events", "/v1/report-templates/weekly/versions/2",
                 f"/v1/orders/{uuid.uuid4()}", "/r/some.signed-token", "/metrics", "/admin/",
                 "/admin/jobs/job/1/change/", "/admin/jobs/"):
        route = metrics.route_of(path)
        assert route != metrics.UNMATCHED and route in metrics.ROUTES, (path, route)
    assert metrics.route_of("/no/such/path") == metrics.UNMATCHED in metrics.ROUTES
    assert "v1/jobs/123" not in metrics.ROUTES


def test_a_jobs_end_is_kept_once_when_it_commits(settings, django_capture_on_commit_callbacks):
    client_id = client_create(name="ends")["client_id"]  # no webhook URL: nothing to deliver

    def job() -> Job:
        job_id, body = uuid.uuid4(), media_body()
        return Job.objects.create(id=job_id, client_id=client_id, idempotency_key=str(job_id), request_hash="0" * 64,
                                  kind="media", model_chain=body["models"], input=body["input"], policy={},
                                  output_key=f"o/{job_id}.mp4", status=JobStatus.RUNNING)

    ended, undone = job(), job()
    labels = {"kind": "media", "status": "failed"}
    _, samples = scrape(settings)
    before = histogram(samples, "payonce_job_end_seconds", **labels)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            assert job_finish(job_id=ended.id, status=JobStatus.FAILED, error={"code": "X", "message": "x"})
            assert not job_finish(job_id=ended.id, status=JobStatus.FAILED)  # ended already: no second end
        with pytest.raises(RuntimeError), django_capture_on_commit_callbacks(execute=True):
            with transaction.atomic():
                assert job_finish(job_id=undone.id, status=JobStatus.FAILED)
                raise RuntimeError("rolled back: no end")
    finally:
        purge_queue(settings.CELERY_BROKER_URL, "jobs")  # a freed slot may have rung for the client
    # Written in the background (config.metrics.observe_soon), GATHER_S after the commit.
    deadline = time.monotonic() + 10
    while True:
        _, samples = scrape(settings)
        change = moved(before, histogram(samples, "payonce_job_end_seconds", **labels))
        if change["count"] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    time.sleep(2 * metrics.GATHER_S)  # and nothing more comes after it (the rolled back end never does)
    _, samples = scrape(settings)
    change = moved(before, histogram(samples, "payonce_job_end_seconds", **labels))

    assert change["count"] == 1 and change["buckets"][1.0] == 1 and 0 <= change["sum"] < 1


def test_observe_never_raises_nor_stalls_when_redis_is_gone(settings):
    settings.METRICS_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    started = time.monotonic()
    for _ in range(50):
        metrics.observe("provider_call_seconds", 1.0, provider="sandbox", paid="yes")
    assert time.monotonic() - started < 1.0  # one short timeout, then paused: no stall per call
    text, samples = scrape(settings)  # the database's figures still come; the histograms are absent, not zero
    assert ("payonce_jobs", (("kind", "media"), ("status", "queued"))) in samples
    assert "payonce_provider_call_seconds" not in text and "payonce_api_request_seconds" not in text


def test_observe_never_raises_on_a_callers_mistake(settings):
    for name, seconds in (("no_such_histogram", 1.0), ("api_request_seconds", "soon"),
                          ("api_request_seconds", math.nan), ("api_request_seconds", math.inf),
                          ("api_request_seconds", None)):
        metrics.observe(name, seconds, route="v1/jobs")
    labels = {"route": "v1/spend", "method": "GET", "status": "5xx"}
    _, samples = scrape(settings)
    before = histogram(samples, "payonce_api_request_seconds", **labels)
    metrics.observe("api_request_seconds", -3.0, **labels)  # a clock stepped back: 0
    _, samples = scrape(settings)
    change = moved(before, histogram(samples, "payonce_api_request_seconds", **labels))
    assert change["count"] == 1 and change["buckets"][0.005] == 1 and change["sum"] == 0


# --- the broker's queues -----------------------------------------------------------------------------------


@pytest.fixture
def own_queues(settings, monkeypatch):
    """Two queues of this test's own on the suite's broker, in place of `jobs` and `webhooks`: a worker of
    another stack on the same Redis never takes their messages, nor does the test touch its queues."""
    names = [f"metrics-test-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    monkeypatch.setattr(collector, "QUEUES", tuple(names))
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    yield client, names
    for name in names:
        client.delete(*client.keys(f"{name}*") or [name])


def depths(samples: dict) -> dict[str, float]:
    return {dict(labels)["queue"]: value for (name, labels), value in samples.items()
            if name == "payonce_broker_queue_depth"}


def test_the_queue_depth_is_the_brokers_lists_lengths(settings, own_queues):
    client, (first, second) = own_queues
    _, samples = scrape(settings)
    assert depths(samples) == {first: 0, second: 0}

    # Messages where kombu puts them: a queue is a list per priority step, named by kombu's own channel.
    with Connection(settings.CELERY_BROKER_URL) as conn:
        lists = [conn.default_channel._q_for_pri(first, priority) for priority in (0, 3, 9, 9)]
    assert lists[0] == first and len(set(lists)) == 3
    for name in lists:
        client.lpush(name, b"{}")
    client.lpush(second, b"{}", b"{}")
    _, samples = scrape(settings)

    assert depths(samples) == {first: 4, second: 2}


def test_the_queue_depth_is_left_out_for_a_broker_that_is_not_redis_or_does_not_answer(settings):
    for url in ("amqp://guest:guest@127.0.0.1:1//", "redis://127.0.0.1:1/0"):
        settings.CELERY_BROKER_URL = url
        started = time.monotonic()
        text, samples = scrape(settings)
        assert time.monotonic() - started < 3, url
        assert "payonce_broker_queue_depth" not in text, url
        assert ("payonce_deliveries", (("status", "pending"),)) in samples
