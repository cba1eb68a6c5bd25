"""State changes of reports (docs/design.md, "Reports and orders"): the report row and its chapters, the prompts
chapters are written from, the signed link, and the delivery mail. Every write is conditional on the state it
expects: a chapter once done is never written again, a report once sealed stays sealed."""

import copy
import hashlib
import json
import logging
from decimal import Decimal

from django.conf import settings
from django.core import signing
from django.core.exceptions import ValidationError
from django.core.mail import EmailMessage, get_connection
from django.utils.crypto import salted_hmac
from django.db import transaction
from django.utils import timezone

from executor import llm
from jobs.models import OPEN_STATUSES, ChapterStatus, Job, Report, ReportChapter

logger = logging.getLogger(__name__)

LINK_SALT = "payonce.report-link"
SYSTEM_PROMPT = (
    "You write one part of a long personal report. Write in Markdown, plainly and warmly, to the person "
    "the subject describes. Never invent facts the subject does not give."
)


# --- loading and the checkpoint -------------------------------------------------------------------------


def figures_of(subject: dict) -> dict:
    """What the report keeps of its input after the personal data is purged: the figures it was written
    from, derived from the subject (a digest, the fields it had, and twelve positions from it)."""
    digest = hashlib.sha256(json.dumps(subject, sort_keys=True, ensure_ascii=False).encode()).digest()
    return {"digest": digest.hex()[:16], "fields": sorted(subject), "chart": [b * 360 // 256 for b in digest[:12]]}


def report_load(*, job) -> Report:
    """Save the input onto the report (first, so its figures survive the later purge) and seed the
    chapter checkpoint: one row per chapter, `pending` unless an earlier run finished it."""
    data = job.input
    report, _ = Report.objects.get_or_create(job_id=job.id, defaults={
        "subject": data["subject"], "email": data["email"], "figures": figures_of(data["subject"]),
        "chapter_keys": list(data["chapters"]),
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


def synthesis_messages(report: Report, *, client_id) -> list[dict]:
    return [{"role": "user", "content": f"{_scope_line(client_id)}Subject:\n{_subject_text(report)}\n\nWrite the "
                                        "synthesis: the few paragraphs every chapter of the report builds on."}]


# Providers cache no prefix shorter than this (Anthropic: 1,024 tokens for most models; OpenAI: 1,024):
# below it the chapters gain nothing from waiting on a first one (jobs.kinds.report.recipe.warmup_chapter).
CACHE_MIN_TOKENS = 1024


def shared_prefix_tokens(report: Report, *, client_id) -> int:
    """About how many tokens the chapters' shared prefix is (four characters a token): whether a
    provider would cache it at all."""
    return (len(SYSTEM_PROMPT) + len(chapter_messages(report, "", client_id=client_id)[0]["content"][0]["text"])) // 4


def chapter_messages(report: Report, key: str, *, client_id) -> list[dict]:
    """What every chapter shares comes first, in one block marked as a cache breakpoint (with the system
    prompt before it, the provider's cached prefix): the client's scope line, the subject and the
    synthesis. The chapter's own instruction follows it, so the prefix is byte for byte the same in every
    chapter of the report, and in every run of it, and no other client's prompt ever has it."""
    shared = {"type": "text", "text": f"{_scope_line(client_id)}Subject:\n{_subject_text(report)}\n\n"
                                      f"Synthesis:\n{report.synthesis}\n\n"}
    if settings.REPORT_PROMPT_CACHE:
        shared["cache_control"] = {"type": "ephemeral"}
    return [{"role": "user", "content": [shared, {"type": "text", "text": f"Write the chapter \"{key}\" of the report."}]}]


# --- what a run may cost ----------------------------------------------------------------------------------


def synthesis_worst_case(report: Report, model: str, *, client_id) -> Decimal:
    """The most the synthesis call can cost."""
    return llm.worst_case(model, system=SYSTEM_PROMPT, messages=synthesis_messages(report, client_id=client_id),
                          max_tokens=settings.REPORT_SYNTHESIS_MAX_TOKENS)


def chapter_worst_case(report: Report, model: str, *, client_id) -> Decimal:
    """The most one chapter call can cost: the prompt of the chapter with the longest key."""
    longest = max(report.chapter_keys, key=len)
    return llm.worst_case(model, system=SYSTEM_PROMPT, messages=chapter_messages(report, longest, client_id=client_id),
                          max_tokens=settings.REPORT_CHAPTER_MAX_TOKENS)


def run_worst_case(report: Report, model: str, *, chapters_left: int, client_id) -> Decimal:
    """The most a run of this report may still reserve (and so pay), every call at its worst case: the
    synthesis if it is not written, and each chapter not written (written ones are read back for free).
    The chapters of a synthesis not written yet read one bounded by its whole max_tokens, each token as
    long as the longest UTF-8 character."""
    total = Decimal("0.000000")
    if report.synthesis is None:
        total += synthesis_worst_case(report, model, client_id=client_id)
        report = copy.copy(report)
        report.synthesis = "\U0010ffff" * settings.REPORT_SYNTHESIS_MAX_TOKENS
    if chapters_left:
        total += chapter_worst_case(report, model, client_id=client_id) * chapters_left
    return total


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


def as_markdown(report: Report) -> str:
    parts = [f"# Your report\n\n_Figures: {', '.join(str(n) for n in report.figures.get('chart', []))}_\n"]
    for chapter in chapters_in_order(report):
        parts.append(f"## {chapter.key.replace('-', ' ').capitalize()}\n\n{chapter.text}\n")
    return "\n".join(parts)


# --- delivery --------------------------------------------------------------------------------------------


def report_mail_link(*, job_id, to: str, subject: str = "Your report is ready") -> None:
    """Send the report's link to `to` through EMAIL_URL's backend (raises if the mail server cannot take it)."""
    body = (f"Your report is ready. Read it here:\n\n{report_link(job_id)}\n\n"
            f"The link works for {settings.REPORT_LINK_MAX_AGE_S // 86400} days.\n")
    with get_connection(fail_silently=False, timeout=settings.EMAIL_TIMEOUT) as mailer:
        EmailMessage(subject, body, settings.DEFAULT_FROM_EMAIL, [to], connection=mailer).send()


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
        Job.objects.filter(id=report.job_id).update(input={"chapters": report.chapter_keys, "purged": True})
    Report.objects.filter(job_id__in=job_ids).update(subject=None, email="", purged_at=timezone.now())
