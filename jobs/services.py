"""State changes of jobs and clients. Every guarantee here is a constraint or a conditional update."""

import hashlib
import json
import logging
import uuid
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from accounts import services as accounts
from accounts.models import Client
from billing import services as billing
from config import tracing
from config.logs import log_event
from config.metrics import observe_soon
from executor.callbacks import Wake
from executor.registry import model_spec
from executor.selectors import attempts_json_sql, uncertain_upstream_keys
from jobs import dispatch, selectors
from jobs.api.errors import IdempotencyConflict, OutputKeyConflict
from jobs.api.serializers import job_as_dict
from jobs.engine import chain
from jobs.engine.outcomes import JobErrorCode
from jobs.models import OPEN_STATUSES, PRIORITY_DEFAULT, Job, JobStatus, StepStatus
from webhooks import services as webhooks
from webhooks.models import WebhookEvent

logger = logging.getLogger(__name__)


# --- clients -------------------------------------------------------------------------------------------


def client_create(*, name: str, webhook_url: str = "", monthly_cap_usd: Decimal | None = None) -> dict:
    """Create a client with one API key and a webhook signing secret. The key is returned only here.

    The client and its key are the accounts app's rows, its endpoint webhooks': accounts stands below
    webhooks, so the two are joined here, above both, in one transaction."""
    with transaction.atomic():
        client, api_key = accounts.client_create(name=name, monthly_cap_usd=monthly_cap_usd)
        _, webhook_secret = webhooks.endpoint_create(client=client, url=webhook_url)
    return {"client_id": str(client.id), "api_key": api_key, "webhook_secret": webhook_secret}


# --- jobs ----------------------------------------------------------------------------------------------


def _canonical_numbers(value):
    """Numbers that are equal are the same request: 2 and 2.0 (and -0.0 and 0) hash alike."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _canonical_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_canonical_numbers(item) for item in value]
    return value


def request_hash(validated: dict) -> str:
    """SHA-256 of the canonical validated body: sorted keys, no insignificant whitespace, equal numbers
    written one way."""
    canonical = json.dumps(_canonical_numbers(validated), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


# Validated fields of POST /v1/jobs that are not hashed, each with why. Every other field is: a field added
# to the serializer is part of the Idempotency-Key's hash without an edit here, so two bodies that differ
# in it are never one job (tests/jobs/test_idempotency_hash.py changes each field in turn and expects 409).
HASH_EXCLUDED = frozenset({
    # The input as the serializer cleaned it (what is stored and run). The hash reads the input as the
    # client sent it instead, `input_as_sent`, under the key `input` (job_create says why).
    "input",
})
# Fields the hash wrote as null when the body left them out, as it did before it was derived from the
# validated fields: kept so, or a replay of a body hashed then would answer 409. A field added later
# enters the hash only when the body has it (it must then have no default: absent stays absent, as
# `policy.paid_retries`), so the hash of every body sent before it stays what it was.
HASH_NULL_WHEN_ABSENT = ("output_key", "webhook_url")


def job_request_hash(data: dict) -> str:
    """The Idempotency-Key's hash of a validated POST /v1/jobs body: every field but HASH_EXCLUDED, with
    the input as sent. For the fields of today the canonical form is the one written by hand before
    (kind, models, input as sent, policy, output_key, webhook_url, metadata: the same keys, the same
    nulls), so every stored job's hash still matches its replay."""
    canonical = {name: value for name, value in data.items() if name not in HASH_EXCLUDED}
    canonical["input"] = canonical.pop("input_as_sent", data["input"])  # a replay's is not cleaned: as sent
    for name in HASH_NULL_WHEN_ABSENT:
        canonical.setdefault(name, None)
    return request_hash(canonical)


def _default_output_key(job_id: uuid.UUID, models: list[str]) -> str:
    # A replay judged by its hash alone may name a model the catalog no longer has: its row exists, and
    # this candidate's key is never written (the INSERT does nothing on the idempotency key).
    spec = model_spec(models[0])
    return f"outputs/{job_id}/output.{spec.extension if spec else 'bin'}"


def job_create(*, client: Client, idempotency_key: str, data: dict) -> tuple[Job, bool]:
    """One key + one body = one job (docs/design.md, "One key and one body are one job"). Returns (job, created).

    1. INSERT ... ON CONFLICT DO NOTHING (the named constraint job_client_idempotency_key decides a
       replay), and in the same statement read the existing row when nothing was inserted.
    2. If a racing request committed its row after our statement's snapshot, that statement sees
       neither row; a second SELECT (a new snapshot) reads the winner's.
    3. Same key, other body -> IdempotencyConflict. A new row is enqueued on commit, with the id of the
       row read back; a replay enqueues nothing, so it never wakes a job that has ended.
    4. A new key naming an output key another of the client's jobs claimed: the INSERT does nothing on
       the named constraint job_client_output_key, and no row has the idempotency key ->
       OutputKeyConflict, before anything is paid. (ON CONFLICT DO NOTHING names no arbiter, so either
       constraint makes it do nothing, and no error aborts a caller's transaction.)
    """
    # The hash is over the input as the client sent it (`input_as_sent`, beside the cleaned `input`
    # that is stored), as it always was: a replay of a body sent before inputs were stored cleaned
    # (an email with a space around it) still hashes as its row did, so it stays a replay (202), not
    # a 409. Two bodies that differ only in what cleaning removes are two requests under one key:
    # the careful side (409), never two bodies taken for one.
    digest = job_request_hash(data)
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
        priority=data.get("priority", PRIORITY_DEFAULT),
        trace_context=tracing.current_traceparent(),  # the request's span: the run's trace starts there
        created_at=now,
        updated_at=now,
        lease_until=now + timedelta(seconds=settings.ENQUEUE_LEASE_S),
    )
    job, created = _insert_or_read(candidate)
    if job is None:
        # The race of step 2: the winner committed while our INSERT waited on its key. Or no row has
        # this idempotency key at all: then the INSERT did nothing because of job_client_output_key.
        job, created = Job.objects.filter(client=client, idempotency_key=idempotency_key).first(), False
    if job is None:
        holder = selectors.job_holding_output_key(client_id=client.id, key=candidate.output_key)
        raise OutputKeyConflict(
            "This output_key is already claimed by another of your jobs.",
            output_key=candidate.output_key, job_id=str(holder) if holder else None,
        )
    if job.request_hash != digest:
        raise IdempotencyConflict(
            "This Idempotency-Key was already used with a different request body.", job_id=str(job.id)
        )
    if created:
        job_enqueue_on_commit(job)
        log_event(logger, "job.created", job_id=job.id, run=job.run, model=job.model_chain[0], kind=job.kind,
                  client_id=client.id)
    return job, created


_INSERT_OR_READ: dict = {}  # the statement of _insert_or_read, and how its rows become jobs: built once


def _insert_or_read_sql() -> tuple[list, str]:
    """The concrete fields of a job and the statement that inserts one or reads the row of its key."""
    if "sql" not in _INSERT_OR_READ:
        fields = Job._meta.concrete_fields
        table = connection.ops.quote_name(Job._meta.db_table)
        columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
        placeholders = ", ".join(["%s"] * len(fields))
        _INSERT_OR_READ["sql"] = fields, (
            f"WITH inserted AS ("
            f" INSERT INTO {table} ({columns}) VALUES ({placeholders})"
            f" ON CONFLICT DO NOTHING RETURNING *)"
            f" SELECT inserted.*, TRUE AS created, '[]'::json AS attempt_rows FROM inserted"
            f" UNION ALL SELECT {table}.*, FALSE, {attempts_json_sql(table + '.id')}"
            f" FROM {table} WHERE client_id = %s AND idempotency_key = %s"
        )
    return _INSERT_OR_READ["sql"]


def _row_reader(columns: tuple[str, ...]):
    """How a row of these columns becomes a Job, as Django's RawQuerySet makes one (the model's fields by
    column with their converters, from_db, every other column an attribute), worked out once per set of
    columns instead of for every row of every create."""
    reader = _INSERT_OR_READ.get(columns)
    if reader is None:
        identifier = connection.introspection.identifier_converter
        by_column = {identifier(f.column): f for f in Job._meta.fields}
        init = [(f.attname, columns.index(identifier(f.column))) for f in Job._meta.fields
                if identifier(f.column) in columns]
        extra = [(column, pos) for pos, column in enumerate(columns) if column not in by_column]
        converters = []
        for pos, column in enumerate(columns):
            field = by_column.get(column)
            if field is not None:
                col = field.get_col(Job._meta.db_table)
                found = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
                if found:
                    converters.append((pos, found, col))
        reader = _INSERT_OR_READ[columns] = ([name for name, _ in init], [pos for _, pos in init], extra, converters)
    return reader


def _insert_or_read(candidate: Job) -> tuple[Job | None, bool]:
    fields, sql = _insert_or_read_sql()
    adapt = connection.ops.adapt_unknown_value  # as a raw query adapts its parameters
    params = [adapt(f.get_db_prep_save(getattr(candidate, f.attname), connection)) for f in fields]
    params += [adapt(candidate.client_id), adapt(candidate.idempotency_key)]
    # A plain cursor rather than Job.objects.raw(): the same statement and the same Job, without a raw
    # query set's machinery (its columns matched to the model's fields again for every create).
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
        if row is None:
            return None, False
        columns = tuple(identifier for identifier in map(connection.introspection.identifier_converter,
                                                         (column[0] for column in cursor.description)))
    names, positions, extra, converters = _row_reader(columns)
    row = list(row)
    for pos, found, col in converters:
        value = row[pos]
        for converter in found:
            value = converter(value, col, connection)
        row[pos] = value
    job = Job.from_db(connection.alias, names, [row[pos] for pos in positions])
    for column, pos in extra:
        setattr(job, column, row[pos])
    if job.created:
        job.client = candidate.client  # spare a query: the caller already holds the client
    return job, bool(job.created)


def job_enqueue_on_commit(job: Job) -> None:
    """Start the job's run once the row is committed. A broker that is down loses nothing: the job stays
    queued in Postgres and the sweeper starts it when its enqueue lease runs out."""
    job_id, run, kind = job.id, job.run, job.kind
    transaction.on_commit(lambda: _enqueue_safely(chain.start_created, job_id, run, kind))


def job_mark_running(*, job_id: uuid.UUID) -> bool:
    """queued -> running. Zero rows: the job was cancelled, or is already running (a resumed run)."""
    with connection.cursor() as cursor:  # plain SQL: this runs for every job (the ORM's cost shows)
        cursor.execute(
            f"UPDATE jobs_job SET status = '{JobStatus.RUNNING}', started_at = now(), updated_at = now()"
            f" WHERE id = %s AND status = '{JobStatus.QUEUED}'",
            [job_id],
        )
        return cursor.rowcount == 1


def job_extend_enqueue_lease(*, job_id: uuid.UUID, seconds: float) -> None:
    """A chain that pauses with no step lease (a READ step backing off) keeps the job as its own: the
    sweeper resumes a job only once this lease ran out."""
    Job.objects.filter(id=job_id, status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).update(
        lease_until=timezone.now() + timedelta(seconds=seconds)
    )


_EVENT_FOR = {
    JobStatus.SUCCEEDED: WebhookEvent.SUCCEEDED,
    JobStatus.FAILED: WebhookEvent.FAILED,
    JobStatus.CANCELLED: WebhookEvent.CANCELLED,
}


def _emit(job: Job, event: WebhookEvent) -> None:
    """Write the outbox row for the state change just made to `job`, in its transaction."""
    webhooks.delivery_create(job=job, event=event, data=job_as_dict(job))


# The job lets go of its slot as it ends (jobs.dispatch); `ring` says it held one while its client was passed
# over at its running limit, so its client's next job is rung for (read from the row as it was before this
# statement: every part of a statement sees the same snapshot).
_FINISH_SQL = f"""
WITH before AS (SELECT holds_slot FROM jobs_job WHERE id = %s)
UPDATE jobs_job SET status = %s, output = %s, error = %s, completed_at = now(), updated_at = now(), holds_slot = false
 WHERE id = %s AND status = ANY(%s)
RETURNING *, {attempts_json_sql("jobs_job.id")} AS attempt_rows,
          (SELECT e.url FROM webhooks_endpoint e WHERE e.client_id = jobs_job.client_id) AS endpoint_url,
          coalesce((SELECT holds_slot FROM before)
                   AND (SELECT t.blocked FROM jobs_clientturn t WHERE t.client_id = jobs_job.client_id), false) AS ring
"""


def job_finish(*, job_id: uuid.UUID, status: str, output: dict | None = None, error: dict | None = None,
               only_from=OPEN_STATUSES) -> bool:
    """End a job. The only function that does: first terminal state wins (docs/design.md, "A job's life").

    One conditional UPDATE on the open states. The winner writes the terminal event's outbox row in
    the same transaction; a writer that gets zero rows back lost the race (a success, a failure and a
    cancel can all try at once) and writes nothing. The UPDATE returns the row the event describes.
    `only_from`: the open states it may end the job from (the sweeper ends only a job still queued).
    """
    if status not in _EVENT_FOR:  # only a terminal status ends a job (and has its event)
        raise ValueError(status)
    prep = Job._meta.get_field("output").get_db_prep_save
    with transaction.atomic(savepoint=False):
        ended = list(Job.objects.raw(_FINISH_SQL, [job_id, status, prep(output, connection), prep(error, connection), job_id,
                                                   [str(state) for state in only_from]]))
        if not ended:
            return False  # another writer ended the job first
        if ended[0].ring:
            ring_for_client(ended[0].client_id)
        _emit(ended[0], _EVENT_FOR[status])
        log_event(logger, "job.cancelled" if status == JobStatus.CANCELLED else "job.finished", job_id=job_id,
                  run=ended[0].run, status=status, error_code=(error or {}).get("code"))
        # Counted once the end commits, as the event is logged: an end rolled back (a race lost, a group of
        # steps undone) was no end.
        lived_s, kind = (ended[0].completed_at - ended[0].created_at).total_seconds(), ended[0].kind
        transaction.on_commit(lambda: observe_soon("job_end_seconds", lived_s, kind=kind, status=status))
    return True


def job_cancel(*, job: Job) -> bool:
    """An API cancel: final. Only the writer that wins the conditional update queues the event, and the
    executor is told on commit so it can cancel upstream work (a dead worker is never a cancel)."""
    with transaction.atomic():
        won = job_finish(
            job_id=job.id, status=JobStatus.CANCELLED,
            error={"code": JobErrorCode.CANCELLED, "message": "Cancelled by the client."},
        )
        if won:
            _keep_uncertain_spend(job.id)
            billing.fanout_release_for_job(job_id=job.id)  # a cancelled report's chapters will not draw again
    if won:
        job_id, run = job.id, job.run
        transaction.on_commit(lambda: _enqueue_safely(chain.stop_upstream, job_id, run))
    return won


def job_hold(*, job_id: uuid.UUID, run: int, error: dict) -> bool:
    """running -> waiting: a person must decide (an uncertain submit, a review). Emits needs_review."""
    now = timezone.now()
    with transaction.atomic(savepoint=False):
        held = Job.objects.filter(id=job_id, run=run, status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).update(
            status=JobStatus.WAITING, error=error, updated_at=now, holds_slot=False
        )
        if not held:
            return False  # cancelled, or ended by another writer
        # A job waiting for a person holds no slot: its client's next job is rung for, should it have been
        # passed over at its running limit (the doorbell finds out).
        ring_for_client(Job.objects.filter(id=job_id).values_list("client_id", flat=True).first())
        _emit(Job.objects.get(id=job_id), WebhookEvent.NEEDS_REVIEW)
        log_event(logger, "job.held", job_id=job_id, run=run, error_code=error.get("code"))
    return True


def job_retry(*, job: Job) -> Job | None:
    """A person's decision to pay again: a failed or waiting job starts its next run, queued.

    The conditional UPDATE on (failed, waiting) decides races between two retries and a cancel: one
    retry wins, the other sees zero rows. Returns the job in its new run, or None if not retryable.
    """
    now = timezone.now()
    with transaction.atomic():
        won = Job.objects.filter(id=job.id, status__in=[JobStatus.FAILED, JobStatus.WAITING]).update(
            status=JobStatus.QUEUED, run=F("run") + 1, output=None, error=None, started_at=None, holds_slot=False,
            completed_at=None, updated_at=now, lease_until=now + timedelta(seconds=settings.ENQUEUE_LEASE_S),
            trace_context=tracing.current_traceparent(),  # a new run, a new trace: the retry's request starts it
        )
        if not won:
            return None
        _keep_uncertain_spend(job.id)
        job = Job.objects.get(id=job.id)
        job_enqueue_on_commit(job)
        log_event(logger, "job.retried", job_id=job.id, run=job.run)
    return job


def _keep_uncertain_spend(job_id) -> None:
    """A person decided (a retry pays again; a cancel stops): attempts whose outcome nobody knows may have
    been paid, so their reservations become spent, unpriced (docs/design.md, "The cap: spent + reserved <= cap")."""
    keys = uncertain_upstream_keys(job_id)
    if keys:
        billing.keep_as_spent(keys=keys)


def job_wake(*, job_id, run: int, step: str, claim) -> Wake:
    """A provider called back about the attempt of `step` in `run` (executor.callbacks, the doorbell):
    wake the job's waiting step now rather than at its next poll. It still asks the provider itself, so a
    callback can cost a poll, never a state (docs/design.md, "Callbacks are a doorbell"). `claim()` takes
    the callback's message id, once; only its taker wakes the step.

    The wake runs the waiting stage under the chain that holds its polling lease (so it takes the lease
    rather than stopping at it); with no wait row yet, under a chain of its own."""
    job = selectors.job_state(job_id)
    if job is None or job.run != run or job.status != JobStatus.RUNNING:
        return Wake.ENDED
    from jobs.kinds import KINDS  # at call time: the kinds' steps import this module (jobs/kinds/__init__.py)

    recipe = KINDS[job.kind].recipe
    waiting = recipe.waiting_step()
    if waiting is None:
        return Wake.ENDED
    steps = selectors.steps_named(job_id=job_id, run=run, names=(waiting.name, step))
    wait = steps.get(waiting.name)
    if wait is None and getattr(steps.get(step), "status", None) != StepStatus.DONE:
        return Wake.EARLY  # the worker that submitted has not recorded the acceptance yet
    if wait is not None and wait.status != StepStatus.RUNNING:
        return Wake.ENDED
    if not claim():
        return Wake.DUPLICATE
    # In the run's trace, linked to the callback's request: the stage it rings is this span's child.
    with tracing.job_span("payonce.callback", job.trace_context, **{"payonce.job_id": str(job_id), "payonce.run": run,
                                                                    "payonce.step": step}):
        chain.start_run(job_id, run, job.kind, recipe.waiting_stage(),
                        root_id=(wait.lease_owner if wait is not None else "") or None, rung=True)
    return Wake.RUNG


def job_release_slot(*, job_id) -> None:
    """The job waits on its provider now: it stops counting against its client's running limit, and its
    client's next job is rung for when the client was passed over at that limit (jobs.dispatch)."""
    ring_for_client(dispatch.job_release_slot(job_id=job_id))


def ring_for_client(client_id) -> None:
    """On commit, a doorbell for a client's next queued job (jobs.dispatch says when one is owed)."""
    if client_id is not None:
        transaction.on_commit(lambda: _enqueue_safely(chain.ring, client_id))


def _enqueue_safely(enqueue, *args) -> None:
    """Call an enqueueing function of jobs.engine.chain; a broker that is down loses nothing (the row is the
    truth, and the sweeper recovers it)."""
    try:
        enqueue(*args)
    except Exception:  # the broker is unreachable; Postgres holds the state and the sweeper recovers
        logger.exception("could not enqueue %s%r; the sweeper will pick it up", enqueue.__name__, args)
