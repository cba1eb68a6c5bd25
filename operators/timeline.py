"""What the operators' job page (operators.admin.jobs) reads: the summary it opens with (per run: attempts, paid,
cost, outcome; and a report's link, recipient, mail and chapters), then the one timeline: its steps and
their leases, its attempts with the provider's own words, usage, cost and source, its reservations, its
output, and its deliveries with each try, in time order, grouped by run. Read only; one query per table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from datetime import datetime

from django.db.models import Case, Count, F, TextField, Value, When

from billing.models import Reservation
from executor.models import STORED_OUTPUT, Attempt
from executor.selectors import RunAttempts, attempts_by_run
from jobs.kinds import KINDS
from jobs.models import Job, Step, StepStatus
from orders.models import Order
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
    run: int = 1  # the run it belongs to: the page folds the timeline by run
    # Where it falls among entries of the same instant: (its phase, its own number). A transaction's rows
    # share one timestamp (PostgreSQL's now() is the transaction's start), so an attempt's end, its
    # reservation's settle, the step's end, the output and the job's end are often equal to the microsecond,
    # and the page showed them by table ("job ended" above the attempt that ended it; a run's tries newest
    # first). Ties go by the order things happen in (PHASE), then by the entry's own number.
    order: tuple[int, int, int] = (99, 0, 0)


def job_timeline(job: Job, *, output_url: str = "", limit: int | None = SHOWN) -> tuple[list[Entry], bool]:
    """The entries in time order, and whether older ones were left out (`limit` rows a table at most)."""
    entries = [Entry(job.created_at, "job", f"created (run 1), {job.kind}", "info",
                     [("idempotency key", job.idempotency_key), ("models", " -> ".join(job.model_chain)),
                      ("output key", job.output_key), ("metadata", job.metadata or "")], order=_order("job created"))]
    if job.started_at:
        entries.append(Entry(job.started_at, "job", f"run {job.run} started", "info", run=job.run,
                             order=_order("job started", job.run)))
    reads = Reads(limit)
    entries += _steps(job, reads)
    attempts = reads.newest(Attempt.objects.filter(job_id=job.id).defer("request", "answer", "output_url")
                            .annotate(output_shown=_OUTPUT_SHOWN), "-number")
    entries += _attempts(attempts)
    entries += _reservations(job, attempts, reads)
    if job.output and job.completed_at:
        entries.append(Entry(job.completed_at, "output", "output written", "ok",
                             [("key", job.output.get("key")), ("written by", job.output.get("written_by")),
                              ("content type", job.output.get("content_type", ""))], link=output_url, run=job.run,
                             order=_order("output")))
    if job.completed_at:
        error = job.error or {}
        entries.append(Entry(job.completed_at, "job", f"ended {job.status}", _STATE.get(job.status, "info"),
                             [("code", error.get("code", ""))] if error else [], text=error.get("message", ""),
                             run=job.run, order=_order("job ended")))
    elif job.status == "waiting":
        error = job.error or {}
        entries.append(Entry(job.updated_at, "job", "waiting for a person", "wait",
                             [("code", error.get("code", ""))], text=error.get("message", ""), run=job.run,
                             order=_order("job ended")))
    entries += _deliveries(job, reads)
    entries.sort(key=lambda entry: (entry.at, entry.order))
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
PHASE = {name: rank for rank, name in enumerate((
    "job created", "job started", "step claimed", "reserved", "attempt intent", "attempt accepted", "attempt sent",
    "attempt ended", "reservation resolved", "step finished", "output", "job ended", "delivery", "try"))}


def _order(phase: str, number: int = 0, then: int = 0) -> tuple[int, int, int]:
    return (PHASE[phase], number, then)


def _steps(job: Job, reads: Reads) -> list[Entry]:
    entries = []
    for step in reads.newest(Step.objects.filter(job_id=job.id), "-started_at", "-id"):
        facts = [("run", step.run), ("executions", step.attempts), ("lease held by", step.lease_owner or "—"),
                 ("lease until", step.lease_until or "—")]
        # `executions` above 1: the lease was claimed again, by a worker that took it over from a dead one
        # or by its own holder after a back-off or a poll (the logs' step.taken_over tells them apart).
        entries.append(Entry(step.started_at, "step", f"step {step.name} claimed", "info", facts, run=step.run,
                             order=_order("step claimed", step.id)))
        if step.finished_at:
            entries.append(Entry(step.finished_at, "step", f"step {step.name} {step.status}",
                                 _STATE.get(step.status, "info"), [("run", step.run)],
                                 text=_short(step.result) if step.status != "done" else "", run=step.run,
                                 # A step written done in the statement that claimed it (jobs.engine.steps' marks,
                                 # several in one statement) ends right after its own claim.
                                 order=_order("step claimed", step.id, 1) if step.finished_at == step.started_at
                                 else _order("step finished", step.id)))
    return entries


# Where an attempt's output is, as the page says it: bytes a provider answered in the body, held on the
# row until the store has them (a `data:` URL, megabytes), are said to be there, never read for the page.
_OUTPUT_SHOWN = Case(When(output_url__startswith="data:", then=Value("data:")), default=F("output_url"),
                     output_field=TextField())


def _output_fact(shown: str) -> str:
    if shown == "data:":
        return "answered in the body, held on this attempt until the store has it"
    if shown.startswith(STORED_OUTPUT):
        return f"answered in the body, now in the store at {shown.removeprefix(STORED_OUTPUT)}"
    return shown  # the provider's URL


def _attempts(rows: list[Attempt]) -> list[Entry]:
    entries = []
    for attempt in rows:
        head = f"attempt {attempt.number} ({attempt.provider}/{attempt.model}, step {attempt.step}, run {attempt.run})"
        entries.append(Entry(attempt.created_at, "attempt", f"{head}: intent written", "info",
                             [("upstream key", attempt.upstream_key)], run=attempt.run,
                             order=_order("attempt intent", attempt.number)))
        if attempt.accepted_at:
            entries.append(Entry(attempt.accepted_at, "attempt", f"{head}: accepted", "info",
                                 [("upstream id", attempt.upstream_id or "—"), ("sends", attempt.sends)],
                                 run=attempt.run, order=_order("attempt accepted", attempt.number)))
        ended = attempt.finished_at or (attempt.submitted_at if attempt.state == "uncertain" else None)
        if ended or attempt.state in ("failed", "succeeded", "uncertain"):
            facts = [("upstream key", attempt.upstream_key), ("state", attempt.state), ("paid", attempt.paid),
                     ("error class", attempt.error_class or "—"), ("sends", attempt.sends),
                     ("last HTTP status", attempt.last_status or "—"), ("usage", attempt.usage or "—"),
                     ("cost", "unpriced" if attempt.cost_usd is None else f"${attempt.cost_usd}"),
                     ("cost source", attempt.cost_source or "—"), ("duration", f"{attempt.duration_ms} ms"
                                                                   if attempt.duration_ms is not None else "—")]
            if attempt.output_shown:
                facts.append(("output", _output_fact(attempt.output_shown)))
            entries.append(Entry(ended or attempt.created_at, "attempt", f"{head}: {attempt.state}",
                                 _STATE.get(attempt.state, "info"), facts, text=attempt.error or "", run=attempt.run,
                                 order=_order("attempt ended", attempt.number)))
        elif attempt.submitted_at:
            entries.append(Entry(attempt.submitted_at, "attempt", f"{head}: sent, {attempt.state}", "wait",
                                 [("sends", attempt.sends)], run=attempt.run,
                                 order=_order("attempt sent", attempt.number)))
    return entries


def _reservations(job: Job, attempts: list[Attempt], reads: Reads) -> list[Entry]:
    """Found by key (billing keeps no index on the job: its hot path pays for none): each attempt's upstream
    key, and each run's fan-out pool (jobs.kinds.report.recipe._pool)."""
    runs = {a.upstream_key: a.run for a in attempts} | {f"fanout-{job.id}-{run}": run for run in range(1, job.run + 1)}
    entries = []
    for row in reads.newest(Reservation.objects.filter(key__in=list(runs)), "-created_at", "-id"):
        entries.append(Entry(row.created_at, "reservation", f"reserved ${row.amount} ({row.kind}, {row.model})",
                             "wait", [("key", row.key)], run=runs[row.key], order=_order("reserved", row.id)))
        if row.resolved_at:
            spent = "unpriced, kept as spent" if row.unpriced else (f"${row.spent}" if row.spent is not None else "—")
            entries.append(Entry(row.resolved_at, "reservation", f"reservation {row.state}",
                                 _STATE.get(row.state, "info"), [("key", row.key), ("spent", spent)],
                                 run=runs[row.key], order=_order("reservation resolved", row.id)))
    return entries


def _deliveries(job: Job, reads: Reads) -> list[Entry]:
    entries = []
    deliveries = reads.newest(Delivery.objects.filter(job_id=job.id).defer("envelope"), "-created_at")
    for delivery in deliveries:
        entries.append(Entry(delivery.created_at, "delivery", f"event {delivery.event} (run {delivery.run})",
                             _STATE.get(delivery.status, "info"),
                             [("webhook-id", delivery.id), ("status", delivery.status), ("tries", delivery.attempts),
                              ("url", delivery.url or "the client's endpoint")], run=delivery.run,
                             order=_order("delivery")))
    runs = {delivery.id: delivery.run for delivery in deliveries}
    tries = reads.newest(DeliveryAttempt.objects.filter(delivery_id__in=list(runs)), "-attempted_at", "-id")
    for attempt in tries:
        good = attempt.status_code is not None and 200 <= attempt.status_code < 300
        entries.append(Entry(attempt.attempted_at, "try", f"try {attempt.number} of {attempt.delivery_id}",
                             "ok" if good else "bad",
                             [("url", attempt.url), ("status", attempt.status_code or "—"),
                              ("duration", f"{attempt.duration_ms} ms" if attempt.duration_ms is not None else "—")],
                             text=attempt.error or attempt.response_body[:500], run=runs[attempt.delivery_id],
                             order=_order("try", attempt.id)))
    return entries


def _short(value, limit: int = 500) -> str:
    text = value if isinstance(value, str) else ("" if value is None else str(value))
    return text if len(text) <= limit else text[:limit] + "…"


# --- the summary the page opens with --------------------------------------------------------------------

# The runs the summary lists one a line; older ones fold under a line of their own (bench/admin.py's heavy
# job has 100 runs).
RUN_LINES = 10


@dataclass(frozen=True)
class RunLine(RunAttempts):
    """One run: its attempts, how many were paid (and of unknown outcome), what they cost, how it ended."""

    outcome: str
    state: str  # a css class, as Entry.state


@dataclass(frozen=True)
class Summary:
    lines: list[RunLine]  # run 1 first
    total: RunLine  # every run; `run` is the number of runs
    webhooks: list[tuple[str, int]]  # (delivery status, how many), e.g. [("dead", 1), ("delivered", 2)]

    @property
    def latest(self) -> list[RunLine]:
        return self.lines[-RUN_LINES:]

    @property
    def earlier(self) -> list[RunLine]:
        return self.lines[:-RUN_LINES]


def job_summary(job: Job) -> Summary:
    """Per run: executor.selectors.attempts_by_run's sums and how the run ended. An earlier run ended failed
    or waiting (a person's retry starts a new run only then): its failed step says with which code."""
    sums = attempts_by_run(job.id)
    codes = {run: _error_code(result) for run, result in
             Step.objects.filter(job_id=job.id, status=StepStatus.FAILED).values_list("run", "result")}
    lines = []
    for run in range(1, job.run + 1):
        if run == job.run:
            code = (job.error or {}).get("code", "")
            outcome, state = (f"{job.status}: {code}" if code else job.status), _STATE.get(job.status, "info")
        else:
            outcome, state = (f"ended {codes[run]}; retried" if codes.get(run) else "ended; retried"), "bad"
        lines.append(RunLine(**asdict(sums.get(run) or RunAttempts.none(run)), outcome=outcome, state=state))
    total = RunLine(**asdict(RunAttempts.total(lines, job.run)), outcome=lines[-1].outcome, state=lines[-1].state)
    webhooks = list(Delivery.objects.filter(job_id=job.id).order_by("status").values("status")
                    .annotate(n=Count("id")).values_list("status", "n"))
    return Summary(lines, total, webhooks)


def _error_code(result) -> str:
    error = result.get("error") if isinstance(result, dict) else None
    return str(error.get("code", "")) if isinstance(error, dict) else ""


def kind_facts(job: Job):
    """The job's kind's section of the page (jobs.engine.workflow.Kind.timeline: a report's link, recipient, mail
    and chapters), with the paid order that made the job and its later duplicates, which the kind cannot
    read (orders sit above jobs); None: the kind has no section."""
    section = KINDS[job.kind].timeline
    facts = section(job) if section is not None else None
    if facts is None:
        return None
    order = Order.objects.filter(job_id=job.id).first()
    duplicates = list(Order.objects.filter(duplicate_of=order).order_by("created_at")) if order else []
    return replace(facts, order=order, duplicates=duplicates)


@dataclass(frozen=True)
class RunGroup:
    """The timeline's entries of one run (in time order), folded under its summary line."""

    run: int
    line: RunLine | None
    entries: list[Entry]


def timeline_by_run(entries: list[Entry], summary: Summary) -> list[RunGroup]:
    lines = {line.run: line for line in summary.lines}
    grouped: dict[int, list[Entry]] = {}
    for entry in entries:
        grouped.setdefault(entry.run, []).append(entry)
    return [RunGroup(run, lines.get(run), grouped[run]) for run in sorted(grouped)]
