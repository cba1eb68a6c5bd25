"""A job's one timeline for the operators' job page (jobs.admin): its steps and their leases, its
attempts with the provider's own words, usage, cost and source, its reservations, its output, and its
deliveries with each try, in time order. Read only; one query per table."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from billing.models import Reservation
from executor.models import Attempt
from jobs.models import Job, Step
from webhooks.models import Delivery, DeliveryAttempt

# A job page stays fast on a job with thousands of rows (bench/admin.py): each table is read newest first,
# at most SHOWN rows, and the newest SHOWN entries are shown; `?all=1` reads and shows every one.
SHOWN = 400


@dataclass
class Entry:
    at: datetime
    kind: str  # job, step, attempt, reservation, output, delivery, try
    title: str
    state: str = ""  # a css class: ok, bad, wait, info
    facts: list[tuple[str, object]] = field(default_factory=list)  # (label, value), shown as they are
    text: str = ""  # the provider's words, an error, a response body: shown in <pre>
    link: str = ""


def job_timeline(job: Job, *, output_url: str = "", limit: int | None = SHOWN) -> tuple[list[Entry], bool]:
    """The entries in time order, and whether older ones were left out (`limit` rows a table at most)."""
    entries = [Entry(job.created_at, "job", f"created (run 1), {job.kind}", "info",
                     [("idempotency key", job.idempotency_key), ("models", " -> ".join(job.model_chain)),
                      ("output key", job.output_key), ("metadata", job.metadata or "")])]
    if job.started_at:
        entries.append(Entry(job.started_at, "job", f"run {job.run} started", "info"))
    reads = Reads(limit)
    entries += _steps(job, reads)
    attempts = reads.newest(Attempt.objects.filter(job_id=job.id).defer("request", "answer"), "-number")
    entries += _attempts(attempts)
    entries += _reservations(job, attempts, reads)
    if job.output and job.completed_at:
        entries.append(Entry(job.completed_at, "output", "output written", "ok",
                             [("key", job.output.get("key")), ("written by", job.output.get("written_by")),
                              ("content type", job.output.get("content_type", ""))], link=output_url))
    if job.completed_at:
        error = job.error or {}
        entries.append(Entry(job.completed_at, "job", f"ended {job.status}", _STATE.get(job.status, "info"),
                             [("code", error.get("code", ""))] if error else [], text=error.get("message", "")))
    elif job.status == "waiting":
        error = job.error or {}
        entries.append(Entry(job.updated_at, "job", "waiting for a person", "wait",
                             [("code", error.get("code", ""))], text=error.get("message", "")))
    entries += _deliveries(job, reads)
    entries.sort(key=lambda entry: (entry.at, _ORDER.get(entry.kind, 9)))
    if limit is not None and len(entries) > limit:
        return entries[-limit:], True
    return entries, reads.cut


class Reads:
    """Each table's rows newest first, at most `limit` of them; remembers whether any table had more."""

    def __init__(self, limit: int | None):
        self.limit, self.cut = limit, False

    def newest(self, rows, *order) -> list:
        if self.limit is None:
            return list(rows.order_by(*order))
        got = list(rows.order_by(*order)[: self.limit + 1])
        self.cut = self.cut or len(got) > self.limit
        return got[: self.limit]


_STATE = {"succeeded": "ok", "failed": "bad", "cancelled": "bad", "uncertain": "wait", "waiting": "wait",
          "running": "info", "submitting": "info", "done": "ok", "delivered": "ok", "dead": "bad",
          "pending": "wait", "held": "wait", "settled": "ok", "released": "info"}
_ORDER = {"job": 0, "step": 1, "reservation": 2, "attempt": 3, "output": 4, "delivery": 5, "try": 6}


def _steps(job: Job, reads: Reads) -> list[Entry]:
    entries = []
    for step in reads.newest(Step.objects.filter(job_id=job.id), "-started_at", "-id"):
        facts = [("run", step.run), ("executions", step.attempts), ("lease held by", step.lease_owner or "—"),
                 ("lease until", step.lease_until or "—")]
        # `executions` above 1: the lease was claimed again, by a worker that took it over from a dead one
        # or by its own holder after a back-off or a poll (the logs' step.taken_over tells them apart).
        entries.append(Entry(step.started_at, "step", f"step {step.name} claimed", "info", facts))
        if step.finished_at:
            entries.append(Entry(step.finished_at, "step", f"step {step.name} {step.status}",
                                 _STATE.get(step.status, "info"), [("run", step.run)],
                                 text=_short(step.result) if step.status != "done" else ""))
    return entries


def _attempts(rows: list[Attempt]) -> list[Entry]:
    entries = []
    for attempt in rows:
        head = f"attempt {attempt.number} ({attempt.provider}/{attempt.model}, step {attempt.step}, run {attempt.run})"
        entries.append(Entry(attempt.created_at, "attempt", f"{head}: intent written", "info",
                             [("upstream key", attempt.upstream_key)]))
        if attempt.accepted_at:
            entries.append(Entry(attempt.accepted_at, "attempt", f"{head}: accepted", "info",
                                 [("upstream id", attempt.upstream_id or "—"), ("sends", attempt.sends)]))
        ended = attempt.finished_at or (attempt.submitted_at if attempt.state == "uncertain" else None)
        if ended or attempt.state in ("failed", "succeeded", "uncertain"):
            facts = [("upstream key", attempt.upstream_key), ("state", attempt.state), ("paid", attempt.paid),
                     ("error class", attempt.error_class or "—"), ("sends", attempt.sends),
                     ("last HTTP status", attempt.last_status or "—"), ("usage", attempt.usage or "—"),
                     ("cost", "unpriced" if attempt.cost_usd is None else f"${attempt.cost_usd}"),
                     ("cost source", attempt.cost_source or "—"), ("duration", f"{attempt.duration_ms} ms"
                                                                   if attempt.duration_ms is not None else "—")]
            entries.append(Entry(ended or attempt.created_at, "attempt", f"{head}: {attempt.state}",
                                 _STATE.get(attempt.state, "info"), facts, text=attempt.error or ""))
        elif attempt.submitted_at:
            entries.append(Entry(attempt.submitted_at, "attempt", f"{head}: sent, {attempt.state}", "wait",
                                 [("sends", attempt.sends)]))
    return entries


def _reservations(job: Job, attempts: list[Attempt], reads: Reads) -> list[Entry]:
    """Found by key (billing keeps no index on the job: its hot path pays for none): each attempt's upstream
    key, and each run's fan-out pool (jobs.recipes._pool)."""
    keys = [a.upstream_key for a in attempts] + [f"fanout-{job.id}-{run}" for run in range(1, job.run + 1)]
    entries = []
    for row in reads.newest(Reservation.objects.filter(key__in=keys), "-created_at", "-id"):
        entries.append(Entry(row.created_at, "reservation", f"reserved ${row.amount} ({row.kind}, {row.model})",
                             "wait", [("key", row.key)]))
        if row.resolved_at:
            spent = "unpriced, kept as spent" if row.unpriced else (f"${row.spent}" if row.spent is not None else "—")
            entries.append(Entry(row.resolved_at, "reservation", f"reservation {row.state}",
                                 _STATE.get(row.state, "info"), [("key", row.key), ("spent", spent)]))
    return entries


def _deliveries(job: Job, reads: Reads) -> list[Entry]:
    entries = []
    deliveries = reads.newest(Delivery.objects.filter(job_id=job.id).defer("envelope"), "-created_at")
    for delivery in deliveries:
        entries.append(Entry(delivery.created_at, "delivery", f"event {delivery.event} (run {delivery.run})",
                             _STATE.get(delivery.status, "info"),
                             [("webhook-id", delivery.id), ("status", delivery.status), ("tries", delivery.attempts),
                              ("url", delivery.url or "the client's endpoint")]))
    tries = reads.newest(DeliveryAttempt.objects.filter(delivery_id__in=[d.id for d in deliveries]),
                         "-attempted_at", "-id")
    for attempt in tries:
        good = attempt.status_code is not None and 200 <= attempt.status_code < 300
        entries.append(Entry(attempt.attempted_at, "try", f"try {attempt.number} of {attempt.delivery_id}",
                             "ok" if good else "bad",
                             [("url", attempt.url), ("status", attempt.status_code or "—"),
                              ("duration", f"{attempt.duration_ms} ms" if attempt.duration_ms is not None else "—")],
                             text=attempt.error or attempt.response_body[:500]))
    return entries


def _short(value, limit: int = 500) -> str:
    text = value if isinstance(value, str) else ("" if value is None else str(value))
    return text if len(text) <= limit else text[:limit] + "…"
