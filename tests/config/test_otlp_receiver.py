"""The OTLP/HTTP receiver the tracing tests read spans from (tests/support/otlp_receiver.py), as a process
of its own: fed by the OpenTelemetry SDK's own exporter, in protobuf and gzip-compressed protobuf, and by
hand in OTLP/JSON, each span decoded exactly; bodies past 16 MiB refused; every request counted."""

import gzip
import time

import pytest
import requests
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from tests.support.otlp_receiver import MAX_BODY_BYTES

pytestmark = pytest.mark.e2e  # the receiver is a process (the `otlp` fixture)

PROTOBUF = {"Content-Type": "application/x-protobuf"}


def hex_ids(span) -> tuple[str, str]:
    return format(span.context.trace_id, "032x"), format(span.context.span_id, "016x")


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_the_sdk_exporters_spans_arrive_decoded_exactly(otlp, monkeypatch, compression):
    # Given an SDK exporting to the receiver: in code with the signal's URL, or as a payonce process is
    # configured, by OTEL_EXPORTER_OTLP_ENDPOINT (the exporter adds /v1/traces) and _COMPRESSION.
    if compression == "gzip":
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
        exporter = OTLPSpanExporter()
    else:
        exporter = OTLPSpanExporter(endpoint=otlp.traces_url)
    provider = TracerProvider(resource=Resource.create({"service.name": "payonce-tests"}))
    # One batch, sent when flushed: the processor's own schedule (60 s here) never sends one first.
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=60_000))
    local = InMemorySpanExporter()  # what the SDK itself recorded: the times and ids to expect
    provider.add_span_processor(SimpleSpanProcessor(local))
    tracer = provider.get_tracer("tests.config.test_otlp_receiver")
    try:
        # When a trace of a parent, with an attribute of each type, an event and a link, and its child
        # ends, with a span of another trace (the one linked to), and the provider is flushed.
        earlier = tracer.start_span("payonce.earlier_attempt")
        earlier.end()
        event_ns = time.time_ns()
        attributes = {"payonce.model": "sandbox/video-keyed", "payonce.attempt": 3, "payonce.cost_usd": 0.0125,
                      "payonce.paid": True, "payonce.models": ["sandbox/a", "sandbox/b"],
                      "payonce.retries_s": [1, 2, 4], "payonce.weights": [0.5, 1.5], "payonce.flags": [True, False]}
        with tracer.start_as_current_span("payonce.job", kind=SpanKind.SERVER, attributes=attributes,
                                          links=[Link(earlier.get_span_context(), {"payonce.why": "retry of"})]) as job:
            job.add_event("payonce.step_started", {"payonce.step": 1}, timestamp=event_ns)
            with tracer.start_as_current_span("payonce.provider_call", kind=SpanKind.CLIENT) as call:
                call.set_status(Status(StatusCode.ERROR, "the provider said no"))
            job.set_status(Status(StatusCode.OK))
        assert provider.force_flush(10_000)
    finally:
        provider.shutdown()

    # Then the receiver took one request of three spans, each exactly as the SDK recorded it.
    spans = otlp.wait_for(lambda spans: len(spans) == 3)
    recorded = {span.name: span for span in local.get_finished_spans()}
    trace_id, earlier_id = hex_ids(recorded["payonce.earlier_attempt"])
    job_trace_id, job_id = hex_ids(recorded["payonce.job"])
    _, call_id = hex_ids(recorded["payonce.provider_call"])
    resource = dict(provider.resource.attributes)
    assert resource["service.name"] == "payonce-tests" and resource["telemetry.sdk.language"] == "python"
    common = {"resource": resource, "scope": "tests.config.test_otlp_receiver"}

    def times(name: str) -> dict:
        return {"start_ns": recorded[name].start_time, "end_ns": recorded[name].end_time}

    assert spans == [
        {"trace_id": trace_id, "span_id": earlier_id, "parent_span_id": "", "name": "payonce.earlier_attempt",
         "kind": "INTERNAL", **times("payonce.earlier_attempt"), "attributes": {}, "events": [], "links": [],
         "status": {"code": "UNSET", "message": ""}, **common},
        {"trace_id": job_trace_id, "span_id": call_id, "parent_span_id": job_id, "name": "payonce.provider_call",
         "kind": "CLIENT", **times("payonce.provider_call"), "attributes": {}, "events": [], "links": [],
         "status": {"code": "ERROR", "message": "the provider said no"}, **common},
        {"trace_id": job_trace_id, "span_id": job_id, "parent_span_id": "", "name": "payonce.job", "kind": "SERVER",
         **times("payonce.job"), "attributes": attributes,
         "events": [{"name": "payonce.step_started", "time_ns": event_ns, "attributes": {"payonce.step": 1}}],
         "links": [{"trace_id": trace_id, "span_id": earlier_id, "attributes": {"payonce.why": "retry of"}}],
         "status": {"code": "OK", "message": ""}, **common},
    ]
    assert job_trace_id != trace_id
    assert otlp.stats() == {"requests": 1, "refused": 0, "spans": 3,
                            "encodings": {"gzip" if compression == "gzip" else "identity": 1}}
    assert [span["span_id"] for span in otlp.traces()[job_trace_id]] == [job_id, call_id]  # in start order
    assert [span["span_id"] for span in otlp.by_name("payonce.provider_call")] == [call_id]


def test_an_otlp_json_request_is_taken_with_hex_ids_and_every_kind_of_value_and_answered_in_json(otlp):
    trace_id, span_id, parent_id = "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174", "eee19b7ec3c1b173"
    linked_trace, linked_span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    body = {"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "payonce-worker"}}]},
        "scopeSpans": [{"scope": {"name": "payonce.executor", "version": "1"}, "spans": [{
            "traceId": trace_id, "spanId": span_id, "parentSpanId": parent_id, "name": "payonce.provider_call",
            "kind": 3, "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001500000000",
            "attributes": [
                {"key": "s", "value": {"stringValue": "sandbox/video-keyed"}},
                {"key": "i", "value": {"intValue": "9007199254740993"}},  # past a double's integers: kept exact
                {"key": "d", "value": {"doubleValue": 0.25}},
                {"key": "b", "value": {"boolValue": False}},
                {"key": "a", "value": {"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "two"}]}}},
                {"key": "kv", "value": {"kvlistValue": {"values": [
                    {"key": "inner", "value": {"arrayValue": {"values": [{"boolValue": True}]}}}]}}},
                {"key": "raw", "value": {"bytesValue": "AAH/"}},  # base64, as protobuf's JSON writes bytes
                {"key": "unset", "value": {}},
            ],
            "events": [{"timeUnixNano": "1700000000700000000", "name": "retry",
                        "attributes": [{"key": "n", "value": {"intValue": 2}}]}],
            "links": [{"traceId": linked_trace, "spanId": linked_span, "attributes": []}],
            "status": {"code": 2, "message": "rate limited"},
            "someFieldOfALaterVersion": 1,  # an OTLP/JSON receiver ignores what it does not know
        }]}],
    }]}

    response = requests.post(otlp.traces_url, json=body, timeout=5)

    assert response.status_code == 200 and response.headers["Content-Type"] == "application/json"
    assert response.json() == {}  # an empty ExportTraceServiceResponse: no partial success to report
    assert otlp.spans() == [{
        "trace_id": trace_id, "span_id": span_id, "parent_span_id": parent_id, "name": "payonce.provider_call",
        "kind": "CLIENT", "start_ns": 1_700_000_000_000_000_000, "end_ns": 1_700_000_001_500_000_000,
        "attributes": {"s": "sandbox/video-keyed", "i": 9007199254740993, "d": 0.25, "b": False, "a": [1, "two"],
                       "kv": {"inner": [True]}, "raw": "0001ff", "unset": None},
        "events": [{"name": "retry", "time_ns": 1_700_000_000_700_000_000, "attributes": {"n": 2}}],
        "links": [{"trace_id": linked_trace, "span_id": linked_span, "attributes": {}}],
        "status": {"code": "ERROR", "message": "rate limited"},
        "resource": {"service.name": "payonce-worker"}, "scope": "payonce.executor",
    }]


def request_of_size(size: int) -> bytes:
    """A valid export request of exactly `size` bytes: one span whose one attribute pads it."""
    pad = size
    while True:
        request = ExportTraceServiceRequest()
        span = request.resource_spans.add().scope_spans.add().spans.add(
            trace_id=bytes(range(16)), span_id=bytes(range(8)), name="big")
        span.attributes.add(key="pad").value.string_value = "x" * pad
        if request.ByteSize() == size:
            return request.SerializeToString()
        pad += size - request.ByteSize()  # the lengths' varints grow by a byte at most: converges in a few


def test_a_body_of_16_mib_is_taken_and_one_byte_more_is_refused_413_sent_or_inflated(otlp):
    taken = requests.post(otlp.traces_url, data=request_of_size(MAX_BODY_BYTES), headers=PROTOBUF, timeout=30)
    assert taken.status_code == 200 and taken.content == b""  # an empty ExportTraceServiceResponse
    assert len(otlp.spans()) == 1

    too_big = requests.post(otlp.traces_url, data=request_of_size(MAX_BODY_BYTES + 1), headers=PROTOBUF, timeout=30)
    assert too_big.status_code == 413
    bomb = gzip.compress(request_of_size(MAX_BODY_BYTES + 1))  # some kilobytes, inflating past the bound
    assert len(bomb) < 100_000
    inflated = requests.post(otlp.traces_url, data=bomb, headers={**PROTOBUF, "Content-Encoding": "gzip"}, timeout=30)
    assert inflated.status_code == 413

    assert len(otlp.spans()) == 1  # only the first
    assert otlp.stats() == {"requests": 3, "refused": 2, "spans": 1, "encodings": {"identity": 1}}
    assert requests.get(f"{otlp.endpoint}/healthz", timeout=5).status_code == 200  # and it still answers


def test_requests_counts_every_export_sent_taken_or_refused_and_a_reset_forgets_them(otlp):
    assert otlp.requests() == 0 and otlp.spans() == []  # nothing sent since the fixture's reset
    requests.get(f"{otlp.endpoint}/healthz", timeout=5)
    assert otlp.requests() == 0  # a look is not an export

    assert requests.post(otlp.traces_url, data=b"", headers=PROTOBUF, timeout=5).status_code == 200  # no span
    assert requests.post(otlp.traces_url, data=request_of_size(200), headers=PROTOBUF, timeout=5).status_code == 200
    assert requests.post(otlp.traces_url, data=b"\xff\xff", headers=PROTOBUF, timeout=5).status_code == 400
    assert requests.post(otlp.traces_url, data=b"{}", headers={"Content-Type": "text/plain"},
                         timeout=5).status_code == 415
    assert requests.post(f"{otlp.endpoint}/v1/metrics", data=b"", headers=PROTOBUF, timeout=5).status_code == 404
    assert otlp.stats() == {"requests": 5, "refused": 3, "spans": 1, "encodings": {"identity": 2}}
    assert len(otlp.spans()) == 1

    otlp.reset()
    assert otlp.stats() == {"requests": 0, "refused": 0, "spans": 0, "encodings": {}}
    assert otlp.spans() == []
