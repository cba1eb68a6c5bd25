"""jobs.services._insert_or_read reads its row through a plain cursor: the Job it returns, created or
replayed, is the one Job.objects.raw() made of the same statement (every attribute, its type, and the
instance's state)."""

import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from accounts.models import Client
from jobs import services
from jobs.models import Job, JobStatus
from jobs.services import client_create

pytestmark = pytest.mark.django_db


def candidate(client, key: str) -> Job:
    now, job_id = timezone.now(), uuid.uuid4()
    return Job(id=job_id, client=client, idempotency_key=key, request_hash="h" * 64, kind="media",
               status=JobStatus.QUEUED, run=1, model_chain=["sandbox/video-keyed"],
               input={"prompt": "x", "render_s": 2.5}, policy={"attempts_per_model": 3}, output_key=f"o/{job_id}",
               webhook_url="", metadata={"n": [1, None]}, priority=3, trace_context=None, created_at=now,
               updated_at=now, lease_until=now + timedelta(seconds=60))


def through_raw(job: Job) -> tuple[Job | None, bool]:
    """The statement as a raw query set reads it (what _insert_or_read did before)."""
    fields, sql = services._insert_or_read_sql()
    values = [f.get_db_prep_save(getattr(job, f.attname), connection) for f in fields]
    rows = list(Job.objects.raw(sql, [*values, job.client_id, job.idempotency_key]))
    if not rows:
        return None, False
    if rows[0].created:
        rows[0].client = job.client
    return rows[0], bool(rows[0].created)


def state(job: Job) -> dict:
    shown = {name: (type(value).__name__, value) for name, value in vars(job).items() if name != "_state"}
    return {**shown, "adding": job._state.adding, "db": job._state.db, "cached": sorted(job._state.fields_cache)}


def test_a_created_and_a_replayed_row_are_the_jobs_a_raw_query_made():
    client = Client.objects.get(id=client_create(name="acme")["client_id"])
    new = candidate(client, "k-1")
    made = []
    for read in (through_raw, services._insert_or_read):
        with transaction.atomic():
            made.append(read(new))
            transaction.set_rollback(True)
    assert made[0][1] is made[1][1] is True
    assert state(made[0][0]) == state(made[1][0])
    services._insert_or_read(new)  # now it exists: a replay reads it, with its attempts
    replays = [read(candidate(client, "k-1")) for read in (through_raw, services._insert_or_read)]
    assert replays[0][1] is replays[1][1] is False
    assert state(replays[0][0]) == state(replays[1][0])
