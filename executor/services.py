"""The executor's services for the job engine: providers, the output store, and what a media run does
around its attempts (executor.attempts). They never change a job's status (that is jobs.services)."""

import logging

from django.conf import settings

from executor.providers import provider_for
from executor.providers.base import ProviderError
from executor.registry import model_spec
from executor.store import OutputKeyTaken, StoredObject, get_store
from jobs.outcomes import JobFailure, StepRetry

logger = logging.getLogger(__name__)


def provider(spec):
    return provider_for(spec.provider)


def store():
    return get_store()


def cancel_upstream(spec, upstream_id: str) -> bool:
    """Stop upstream work where the provider can. Best effort and idempotent: a render that already
    ended, or a provider that cannot cancel, is left as it is."""
    if not spec.capabilities.cancel:
        return False
    try:
        provider(spec).cancel(spec.model, upstream_id)
    except ProviderError as exc:
        logger.info("cancel of %s on %s answered %s", upstream_id, spec.name, exc)
        return False
    return True


def output_describe(job, stored: StoredObject) -> dict:
    url = store().presigned_url(stored.key) or f"{settings.PUBLIC_BASE_URL}/v1/jobs/{job.id}/output"
    return {
        "key": stored.key,
        "url": url,
        "written_by": stored.written_by,
        "content_type": stored.content_type,
        "bytes": stored.size,
    }


def output_check(job) -> dict | None:
    """Head the output key before preparing inputs or calling a provider (DESIGN.md, section 4): this
    job's finished output means success with no provider call; another job's is a conflict."""
    existing = store().head(job.output_key)
    if existing is None:
        return None
    if existing.written_by != str(job.id):
        raise JobFailure(
            "OUTPUT_KEY_CONFLICT", f"output key {job.output_key!r} was written by another job ({existing.written_by})"
        )
    return output_describe(job, existing) if existing.complete else None


def media_store(job, finished: dict) -> dict:
    """Download the finished media and write it create-only under the job's output key, tagged with the
    job, provider, model and attempt that made it."""
    spec = model_spec(finished["model"])
    try:
        payload = provider(spec).fetch(finished["output_url"])
    except ProviderError as exc:
        raise StepRetry(f"download failed ({exc.kind}: {exc.message})") from exc
    metadata = {"written_by": str(job.id), "provider": spec.provider, "model": spec.model,
                "attempt": str(finished["attempt"])}
    try:
        stored = store().put(job.output_key, payload, content_type=spec.content_type, metadata=metadata)
    except OutputKeyTaken as exc:
        raise JobFailure("OUTPUT_KEY_CONFLICT", str(exc)) from exc
    return output_describe(job, stored)
