"""Typed results: what payonce answers, as dataclasses whose fields are named exactly as in the JSON.

Money is a :class:`decimal.Decimal` (payonce sends it as a decimal string with 6 places precisely so that
no float ever rounds a cent; ``None`` means *unpriced*, which is not zero). Times are timezone-aware
:class:`datetime.datetime` in UTC. A field payonce adds later does not break this version: each result
keeps the whole JSON object it was made from in ``raw``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, Dict, List, Optional

__all__ = [
    "STOP_STATUSES",
    "TERMINAL_STATUSES",
    "Attempt",
    "Chapter",
    "Cost",
    "Event",
    "Job",
    "Order",
    "OrderJob",
    "Report",
    "ReportTemplateChapter",
    "ReportTemplateLayout",
    "ReportTemplateLive",
    "ReportTemplateMail",
    "ReportTemplateSummary",
    "ReportTemplateVersion",
    "ReportTemplateVersionCreated",
    "ReportText",
    "Spend",
    "SpendByModel",
    "WhoAmI",
]

TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})
"""A job in one of these has ended: nothing more happens to it (a person's retry of a failed job aside)."""

STOP_STATUSES = TERMINAL_STATUSES | {"waiting"}
"""Where ``jobs.wait`` returns: ended, or waiting for a person's decision (nothing happens without one)."""

_FRACTION = re.compile(r"\.(\d+)")


def money(value: Any) -> Optional[Decimal]:
    """A money field that may be unpriced (None)."""
    return None if value is None else Decimal(str(value))


def amount(value: Any) -> Decimal:
    """A money field that is always there (a sum, a cap): zero if a server left it out."""
    return Decimal(str(value)) if value is not None else Decimal(0)


def timestamp(value: Any) -> Optional[datetime]:
    """An ISO 8601 time as payonce writes it (``2026-12-02T16:20:16.089851Z``). Python before 3.11 reads
    neither ``Z`` nor fractions of other than 3 or 6 digits, so both are normalised first."""
    if not value:
        return None
    text = str(value).replace("Z", "+00:00").replace("z", "+00:00")
    text = _FRACTION.sub(lambda m: "." + (m.group(1) + "000000")[:6], text, count=1)
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


@dataclass
class Cost:
    """What a job (or a run, or a month) cost: the sum of the priced attempts, and how many attempts may
    have been paid but could not be priced."""

    total_usd: Decimal
    unpriced_attempts: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: Optional[Dict[str, Any]]) -> Cost:
        data = data or {}
        return cls(total_usd=amount(data.get("total_usd")),
                   unpriced_attempts=int(data.get("unpriced_attempts") or 0), raw=dict(data))


@dataclass
class Attempt:
    """One call that could cost money, under its upstream key (the key the provider dedupes on).
    ``paid`` is ``"yes"``, ``"no"`` or ``"unknown"``."""

    number: int
    step: Optional[str]
    provider: Optional[str]
    model: Optional[str]
    upstream_key: Optional[str]
    state: Optional[str]
    error_class: Optional[str]
    error: Optional[str]
    duration_ms: Optional[int]
    cost_usd: Optional[Decimal]
    cost_source: Optional[str]
    usage: Optional[Dict[str, Any]]
    paid: Optional[str]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> Attempt:
        return cls(number=int(data.get("number") or 0), step=data.get("step"), provider=data.get("provider"),
                   model=data.get("model"), upstream_key=data.get("upstream_key"), state=data.get("state"),
                   error_class=data.get("error_class"), error=data.get("error"),
                   duration_ms=data.get("duration_ms"), cost_usd=money(data.get("cost_usd")),
                   cost_source=data.get("cost_source"), usage=data.get("usage"), paid=data.get("paid"),
                   raw=dict(data))


@dataclass
class Chapter:
    """A report job's chapter, with its attempts (every run's) and what they cost."""

    key: str
    status: str
    attempts: List[Attempt]
    cost_usd: Optional[Decimal]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> Chapter:
        return cls(key=data.get("key", ""), status=data.get("status", ""),
                   attempts=[Attempt.from_dict(a) for a in data.get("attempts") or []],
                   cost_usd=money(data.get("cost_usd")), raw=dict(data))


@dataclass
class Job:
    """A job as payonce shows it. ``replayed`` is True when this answer was payonce recognising a key it
    had already seen (``202`` to a create): the same job, no new work and no new charge.

    ``priority`` is 1 to 5 (higher starts sooner). ``waiting`` is only in ``jobs.get``'s answer (None in a
    list's or a create's): None, or why a job that has not sent its paid call yet waits,
    ``{"reason": "client_limit" | "turn" | "provider_limit", "message": ..., "limit"?, "running"?,
    "in_flight"?}``."""

    id: str
    kind: str
    status: str
    run: int
    idempotency_key: Optional[str]
    models: List[str]
    input: Dict[str, Any]
    policy: Dict[str, Any]
    output_key: Optional[str]
    webhook_url: Optional[str]
    metadata: Dict[str, Any]
    output: Optional[Dict[str, Any]]
    error: Optional[Dict[str, Any]]
    attempts: List[Attempt]
    cost: Cost
    created_at: Optional[datetime]
    started_at: Optional[datetime]
    completed_at: Optional[datetime]
    chapters: Optional[List[Chapter]] = None
    priority: int = 3
    waiting: Optional[Dict[str, Any]] = None
    replayed: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ended(self) -> bool:
        """Whether the job has ended (succeeded, failed or cancelled)."""
        return self.status in TERMINAL_STATUSES

    @classmethod
    def from_dict(cls, data: Dict[str, Any], *, replayed: bool = False) -> Job:
        chapters = data.get("chapters")
        return cls(
            id=str(data["id"]), kind=data.get("kind", ""), status=data.get("status", ""),
            run=int(data.get("run") or 0), idempotency_key=data.get("idempotency_key"),
            models=list(data.get("models") or []), input=data.get("input") or {}, policy=data.get("policy") or {},
            output_key=data.get("output_key"), webhook_url=data.get("webhook_url"),
            metadata=data.get("metadata") or {}, output=data.get("output"), error=data.get("error"),
            attempts=[Attempt.from_dict(a) for a in data.get("attempts") or []],
            cost=Cost.from_dict(data.get("cost")), created_at=timestamp(data.get("created_at")),
            started_at=timestamp(data.get("started_at")), completed_at=timestamp(data.get("completed_at")),
            chapters=[Chapter.from_dict(c) for c in chapters] if chapters is not None else None,
            priority=int(data.get("priority", 3)), waiting=data.get("waiting"),
            replayed=replayed, raw=dict(data),
        )


@dataclass
class OrderJob:
    """An order's report job, as the order shows it: its status and cost."""

    status: str
    cost: Cost
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> OrderJob:
        return cls(status=data.get("status", ""), cost=Cost.from_dict(data.get("cost")), raw=dict(data))


@dataclass
class Order:
    """A paid order: one payment, one report job. ``status`` is ``"paid"``, or ``"duplicate"`` for a second
    payment of the same run and product (no new job; ``duplicate_of`` names the paid order). ``replayed``
    is True when payonce answered ``200``: the same payment again, the same order."""

    id: str
    status: str
    job_id: Optional[str]
    duplicate_of: Optional[str]
    payment_id: str
    run_id: str
    product: str
    created_at: Optional[datetime]
    job: Optional[OrderJob] = None
    replayed: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: Dict[str, Any], *, replayed: bool = False) -> Order:
        job = data.get("job")
        return cls(id=str(data["id"]), status=data.get("status", ""), job_id=data.get("job_id"),
                   duplicate_of=data.get("duplicate_of"), payment_id=data.get("payment_id", ""),
                   run_id=data.get("run_id", ""), product=data.get("product", ""),
                   created_at=timestamp(data.get("created_at")),
                   job=OrderJob.from_dict(job) if isinstance(job, dict) else None, replayed=replayed,
                   raw=dict(data))


@dataclass
class SpendByModel:
    model: str
    spent_usd: Decimal
    attempts: int
    unpriced_attempts: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> SpendByModel:
        return cls(model=data.get("model", ""), spent_usd=amount(data.get("spent_usd")),
                   attempts=int(data.get("attempts") or 0),
                   unpriced_attempts=int(data.get("unpriced_attempts") or 0), raw=dict(data))


@dataclass
class Spend:
    """One UTC month of a client's money against its cap, as payonce's budget guard keeps it."""

    month: str
    resets_at: Optional[datetime]
    cap_usd: Decimal
    spent_usd: Decimal
    reserved_usd: Decimal
    headroom_usd: Decimal
    unpriced_attempts: int
    by_model: List[SpendByModel]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> Spend:
        return cls(month=data.get("month", ""), resets_at=timestamp(data.get("resets_at")),
                   cap_usd=amount(data.get("cap_usd")), spent_usd=amount(data.get("spent_usd")),
                   reserved_usd=amount(data.get("reserved_usd")),
                   headroom_usd=amount(data.get("headroom_usd")),
                   unpriced_attempts=int(data.get("unpriced_attempts") or 0),
                   by_model=[SpendByModel.from_dict(m) for m in data.get("by_model") or []], raw=dict(data))


@dataclass
class WhoAmI:
    client_id: str
    name: str
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> WhoAmI:
        return cls(client_id=str(data.get("client_id", "")), name=data.get("name", ""), raw=dict(data))


@dataclass
class ReportText:
    key: str
    text: str


@dataclass
class Report:
    """A sealed report as JSON: its chapters' text in order, and the figures it was written from."""

    job_id: str
    sealed_at: Optional[datetime]
    figures: Any
    chapters: List[ReportText]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> Report:
        return cls(job_id=str(data.get("job_id", "")), sealed_at=timestamp(data.get("sealed_at")),
                   figures=data.get("figures"),
                   chapters=[ReportText(c.get("key", ""), c.get("text") or "") for c in data.get("chapters") or []],
                   raw=dict(data))


@dataclass
class ReportTemplateVersionCreated:
    """A template's version just written: its ``version`` number, and whether ``live`` points at it now."""

    name: str
    version: int
    live: bool
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> ReportTemplateVersionCreated:
        return cls(name=data.get("name", ""), version=int(data.get("version") or 0), live=bool(data.get("live")),
                   raw=dict(data))


@dataclass
class ReportTemplateSummary:
    """One of your templates: the version ``live`` points at, and how many ``versions`` it has."""

    name: str
    live: int
    versions: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> ReportTemplateSummary:
        return cls(name=data.get("name", ""), live=int(data.get("live") or 0),
                   versions=int(data.get("versions") or 0), raw=dict(data))


@dataclass
class ReportTemplateChapter:
    """A template's chapter: its ``key`` (what a job's ``chapters`` names), its ``title`` and its
    ``instruction`` (a text that may print ``{{ subject.<field> }}``)."""

    key: str
    title: str
    instruction: str
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> ReportTemplateChapter:
        return cls(key=data.get("key", ""), title=data.get("title", ""), instruction=data.get("instruction", ""),
                   raw=dict(data))


@dataclass
class ReportTemplateLayout:
    """How a template's report reads: its ``title`` (the ``#`` heading), each chapter's ``chapter_heading``,
    the ``closing`` Markdown and whether the ``figures`` line is shown (None: not written, the default)."""

    title: str
    chapter_heading: str
    closing: Optional[str] = None
    figures: Optional[bool] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> ReportTemplateLayout:
        return cls(title=data.get("title", ""), chapter_heading=data.get("chapter_heading", ""),
                   closing=data.get("closing"), figures=data.get("figures"), raw=dict(data))


@dataclass
class ReportTemplateMail:
    """A template's delivery mail: its ``subject`` and text ``body`` (which may print ``{{ link }}``)."""

    subject: str
    body: str
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> ReportTemplateMail:
        return cls(subject=data.get("subject", ""), body=data.get("body", ""), raw=dict(data))


@dataclass
class ReportTemplateVersion:
    """One version of a template, as it was written, with its ``version`` number, whether ``live`` points at
    it and when it was written. A field the version was written without is None (payonce's default)."""

    name: str
    version: int
    live: bool
    created_at: Optional[datetime]
    system: str
    synthesis: Optional[str]
    chapters: List[ReportTemplateChapter]
    max_output_tokens: Optional[int] = None
    layout: Optional[ReportTemplateLayout] = None
    mail: Optional[ReportTemplateMail] = None
    page_title: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> ReportTemplateVersion:
        layout, mail, tokens = data.get("layout"), data.get("mail"), data.get("max_output_tokens")
        return cls(name=data.get("name", ""), version=int(data.get("version") or 0), live=bool(data.get("live")),
                   created_at=timestamp(data.get("created_at")), system=data.get("system", ""),
                   synthesis=data.get("synthesis"),
                   chapters=[ReportTemplateChapter.from_dict(c) for c in data.get("chapters") or []],
                   max_output_tokens=int(tokens) if tokens is not None else None,
                   layout=ReportTemplateLayout.from_dict(layout) if isinstance(layout, dict) else None,
                   mail=ReportTemplateMail.from_dict(mail) if isinstance(mail, dict) else None,
                   page_title=data.get("page_title"), raw=dict(data))


@dataclass
class ReportTemplateLive:
    """Where a template's ``live`` label points now: the version orders for its name are written from."""

    name: str
    live: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> ReportTemplateLive:
        return cls(name=data.get("name", ""), live=int(data.get("live") or 0), raw=dict(data))


@dataclass
class Event:
    """One server-sent event of a job's progress. ``event`` is ``"message"`` for a progress frame (``data``
    is the snapshot: status, run, steps, cost, and for a report ``chapters: {done, total}``) and ``"end"``
    for the last one (``data`` is ``{"status"}``). ``id`` is the frame's id (None on ``end``, which has
    none): the stream resumes after it."""

    id: Optional[str]
    event: str
    data: Dict[str, Any]

    @property
    def status(self) -> Optional[str]:
        return self.data.get("status") if isinstance(self.data, dict) else None

    @classmethod
    def from_fields(cls, id: Optional[str], event: str, data: str) -> Event:
        try:
            parsed = json.loads(data)
        except ValueError:
            parsed = None
        return cls(id=id, event=event or "message", data=parsed if isinstance(parsed, dict) else {"raw": data})
