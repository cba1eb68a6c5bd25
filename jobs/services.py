"""State changes of jobs and clients. Every guarantee here is a constraint or a conditional update."""

import hashlib
import json
import logging
import uuid
from decimal import Decimal

from django.db import connection, transaction
from django.db.models.functions import Coalesce
from django.utils import timezone

from executor.registry import model_spec
from jobs.errors import IdempotencyConflict
from jobs.models import OPEN_STATUSES, Client, ClientAPIKey, Job, JobStatus

logger = logging.getLogger(__name__)


# --- clients -------------------------------------------------------------------------------------------


def client_create(*, name: str, webhook_url: str = "", monthly_cap_usd: Decimal | None = None) -> dict:
    """Create a client with one API key and a webhook signing secret. The key is returned only here."""
    from webhooks.services import endpoint_create

    with transaction.atomic():
        client = Client.objects.create(name=name, monthly_cap_usd=monthly_cap_usd)
        _, api_key = ClientAPIKey.objects.create_key(name=f"{name} key", client=client)
        _, webhook_secret = endpoint_create(client=client, url=webhook_url)
    return {"client_id": str(client.id), "api_key": api_key, "webhook_secret": webhook_secret}


def client_key_create(*, client: Client, name: str) -> str:
    _, api_key = ClientAPIKey.objects.create_key(name=name, client=client)
    return api_key


# --- jobs ----------------------------------------------------------------------------------------------


def request_hash(validated: dict) -> str:
    """SHA-256 of the canonical validated body: sorted keys, no insignificant whitespace."""
    canonical = json.dumps(validated, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _default_output_key(job_id: uuid.UUID, models: list[str]) -> str:
    return f"outputs/{job_id}/output.{model_spec(models[0]).extension}"


def job_create(*, client: Client, idempotency_key: str, data: dict) -> tuple[Job, bool]:
    """One key + one body = one job (DESIGN.md, section 1). Returns (job, created).

    1. INSERT ... ON CONFLICT DO NOTHING on the named constraint job_client_idempotency_key, and in the
       same statement read the existing row when nothing was inserted.
    2. If a racing request committed its row after our statement's snapshot, that statement sees
       neither row; a second SELECT (a new snapshot) reads the winner's.
    3. Same key, other body -> IdempotencyConflict. A new row is enqueued on commit, with the id of the
       row read back; a replay enqueues nothing, so it never wakes a job that has ended.
    """
    canonical = {
        "kind": data["kind"],
        "models": data["models"],
        "input": data["input"],
        "policy": data["policy"],
        "output_key": data.get("output_key"),
        "webhook_url": data.get("webhook_url"),
        "metadata": data["metadata"],
    }
    digest = request_hash(canonical)
    now = timezone.now()
    job_id = uuid.uuid4()
    candidate = Job(
        id=job_id,
        client=client,
        idempotency_key=idempotency_key,
        request_hash=digest,
        kind=data["kind"],
        status=JobStatus.QUEUED,
        run=1,
        model_chain=data["models"],
        input=data["input"],
        policy=data["policy"],
        output_key=data.get("output_key") or _default_output_key(job_id, data["models"]),
        webhook_url=data.get("webhook_url") or "",
        metadata=data["metadata"],
        created_at=now,
        updated_at=now,
    )
    job, created = _insert_or_read(candidate)
    if job is None:
        # The race of step 2: the winner committed while our INSERT waited on its key.
        job, created = Job.objects.get(client=client, idempotency_key=idempotency_key), False
    if job.request_hash != digest:
        raise IdempotencyConflict(
            "This Idempotency-Key was already used with a different request body.", job_id=str(job.id)
        )
    if created:
        job_enqueue_on_commit(job)
    return job, created


def _insert_or_read(candidate: Job) -> tuple[Job | None, bool]:
    fields = Job._meta.concrete_fields
    table = connection.ops.quote_name(Job._meta.db_table)
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    placeholders = ", ".join(["%s"] * len(fields))
    values = [f.get_db_prep_save(getattr(candidate, f.attname), connection) for f in fields]
    sql = (
        f"WITH inserted AS ("
        f" INSERT INTO {table} ({columns}) VALUES ({placeholders})"
        f" ON CONFLICT ON CONSTRAINT job_client_idempotency_key DO NOTHING RETURNING *)"
        f" SELECT inserted.*, TRUE AS created FROM inserted"
        f" UNION ALL SELECT {table}.*, FALSE FROM {table} WHERE client_id = %s AND idempotency_key = %s"
    )
    rows = list(Job.objects.raw(sql, [*values, candidate.client_id, candidate.idempotency_key]))
    if not rows:
        return None, False
    job = rows[0]
    if job.created:
        job.client = candidate.client  # spare a query: the caller already holds the client
    return job, bool(job.created)


def job_enqueue_on_commit(job: Job) -> None:
    """Start the job's run once the row is committed. A broker that is down loses nothing: the job stays
    queued in Postgres and the sweeper starts it."""
    job_id, run = job.id, job.run

    def enqueue():
        from jobs.tasks import start_run

        try:
            start_run(job_id, run)
        except Exception:  # the broker is unreachable; the row is durable
            logger.exception("could not enqueue job %s run %s; the sweeper will start it", job_id, run)

    transaction.on_commit(enqueue)


def job_mark_running(*, job_id: uuid.UUID) -> bool:
    """queued -> running. Zero rows: the job was cancelled or already running (a redelivery)."""
    now = timezone.now()
    return bool(
        Job.objects.filter(id=job_id, status=JobStatus.QUEUED).update(
            status=JobStatus.RUNNING, started_at=Coalesce("started_at", now), updated_at=now
        )
    )


def job_finish(*, job_id: uuid.UUID, status: str, output: dict | None = None, error: dict | None = None) -> bool:
    """End a job. The only function that does: first terminal state wins (DESIGN.md, "Job lifecycle").

    One conditional UPDATE on the open states; a writer that gets zero rows back lost the race (another
    writer ended the job first) and must write nothing else.
    """
    assert status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)
    now = timezone.now()
    won = Job.objects.filter(id=job_id, status__in=OPEN_STATUSES).update(
        status=status, output=output, error=error, completed_at=now, updated_at=now
    )
    return bool(won)
