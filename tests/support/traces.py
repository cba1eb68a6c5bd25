"""Traces as the tests read them from the OTLP receiver (tests/support/otlp_receiver.py): the settings a
traced process runs with, and the rule that the paid calls of the traces are the sandbox's ledger
(docs/operating.md, "Traces")."""

from collections import Counter, defaultdict

CALL = "payonce.provider_call"
# Spans leave a process in batches every 200 ms (a paid call at once).
TRACED = {"OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_SERVICE_NAME": "payonce-test"}


def traced(otlp) -> dict:
    """The environment of a process that exports its spans to `otlp`."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint, **TRACED}


def paid_calls(spans: list[dict]) -> list[dict]:
    return [span for span in spans if span["name"] == CALL]


def assert_calls_are_the_ledger(spans: list[dict], charges: list[dict]) -> dict[str, list[dict]]:
    """Every charge is one paid call's span (by its upstream key), and every paid call a span of its own.
    A key's span may arrive more than once only as the span its sender exported and the ones executions that
    took the call over emitted (`payonce.recovered`; one killed after its emission leaves the next to emit it
    again), all under the same trace and span id (executor.tracing): one span to a trace store. Never two
    sends of a key as two paid calls, never a paid "yes" without a charge. Returns the paid calls' spans by
    upstream key."""
    by_key: dict[str, list[dict]] = defaultdict(list)
    for span in paid_calls(spans):
        by_key[span["attributes"]["payonce.upstream_key"]].append(span)
    charged = Counter(charge["metadata"]["upstream_key"] for charge in charges)
    assert set(charged) <= set(by_key), f"charges with no paid-call span: {sorted(set(charged) - set(by_key))}"
    for key, key_spans in by_key.items():
        assert len({(s["trace_id"], s["span_id"]) for s in key_spans}) == 1, (key, key_spans)
        sent = [s for s in key_spans if not s["attributes"].get("payonce.recovered")]
        assert len(sent) <= 1, (key, key_spans)  # a resend is payonce.provider_resend, never a second call
        paid = {s["attributes"]["payonce.paid"] for s in key_spans}
        if key in charged:
            assert paid & {"yes", "unknown"}, (key, key_spans)
        else:  # a call no charge is for was refused, or its outcome is unknown
            assert paid <= {"no", "unknown"}, (key, key_spans)
    return by_key


def wait_for_the_ledger(otlp, charges: list[dict], timeout: float = 20) -> list[dict]:
    """The receiver's spans once every charge has its paid call's span (the last ones may be on their way)."""
    keys = {charge["metadata"]["upstream_key"] for charge in charges}
    return otlp.wait_for(lambda spans: keys <= {s["attributes"]["payonce.upstream_key"] for s in paid_calls(spans)},
                         timeout=timeout, message=f"a paid call's span for each of {len(keys)} charges")
