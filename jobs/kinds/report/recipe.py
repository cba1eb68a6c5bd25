"""The report kind's recipe (docs/design.md, "Reports and orders"): mark running, load the input,
synthesis, the budget pre-flight | one step per chapter, in parallel | seal | deliver, finish. Its state
changes are jobs.kinds.report.reports'."""

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from billing import services as billing
from executor import llm
from jobs import services
from jobs.engine.outcomes import JobErrorCode, JobFailure, StepRetry
from jobs.engine.workflow import Effect, FanOutSpec, Recipe, Stage, StepSpec
from jobs.kinds.common import mark_running
from jobs.kinds.report import reports
from jobs.models import JobStatus


def _model(ctx) -> str:
    return ctx.job.model_chain[0]


def _pool(ctx) -> str:
    return f"fanout-{ctx.job.id}-{ctx.run}"


def load_report(ctx) -> dict:
    report = reports.report_load(job=ctx.job)
    return {"chapters": report.chapter_keys}


def synthesis(ctx) -> dict:
    """Every chapter reads it; never delivered. Written once: a resumed report and a person's retry
    (a new run) reuse it verbatim."""
    report = reports.report_of(ctx.job.id)
    if not reports.has_synthesis(report):  # the template writes none: the chapters read the subject alone
        return {"synthesis": False}
    if report.synthesis is None:
        answer = llm.llm_call(ctx.job, step="synthesis", model_name=_model(ctx), system=reports.system_prompt(report),
                              messages=reports.synthesis_messages(report, client_id=ctx.job.client_id),
                              max_tokens=reports.version(report).synthesis_max_tokens)
        if not answer["text"].strip():
            raise JobFailure(JobErrorCode.CHAPTER_FAILED, "The synthesis came back empty.", chapters=["synthesis"])
        reports.synthesis_save(report=report, text=answer["text"])
    return {"synthesis": True}


def preflight(ctx) -> dict:
    """Before the chapters start: one reservation of chapters remaining x the most one can cost. Refused:
    no chapter starts, and no provider is called (the parallel chapters cannot all pass the check)."""
    report = reports.report_of(ctx.job.id)
    left = reports.chapters_left(report)
    if left and not billing.fanout_reserve(client_id=ctx.job.client_id, job_id=ctx.job.id, key=_pool(ctx),
                                           units=len(left), guard=ctx.job.NOT_CANCELLED_SQL, model=_model(ctx),
                                           unit_worst_case=reports.chapter_worst_case(
                                               report, _model(ctx), client_id=ctx.job.client_id)):
        raise JobFailure(JobErrorCode.BUDGET_EXCEEDED, f"The worst case of {len(left)} chapters does not fit under "
                                                       "this month's budget; no chapter was started.", chapters=left)
    return {"chapters_left": left}


def chapter_keys(ctx) -> list[str]:
    return list(ctx.job.input["chapters"])


def warmup_chapter(ctx, pending: list[str]) -> str | None:
    """The chapter that goes out alone first, so that its call writes the prompt cache every other chapter
    then reads (REPORT_CACHE_WARMUP): the first one still to write. None (all at once) when caching or the
    warm-up is off, when fewer than two chapters are left to pay for (nothing would read the cache), or
    when the shared prefix is too short for a provider to cache (waiting would buy nothing)."""
    if not (settings.REPORT_PROMPT_CACHE and settings.REPORT_CACHE_WARMUP):
        return None
    report = reports.report_of(ctx.job.id)
    if reports.shared_prefix_tokens(report, client_id=ctx.job.client_id) < reports.CACHE_MIN_TOKENS:
        return None
    left = reports.chapters_left(report)
    to_write = [key for key in pending if key in left]
    return to_write[0] if len(to_write) >= 2 else None


def write_chapter(ctx, key: str) -> dict:
    """One chapter: a done one (from any run) is read back, never paid for again; a missing one is one
    LLM call drawn from the pre-flight's pool. An empty answer fails the chapter (it is not done)."""
    report = reports.report_of(ctx.job.id)
    kept = reports.done_chapter(report, key)
    if kept is not None:
        return {"key": key, "kept": True}
    try:
        answer = llm.llm_call(ctx.job, step=f"chapter-{key}", model_name=_model(ctx), system=reports.system_prompt(report),
                              messages=reports.chapter_messages(report, key, client_id=ctx.job.client_id),
                              max_tokens=reports.version(report).chapter_max_tokens, pool=_pool(ctx))
    except JobFailure as failure:
        reports.chapter_fail(report=report, key=key, error=f"{failure.code}: {failure.message}")
        raise
    if not answer["text"].strip():
        reports.chapter_fail(report=report, key=key, error="the answer was empty")
        raise JobFailure(JobErrorCode.CHAPTER_FAILED, f"Chapter {key} came back empty.", chapters=[key])
    reports.chapter_save(report=report, key=key, text=answer["text"], run=ctx.run, attempt=answer["attempt"])
    return {"key": key, "kept": False, "attempt": answer["attempt"]}


def seal(ctx) -> dict:
    """Seal only when every chapter is done. Either way what the pool did not draw goes back (committed
    here: the verdict, in the next step, may fail the run)."""
    billing.fanout_release(key=_pool(ctx))
    report = reports.report_of(ctx.job.id)
    left = reports.chapters_left(report)
    if not left:
        reports.report_seal(report=report)
    return {"sealed": not left, "missing": left}


def verdict(ctx) -> dict:
    """A report with a chapter missing fails, naming the chapters (a person's retry writes only those)."""
    missing = ctx.result("seal")["missing"]
    if missing:
        raise JobFailure(JobErrorCode.CHAPTER_FAILED, f"Chapters not written: {', '.join(missing)}.", chapters=missing)
    return {"sealed": True}


def deliver(ctx) -> dict:
    """The emailed link, in its own step: a mail outage cannot fail a sealed report. Tried again with
    back-off until REPORT_DELIVERY_DEADLINE_S after the seal, then given up (on the record). A delivered
    report is not mailed again: the step is done, and the report says so."""
    report = reports.report_of(ctx.job.id)
    if report.delivered_at is not None:
        return {"delivered": True}
    try:
        reports.report_mail_link(job_id=report.job_id, to=report.email)
    except Exception as exc:  # noqa: BLE001 - every mail failure is one the next try may not have
        words = f"{type(exc).__name__}: {exc}"[:500]
        reports.report_delivery_failed(report=report, error=words)
        if timezone.now() - report.sealed_at > timedelta(seconds=settings.REPORT_DELIVERY_DEADLINE_S):
            return {"delivered": False, "error": words}
        raise StepRetry(f"the mail could not be sent ({words})") from exc
    reports.report_mark_delivered(report=report)
    return {"delivered": True}


def finish_report(ctx) -> dict:
    report = reports.report_of(ctx.job.id)
    output = {"report": f"{settings.PUBLIC_BASE_URL}/v1/jobs/{ctx.job.id}/report", "link": reports.report_link(report.job_id),
              "delivered": ctx.result("deliver", {}).get("delivered", False)}
    return {"won": services.job_finish(job_id=ctx.job.id, status=JobStatus.SUCCEEDED, output=output)}


RECIPE = Recipe(
    stages=(
        Stage("prepare", (
            StepSpec("mark_running", mark_running, Effect.DB),
            StepSpec("load", load_report, Effect.DB),
            StepSpec("synthesis", synthesis, Effect.EXTERNAL),
            StepSpec("preflight", preflight, Effect.DB),
        )),
        Stage("chapters", fanout=FanOutSpec("chapter", keys=chapter_keys, fn=write_chapter, lead=warmup_chapter)),
        Stage("seal", (StepSpec("seal", seal, Effect.DB),)),
        Stage("deliver", (
            StepSpec("verdict", verdict, Effect.DB),
            StepSpec("deliver", deliver, Effect.EXTERNAL),
            StepSpec("finish", finish_report, Effect.DB),
        )),
    ),
)
