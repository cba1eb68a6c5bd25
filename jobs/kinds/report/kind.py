"""The report kind, declared (jobs.engine.workflow.Kind): its input, its answer, its text, what a retry may reserve,
and its section of the operators' job page. Its recipe is jobs.kinds.report.recipe; its state changes
jobs.kinds.report.reports."""

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from types import SimpleNamespace

from django.conf import settings
from django.db.models import Case, Count, F, JSONField, OuterRef, Subquery, When
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Coalesce
from django.utils import timezone
from rest_framework import serializers

from executor.models import ModelKind
from jobs.api.serializers import METADATA_MAX_BYTES, StrictCharField, StrictIntegerField, StrictSerializer
from jobs.engine.workflow import Kind
from jobs.kinds.report import reports, templates
from jobs.kinds.report.recipe import RECIPE
from jobs.models import ChapterStatus, Job, Report, ReportChapter

# --- the input -----------------------------------------------------------------------------------------------

# The whole key (\A...\Z: `$` would also match before a final newline), ASCII only.
CHAPTER_KEY = re.compile(r"\A[a-z0-9][a-z0-9-]{0,63}\Z", re.ASCII)



class TemplateRefSerializer(StrictSerializer):
    """Which template a report is written from: a name of the client's, and a version number or a label
    (only `live`, the default)."""

    name = StrictCharField(max_length=64, trim_whitespace=False)
    version = StrictIntegerField(min_value=1, required=False)
    label = serializers.ChoiceField(choices=[templates.LIVE], required=False)

    def validate(self, attrs):
        if "version" in attrs and "label" in attrs:
            raise serializers.ValidationError("Give a version or a label, not both.")
        return attrs


class ReportInputSerializer(StrictSerializer):
    """A report's input: the subject it is written about (personal: purged after the retention period),
    its chapters (slugs, in order, each once), where the link goes, and the template it is written from
    (none: the built-in default, whose chapters are any keys). Its validated_data is what is stored: a
    chapter key is taken exactly as sent (not trimmed: " sun" or "sun\n" is not a slug and is refused,
    rather than checked trimmed and stored raw), the email trimmed as DRF's EmailField does."""

    subject = serializers.DictField()
    chapters = serializers.ListField(child=StrictCharField(max_length=64, trim_whitespace=False), min_length=1,
                                     required=False)
    email = serializers.EmailField(max_length=254)
    template = TemplateRefSerializer(required=False)

    def validate_subject(self, value):
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
        if not value:
            raise serializers.ValidationError("The subject is empty.")
        if size > METADATA_MAX_BYTES:
            raise serializers.ValidationError(f"At most {METADATA_MAX_BYTES} bytes of JSON ({size} given).")
        return value

    def validate_chapters(self, value):
        if len(value) > settings.REPORT_MAX_CHAPTERS:
            raise serializers.ValidationError(f"At most {settings.REPORT_MAX_CHAPTERS} chapters.")
        bad = [repr(key) for key in value if not CHAPTER_KEY.match(key)]
        if bad:
            raise serializers.ValidationError(f"Chapter keys are slugs (a-z, 0-9, '-'): {', '.join(bad[:5])}.")
        if len(set(value)) != len(value):
            raise serializers.ValidationError("Each chapter key once.")
        return value


def report_input(data, *, client_id) -> tuple[dict, dict]:
    """A report's input checked, and its template pinned: (errors, the input to store). With a template,
    its version is resolved now (a number given, or where `live` points now) and written into the input
    ({"name", "version"}): every run, retry and resume of the job is written from that version, whatever
    is edited later. Its chapters are the template's (all, or those named, in the template's order), and
    every text of it is rendered for the subject once, here: a variable the subject lacks is refused
    naming it, before anything is stored or paid. Another client's template is no template of this one."""
    checked = ReportInputSerializer(data=data)
    if not checked.is_valid():
        return dict(checked.errors), {}
    cleaned = dict(checked.validated_data)
    ref = cleaned.get("template")
    if ref is None:
        if "chapters" not in cleaned:  # the built-in template has no chapters of its own
            return {"chapters": ["This field is required (or name a `template`)."]}, {}
        version = templates.DEFAULT
    else:
        row = templates.version_row(client_id=client_id, name=ref["name"], number=ref.get("version"))
        if row is None:
            return {"template": [f"You have no report template {ref['name']!r}"
                                 + (f" with a version {ref['version']}." if "version" in ref else ".")]}, {}
        version = templates.version_of(row.id)
        cleaned["template"] = {"name": version.name, "version": version.number}
        known = version.keys()
        unknown = [key for key in cleaned.get("chapters", []) if key not in known]
        if unknown:
            return {"chapters": [f"Not chapters of {version.name} v{version.number}: {', '.join(unknown[:5])}."
                                 f" Its chapters: {', '.join(known)}."]}, {}
        chosen = set(cleaned.get("chapters") or known)
        cleaned["chapters"] = [key for key in known if key in chosen]  # in the template's order
    try:
        version.check_subject(cleaned["subject"], cleaned["chapters"])
    except templates.TemplateProblem as problem:
        return {"subject": [f"The template's {problem.field} cannot be written for this subject: {problem.message}"]}, {}
    return {}, cleaned


def accept_input(attrs: dict, *, client) -> dict:
    """The create serializer's check of a report's `input`; a report has no output key (jobs.engine.workflow.Kind)."""
    # No client (a serializer used on its own): no template but the built-in one.
    errors, cleaned = report_input(attrs["input"], client_id=client.id if client is not None else None)
    if errors:
        return {"input": errors}
    if "output_key" in attrs:
        return {"output_key": ["A report has no output key: it is read at /v1/jobs/{id}/report."]}
    attrs["input_as_sent"], attrs["input"] = attrs["input"], cleaned
    return {}


# --- the answer and the text ---------------------------------------------------------------------------------


def answer(job, attempts: list[dict]) -> dict:
    return {"chapters": report_chapters(job, attempts)}


def report_chapters(job, attempts: list[dict]) -> list[dict]:
    """A report's chapters in order, each with its attempts (every run's) and their cost (docs/api.md, "A job")."""
    by_step: dict[str, list[dict]] = {}
    for attempt in attempts:
        by_step.setdefault(attempt.get("step") or "", []).append(attempt)
    keys = job.input.get("chapters") or []
    status = dict(ReportChapter.objects.filter(report_id=job.id).values_list("key", "status"))
    chapters = []
    for key in keys:
        rows = by_step.get(f"chapter-{key}", [])
        cost = sum((Decimal(a["cost_usd"]) for a in rows if a["cost_usd"] is not None), Decimal(0))
        chapters.append({"key": key, "status": status.get(key, "pending"), "attempts": rows,
                         "cost_usd": str(cost.quantize(Decimal("0.000001")))})
    return chapters


def sealed_text(job) -> str | None:
    """A report's output is its sealed chapters (no store object): their Markdown, None until sealed."""
    report = Report.objects.filter(job_id=job.id, sealed_at__isnull=False).first()
    return reports.as_markdown(report) if report is not None else None


# --- an operator's retry ------------------------------------------------------------------------------------

# Rows read at a time while summing a bulk retry's worst case.
CHUNK = 2000


def worst_cases(jobs) -> Decimal:
    """What new runs of these reports may reserve: one call for each chapter not yet written and the
    synthesis if it was not (written ones are read back for free), read in one statement with their
    chapters left counted beside each (the match is a subquery, never a list of ids sent back)."""
    total = Decimal("0.000000")
    # One pass over the matched reports, each with its report row and its chapters left. A report that
    # failed before its first step wrote the report row (rare) has everything still to write, from the
    # job's input (read for those rows only).
    left = (ReportChapter.objects.filter(report_id=OuterRef("id")).exclude(status=ChapterStatus.DONE)
            .order_by().values("report_id").annotate(n=Count("id")).values("n"))
    rows = (jobs.order_by()
            .annotate(left=Coalesce(Subquery(left), 0), first_model=KeyTextTransform("0", "model_chain"),
                      orphan_input=Case(When(report__isnull=True, then=F("input")), output_field=JSONField()))
            .values_list("report__job_id", "report__subject", "report__chapter_keys", "report__synthesis", "left",
                         "first_model", "orphan_input", "client_id", "report__template_version_id"))
    for has_row, subject, chapter_keys, synthesis, chapters_left, model, orphan_input, client_id, version_id in rows.iterator(
            chunk_size=CHUNK):
        if has_row is None:
            orphan_input = orphan_input or {}
            subject, chapter_keys = orphan_input.get("subject"), list(orphan_input.get("chapters", []))
            chapters_left = len(chapter_keys)
            version_id = _pinned_version_id(orphan_input, client_id)
        # Only what the prompts are made of: a model instance per row would cost more than its pricing.
        report = SimpleNamespace(subject=subject, chapter_keys=chapter_keys, synthesis=synthesis,
                                 template_version_id=version_id)
        total += reports.run_worst_case(report, model, chapters_left=chapters_left, client_id=client_id)
    return total


def _pinned_version_id(data: dict, client_id) -> int | None:
    pinned = data.get("template")
    if not pinned:
        return None
    row = templates.version_row(client_id=client_id, name=pinned["name"], number=pinned["version"])
    return row.id if row is not None else None


# --- the operators' job page ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportFacts:
    """What support needs of a report job: the link its buyer gets, where the mail goes and whether it
    went, and its chapters done of total."""

    link: str  # the /r/<token> page; "" before the report's first step made its row (the page would 404)
    recipient: str  # the address its mail goes to: the order's email ("" once purged)
    purged_at: datetime | None
    mail: str  # the delivery mail's state, in words
    mail_state: str  # a css class, as Entry.state
    chapters_done: int
    chapters_total: int
    not_done: list[ReportChapter]
    # The paid order that made it, if an order did, and later payments for the same run and product (the
    # link mailed again: mailed_to). Filled in by operators.timeline: orders sit above jobs, so this
    # module cannot read them.
    order: object | None = None
    duplicates: list = field(default_factory=list)


def report_facts(job: Job) -> ReportFacts | None:
    """The report's section of the operators' job page (jobs.engine.workflow.Kind.timeline)."""
    report = Report.objects.filter(job_id=job.id).first()
    if report is None:  # the first step writes it: until then, the job's input
        data = job.input if isinstance(job.input, dict) else {}
        return ReportFacts("", str(data.get("email", "")), None,
                           "nothing mailed: the report's first step has not run", "info", 0,
                           len(data.get("chapters") or []), [])
    chapters = list(report.chapters.order_by("position"))
    mail, mail_state = _mail_state(job, report)
    return ReportFacts(reports.report_link(job.id), report.email, report.purged_at, mail, mail_state,
                       sum(1 for c in chapters if c.status == ChapterStatus.DONE), len(chapters),
                       [c for c in chapters if c.status != ChapterStatus.DONE])


def _mail_state(job: Job, report: Report) -> tuple[str, str]:
    """The deliver step's record (jobs.kinds.report.recipe.deliver): mailed when, or why not yet."""
    if report.delivered_at:
        return f"mailed {_at(report.delivered_at)}", "ok"
    if report.delivery_error:
        if job.status == "succeeded":  # the deliver step gave up at REPORT_DELIVERY_DEADLINE_S
            return f"not sent, given up: {report.delivery_error}", "bad"
        return f"not sent yet, tried again with back-off: {report.delivery_error}", "wait"
    if report.sealed_at:
        return f"sealed {_at(report.sealed_at)}, not mailed yet", "wait"
    return "not mailed: the report is not sealed (a chapter is not done)", "info"


def _at(moment: datetime) -> str:
    return f"{timezone.localtime(moment):%Y-%m-%d %H:%M:%S %Z}"


KIND = Kind(
    name="report",
    model_kinds=frozenset({ModelKind.TEXT}),
    recipe=RECIPE,
    accept_input=accept_input,
    worst_cases=worst_cases,
    answer=answer,
    text=sealed_text,
    timeline=report_facts,
)
