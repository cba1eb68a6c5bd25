"""State changes of reports (docs/design.md, "Reports and orders"): the report row and its chapters, the prompts
chapters are written from, the signed link, and the delivery mail. Every write is conditional on the state it
expects: a chapter once done is never written again, a report once sealed stays sealed."""

import copy
import hashlib
import json
import logging
from decimal import Decimal
from types import SimpleNamespace

from django.conf import settings
from django.core import signing
from django.core.exceptions import ValidationError
from django.core.mail import EmailMessage, get_connection
from django.utils.crypto import salted_hmac
from django.db import transaction
from django.utils import timezone

from executor import llm
from jobs.kinds.report import templates
from jobs.kinds.report.templates import Version
from jobs.models import OPEN_STATUSES, ChapterStatus, Job, Report, ReportChapter

logger = logging.getLogger(__name__)

LINK_SALT = "payonce.report-link"
# The built-in template's system prompt (a report that names no template is written from it).
SYSTEM_PROMPT = templates.DEFAULT.system


# --- loading and the checkpoint -------------------------------------------------------------------------


def figures_of(subject: dict) -> dict:
    """What the report keeps of its input after the personal data is purged: the figures it was written
    from, derived from the subject (a digest, the fields it had, and twelve positions from it)."""
    digest = hashlib.sha256(json.dumps(subject, sort_keys=True, ensure_ascii=False).encode()).digest()
    return {"digest": digest.hex()[:16], "fields": sorted(subject), "chart": [b * 360 // 256 for b in digest[:12]]}


def report_load(*, job) -> Report:
    """Save the input onto the report (first, so its figures survive the later purge), with the template
    version the job pinned at submit and the report's layout rendered from it (its title, headings,
    closing and mail, which read the subject: rendered now, they stay readable after the purge), and seed
    the chapter checkpoint: one row per chapter, `pending` unless an earlier run finished it."""
    data = job.input
    pinned = data.get("template")
    version_row = None
    if pinned is not None:  # pinned at submit (accept_input): a version is never deleted nor changed
        version_row = templates.version_row(client_id=job.client_id, name=pinned["name"], number=pinned["version"])
    version = templates.version_of(version_row.id if version_row is not None else None)
    report, _ = Report.objects.get_or_create(job_id=job.id, defaults={
        "subject": data["subject"], "email": data["email"], "figures": figures_of(data["subject"]),
        "chapter_keys": list(data["chapters"]), "template_version": version_row,
        "layout": layout_of(version, data["subject"], list(data["chapters"]), link=report_link(job.id)),
    })
    ReportChapter.objects.bulk_create(
        [ReportChapter(report=report, key=key, position=n) for n, key in enumerate(report.chapter_keys)],
        ignore_conflicts=True,  # report_chapter_key: the chapters an earlier run seeded stay as they are
    )
    return report


def report_of(job_id) -> Report:
    return Report.objects.get(job_id=job_id)


def chapters_left(report: Report) -> list[str]:
    return list(report.chapters.exclude(status=ChapterStatus.DONE).values_list("key", flat=True))


def done_chapter(report: Report, key: str) -> ReportChapter | None:
    return report.chapters.filter(key=key, status=ChapterStatus.DONE).first()


# --- the prompts (chained in a fixed order: the synthesis, then every chapter from it) ---------------------


def _subject_text(report: Report) -> str:
    # Compact: every byte of it is paid for as input tokens, in each call of the report, and json's
    # indented form runs in pure Python (a bulk retry's preview prices thousands of these).
    return json.dumps(report.subject or {}, sort_keys=True, ensure_ascii=False)


# A cached prefix is one client's. A provider's prompt cache is per organisation, and payonce is one
# organisation: two clients sending the same subject would share one cache entry, so the second would
# read (and its usage show: cache_read_tokens) what the first wrote, learning that someone sent that
# exact, personal, subject lately; and the first would have paid the write. So every prompt of a report
# starts, right after the system prompt, with a line only that client's requests carry: its scope tag.
# - What it is: an HMAC of the client's id under SECRET_KEY (Django's salted_hmac), 32 hex characters
#   (128 bits). Another client cannot guess it (it never sees the key, nor another's tag); the sandbox and
#   the providers see only an opaque string, never the client's id.
# - Stable: it depends on nothing but the client and the key, so every chapter of a report, in every run
#   and after every resume, sends the same prefix byte for byte, and reads the cache its earlier chapters
#   wrote. (Rotating SECRET_KEY changes every tag: each client's next chapter writes the cache once more.
#   It costs one write, never a wrong answer.)
# - Where: first in the marked block, before the subject. A cache key covers the prompt up to the
#   breakpoint (Anthropic's, the sandbox's), and OpenAI matches the longest cached prefix on its own
#   (no mark needed, from 1,024 tokens): what two clients' prompts then share is the system prompt
#   alone, far under any provider's minimum. The synthesis starts with it too, for that second reason:
#   it has no mark, but its prompt carries the same subject.
# - Fixed length: the worst case of a call counts the prompt's bytes, so it is the same for every client.
SCOPE_TAG_SALT = "payonce.report-prompt-scope"
SCOPE_TAG_CHARS = 32


def scope_tag(client_id) -> str:
    """The client's opaque prompt-cache scope (see above): stable, and unguessable by anyone else."""
    return salted_hmac(SCOPE_TAG_SALT, str(client_id), algorithm="sha256").hexdigest()[:SCOPE_TAG_CHARS]


def _scope_line(client_id) -> str:
    return f"Scope: {scope_tag(client_id)}\n\n"


def version(report: Report) -> Version:
    """The template version the report is written from (pinned at submit; the built-in default if none)."""
    return templates.version_of(report.template_version_id)


def system_prompt(report: Report) -> str:
    return version(report).system_prompt(report.subject or {})


def has_synthesis(report: Report) -> bool:
    """Whether the report's template writes a synthesis first (a template may have none)."""
    return version(report).synthesis is not None


def synthesis_messages(report: Report, *, client_id) -> list[dict]:
    instruction = version(report).synthesis_instruction(report.subject or {})
    return [{"role": "user", "content": f"{_scope_line(client_id)}Subject:\n{_subject_text(report)}\n\n{instruction}"}]


# Providers cache no prefix shorter than this (Anthropic: 1,024 tokens for most models; OpenAI: 1,024):
# below it the chapters gain nothing from waiting on a first one (jobs.kinds.report.recipe.warmup_chapter).
CACHE_MIN_TOKENS = 1024


def shared_prefix_tokens(report: Report, *, client_id) -> int:
    """About how many tokens the chapters' shared prefix is (four characters a token): whether a
    provider would cache it at all."""
    return (len(system_prompt(report)) + len(_shared_text(report, client_id=client_id))) // 4


def _shared_text(report: Report, *, client_id) -> str:
    synthesis = f"Synthesis:\n{report.synthesis}\n\n" if has_synthesis(report) else ""
    return f"{_scope_line(client_id)}Subject:\n{_subject_text(report)}\n\n{synthesis}"


def chapter_messages(report: Report, key: str, *, client_id) -> list[dict]:
    """What every chapter shares comes first, in one block marked as a cache breakpoint (with the system
    prompt before it, the provider's cached prefix): the client's scope line, the subject and the
    synthesis. The chapter's own instruction (its template's, rendered for the subject) follows it, so the
    prefix is byte for byte the same in every chapter of the report, and in every run of it (the version
    is pinned), and no other client's prompt ever has it."""
    shared = {"type": "text", "text": _shared_text(report, client_id=client_id)}
    if settings.REPORT_PROMPT_CACHE:
        shared["cache_control"] = {"type": "ephemeral"}
    instruction = version(report).chapter_instruction(key, report.subject or {})
    return [{"role": "user", "content": [shared, {"type": "text", "text": instruction}]}]


# --- what a run may cost ----------------------------------------------------------------------------------


def synthesis_worst_case(report: Report, model: str, *, client_id) -> Decimal:
    """The most the synthesis call can cost (nothing, for a template without one)."""
    if not has_synthesis(report):
        return Decimal("0.000000")
    return llm.worst_case(model, system=system_prompt(report), messages=synthesis_messages(report, client_id=client_id),
                          max_tokens=version(report).synthesis_max_tokens)


def chapter_worst_case(report: Report, model: str, *, client_id) -> Decimal:
    """The most one chapter call can cost: the prompt of the chapter with the longest instruction, with a
    synthesis at its longest (its whole max_tokens, each token as long as the longest UTF-8 character),
    whatever the synthesis said. So a report's worst case is the template's, the subject's and its
    chapters' alone: the admin's preview (which calls no model) and the pre-flight price it alike."""
    if has_synthesis(report):
        report = copy.copy(report)
        report.synthesis = "\U0010ffff" * version(report).synthesis_max_tokens
    longest = version(report).longest_chapter(report.chapter_keys, report.subject or {})
    return llm.worst_case(model, system=system_prompt(report), messages=chapter_messages(report, longest, client_id=client_id),
                          max_tokens=version(report).chapter_max_tokens)


def run_worst_case(report: Report, model: str, *, chapters_left: int, client_id) -> Decimal:
    """The most a run of this report may still reserve (and so pay), every call at its worst case: the
    synthesis if it is not written, and each chapter not written (written ones are read back for free)."""
    total = Decimal("0.000000")
    if report.synthesis is None:
        total += synthesis_worst_case(report, model, client_id=client_id)
    if chapters_left:
        total += chapter_worst_case(report, model, client_id=client_id) * chapters_left
    return total


def preview(*, version_id: int | None, subject: dict, model: str, client_id, chapters: list[str] | None = None) -> dict:
    """Every prompt a report from this version sends for `subject`, its layout and mail, and the most it may
    reserve at `model`'s rate card: computed as the pre-flight computes them (the same functions, on a
    report not yet written), without calling a model. TemplateProblem: the subject cannot fill it."""
    pinned = templates.version_of(version_id)
    keys = chapters or pinned.keys()
    pinned.check_subject(subject, keys)
    report = SimpleNamespace(job_id=None, subject=subject, chapter_keys=keys, synthesis=None,
                             template_version_id=version_id)
    synthesis = synthesis_worst_case(report, model, client_id=client_id)
    per_chapter = chapter_worst_case(report, model, client_id=client_id) if keys else Decimal("0.000000")
    shown = layout_of(pinned, subject, keys, link=f"{settings.PUBLIC_BASE_URL}/r/<token>")
    written = copy.copy(report)
    written.synthesis = "<the synthesis>"
    return {
        "system": system_prompt(report),
        "synthesis": synthesis_messages(report, client_id=client_id)[0]["content"] if has_synthesis(report) else None,
        "chapters": [{"key": key, "heading": shown["headings"][key],
                      "prompt": "".join(part["text"] for part in chapter_messages(written, key, client_id=client_id)[0]["content"])}
                     for key in keys],
        "layout": shown,
        "worst_case": {"model": model, "synthesis_usd": synthesis, "per_chapter_usd": per_chapter, "chapters": len(keys),
                       "total_usd": run_worst_case(report, model, chapters_left=len(keys), client_id=client_id)},
    }


# --- writing --------------------------------------------------------------------------------------------


def synthesis_save(*, report: Report, text: str) -> str:
    """Keep the synthesis; one already kept wins (it is reused verbatim, never rewritten)."""
    Report.objects.filter(job_id=report.job_id, synthesis__isnull=True).update(synthesis=text)
    report.refresh_from_db(fields=["synthesis"])
    return report.synthesis


def chapter_save(*, report: Report, key: str, text: str, run: int, attempt: int) -> str:
    """The chapter is done. Conditional on it not being done: a chapter once written stays byte for byte
    as it was (a late duplicate of its step changes nothing). Returns the kept text."""
    ReportChapter.objects.filter(report=report, key=key).exclude(status=ChapterStatus.DONE).update(
        status=ChapterStatus.DONE, text=text, error="", run=run, attempt=attempt, done_at=timezone.now())
    return ReportChapter.objects.get(report=report, key=key).text


def chapter_fail(*, report: Report, key: str, error: str) -> None:
    """The chapter failed this run (never a done one: a sibling's failure discards nothing)."""
    ReportChapter.objects.filter(report=report, key=key).exclude(status=ChapterStatus.DONE).update(
        status=ChapterStatus.FAILED, error=error[:2000])


def report_seal(*, report: Report) -> bool:
    """Sealed once; a late duplicate of the seal step changes nothing."""
    return bool(Report.objects.filter(job_id=report.job_id, sealed_at__isnull=True).update(sealed_at=timezone.now()))


# --- reading and the link ------------------------------------------------------------------------------


def link_token(job_id) -> str:
    return signing.dumps({"r": str(job_id)}, salt=LINK_SALT, compress=True)


def report_link(job_id) -> str:
    return f"{settings.PUBLIC_BASE_URL}/r/{link_token(job_id)}"


def report_from_token(token: str) -> Report | None:
    """The report a link names (sealed or still being written), or None: a token that is not ours,
    tampered with or expired."""
    try:
        data = signing.loads(token, salt=LINK_SALT, max_age=settings.REPORT_LINK_MAX_AGE_S)
    except signing.BadSignature:  # SignatureExpired is one
        return None
    if not isinstance(data, dict) or not isinstance(data.get("r"), str):
        return None
    try:
        return Report.objects.filter(job_id=data["r"]).first()
    except (ValueError, ValidationError):
        return None


def chapters_in_order(report: Report) -> list[ReportChapter]:
    return list(report.chapters.order_by("position"))


def layout_of(version: Version, subject: dict, keys: list[str], *, link: str) -> dict:
    """The report's layout and mail, rendered for its subject (saved on the report at its first step)."""
    mail_subject, mail_body = version.mail(subject, link=link)
    return {"title": _one_line(version.title(subject)), "page_title": _one_line(version.page(subject)),
            "figures": version.figures, "headings": {key: _one_line(version.heading(key, subject)) for key in keys},
            "closing": version.closing_text(subject), "mail_body": mail_body,
            "mail_subject": _one_line(mail_subject)}  # a header: a line break in it would be refused by the mailer


def _one_line(text: str) -> str:
    """A heading is one line: a subject's value with a line break in it (a buyer's name) cannot open a
    section of its own in the report's Markdown."""
    return " ".join(text.split())


# What a saved layout holds: the keys layout_of writes.
_LAYOUT_KEYS = frozenset(layout_of(templates.DEFAULT, {}, [], link=""))


def layout(report: Report) -> dict:
    """The rendered layout saved on the report. What it lacks (a report loaded before templates existed has
    none; a purge removed the mail) is the default's, which reads no subject field: rendered only then, not
    on every read of a report."""
    saved = report.layout or {}
    if _LAYOUT_KEYS <= saved.keys():
        return saved
    fallback = layout_of(templates.DEFAULT, {}, list(report.chapter_keys), link=report_link(report.job_id))
    return {**fallback, **saved}


def as_markdown(report: Report) -> str:
    """The sealed report: the layout's title as a `#` heading (and the figures line, where the layout has
    it), each chapter under its heading, then the closing."""
    shown = layout(report)
    figures = f"\n_Figures: {', '.join(str(n) for n in report.figures.get('chart', []))}_\n" if shown["figures"] else ""
    parts = [f"# {shown['title']}\n{figures}"]
    for chapter in chapters_in_order(report):
        parts.append(f"## {shown['headings'].get(chapter.key, chapter.key)}\n\n{chapter.text}\n")
    if shown.get("closing"):
        parts.append(f"{shown['closing']}\n")
    return "\n".join(parts)


# --- delivery --------------------------------------------------------------------------------------------


def report_mail_link(*, job_id, to: str, subject: str | None = None) -> None:
    """Send the report's link to `to` through EMAIL_URL's backend (raises if the mail server cannot take it):
    the template's mail, rendered when the report was loaded (the default's while it is not: a duplicate
    order's mail may go before the first report's first step); `subject` replaces its subject line."""
    report = Report.objects.filter(job_id=job_id).first()
    shown = layout(report) if report is not None else layout_of(templates.DEFAULT, {}, [], link=report_link(job_id))
    with get_connection(fail_silently=False, timeout=settings.EMAIL_TIMEOUT) as mailer:
        EmailMessage(subject or shown["mail_subject"], shown["mail_body"], settings.DEFAULT_FROM_EMAIL, [to],
                     connection=mailer).send()


def report_mark_delivered(*, report: Report) -> bool:
    with transaction.atomic():
        return bool(Report.objects.filter(job_id=report.job_id, delivered_at__isnull=True).update(
            delivered_at=timezone.now(), delivery_error=""))


def report_delivery_failed(*, report: Report, error: str) -> None:
    Report.objects.filter(job_id=report.job_id).update(delivery_error=error[:2000])


# --- personal data -----------------------------------------------------------------------------------------


def reports_purgeable(*, older_than) -> list[str]:
    """The ids of the report jobs made before `older_than` that have ended and still hold personal input."""
    reports = Report.objects.filter(created_at__lt=older_than, purged_at__isnull=True).exclude(
        job__status__in=OPEN_STATUSES)
    return [str(job_id) for job_id in reports.values_list("job_id", flat=True)]


def reports_purge_input(*, job_ids) -> None:
    """The reports' part of a purge (operators.purge): the subject and the email on the report, and the
    job's input. The sealed report, its chapters and the figures saved onto it stay readable. Runs in the
    purge's transaction; each report is locked while its job's input is rewritten."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("a purge is one transaction (operators.purge)")
    for report in Report.objects.filter(job_id__in=job_ids).select_for_update():
        kept = {"chapters": report.chapter_keys, "purged": True}
        if report.template_version_id is not None:  # which version it was written from is no personal data
            pinned = version(report)
            kept["template"] = {"name": pinned.name, "version": pinned.number}
        Job.objects.filter(id=report.job_id).update(input=kept)
        if report.layout:  # the mail, rendered for the buyer, goes; what the page shows stays with the chapters
            Report.objects.filter(job_id=report.job_id).update(layout={
                key: value for key, value in report.layout.items() if key not in ("mail_subject", "mail_body")})
    Report.objects.filter(job_id__in=job_ids).update(subject=None, email="", purged_at=timezone.now())
