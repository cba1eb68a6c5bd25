"""Operators' actions, alone or in bulk over every job a filter matches: the actions of operators.actions
(cancel, retry (pays again), replay deliveries, re-run orders, replay dead letters), a price set, a price
drift cleared and a report template's live label moved. Each is previewed first (how many rows match, how
many it would change, what a retry may reserve) and leaves one audit row (who, when, what, how many, why).
The admin (operators.admin) and the CLI (operators.cli and its commands) call only these functions, so both
act and count the same way.

Every change goes through the same services the API uses (job_cancel, job_retry, delivery_replay), so
each keeps its race rules: a job another writer ended first is skipped, not changed twice. Replaying
sends stored envelopes and calls no provider; a retry or re-run starts a new run whose done steps (a
report's written chapters, its synthesis) are read back, never paid for again.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from accounts.models import Client
from billing import months
from billing import services as billing
from executor.record import upstream_key_parts
from jobs.kinds import KINDS
from jobs.kinds.report import templates
from jobs.models import Job, JobStatus, ReportTemplate
from operators.actions import BY_NAME, Action
from operators.models import OperatorAction, OperatorActionKind

CHUNK = 500  # rows per read while acting on a large match
SAMPLE = 20  # ids kept on the audit row


class OperationRefused(ValueError):
    """An action that cannot start: no reason given, an unknown filter value, an unknown action."""


# --- what a filter matches ------------------------------------------------------------------------------


def month_range(month: str) -> tuple[datetime, datetime]:
    """"YYYY-MM" as [its first instant, the next month's first instant), in UTC: billing's months, named as
    GET /v1/spend names them (billing.months)."""
    try:
        return months.month_bounds(months.parse_month(month))
    except ValueError:
        raise OperationRefused(f"month must be {months.MONTH_WORDS[:-1]}, not {month!r}") from None


def jobs_search(jobs: QuerySet, term: str) -> QuerySet:
    """One search box for every id an operator holds, each answered by an index or a narrow scan:
    a job id; an upstream key `payonce-<job>-<n>` (the job id is in it, so the job's own attempts are
    checked, not the attempts table); `key=value` for a metadata pair (JSON containment); anything else
    is an idempotency key."""
    term = (term or "").strip()
    if not term:
        return jobs
    upstream = upstream_key_parts(term)
    if upstream is not None:
        return jobs.filter(id=upstream[0], attempts__upstream_key=term)
    try:
        return jobs.filter(id=uuid.UUID(term))
    except ValueError:
        pass
    if "=" in term:
        key, _, value = (part.strip() for part in term.partition("="))
        pairs = Q(metadata__contains={key: value})
        try:
            parsed = json.loads(value)  # customer=7 matches {"customer": 7} as well as {"customer": "7"}
        except ValueError:
            parsed = value
        if parsed != value:
            pairs |= Q(metadata__contains={key: parsed})
        return jobs.filter(pairs)
    return jobs.filter(idempotency_key=term)


@dataclass
class JobFilter:
    """The job filter the admin's list and the CLI share: every field optional, all of them ANDed."""
    status: str = ""
    client: str = ""  # a client id, or an exact client name
    model: str = ""  # "provider/model": jobs whose chain names it
    kind: str = ""
    month: str = ""  # "YYYY-MM": jobs created in that UTC month
    search: str = ""  # jobs_search's term
    ids: list[str] = field(default_factory=list)  # explicit job ids (the admin's selected rows)

    def jobs(self) -> QuerySet:
        jobs = Job.objects.all()
        if self.status:
            if self.status not in JobStatus.values:
                raise OperationRefused(f"status must be one of {', '.join(JobStatus.values)}")
            jobs = jobs.filter(status=self.status)
        if self.kind:
            if self.kind not in KINDS:
                raise OperationRefused(f"kind must be one of {', '.join(KINDS)}")
            jobs = jobs.filter(kind=self.kind)
        if self.client:
            jobs = jobs.filter(client_id__in=client_ids(self.client))
        if self.model:
            jobs = jobs.filter(model_chain__contains=[self.model])
        if self.month:
            first, after = month_range(self.month)
            jobs = jobs.filter(created_at__gte=first, created_at__lt=after)
        if self.ids:
            try:
                jobs = jobs.filter(id__in=[uuid.UUID(str(ident)) for ident in self.ids])
            except ValueError:
                raise OperationRefused("ids must be job ids") from None
        return jobs_search(jobs, self.search)

    def describe(self) -> str:
        parts = [f"{name}={value}" for name, value in asdict(self).items() if value and name != "ids"]
        if self.ids:
            parts.append(f"ids={len(self.ids)} selected")
        return ", ".join(parts) or "every job"


def client_ids(client: str) -> list:
    try:
        return [uuid.UUID(client)]
    except ValueError:
        ids = list(Client.objects.filter(name=client).values_list("id", flat=True))
        if not ids:
            raise OperationRefused(f"no client is named {client!r}") from None
        return ids


# --- previews -------------------------------------------------------------------------------------------


@dataclass
class Preview:
    """What an action would do, shown before it is confirmed (and printed by --dry-run)."""
    action: str
    target: str
    matched: int  # rows the target matches
    acting: int  # rows the action would change (open jobs for a cancel, failed or waiting for a retry ...)
    skipped: int
    deliveries: int | None = None  # a replay: the deliveries it sends again
    worst_case_usd: Decimal | None = None  # a retry or re-run: the most its new runs may reserve
    sample: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        data = asdict(self)
        data["worst_case_usd"] = None if self.worst_case_usd is None else str(self.worst_case_usd)
        return data


def action_preview(action: Action, *, rows: QuerySet, target: str) -> Preview:
    """How many rows the target matches and how many of them the action changes (operators.actions: those
    in its statuses), counted in one pass over the match; what a replay sends again; what an action that
    pays again may reserve at worst."""
    acting = action.acting(rows)
    counts = rows.order_by().aggregate(
        matched=Count("pk"),
        acting=Count("pk", filter=Q(status__in=action.statuses)) if action.statuses is not None else Count("pk"))
    matched, count = counts["matched"], counts["acting"]
    sample = [str(ident) for ident in acting.order_by("-created_at").values_list("pk", flat=True)[:SAMPLE]]
    return Preview(action=str(action.kind), target=target, matched=matched, acting=count, skipped=matched - count,
                   sample=sample, deliveries=action.replays(acting).count() if action.replays else None,
                   worst_case_usd=retry_worst_cases(acting) if action.pays_again else None)


def preview_jobs(*, action: str, jobs: QuerySet, target: str) -> Preview:
    """action_preview() of the job action named `action` (operators.actions: cancel, retry, replay, rerun)."""
    chosen = BY_NAME.get(action)
    if chosen is None or chosen.rows is not Job:
        raise OperationRefused(f"unknown action {action!r}")
    return action_preview(chosen, rows=jobs, target=target)


def retry_worst_case(job: Job) -> Decimal:
    """The most a new run of `job` may reserve (and so pay), every call at its worst case: a media job,
    each model of its chain tried attempts_per_model times; a report, one call for each chapter not yet
    written and the synthesis if it was not (written ones are read back for free)."""
    return retry_worst_cases(Job.objects.filter(id=job.id))


def retry_worst_cases(jobs: QuerySet) -> Decimal:
    """retry_worst_case summed over `jobs`, in a few statements whatever their number (a bulk retry's
    preview over thousands of failed jobs answers at once: bench/admin.py): each kind sums its own
    (jobs.engine.workflow.Kind.worst_cases: media jobs grouped by chain and policy; reports read in one statement
    with their chapters left counted beside each)."""
    total = Decimal("0.000000")
    for name, kind in KINDS.items():
        total += kind.worst_cases(jobs.filter(kind=name))
    return total


# --- acting ---------------------------------------------------------------------------------------------


def audit_start(*, action: str, who: str, via: str, target: str, reason: str, preview: Preview) -> OperatorAction:
    reason = (reason or "").strip()
    if not reason:
        raise OperationRefused("a reason is required")
    if not (who or "").strip():
        raise OperationRefused("who acts must be named")
    return OperatorAction.objects.create(action=action, who=who.strip()[:150], via=via, target=target,
                                         reason=reason, matched=preview.matched, detail=preview.as_dict())


def audit_finish(entry: OperatorAction, acted: int) -> OperatorAction:
    OperatorAction.objects.filter(id=entry.id).update(acted=acted, finished_at=timezone.now())
    entry.refresh_from_db()
    return entry


def price_set(*, model: str, price: dict | None, who: str, via: str, reason: str) -> OperatorAction | None:
    """A model's price (the rate card's override; None drops it) set by an operator: money, so a decision
    with a reason and an audit row (before and after), in one transaction with the change. None when the
    price is as it was (nothing changed, nothing audited). The caller holds billing.change_modelprice."""
    before = billing.model_price(model)
    after = None if price is None else billing.price_words(price)
    if before == after:
        return None
    preview = Preview(action=OperatorActionKind.PRICE, target=f"model {model}", matched=1, acting=1, skipped=0)
    with transaction.atomic():
        entry = audit_start(action=OperatorActionKind.PRICE, who=who, via=via, target=preview.target, reason=reason,
                            preview=preview)
        OperatorAction.objects.filter(id=entry.id).update(detail={**entry.detail, "before": before, "after": after})
        billing.model_price_set(model=model, price=price)
        return audit_finish(entry, 1)


def drifts_preview(*, drifts: QuerySet, target: str) -> Preview:
    matched = drifts.count()
    acting = drifts.filter(cleared_at__isnull=True).count()
    return Preview(action=OperatorActionKind.DRIFT_CLEAR, target=target, matched=matched, acting=acting,
                   skipped=matched - acting, sample=list(drifts.values_list("model", flat=True)[:SAMPLE]))


def drifts_clear(*, drifts: QuerySet, target: str, who: str, via: str, reason: str) -> OperatorAction:
    """Price drifts cleared by an operator: their models' reservations go back to the rate card's worst
    case (a settle above its reservation starts a drift again). Audited, as a price change is."""
    preview = drifts_preview(drifts=drifts, target=target)
    entry = audit_start(action=OperatorActionKind.DRIFT_CLEAR, who=who, via=via, target=target, reason=reason,
                        preview=preview)
    return audit_finish(entry, billing.price_drift_clear(drifts=drifts, who=who))


# --- a report template's live label ------------------------------------------------------------------------


def template_live_target(template: ReportTemplate, number: int) -> str:
    """What the audit row says was acted on: the template (its client by name and id: two may share a name)
    and the move."""
    return (f"report template {template.name} of {template.client.name} ({template.client_id}): "
            f"live v{template.live} -> v{number}")


def template_live_preview(*, template: ReportTemplate, number: int) -> Preview:
    """The move, before it is confirmed: one template, changed unless `live` points at `number` already."""
    acting = int(template.live != number)
    return Preview(action=OperatorActionKind.TEMPLATE_LIVE, target=template_live_target(template, number),
                   matched=1, acting=acting, skipped=1 - acting)


def template_live_set(*, template: ReportTemplate, number: int, who: str, via: str, reason: str) -> OperatorAction:
    """A report template's `live` label moved by an operator (a client moves its own through the API): the
    orders and jobs accepted from then on are written from version `number`; those accepted before keep the
    version they pinned at submit, so nothing already sold changes. A decision, so a reason and an audit row
    with where the label pointed before and after, in one transaction with the move, which goes through the
    templates' own service (version_set_live: it takes the template's row lock, and says what it replaced).
    OperationRefused: no reason, or no such version (the audit row goes with the rolled-back transaction)."""
    preview = template_live_preview(template=template, number=number)
    with transaction.atomic():
        entry = audit_start(action=OperatorActionKind.TEMPLATE_LIVE, who=who, via=via, target=preview.target,
                            reason=reason, preview=preview)
        before = templates.version_set_live(client=template.client, name=template.name, number=number)
        if before is None:
            raise OperationRefused(f"{template.name} has no version {number}; nothing was done")
        # `before` is what the lock saw, which a client's own move since the page was read may have changed.
        OperatorAction.objects.filter(id=entry.id).update(detail={**entry.detail, "before": before, "after": number})
        return audit_finish(entry, int(before != number))


def action_take(action: Action, *, rows: QuerySet, target: str, who: str, via: str, reason: str) -> OperatorAction:
    """The one door of every action of operators.actions, from the admin and the CLI alike:

    1. the preview, kept on the audit row (what the operator confirmed);
    2. the audit row, written before anything changes (an action cut short by a crash still shows), and
       refused without a reason or someone named;
    3. the action's service called once per row it acts on (a replay: per delivery it sends again), each
       call its own transaction: a bulk cancel of 100,000 jobs holds no long transaction, and a job a
       worker ended meanwhile is skipped (the service's conditional update matched no row), not counted;
    4. the row finished with how many changed.
    """
    shown = action_preview(action, rows=rows, target=target)
    entry = audit_start(action=action.kind, who=who, via=via, target=target, reason=reason, preview=shown)
    chosen = action.acting(rows)
    if action.replays:
        chosen = action.replays(chosen)
    acted = sum(bool(action.each(row)) for row in chosen.only("id", *action.loads).iterator(chunk_size=CHUNK))
    return audit_finish(entry, acted)
