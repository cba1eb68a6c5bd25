"""Reads of the executor's record: a job's attempts as the API shows them, and what they cost."""

from dataclasses import dataclass
from decimal import Decimal

from django.db import connection

from config.conditions import case_sql
from executor.models import PAID_UNKNOWN, PAID_WHEN, PAID_YES, Attempt, AttemptState, Paid

# Whether an attempt `a` was paid, as the API says it (`paid`): executor.models.PAID_WHEN written out as
# SQL, so the statements that show attempts and Attempt.paid read one rule.
PAID_SQL = case_sql(PAID_WHEN, Paid.NO, Attempt, "a")
# An attempt nobody could price: it may have been paid (accepted, or its outcome unknown) and no cost is
# known. The one rule for a job's `cost.unpriced_attempts` wherever it is counted (the API, the event
# stream, the admin's runs and orders); a client month counts its reservations instead
# (billing.selectors.UNPRICED_ATTEMPT_SQL).
UNPRICED_SQL = (f"(a.cost_usd IS NULL AND (a.accepted_at IS NOT NULL"
                f" OR a.state IN ('{AttemptState.SUBMITTING}', '{AttemptState.UNCERTAIN}')))")

# A job's attempts, API-shaped, as one JSON value: a subquery other reads embed (`%s` is the job id
# column or a parameter), so a job and its attempts come back in one statement.
ATTEMPTS_JSON_SQL = f"""
(SELECT coalesce(json_agg(json_build_object(
        'number', a.number, 'step', a.step, 'provider', a.provider, 'model', a.model, 'upstream_key', a.upstream_key,
        'state', a.state, 'error_class', a.error_class, 'error', a.error, 'duration_ms', a.duration_ms,
        'cost_usd', a.cost_usd::text, 'cost_source', a.cost_source, 'usage', a.usage, 'paid', {PAID_SQL},
        'unpriced', {UNPRICED_SQL})
        ORDER BY a.number), '[]'::json)
   FROM executor_attempt a WHERE a.job_id = {{job}})
"""

_SIX = Decimal("0.000001")


def attempts_json_sql(job_column: str) -> str:
    return ATTEMPTS_JSON_SQL.format(job=job_column)


def attempts_for(job_ids) -> dict:
    """{job_id: [attempt, ...]} for many jobs in one statement (a job with none: `[]`)."""
    found = {}
    if not job_ids:
        return found
    # The ids as a set of rows of their own (unnest), not a read of jobs' table: the executor reads only
    # its own tables (tests/project/test_architecture.py), and the caller has the jobs already.
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT j.id, {attempts_json_sql('j.id')} FROM unnest(%s::uuid[]) AS j(id)", [list(job_ids)]
        )
        for job_id, rows in cursor.fetchall():
            found[job_id] = rows
    return found


def public_attempts(rows: list[dict]) -> tuple[list[dict], dict]:
    """The attempts as the API shows them, and the job's cost: the sum of priced attempts, and how many
    attempts that may have been paid nobody could price (null is not zero)."""
    attempts, total, unpriced = [], Decimal(0), 0
    for row in rows:
        row = dict(row)
        unpriced += row.pop("unpriced")
        if row["cost_usd"] is not None:
            cost = Decimal(row["cost_usd"]).quantize(_SIX)
            total += cost
            row["cost_usd"] = str(cost)
        attempts.append(row)
    return attempts, {"total_usd": str(total.quantize(_SIX)), "unpriced_attempts": unpriced}


@dataclass(frozen=True)
class RunAttempts:
    """One run's attempts as the job page sums them: how many, how many paid (`yes`) and of unknown
    outcome (`unknown`, PAID_SQL), what the priced ones cost, and how many nobody could price."""

    run: int
    attempts: int
    paid: int
    paid_unknown: int
    cost_usd: Decimal
    unpriced: int

    @classmethod
    def none(cls, run: int) -> "RunAttempts":
        """A run that made no attempt."""
        return cls(run, 0, 0, 0, Decimal(0).quantize(_SIX), 0)

    @classmethod
    def total(cls, runs: list["RunAttempts"], run: int) -> "RunAttempts":
        """The sums over `runs`, under `run` (the number of runs)."""
        return cls(run, sum(r.attempts for r in runs), sum(r.paid for r in runs), sum(r.paid_unknown for r in runs),
                   sum((r.cost_usd for r in runs), Decimal(0).quantize(_SIX)), sum(r.unpriced for r in runs))


_BY_RUN_SQL = f"""
SELECT a.run, count(*), count(*) FILTER (WHERE ({PAID_SQL}) = 'yes'), count(*) FILTER (WHERE ({PAID_SQL}) = 'unknown'),
       coalesce(sum(a.cost_usd), 0), count(*) FILTER (WHERE {UNPRICED_SQL})
  FROM executor_attempt a WHERE a.job_id = %s GROUP BY a.run ORDER BY a.run
"""


def attempts_by_run(job_id) -> dict[int, RunAttempts]:
    """{run: RunAttempts} of one job, in one statement (the same rules as `paid` and public_attempts)."""
    with connection.cursor() as cursor:
        cursor.execute(_BY_RUN_SQL, [job_id])
        return {row[0]: RunAttempts(row[0], row[1], row[2], row[3], Decimal(row[4]).quantize(_SIX), row[5])
                for row in cursor.fetchall()}


def attempts_maybe_paid(job_id) -> bool:
    """Whether an attempt of the job, in any run, may have been paid (Paid: yes or unknown)."""
    return Attempt.objects.filter(job_id=job_id).filter(PAID_YES | PAID_UNKNOWN).exists()


def uncertain_upstream_keys(job_id) -> list[str]:
    """The upstream keys of the job's attempts whose outcome nobody knows (a person decides about them)."""
    return list(Attempt.objects.filter(job_id=job_id, state=AttemptState.UNCERTAIN).values_list("upstream_key", flat=True))


@dataclass(frozen=True)
class CalledBack:
    """The attempt a provider's callback names: whose it is and where it stands."""

    job_id: object
    run: int
    step: str
    upstream_key: str
    state: str


_BY_UPSTREAM_ID_SQL = f"""
SELECT a.job_id, a.run, a.step, a.upstream_key, a.state FROM executor_attempt a
 WHERE a.provider = %s AND a.upstream_id = %s
 -- A provider's ids are its own: should one name two attempts (a sandbox reset starts its ids again),
 -- the one still running is the one waited on, else the newest.
 ORDER BY a.state = '{AttemptState.RUNNING}' DESC, a.id DESC
 LIMIT 1
"""


def attempt_by_upstream_id(*, provider: str, upstream_id: str) -> CalledBack | None:
    """The attempt a provider knows as `upstream_id` (on the index attempt_upstream_id), or None."""
    with connection.cursor() as cursor:
        cursor.execute(_BY_UPSTREAM_ID_SQL, [provider, upstream_id])
        found = cursor.fetchone()
    return CalledBack(*found) if found is not None else None
