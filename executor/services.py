"""The executor: it talks to providers and the output store. The job engine calls these functions; they
never change a job's status themselves (that is jobs.services)."""

import logging
import time

from django.conf import settings

from executor.providers import provider_for
from executor.providers.base import ErrorClass, ProviderError
from executor.registry import model_spec
from executor.store import OutputKeyTaken, StoredObject, get_store
from jobs.outcomes import JobFailure, StepRetry

logger = logging.getLogger(__name__)


_CODE_FOR_CLASS = {
    ErrorClass.AUTH: "PROVIDER_AUTH",
    ErrorClass.INVALID_INPUT: "INVALID_INPUT",
    ErrorClass.REFUSED: "PROVIDER_REFUSED",
}


def upstream_key(job, number: int) -> str:
    """One key per decision to pay (seed 002): derived from the durable record, never random."""
    return f"payonce-{job.id}-{number}"


def output_describe(job, stored: StoredObject) -> dict:
    url = get_store().presigned_url(stored.key) or f"{settings.PUBLIC_BASE_URL}/v1/jobs/{job.id}/output"
    return {
        "key": stored.key,
        "url": url,
        "written_by": stored.written_by,
        "content_type": stored.content_type,
        "bytes": stored.size,
    }


def output_check(job) -> dict | None:
    """Head the output key before preparing inputs or calling a provider (DESIGN.md, section 4)."""
    existing = get_store().head(job.output_key)
    if existing is None:
        return None
    if existing.written_by != str(job.id):
        raise JobFailure(
            "OUTPUT_KEY_CONFLICT", f"output key {job.output_key!r} was written by another job ({existing.written_by})"
        )
    return output_describe(job, existing) if existing.complete else None


def media_submit(job, *, number: int = 1) -> dict:
    """Submit the job's render to its primary model under the attempt's upstream key."""
    spec = model_spec(job.model_chain[0])
    key = upstream_key(job, number)
    params = {name: value for name, value in job.input.items() if name != "prompt"}
    metadata = {"payonce_job": str(job.id), "payonce_attempt": number, "upstream_key": key}
    try:
        submission = provider_for(spec.provider).submit(
            spec.model, upstream_key=key, prompt=job.input["prompt"], params=params, metadata=metadata
        )
    except ProviderError as exc:
        if exc.outcome_unknown:
            # The provider may have accepted it: the same key goes out again after a pause.
            raise StepRetry(f"submit outcome unknown ({exc.kind}: {exc.message})") from exc
        raise JobFailure(_CODE_FOR_CLASS.get(exc.kind, "ATTEMPTS_EXHAUSTED"), exc.message) from exc
    return {"model": spec.name, "upstream_id": submission.upstream_id, "upstream_key": key,
            "submitted_at": time.time(), "status": submission.status, "output_url": submission.output_url}


def media_poll(job, submitted: dict) -> dict | None:
    """Ask the provider about the render. None while it runs; its result once it succeeded. A render
    the provider reported finished in its answer to the submit needs no poll."""
    if submitted.get("status") == "succeeded" and submitted.get("output_url"):
        return {"status": "succeeded", "output_url": submitted["output_url"]}
    spec = model_spec(submitted["model"])
    try:
        result = provider_for(spec.provider).poll(spec.model, submitted["upstream_id"])
    except ProviderError as exc:
        raise StepRetry(f"poll failed ({exc.kind}: {exc.message})", countdown=settings.POLL_INTERVAL_S) from exc
    if result.status == "running":
        if time.time() - submitted["submitted_at"] > settings.WAIT_DEADLINE_S:
            raise JobFailure("ATTEMPTS_EXHAUSTED", "the provider did not finish before the deadline")
        return None
    if result.status != "succeeded":
        raise JobFailure("ATTEMPTS_EXHAUSTED", result.error or f"render {result.status} upstream")
    return {"status": result.status, "output_url": result.output_url}


def media_cancel(job, submitted: dict) -> bool:
    """Cancel the upstream render of a cancelled job where the provider can. Best effort, idempotent."""
    spec = model_spec(submitted["model"])
    if not spec.capabilities.cancel:
        return False
    try:
        provider_for(spec.provider).cancel(spec.model, submitted["upstream_id"])
    except ProviderError as exc:
        logger.info("job %s: upstream cancel of %s answered %s", job.id, submitted["upstream_id"], exc)
        return False
    return True


def media_store(job, submitted: dict, finished: dict) -> dict:
    """Download the finished media and write it create-only under the job's output key."""
    spec = model_spec(submitted["model"])
    try:
        payload = provider_for(spec.provider).fetch(finished["output_url"])
    except ProviderError as exc:
        raise StepRetry(f"download failed ({exc.kind}: {exc.message})") from exc
    metadata = {"written_by": str(job.id), "provider": spec.provider, "model": spec.model,
                "attempt": submitted.get("upstream_key")}
    try:
        stored = get_store().put(job.output_key, payload, content_type=spec.content_type, metadata=metadata)
    except OutputKeyTaken as exc:
        raise JobFailure("OUTPUT_KEY_CONFLICT", str(exc)) from exc
    return output_describe(job, stored)
