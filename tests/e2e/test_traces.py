"""Traces on real processes, read from a real OTLP/HTTP receiver (tests/support/otlp_receiver.py): one trace
per job run, from the create request to the provider's charge and the webhook, every paid call one span that
the sandbox's ledger accounts for (docs/operating.md, "Traces")."""

import json
import socket
import threading
import time
from collections import Counter

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from jobs.services import client_create
from tests.support import redis_server
from tests.conftest import WEBHOOK_TEST_ENV
from tests.support.books import assert_books_balance
from tests.support.http_api import HttpApi
from tests.support.procs import Stack
from tests.support.traces import CALL, assert_calls_are_the_ledger, paid_calls, traced
from tests.support.reports import CHAPTERS, SUBJECT
from tests.support.webhook_receiver import WebhookReceiver

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

def traced_stack(otlp, **env) -> Stack:
    return Stack(redis_server.url(5), webhooks=True, **{**WEBHOOK_TEST_ENV, **traced(otlp), **env})


@pytest.fixture
def stack(otlp, ledger):  # stopped before the database is flushed
    # Every instrumentation on: payonce's default leaves out psycopg, redis and celery (config.tracing).
    processes = traced_stack(otlp, OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="").start()
    try:
        yield processes
    finally:
        processes.stop()


def api_for(stack, name: str, **client) -> HttpApi:
    return HttpApi(stack.url, client_create(name=name, **client))


def created(api: HttpApi, body: dict, key: str, path: str = "/v1/jobs") -> dict:
    """The created job or order, and its answer's X-Request-Id as `request_id`."""
    if path == "/v1/jobs":
        response = api.create(body, key=key)
    else:
        response = api.http.post(f"{api.base_url}{path}", json=body, headers=api.headers(), timeout=10)
    assert response.status_code == 201, response.text
    return {**response.json(), "request_id": response.headers["X-Request-Id"]}


def trace_of(otlp, trace_id: str, ready, timeout: float = 20) -> list[dict]:
    """The trace's spans once `ready(spans)` holds (the last batches may still be on their way)."""
    def of_trace(spans):
        return [span for span in spans if span["trace_id"] == trace_id]

    return of_trace(otlp.wait_for(lambda spans: ready(of_trace(spans)), timeout=timeout,
                                  message=f"trace {trace_id}"))


def one_tree(spans: list[dict]) -> bool:
    """Every span's parent is in the trace: the batches of every process that worked on it have come (a
    Celery message's consumer span may arrive before its sender's batch)."""
    ids = {span["span_id"] for span in spans}
    return all(span["parent_span_id"] in ids for span in spans if span["parent_span_id"])


def histogram_counts(stack) -> Counter:
    """The count of every histogram series /metrics answers, by (name, labels)."""
    text = requests.get(f"{stack.url}/metrics", timeout=10).text
    return Counter({(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                    for family in text_string_to_metric_families(text) for sample in family.samples
                    if sample.name.endswith("_seconds_count")})


def test_a_media_job_is_one_trace_from_its_post_to_its_charge_and_its_webhook(stack, otlp, ledger):
    before = histogram_counts(stack)
    with WebhookReceiver() as hooks:
        api = api_for(stack, "traced", webhook_url=hooks.url)
        job = created(api, {"kind": "media", "models": ["sandbox/video-keyed"],
                            "input": {"prompt": "a lighthouse at dusk", "render_s": 1}}, key="traced-1")
        trace_id = job["trace_id"]
        assert trace_id and len(trace_id) == 32, job
        done = api.wait(job["id"], timeout=90)
        assert done["status"] == "succeeded" and done["trace_id"] == trace_id, done
        spans = trace_of(otlp, trace_id, lambda spans: any(s["name"] == "payonce.webhook.deliver" for s in spans)
                         and paid_calls(spans) and one_tree(spans))
        hooks.wait_for(lambda: hooks.requests)
        delivered = hooks.requests[0]

    names = Counter(span["name"] for span in spans)
    # The create request is the root: its server span, in the web process, has no parent.
    roots = [s for s in spans if not s["parent_span_id"]]
    assert [(s["kind"], s["resource"]["payonce.process"]) for s in roots] == [("SERVER", "web")], roots
    assert roots[0]["attributes"].get("http.route") == "v1/jobs", roots[0]["attributes"]
    # The request's id is on its span, and the log lines of every process name the trace and their span.
    assert roots[0]["attributes"]["http.request.header.x-request-id"] == [job["request_id"]]
    created_line = next(json.loads(line) for line in stack["web"].output().splitlines()
                        if '"event":"job.created"' in line and job["id"] in line)
    assert (created_line["request_id"], created_line["trace_id"]) == (job["request_id"], trace_id), created_line
    worker_lines = [json.loads(line) for line in stack["worker"].output().splitlines()
                    if line.startswith("{") and f'"job_id":"{job["id"]}"' in line]
    assert worker_lines and all(line.get("trace_id") == trace_id for line in worker_lines
                                if line["event"].startswith(("attempt.", "step."))), worker_lines
    step_ids = {s["span_id"] for s in spans if s["name"].startswith("payonce.step ")} | \
        {s["span_id"] for s in spans if s["name"] == CALL}
    assert {line["span_id"] for line in worker_lines if line["event"].startswith("attempt.")} <= step_ids
    processes = {s["resource"]["payonce.process"] for s in spans}
    assert {"web", "worker", "webhooks"} <= processes, processes
    assert {"payonce.step submit", "payonce.step wait", "payonce.webhook.deliver"} <= set(names), names
    assert any(name.startswith("run/jobs.run_stage") for name in names), names  # Celery's consumer spans
    assert any(s["attributes"].get("db.system") == "postgresql" or s["attributes"].get("db.system.name") == "postgresql"
               for s in spans), "no statement spans (psycopg)"
    # Every span of the trace hangs off the root: one tree, whatever process sent it.
    ids = {s["span_id"] for s in spans}
    assert one_tree(spans), [s["name"] for s in spans if s["parent_span_id"] and s["parent_span_id"] not in ids]

    charges = assert_books_balance(ledger)
    by_key = assert_calls_are_the_ledger(spans, charges)
    assert list(by_key) == [f"payonce-{job['id']}-1"] and names[CALL] == 1
    call = by_key[f"payonce-{job['id']}-1"][0]
    assert call["kind"] == "CLIENT" and call["resource"]["payonce.process"] == "worker"
    expected = {"payonce.job_id": job["id"], "payonce.run": 1, "payonce.attempt": 1, "payonce.provider": "sandbox",
                "payonce.model": "sandbox/video-keyed", "payonce.paid": "yes", "payonce.cost_usd": "0.400000",
                "payonce.cost_source": "quoted", "payonce.step": "submit"}
    assert {name: call["attributes"].get(name) for name in expected} == expected, call["attributes"]
    # The provider's HTTP request (requests' span) is the call's child.
    assert any(s["kind"] == "CLIENT" and s["parent_span_id"] == call["span_id"] for s in spans)
    # The webhook's receiver was handed the trace.
    assert delivered.headers.get("traceparent", "").split("-")[1] == trace_id, delivered.headers
    assert done["trace_id"] == trace_id
    # The call's figures, written in the background: its latency, and the job's time to its first paid call.
    expected = {("payonce_provider_call_seconds_count", (("paid", "yes"), ("provider", "sandbox"))): 1,
                ("payonce_job_first_paid_call_seconds_count", (("kind", "media"),)): 1,
                ("payonce_job_end_seconds_count", (("kind", "media"), ("status", "succeeded"))): 1}
    deadline = time.monotonic() + 10
    while (moved := {key: histogram_counts(stack)[key] - before[key] for key in expected}) != expected:
        assert time.monotonic() < deadline, moved
        time.sleep(0.2)


def test_a_report_of_8_chapters_is_one_trace_with_a_paid_call_per_charge_and_its_tokens(stack, otlp, ledger):
    api = api_for(stack, "traced-report")
    body = {"kind": "report", "models": ["sandbox/llm"],
            "input": {"subject": SUBJECT, "chapters": CHAPTERS, "email": "ada@example.com"}}
    assert len(CHAPTERS) == 8
    job = created(api, body, key="traced-report-1")
    done = api.wait(job["id"], timeout=90)
    assert done["status"] == "succeeded", done
    charges = assert_books_balance(ledger)
    spans = trace_of(otlp, job["trace_id"], lambda spans: len(paid_calls(spans)) >= len(charges)
                     and any(s["name"] == "payonce.step deliver" for s in spans))
    calls = paid_calls(spans)
    assert len(calls) == len(charges) >= 8, (len(calls), len(charges))
    by_key = assert_calls_are_the_ledger(spans, charges)
    attempts = {(a["upstream_key"]): a for chapter in done["chapters"] for a in chapter["attempts"]}
    for key, (call,) in by_key.items():
        attributes = call["attributes"]
        assert attributes["gen_ai.operation.name"] == "chat" and attributes["gen_ai.request.model"] == "llm"
        assert attributes["payonce.paid"] == "yes" and attributes["payonce.cost_source"] == "derived"
        if key in attempts:  # a chapter's call: its tokens and cost are the attempt's
            usage = attempts[key]["usage"]
            assert attributes["gen_ai.usage.input_tokens"] == usage["input_tokens"]
            assert attributes["gen_ai.usage.output_tokens"] == usage["output_tokens"]
            assert attributes["payonce.cost_usd"] == attempts[key]["cost_usd"]
    # A step span per chapter, then the synthesis and the delivery, each holding its own calls.
    names = {s["name"] for s in spans}
    assert {f"payonce.step chapter-{c}" for c in CHAPTERS} | {"payonce.step synthesis"} <= names, sorted(names)
    steps = {s["span_id"]: s["attributes"]["payonce.step"] for s in spans if s["name"].startswith("payonce.step ")}
    assert all(steps.get(call["parent_span_id"]) == call["attributes"]["payonce.step"] for call in calls), \
        [(call["attributes"]["payonce.step"], steps.get(call["parent_span_id"])) for call in calls]


def test_a_paid_order_is_one_trace_from_the_order_to_its_report_with_the_default_instrumentations(otlp, ledger):
    stack = traced_stack(otlp).start()  # payonce's default set: no statement, Redis or Celery spans
    try:
        api = api_for(stack, "traced-order")
        order = created(api, {"payment_id": "pi_traced", "run_id": "run-traced", "product": "natal-chart",
                              "input": {"subject": SUBJECT, "chapters": CHAPTERS[:3]}, "email": "buyer@example.com"},
                        key="", path="/v1/orders")
        job = api.wait(order["job_id"], timeout=90)
        assert job["status"] == "succeeded" and job["trace_id"], job
        charges = assert_books_balance(ledger)
        spans = trace_of(otlp, job["trace_id"], lambda spans: len(paid_calls(spans)) >= len(charges)
                         and any(s["name"] == "payonce.step deliver" for s in spans))
    finally:
        stack.stop()
    roots = [s for s in spans if not s["parent_span_id"]]
    assert len(roots) == 1 and roots[0]["attributes"].get("http.route") == "v1/orders", roots
    assert one_tree(spans), "not one tree"
    assert len(paid_calls(spans)) == len(charges) >= 3
    assert_calls_are_the_ledger(spans, charges)
    scopes = {s["scope"] for s in otlp.spans()}
    assert not {scope for scope in scopes if "psycopg" in scope or "redis" in scope or "celery" in scope}, scopes


def test_sampling_off_sends_nothing_and_no_job_names_a_trace(otlp, ledger):
    stack = traced_stack(otlp, OTEL_TRACES_SAMPLER="always_off").start()
    try:
        api = api_for(stack, "untraced")
        job = created(api, {"kind": "media", "models": ["sandbox/image-blind"],
                            "input": {"prompt": "a quiet harbour", "render_s": 0}}, key="untraced-1")
        done = api.wait(job["id"], timeout=60)
    finally:
        stack.stop()  # a warm shutdown: whatever was batched has been sent by now
    assert done["status"] == "succeeded" and done["trace_id"] is None and job["trace_id"] is None, done
    assert len(assert_books_balance(ledger)) == 1
    assert otlp.requests() == 0, otlp.stats()


class BlackHole:
    """A collector that takes connections and never answers: the worst an exporter can meet."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._hold, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _hold(self) -> None:
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:  # closed
                return

    def close(self) -> None:
        self.sock.close()
        for held in self.held:
            held.close()


def test_a_collector_that_never_answers_holds_a_paid_call_a_second_at_most_once(ledger):
    hole = BlackHole()
    stack = Stack(redis_server.url(5), **{**traced(hole), "OTEL_EXPORTER_OTLP_TIMEOUT": 5}).start()
    try:
        api = api_for(stack, "collector-down")
        started = time.monotonic()
        jobs = [created(api, {"kind": "media", "models": ["sandbox/image-blind"],
                              "input": {"prompt": f"harbour {n}", "render_s": 0}}, key=f"down-{n}") for n in range(8)]
        ended = [api.wait(job["id"], timeout=60)["status"] for job in jobs]
        took = time.monotonic() - started
    finally:
        stack.stop()
        hole.close()
    assert ended == ["succeeded"] * 8
    assert hole.held, "nothing tried to export"
    # The first paid call's span waited out PAID_CALL_EXPORT_TIMEOUT_S (1 s); the rest went to the batch.
    # Had each waited out the exporter's own timeout (5 s here), the eight would have taken 40 s.
    assert took < 20, took
    assert len(assert_books_balance(ledger)) == 8
