"""The executor's services for the job engine: providers, the output store, and what a media run does
around its attempts (executor.render, executor.llm). They never change a job's status (that is jobs.services)."""

import errno
import logging
from datetime import datetime

from botocore.exceptions import ClientError, ParamValidationError
from django.conf import settings
from django.utils import timezone

from executor import record
from executor.models import STORED_OUTPUT, Attempt
from executor.providers import http, provider_for
from executor.providers.base import ProviderError
from executor.registry import model_spec
from executor.store import ClientStore, OutputKeyTaken, StoredObject, client_store
from jobs.engine.outcomes import JobErrorCode, JobFailure, StepRetry

logger = logging.getLogger(__name__)


def provider(spec):
    return provider_for(spec.provider)


def store(job) -> ClientStore:
    """The job's client's part of the output store: a job never sees another client's keys."""
    return client_store(job.client_id)


# What a store error means. A key the store cannot hold, a missing object, a refused permission: asking
# again changes nothing, so the job ends (UPLOAD_FAILED, or INVALID_INPUT for a reference). A network
# error, a 5xx, a full disk: asked again after a pause, for at most STORE_RETRY_WINDOW_S.
_PERMANENT_ERRNOS = {errno.ENOENT, errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM,
                     errno.EINVAL, errno.ELOOP, errno.EROFS}


def store_error_is_permanent(exc: Exception) -> bool:
    if isinstance(exc, (ValueError, ParamValidationError)):
        return True
    if isinstance(exc, OSError):
        return exc.errno in _PERMANENT_ERRNOS
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return 400 <= status < 500 and status not in (408, 429)
    return False


def _store_failed(exc: Exception, doing: str, since: datetime | None):
    """A store error as the step's outcome: the job ends at once on a permanent error, and on a transient
    one once STORE_RETRY_WINDOW_S has passed since `since`; until then the step is tried again."""
    words = f"{type(exc).__name__}: {str(exc)[:300]}"
    if store_error_is_permanent(exc):
        return JobFailure(JobErrorCode.UPLOAD_FAILED, f"The output store could not {doing}: {words}")
    if since is not None and (timezone.now() - since).total_seconds() > settings.STORE_RETRY_WINDOW_S:
        return JobFailure(JobErrorCode.UPLOAD_FAILED, f"The output store could not {doing} for "
                                           f"{settings.STORE_RETRY_WINDOW_S:g} s: {words}")
    return StepRetry(f"the output store could not {doing} ({words})")


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
    url = store(job).presigned_url(stored.key) or f"{settings.PUBLIC_BASE_URL}/v1/jobs/{job.id}/output"
    return {
        "key": stored.key,
        "url": url,
        "written_by": stored.written_by,
        "content_type": stored.content_type,
        "bytes": stored.size,
    }


def output_check(job) -> dict | None:
    """Head the output key before preparing inputs or calling a provider
    (docs/design.md, "The output key: read back before paying"): this job's finished output means success with
    no provider call; another job's is a conflict. The store is the client's own, and the key was claimed by
    this job at create (jobs.services), so a conflict here means an object left from before that claim: it
    names only a job of the same client."""
    try:
        existing = store(job).head(job.output_key)
    except Exception as exc:  # noqa: BLE001 - every store error is a decided outcome, never a stuck job
        raise _store_failed(exc, "be read before paying", job.started_at) from exc
    if existing is None:
        return None
    if existing.written_by != str(job.id):
        raise JobFailure(
            JobErrorCode.OUTPUT_KEY_CONFLICT,
            f"output key {job.output_key!r} was written by another job ({existing.written_by})",
        )
    return output_describe(job, existing) if existing.complete else None


def media_store(job, finished: dict) -> dict:
    """Download the finished media (or read the bytes a provider answered in its body from the attempt's
    row) and write it create-only under the job's output key, tagged with the job, provider, model and
    attempt that made it. The attempt's own spec says what it made (the model may have left the catalog
    since it went out)."""
    provider_name, _, model = finished["model"].partition("/")
    content_type = finished.get("content_type") or _finished_spec(job, finished).content_type  # older results
    output_url = finished["output_url"]
    if finished.get("output_on_attempt"):  # the bytes are on the attempt's row (record.output_reference)
        output_url = _output_on_attempt(job, finished)
        if output_url is None:
            return _stored_before(job)
    carried = http.data_url_payload(output_url)
    if carried is not None:  # the provider answered the bytes themselves, kept on the attempt (render)
        payload, content_type = carried
    else:
        try:
            payload = provider_for(provider_name).fetch(output_url)
        except ProviderError as exc:
            raise StepRetry(f"download failed ({exc.kind}: {exc.message})") from exc
    metadata = {"written_by": str(job.id), "provider": provider_name, "model": model,
                "attempt": str(finished["attempt"])}
    try:
        stored = store(job).put(job.output_key, payload, content_type=content_type, metadata=metadata)
    except OutputKeyTaken as exc:
        raise JobFailure(JobErrorCode.OUTPUT_KEY_CONFLICT, str(exc)) from exc
    except Exception as exc:  # noqa: BLE001 - every store error is a decided outcome, never a stuck job
        finished_at = finished.get("finished_at")
        raise _store_failed(exc, "store the output", datetime.fromisoformat(finished_at) if finished_at
                            else job.started_at) from exc
    return output_describe(job, stored)


def _finished_spec(job, finished: dict):
    made = Attempt.objects.filter(job=job, number=finished["attempt"]).only(
        "provider", "model", "step", "spec").first()
    return record.attempt_spec(made) if made is not None else model_spec(finished["model"])


# --- outputs live in the store, not the database (a synchronous provider's bytes) ------------------------


def _output_on_attempt(job, finished: dict) -> str | None:
    """The bytes a provider answered in its body, as the attempt's row keeps them (a `data:` URL). None
    when the row no longer holds them: an earlier pass of the store step stored them (media_stored)."""
    kept = Attempt.objects.filter(job_id=job.id, number=finished["attempt"]).values_list("output_url", flat=True)
    url = kept.first()
    return url if http.is_data_url(url) else None


def _stored_before(job) -> dict:
    """The attempt's bytes were cleared as stored: the store holds them, written by this job (read back as
    the output check reads it: no provider call). Not there any more: nothing is left to store them from."""
    stored = output_check(job)
    if stored is None:
        raise JobFailure(JobErrorCode.UPLOAD_FAILED, "The output's bytes were cleared from its attempt as stored, "
                                                     f"but the store holds nothing complete at {job.output_key!r}.")
    return stored


def media_stored(job, finished: dict, output: dict) -> None:
    """Once the store holds the output, the attempt's inline bytes (a synchronous provider's answer, kept
    on its row until now) give way to the stored key: megabytes an image, otherwise kept for good.
    Called in the transaction that marks the store step done (jobs.kinds.media.finish), so the row lets go of
    the bytes in the commit after which the store step never runs again; conditional on the row still
    holding them, so a second pass changes nothing (and a store step run again after that finds them in
    the store: _stored_before). An output that came by URL (or was in the store before any provider was
    called) kept nothing inline: no statement. A wait step's result written before results named the row
    (`output_url` a `data:` URL) keeps its copy: it is read as it always was."""
    if not (finished.get("output_on_attempt") or http.is_data_url(finished.get("output_url"))):
        return
    Attempt.objects.filter(job_id=job.id, number=finished["attempt"], output_url__startswith="data:").update(
        output_url=f"{STORED_OUTPUT}{output['key']}")


def reference_read(job, key: str) -> bytes:
    """The bytes of a reference naming an earlier output of the job's own client (validated at submit:
    an output of one of its own succeeded jobs). Unreadable for good: INVALID_INPUT, at once."""
    try:
        with store(job).open(key) as handle:
            return handle.read()
    except Exception as exc:  # noqa: BLE001
        if store_error_is_permanent(exc):
            raise JobFailure(JobErrorCode.INVALID_INPUT,
                             f"The reference {key!r} cannot be read: {type(exc).__name__}") from exc
        raise StepRetry(f"the reference {key!r} could not be read ({type(exc).__name__}: {str(exc)[:200]})") from exc


def attempts_purge_requests(*, job_ids) -> int:
    """Personal data purged (operators.purge): what the attempts sent goes (prompts carry the
    subject); their keys, usage, cost and outcome stay on the record."""
    purged = 0
    for attempt in Attempt.objects.filter(job_id__in=job_ids).only("id", "request"):
        kept = {"metadata": attempt.request.get("metadata"), "purged": True}
        purged += Attempt.objects.filter(id=attempt.id).update(request=kept, answer=None)
    return purged
