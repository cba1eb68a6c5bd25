"""Traces: OpenTelemetry, exported as OTLP over HTTP, off unless configured (docs/operating.md, "Traces").

Configured by the SDK's own settings, read from the environment: OTEL_EXPORTER_OTLP_ENDPOINT (or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) turns it on; OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER and its argument,
OTEL_BSP_* (the batch) and OTEL_EXPORTER_OTLP_* (headers, timeout, compression) are the SDK's. With no
endpoint, or OTEL_SDK_DISABLED=true, or OTEL_TRACES_EXPORTER=none, nothing is set up: the API's no-op
tracer answers every call, no exporter starts, and the helpers below return at their first line.

Each process kind the Procfile starts calls `setup(process)` once: `web` in config.asgi before Django loads
its middleware (each uvicorn worker process imports it), the Celery worker and beat from their init signals
(config.celery). A warm shutdown flushes what is still batched (config.celery's worker_shutdown, and the
SDK's own exit hook for every process).

The maintained instrumentations cover the edges: Django (a server span per request), Celery (a producer span
per message sent and a consumer span per task run, the trace context carried in the message's headers),
psycopg 3 (a span per statement), requests (a span per outgoing call) and Redis (a span per command).
payonce adds its own spans where a job's life is not a request or a message:

- One trace per job run. The span that creates a run (the create or retry request, a paid order) is the
  run's root, and its W3C `traceparent` is kept on the job's row (Job.trace_context). Every step that runs
  later, in whatever process and whichever message woke it (the chain's next link, a sweep's re-ring, a
  provider's callback, a redelivery after a crash), opens its span as a child of that context, with a link
  to the message's own span (the messaging conventions' link from a consumer to what woke it): `job_span`.
- A paid call is one span, `payonce.provider_call`, traced once, when it is sent (executor.tracing). Its
  span id is derived from the attempt's upstream key (`span_id_for`), so the execution that takes over an
  attempt from a worker that died during its call emits the span the dead one never could, under the same
  id, and never a second paid call.

Client spans with no parent (the broker's polling, a pool's health check, the counters' Redis) are not
sampled: they belong to no operation and would be most of the spans.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar

from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceFlags

logger = logging.getLogger(__name__)

# The span a paid call is: exported the moment it ends, not in a batch (ExportPaidCallsAtOnce says why).
PROVIDER_CALL = "payonce.provider_call"

_enabled = False
_lock = threading.Lock()
_process: str | None = None
_tracer = trace.get_tracer("payonce")

# A span id chosen before the span starts (span_id_for): read by _IdGenerator once, then cleared.
_NEXT_SPAN_ID: ContextVar[int | None] = ContextVar("payonce_next_span_id", default=None)


def configured(environ=os.environ) -> bool:
    """Whether traces are to be exported: an OTLP endpoint is set and the SDK is not turned off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() in ("none", ""):
        return False
    return bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def enabled() -> bool:
    return _enabled


def setup(process: str) -> bool:
    """Set up tracing for this process (once; a second call does nothing). Returns whether it is on."""
    global _enabled, _process, _tracer
    with _lock:
        if _process is not None:
            return _enabled
        _process = process
        if not configured():
            return False
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import _get_from_env_or_default

        from payonce import __version__

        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "payonce",
                                    "service.version": __version__, "payonce.process": process})
        provider = TracerProvider(resource=resource, sampler=_NoOrphanClients(_get_from_env_or_default()),
                                  id_generator=_IdGenerator())
        provider.add_span_processor(ExportPaidCallsAtOnce(
            BatchSpanProcessor(OTLPSpanExporter(session=_session())),
            OTLPSpanExporter(timeout=PAID_CALL_EXPORT_TIMEOUT_S, session=_session())))
        trace.set_tracer_provider(provider)
        _tracer = trace.get_tracer("payonce")
        _instrument(process)
        _enabled = True
        logger.info("traces: exported as OTLP/HTTP (%s)", os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                    or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
        return True


# The maintained instrumentations payonce can turn on, by the names OTEL_PYTHON_DISABLED_INSTRUMENTATIONS
# (the setting OpenTelemetry's own auto-instrumentation reads: a comma-separated list) leaves out.
INSTRUMENTATIONS = ("django", "celery", "psycopg", "requests", "redis")
# Left out unless that setting is given (an empty value turns all five on). A span per statement, per
# Redis command and per Celery message sent and run is two to three times the spans of a job, and with
# them tracing every job cost a fifth of the throughput (bench/README.md, issue 43): the job's own spans
# already tie every message's work to its run's trace through the row (job_span), which is what the
# messaging instrumentation's propagation would otherwise be for. The requests instrumentation's spans
# repeat, under each paid call's span, what that span says (its status and its time), and it wraps every
# HTTP call the worker makes, the exporter's own included.
DISABLED_BY_DEFAULT = "psycopg,redis,celery,requests"


def _session():
    """The exporters' HTTP session, without requests' look at the environment for each POST (~/.netrc, proxy
    settings): a file read per export, on the thread of a paid call for its span (ExportPaidCallsAtOnce)."""
    import requests

    session = requests.Session()
    session.trust_env = False
    return session


def _instrument(process: str) -> None:
    disabled = {name.strip() for name in
                os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", DISABLED_BY_DEFAULT).split(",")}
    if process == "web" and "django" not in disabled:
        from opentelemetry.instrumentation.django import DjangoInstrumentor

        # Probes and the scrape are answered many times a minute and say nothing about a job.
        DjangoInstrumentor().instrument(excluded_urls="healthz,readyz,metrics", request_hook=_request_hook)
    if "celery" not in disabled:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        # Every process sends messages (web a new job's doorbell): each carries its sender's trace context.
        CeleryInstrumentor().instrument()
    if "psycopg" not in disabled:
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

        # Statements as spans, without the statement's text in a comment sent to the server.
        PsycopgInstrumentor().instrument(enable_commenter=False, skip_dep_check=True)
    if "requests" not in disabled:
        from opentelemetry.instrumentation.requests import RequestsInstrumentor

        RequestsInstrumentor().instrument()
    if "redis" not in disabled:
        from opentelemetry.instrumentation.redis import RedisInstrumentor

        RedisInstrumentor().instrument()


def _request_hook(span, request) -> None:
    """The request's id (X-Request-Id, the caller's or a new one: config.requestid) on its server span, so
    a log line and a trace find each other."""
    request_id = getattr(request, "scope", {}).get("payonce.request_id")  # config.requestid.SCOPE_KEY
    if request_id and span.is_recording():
        span.set_attribute("http.request.header.x-request-id", (request_id,))


def flush(timeout_s: float = 5.0) -> None:
    """Export what is batched now (a warm shutdown)."""
    if _enabled:
        trace.get_tracer_provider().force_flush(int(timeout_s * 1000))


# --- a job's trace ------------------------------------------------------------------------------------------


def current_traceparent() -> str | None:
    """The W3C traceparent of the span in progress, if it is sampled: what a new run's row keeps."""
    if not _enabled:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid or not context.trace_flags.sampled:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def log_fields() -> dict:
    """`trace_id` and `span_id` of the span in progress, for a log line (config.logs); {} when none records."""
    if not _enabled:
        return {}
    context = trace.get_current_span().get_span_context()
    if not context.is_valid or not context.trace_flags.sampled:
        return {}
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id (32 hex digits) a traceparent names, or None."""
    return traceparent[3:35] if traceparent and len(traceparent) == 55 else None


def _parent(traceparent: str | None) -> SpanContext | None:
    if not traceparent or len(traceparent) != 55:
        return None
    try:
        trace_id, span_id, flags = int(traceparent[3:35], 16), int(traceparent[36:52], 16), int(traceparent[53:55], 16)
    except ValueError:
        return None
    context = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))
    return context if context.is_valid else None


@contextmanager
def _job_span(name: str, parent: SpanContext, attributes: dict, kind: SpanKind):
    here = trace.get_current_span().get_span_context()
    # What woke this work (the message's consumer span, a callback's request) when it is not of the job's trace.
    links = [Link(here)] if here.is_valid and here.trace_id != parent.trace_id else None
    # The engine's control flow is exceptions (StepRetry, NotYet, JobFailure): none is the span's error, and
    # a traceback formatted for each would cost more than the step.
    with _tracer.start_as_current_span(name, context=trace.set_span_in_context(NonRecordingSpan(parent)),
                                       kind=kind, attributes=attributes, links=links, record_exception=False,
                                       set_status_on_exception=False) as span:
        yield span


def job_span(name: str, traceparent: str | None, *, kind: SpanKind = SpanKind.INTERNAL, **attributes):
    """A span of a job's run (a context manager yielding it, or None when nothing is traced): a child of
    the run's trace context (Job.trace_context), current inside the block, linked to the span that was
    current (what woke this work) when that is of another trace. A run created while traces were off, or
    not sampled, has no context: then nothing is traced, as for its create."""
    parent = _parent(traceparent) if _enabled else None
    if parent is None:
        return nullcontext()
    return _job_span(name, parent, {key: value for key, value in attributes.items() if value is not None}, kind)


def inject(headers: dict) -> None:
    """The W3C `traceparent` of the span in progress into outgoing headers (nothing when none records)."""
    if _enabled and trace.get_current_span().is_recording():
        from opentelemetry.propagate import inject as propagate

        propagate(headers)


def event(name: str, **attributes) -> None:
    """An event on the span in progress (nothing when none records)."""
    if _enabled:
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event(name, {key: value for key, value in attributes.items() if value is not None})


# --- spans whose id is known before they start --------------------------------------------------------------


def span_id_for(key: str) -> int:
    """The span id of the paid call sent under `key` (an upstream key): the same in every process, so that
    a paid call emitted again (by the execution that took it over from one that died) is the same span."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") or 1


@contextmanager
def span_with_id(name: str, span_id: int | None, *, kind: SpanKind = SpanKind.INTERNAL, start_time: int | None = None,
                 links=None, **attributes):
    """A span of the current context whose id is `span_id` (span_id_for; None: a random one), current inside
    the block; None (and no span) when nothing records."""
    if not _enabled or not trace.get_current_span().get_span_context().trace_flags.sampled:
        yield None
        return
    token = _NEXT_SPAN_ID.set(span_id)  # None: the generator's own
    try:
        span = _tracer.start_span(name, kind=kind, start_time=start_time, links=links,
                                  attributes={key: value for key, value in attributes.items() if value is not None})
    finally:
        _NEXT_SPAN_ID.reset(token)
    with trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
        yield span


def link_here(span_id: int) -> list[Link]:
    """A link to the span `span_id` of the current trace (the paid call a resend sends again)."""
    here = trace.get_current_span().get_span_context()
    if not here.is_valid:
        return []
    return [Link(SpanContext(here.trace_id, span_id, is_remote=True, trace_flags=here.trace_flags))]


# --- the SDK's parts ----------------------------------------------------------------------------------------


def _sdk_parts():
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

    return SpanProcessor, RandomIdGenerator, Sampler, SamplingResult, Decision


SpanProcessor, RandomIdGenerator, Sampler, SamplingResult, Decision = _sdk_parts()


class _IdGenerator(RandomIdGenerator):
    """Random ids, except a span id chosen beforehand (span_with_id)."""

    def generate_span_id(self) -> int:
        chosen = _NEXT_SPAN_ID.get()
        if chosen is not None:
            _NEXT_SPAN_ID.set(None)
            return chosen
        return super().generate_span_id()


class _NoOrphanClients(Sampler):
    """The configured sampler (OTEL_TRACES_SAMPLER), except that a client span with no parent is dropped."""

    def __init__(self, sampler: Sampler):
        self._sampler = sampler

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
        if kind is SpanKind.CLIENT and not trace.get_current_span(parent_context).get_span_context().is_valid:
            return SamplingResult(Decision.DROP)
        return self._sampler.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        return f"NoOrphanClients{{{self._sampler.get_description()}}}"


# A paid call's span is sent before its answer is recorded (ExportPaidCallsAtOnce): the most that sending may
# hold the call's thread, and how long the batch takes those spans instead after a send failed.
PAID_CALL_EXPORT_TIMEOUT_S = 1.0
PAID_CALL_EXPORT_PAUSE_S = 30.0


class ExportPaidCallsAtOnce(SpanProcessor):
    """The batch for every span, but a paid call's span is exported the moment it ends, before the call's
    answer is committed: a worker killed after its call returned loses no paid call from its batch (the
    execution that takes the attempt over sees its answer recorded and emits nothing). One POST per paid
    call, serialised in the process, bounded by PAID_CALL_EXPORT_TIMEOUT_S. A trace never stops paid work:
    after a send that failed (the collector down or slow), paid calls go into the batch like any span for
    PAID_CALL_EXPORT_PAUSE_S, so an outage costs one call a second at most, then nothing."""

    def __init__(self, batch, exporter):
        self._batch = batch
        self._exporter = exporter
        self._lock = threading.Lock()
        self._paused_until = 0.0

    def on_start(self, span, parent_context=None):
        self._batch.on_start(span, parent_context=parent_context)

    def on_end(self, span):
        if span.name != PROVIDER_CALL or time.monotonic() < self._paused_until:
            self._batch.on_end(span)
            return
        if not span.context.trace_flags.sampled:
            return
        from opentelemetry.context import attach, detach, set_value, _SUPPRESS_INSTRUMENTATION_KEY
        from opentelemetry.sdk.trace.export import SpanExportResult

        token = attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))  # the export's own POST is not traced
        try:
            with self._lock:
                sent = self._exporter.export((span,)) is SpanExportResult.SUCCESS
        except Exception:  # noqa: BLE001 - a trace never stops paid work
            logger.warning("traces: a paid call's span could not be sent", exc_info=True)
            sent = False
        finally:
            detach(token)
        if not sent:
            self._paused_until = time.monotonic() + PAID_CALL_EXPORT_PAUSE_S
            self._batch.on_end(span)  # the batch tries again later

    def shutdown(self):
        self._batch.shutdown()
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._batch.force_flush(timeout_millis)
