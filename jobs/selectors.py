"""Reads of the jobs tables: for the views, the serializers' checks, the runner, the sweeper, the
executor and the operators' job list (nobody else reads jobs_job or jobs_step directly)."""

from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Exists, OuterRef, Q

from accounts.models import Client
from executor.in_flight import IN_FLIGHT, full_limit
from executor.selectors import UNPRICED_SQL, attempts_json_sql
from jobs.models import ChapterStatus, Job, JobStatus, Step, StepStatus


def succeeded_output_keys(*, client_id, keys) -> set[str]:
    """Which of `keys` are outputs of the client's own succeeded jobs (one statement, on the claim's
    unique index): the only outputs a reference may name."""
    if not keys:
        return set()
    return set(
        Job.objects.filter(client_id=client_id, status=JobStatus.SUCCEEDED, output_key__in=list(keys))
        .values_list("output_key", flat=True)
    )


def job_holding_output_key(*, client_id, key: str):
    """The id of the client's job that claimed `key`, or None."""
    return Job.objects.filter(client_id=client_id, output_key=key).values_list("id", flat=True).first()


# --- the API ---------------------------------------------------------------------------------------------

# With what job_waiting needs of an open job (its client's running limit and slots held, whether a call of
# its current run is in flight), in the same statement: a client polling its job pays no second one.
# Each CASE reads its subquery only for the status that needs it.
_OWN_JOB_SQL = f"""
SELECT j.*, {attempts_json_sql('j.id')} AS attempt_rows,
       CASE WHEN j.status = '{JobStatus.QUEUED}' THEN
            (SELECT coalesce(c.max_running, %s) FROM jobs_client c WHERE c.id = j.client_id) END AS slot_limit,
       CASE WHEN j.status = '{JobStatus.QUEUED}' THEN
            (SELECT count(*) FROM jobs_job h WHERE h.client_id = j.client_id AND h.holds_slot) END AS slots_held,
       CASE WHEN j.status = '{JobStatus.RUNNING}' THEN
            EXISTS (SELECT 1 FROM executor_attempt a WHERE a.job_id = j.id AND a.run = j.run
                     AND a.state IN ('{IN_FLIGHT[0]}', '{IN_FLIGHT[1]}')) END AS call_in_flight
  FROM jobs_job j WHERE j.id = %s AND j.client_id = %s
"""


def idempotency_key_used(*, client_id, key: str) -> bool:
    """Whether the client has a job under this Idempotency-Key (job_client_idempotency_key's index)."""
    return Job.objects.filter(client_id=client_id, idempotency_key=key).exists()


def own_job(*, client_id, job_id) -> Job | None:
    """The client's job with its attempts, in one statement; another client's job is None."""
    return next(iter(Job.objects.raw(_OWN_JOB_SQL, [settings.CLIENT_MAX_RUNNING, job_id, client_id])), None)


def own_job_output(*, client_id, job_id) -> Job | None:
    """What GET /v1/jobs/{id}/output needs of the client's job (its kind, status and output), without the
    attempts own_job brings; another client's job is None."""
    return Job.objects.filter(client_id=client_id, id=job_id).only("kind", "status", "output").first()


def job_list_rows(*, client_id, status: str | None, after: tuple | None, backwards: bool, limit: int,
                  created_after=None, created_before=None, metadata: dict | None = None) -> list[Job]:
    """A client's jobs by (created_at, id): newest first, older than `after` (a position); or, going
    `backwards`, newer than `after`, nearest first; within [created_after, created_before), and with every
    `metadata` pair (`@>`, a string value). On the index job_client_created: the time range bounds its scan;
    a metadata pair is checked on the rows it reads."""
    jobs = Job.objects.filter(client_id=client_id)
    if status:
        jobs = jobs.filter(status=status)
    if created_after is not None:
        jobs = jobs.filter(created_at__gte=created_after)
    if created_before is not None:
        jobs = jobs.filter(created_at__lt=created_before)
    if metadata:
        jobs = jobs.filter(metadata__contains=metadata)
    if after is None:
        jobs = jobs.order_by("-created_at", "-id")
    elif backwards:
        at, job_id = after
        jobs = jobs.filter(Q(created_at__gt=at) | Q(created_at=at, id__gt=job_id)).order_by("created_at", "id")
    else:
        at, job_id = after
        jobs = jobs.filter(Q(created_at__lt=at) | Q(created_at=at, id__lt=job_id)).order_by("-created_at", "-id")
    return list(jobs[:limit])


# --- the operators' job list (operators.admin.jobs) ----------------------------------------------------------------

# The models named in the newest jobs' chains: read along job_created, so it costs the same over any size of
# table (the whole table's chains would be every row unnested: 300,000 of them in bench/admin.py).
_MODELS_IN_USE_SQL = """
SELECT DISTINCT m.name
  FROM (SELECT model_chain FROM jobs_job ORDER BY created_at DESC, id DESC LIMIT %s) j
 CROSS JOIN LATERAL jsonb_array_elements_text(
     CASE WHEN jsonb_typeof(j.model_chain) = 'array' THEN j.model_chain ELSE '[]'::jsonb END) AS m(name)
 ORDER BY m.name
"""


def models_in_use(*, newest: int) -> list[str]:
    """The models (provider/model) the chains of the newest `newest` jobs name, sorted."""
    with connection.cursor() as cursor:
        cursor.execute(_MODELS_IN_USE_SQL, [newest])
        return [name for (name,) in cursor.fetchall()]


def clients_with_jobs():
    """The clients that have a job, by name: one probe of job_client_created per client, never a scan of
    the jobs (a DISTINCT over client_id reads every row)."""
    return (Client.objects.filter(Exists(Job.objects.filter(client_id=OuterRef("pk"))))
            .order_by("name", "id").only("id", "name"))


# --- the runner and the sweeper ---------------------------------------------------------------------------

# The job and the steps of its current run, in one statement (the hot path of every stage).
_JOB_WITH_STEPS_SQL = """
SELECT j.*, (SELECT coalesce(json_agg(json_build_object(
                 'id', s.id, 'name', s.name, 'status', s.status, 'result', s.result, 'attempts', s.attempts,
                 'lease_owner', s.lease_owner, 'lease_until', s.lease_until)), '[]'::json)
               FROM jobs_step s WHERE s.job_id = j.id AND s.run = j.run) AS step_rows,
       EXISTS (SELECT 1 FROM executor_attempt a WHERE a.job_id = j.id) AS has_attempts
  FROM jobs_job j WHERE j.id = %s
"""


def job_with_steps(job_id):
    """The job with `step_rows` (its current run's steps as dicts) and `has_attempts` (whether any attempt
    of it exists: the executor then need not look for one, jobs.kinds.media.submit), or None."""
    return next(iter(Job.objects.raw(_JOB_WITH_STEPS_SQL, [job_id])), None)


def done_step_names(*, job_id, run: int) -> set[str]:
    return set(Step.objects.filter(job_id=job_id, run=run, status=StepStatus.DONE).values_list("name", flat=True))


def ended_step_count(*, job_id, run: int, names) -> int:
    """How many of the named steps of the run are done or failed (a fan-out's join)."""
    return Step.objects.filter(job_id=job_id, run=run, name__in=list(names),
                               status__in=[StepStatus.DONE, StepStatus.FAILED]).count()


# No live chain: the enqueue lease ran out, no step of the current run holds a live lease, and no step
# finished within the lease (a message handing the job to its next stage may still be queued).
# A queued job of a client at its running limit is not stuck but waiting its turn: a slot its client frees
# rings for it (jobs.dispatch). Only when the client is under its limit again (that doorbell lost) is it.
_STUCK_SQL = f"""
WITH full_clients AS MATERIALIZED (
    SELECT t.client_id FROM jobs_clientturn t JOIN jobs_client c ON c.id = t.client_id
     WHERE t.blocked AND coalesce(c.max_running, %(default_running)s) > 0
       AND (SELECT count(*) FROM jobs_job h WHERE h.client_id = t.client_id AND h.holds_slot)
           >= coalesce(c.max_running, %(default_running)s)
)
SELECT j.id, j.run, j.kind, j.status = '{JobStatus.QUEUED}', j.trace_context FROM jobs_job j
 WHERE j.status IN ('{JobStatus.QUEUED}', '{JobStatus.RUNNING}')
   AND j.lease_until < now()
   AND NOT (j.status = '{JobStatus.QUEUED}' AND j.client_id IN (SELECT client_id FROM full_clients))
   AND NOT EXISTS (
       SELECT 1 FROM jobs_step s
        WHERE s.job_id = j.id AND s.run = j.run
          AND ((s.status = '{StepStatus.RUNNING}' AND s.lease_until >= now()) OR s.finished_at >= now() - %(handoff)s))
 ORDER BY j.lease_until
 LIMIT %(limit)s
"""


def stuck_jobs(*, handoff: timedelta, limit: int = 500) -> list[tuple]:
    """Jobs that should be moving but show no sign of a live chain: [(id, run, kind, queued, trace_context)]."""
    with connection.cursor() as cursor:
        cursor.execute(_STUCK_SQL, {"handoff": handoff, "limit": limit, "default_running": settings.CLIENT_MAX_RUNNING})
        return cursor.fetchall()


# Queued jobs whose deadline (executor.policy.job_deadline, in SQL: the earlier of the two) has passed.
_QUEUED_PAST_DEADLINE_SQL = f"""
SELECT id, run, deadline FROM (
    SELECT id, run, least(created_at + make_interval(secs => (policy->>'deadline_s')::float8),
                          (policy->>'deadline_at')::timestamptz) AS deadline
      FROM jobs_job WHERE status = '{JobStatus.QUEUED}' AND (policy ? 'deadline_s' OR policy ? 'deadline_at')
) q WHERE deadline < now() LIMIT %s
"""


def queued_past_deadline(*, limit: int) -> list[tuple]:
    """[(id, run, deadline)] of queued jobs whose first paid call can no longer go out in time."""
    with connection.cursor() as cursor:
        cursor.execute(_QUEUED_PAST_DEADLINE_SQL, [limit])
        return cursor.fetchall()


# --- a provider's callback (jobs.services.job_wake) ---------------------------------------------------------


def job_state(job_id) -> Job | None:
    """The job's status, kind, run and trace, or None."""
    return Job.objects.filter(id=job_id).only("status", "kind", "run", "trace_context").first()


def steps_named(*, job_id, run: int, names) -> dict[str, Step]:
    """{name: Step} of the run's steps among `names` (their status and lease owner)."""
    return {step.name: step for step in Step.objects.filter(job_id=job_id, run=run, name__in=list(names))
            .only("name", "status", "lease_owner")}


# --- progress (GET /v1/jobs/{id}/events) -------------------------------------------------------------------

# One statement: the job's status, its current run's steps, its chapters done of total and its cost so
# far, and a version: the latest moment any of them changed (microseconds), which numbers the frames.
_SNAPSHOT_SQL = f"""
SELECT j.status, j.run,
       (SELECT coalesce(json_agg(json_build_object('name', s.name, 'status', s.status) ORDER BY s.id), '[]'::json)
          FROM jobs_step s WHERE s.job_id = j.id AND s.run = j.run),
       (SELECT count(*) FILTER (WHERE c.status = '{ChapterStatus.DONE}') FROM jobs_reportchapter c WHERE c.report_id = j.id),
       (SELECT count(*) FROM jobs_reportchapter c WHERE c.report_id = j.id),
       (SELECT coalesce(sum(a.cost_usd), 0) FROM executor_attempt a WHERE a.job_id = j.id),
       (SELECT count(*) FROM executor_attempt a WHERE a.job_id = j.id AND {UNPRICED_SQL}),
       floor(extract(epoch FROM greatest(
           j.updated_at,
           (SELECT max(greatest(s.started_at, coalesce(s.finished_at, s.started_at))) FROM jobs_step s
             WHERE s.job_id = j.id AND s.run = j.run),
           (SELECT max(greatest(a.created_at, coalesce(a.finished_at, a.created_at))) FROM executor_attempt a
             WHERE a.job_id = j.id),
           (SELECT max(c.done_at) FROM jobs_reportchapter c WHERE c.report_id = j.id))) * 1000000)::bigint
  FROM jobs_job j WHERE j.id = %s AND j.client_id = %s
"""


def job_snapshot(*, client_id, job_id) -> tuple[int, dict] | None:
    """(version, snapshot) of the client's job, or None (not the client's)."""
    with connection.cursor() as cursor:
        cursor.execute(_SNAPSHOT_SQL, [job_id, client_id])
        found = cursor.fetchone()
    if found is None:
        return None
    status, run, steps, done, total, cost, unpriced, version = found
    snapshot = {"status": status, "run": run, "steps": steps,
                "cost": {"total_usd": f"{cost:.6f}", "unpriced_attempts": unpriced}}
    if total:
        snapshot["chapters"] = {"done": done, "total": total}
    return version, snapshot


# --- why a job waits (GET /v1/jobs/{id}, the admin's job page) ----------------------------------------------

_WAITING_SQL = f"""
SELECT coalesce(c.max_running, %(default_running)s),
       (SELECT count(*) FROM jobs_job h WHERE h.client_id = j.client_id AND h.holds_slot),
       EXISTS (SELECT 1 FROM executor_attempt a WHERE a.job_id = j.id AND a.run = j.run
                AND a.state IN ('{IN_FLIGHT[0]}', '{IN_FLIGHT[1]}'))
  FROM jobs_job j JOIN jobs_client c ON c.id = j.client_id
 WHERE j.id = %(job)s
"""


def job_waiting(job: Job) -> dict | None:
    """Why a job that has not sent its call yet waits, or None (it does not wait on payonce):
    - `client_limit`: queued, its client has `limit` jobs in progress (jobs.dispatch starts it when one ends
      or waits on its provider);
    - `turn`: queued, in the rotation across clients (jobs.dispatch: by priority, then turns);
    - `provider_limit`: started, its call held back unsent because a provider or model has its calls in
      flight (executor.in_flight), `limit` naming which."""
    if job.status not in (JobStatus.QUEUED, JobStatus.RUNNING):
        return None
    if hasattr(job, "call_in_flight"):  # read with the job (own_job)
        limit, running, in_flight_now = job.slot_limit, job.slots_held, job.call_in_flight
    else:
        with connection.cursor() as cursor:
            cursor.execute(_WAITING_SQL, {"default_running": settings.CLIENT_MAX_RUNNING, "job": job.id})
            row = cursor.fetchone()
        if row is None:
            return None
        limit, running, in_flight_now = row
    if job.status == JobStatus.QUEUED:
        if limit and running >= limit:
            return {"reason": "client_limit", "running": running, "limit": limit,
                    "message": f"Your client has {running} jobs in progress, its limit of {limit}: this one starts "
                               "when one of them ends or waits on its provider."}
        return {"reason": "turn", "message": "Queued: started in its turn across clients, by priority."}
    if in_flight_now:
        return None
    for name in job.model_chain:
        provider, _, model = name.partition("/")
        full = full_limit(provider, model)
        if full is not None:
            return {"reason": "provider_limit", "limit": full[0], "in_flight": full[1],
                    "message": f"{full[0]} has {full[1]} calls in flight, its limit: this job's call waits unsent "
                               "(nothing is paid while it waits)."}
    return None
