"""A paid call as a span (docs/operating.md, "Traces"): the executor's own spans, where no instrumentation
can know what a call costs or whether it was paid.

Every call sent to a provider under an attempt's upstream key for the first time is one span,
`payonce.provider_call` (config.tracing.PROVIDER_CALL), a child of the step that sends it, in the job's
trace. It ends when the provider's answer (or the lack of one) is in hand and is exported at once, before the
answer is recorded (config.tracing.ExportPaidCallsAtOnce), with what the answer says: `payonce.paid` yes,
no or unknown, the cost and where it comes from, and for an LLM call the GenAI conventions' token counts.
Its span id is the upstream key's (config.tracing.span_id_for), so:

- a send of the same key again (an unknown outcome resolved by resending) is `payonce.provider_resend`,
  linked to the call, never a second paid call; a lookup that finds the work is the instrumented request
  inside the resolving step;
- a worker killed while its call was out never ends that span: the execution that takes the attempt over
  (it finds the attempt `submitting` with no answer recorded) emits it, `payonce.recovered`, from the
  moment the call went out, under the same id. Had the dead worker exported it after all (killed between
  the export and the commit), the collector holds the same span twice, never two paid calls.

The render's end (its poll that finds it done, and the settled cost) is an event on the step that records
it, naming the call's span.
"""

import time
from contextlib import contextmanager
from dataclasses import dataclass

from django.utils import timezone
from opentelemetry.trace import SpanKind

from billing import rates
from config import tracing
from config.metrics import observe_soon
from executor.models import Attempt, AttemptState, Paid

RESEND = "payonce.provider_resend"


@dataclass
class Call:
    """What the caller learns from the provider: set on the span before it ends, and kept for the call's
    figures (provider_call). `cost`: a function answering (cost, its source), asked only when traced."""

    span: object | None
    paid: str | None = None

    def answered(self, *, paid: str, cost=None, usage: dict | None = None, status: int | None = None,
                 error_class: str | None = None) -> None:
        self.paid = str(paid)
        if self.span is None:
            return
        self.span.set_attribute("payonce.paid", self.paid)
        cost_usd, source = cost() if cost is not None else (None, None)
        if cost_usd is not None:
            self.span.set_attribute("payonce.cost_usd", str(cost_usd))
            self.span.set_attribute("payonce.cost_source", source)
        if status is not None:
            self.span.set_attribute("http.response.status_code", status)
        if error_class:
            self.span.set_attribute("error.type", str(error_class))
        for name, tokens in _gen_ai_usage(usage).items():
            self.span.set_attribute(name, tokens)


def _gen_ai_usage(usage: dict | None) -> dict:
    """The GenAI semantic conventions' token attributes, from an attempt's usage (executor.providers.base.Usage)."""
    if not usage:
        return {}
    tokens = {"gen_ai.usage.input_tokens": int(usage.get("input_tokens") or 0),
              "gen_ai.usage.output_tokens": int(usage.get("output_tokens") or 0)}
    if usage.get("cache_read_tokens"):
        tokens["gen_ai.usage.cache_read.input_tokens"] = int(usage["cache_read_tokens"])
    if usage.get("cache_write_tokens"):
        tokens["gen_ai.usage.cache_creation.input_tokens"] = int(usage["cache_write_tokens"])
    return tokens


def _attributes(attempt: Attempt, *, text: bool) -> dict:
    attributes = {"payonce.job_id": str(attempt.job_id), "payonce.run": attempt.run, "payonce.step": attempt.step,
                  "payonce.attempt": attempt.number, "payonce.provider": attempt.provider,
                  "payonce.model": attempt.model_name, "payonce.upstream_key": attempt.upstream_key}
    if text:
        attributes.update({"gen_ai.operation.name": "chat", "gen_ai.system": attempt.provider,
                           "gen_ai.request.model": attempt.model})
    return attributes


def derived_cost(attempt: Attempt, usage: dict | None):
    """The rate card's cost of a call (what record.end would derive), for a span that ends before the
    attempt's end is written; None when nothing prices it. Only when traces record."""
    return rates.cost_of(attempt.model_name, usage, params=(attempt.request or {}).get("params"))


@contextmanager
def provider_call(job, attempt: Attempt, *, text: bool = False):
    """Around a call sent to a provider under the attempt's key (its `sends` already counted): the paid
    call's span for the key's first send, a resend's span linked to it for any later one. Yields a Call
    (its span None when nothing records); the caller says what the answer was (Call.answered).

    Traced or not, the call's figures (config.metrics, written in the background): its latency by provider
    and whether it was paid; an LLM call's time to its first token, which is its latency (payonce's calls
    are not streamed: the first token comes with the answer); and for the first attempt of a job's first run,
    once paid, the time from the job's creation to this call."""
    call, started = Call(None), time.monotonic()
    try:
        if not tracing.enabled():
            yield call
        elif attempt.sends > 1:
            with tracing.span_with_id(RESEND, None, kind=SpanKind.CLIENT,
                                      links=tracing.link_here(tracing.span_id_for(attempt.upstream_key)),
                                      **_attributes(attempt, text=text), **{"payonce.send": attempt.sends}) as span:
                call.span = span
                yield call
        else:
            with tracing.span_with_id(tracing.PROVIDER_CALL, tracing.span_id_for(attempt.upstream_key),
                                      kind=SpanKind.CLIENT, **_attributes(attempt, text=text)) as span:
                call.span = span
                yield call
    finally:
        if call.paid is not None:
            _observed(job, attempt, call.paid, time.monotonic() - started, text=text)


def _observed(job, attempt: Attempt, paid: str, seconds: float, *, text: bool) -> None:
    observe_soon("provider_call_seconds", seconds, provider=attempt.provider, paid=paid)
    if text and paid == Paid.YES:
        observe_soon("llm_time_to_first_token_seconds", seconds, provider=attempt.provider)
    if paid == Paid.YES and attempt.number == 1 and job.run == 1:
        observe_soon("job_first_paid_call_seconds", (timezone.now() - job.created_at).total_seconds(), kind=job.kind)


def _died_with_call_out(attempt: Attempt) -> bool:
    """The attempt (as read before it was taken over) went out, and its sender recorded nothing of an
    answer: no error, no status. A sender that lived to see any answer records it, after its span ended."""
    return attempt.sends >= 1 and not (attempt.error or attempt.error_class or attempt.last_status)


def recover(attempt: Attempt) -> None:
    """A render's attempt found `submitting` by the execution resolving it: if its sender died with the
    call out, the paid call its sender never ended is emitted here (recovered), then noted on the row (a
    conditional update), so that the executions that resolve it after this one emit nothing. Emitted
    before the note: an execution killed between the two leaves the next one to emit the same span again
    (same trace, same id: one span to a trace store), never a paid call without its span."""
    if not tracing.enabled() or not _died_with_call_out(attempt):
        return
    recovered(attempt)
    note = "its sender stopped while the call was out; resolved by what the provider can do"
    if Attempt.objects.filter(id=attempt.id, state=AttemptState.SUBMITTING, error__isnull=True,
                              error_class__isnull=True, last_status__isnull=True).update(error=note):
        attempt.error = note


def orphan_ended(attempt: Attempt) -> None:
    """A cancelled job's attempt left `submitting`, about to be ended by a conditional update
    (executor.cancel; `attempt` as it was read): if its sender died with the call out, its paid call is
    emitted here, in the job's trace, before the end (so a kill between the two loses nothing; an end that
    another execution made first means the same span twice, one to a trace store)."""
    if tracing.enabled() and _died_with_call_out(attempt):
        with tracing.job_span("payonce.cancel.orphan", attempt.job.trace_context,
                              **{"payonce.job_id": str(attempt.job_id)}):
            recovered(attempt)


def recovered(attempt: Attempt, *, text: bool = False) -> None:
    """The paid call of an attempt whose sender died with the call out, emitted by the execution that takes
    it over, before it records so: from the moment it went out to now, under the call's own span id.
    Paid: unknown (what the resolution finds is on the record)."""
    if not tracing.enabled() or attempt.sends < 1:
        return
    sent = attempt.submitted_at or attempt.created_at
    with tracing.span_with_id(tracing.PROVIDER_CALL, tracing.span_id_for(attempt.upstream_key), kind=SpanKind.CLIENT,
                              start_time=int(sent.timestamp() * 1e9), **_attributes(attempt, text=text),
                              **{"payonce.recovered": True, "payonce.paid": "unknown"}):
        pass


def ended(attempt: Attempt) -> None:
    """An attempt's end, recorded by this execution: an event on the step's span, naming its call's span."""
    if not tracing.enabled():
        return
    tracing.event("payonce.attempt.ended", **{
        "payonce.upstream_key": attempt.upstream_key, "payonce.attempt": attempt.number,
        "payonce.state": str(attempt.state), "payonce.paid": str(attempt.paid),
        "payonce.cost_usd": str(attempt.cost_usd) if attempt.cost_usd is not None else None,
        "payonce.cost_source": attempt.cost_source or None,
        "payonce.provider_call.span_id": f"{tracing.span_id_for(attempt.upstream_key):016x}" if attempt.sends else None,
    })
