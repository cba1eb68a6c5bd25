"""The budget guard (docs/design.md, "The cap: spent + reserved <= cap"): reserve the worst case before a paid call,
settle or release it exactly once when its money is known, and never let `spent + reserved` pass a client month's cap.

1. Reserve rides the executor's intent: it must run inside the transaction that commits the attempt in
   `submitting` (executor.record.intend), so intent and reservation exist together or not at all.
2. One statement reserves: it creates or updates the client month's row, conditionally on
   `spent + reserved + worst_case <= cap`, and inserts the reservation keyed by the upstream key. The
   row lock that UPDATE takes serialises every reservation of one client month, across processes and
   machines; the second one re-evaluates the condition on the first one's committed row (PostgreSQL's
   READ COMMITTED re-check), so parallel calls can never all pass a check on a stale total.
3. Settle and release are one statement each on the reservation's own row, conditional on it being
   `held`: whoever resolves an attempt (its own execution, a redelivery, the sweeper's path after a
   crash) moves its money once, and every later try changes nothing. They do not touch the month's row,
   so they never queue behind the reservations of a busy month: until a fold, the month keeps their
   whole amount in `reserved`, which can only make the check stricter, never looser.
4. A fold moves resolved reservations into the month's counters (actual cost into `spent`, the amount out
   of `reserved`), exactly once each (`folded`). It runs when a reservation does not fit (then the check
   is tried again on the folded counters, in the same transaction) and periodically (beat).
5. A fan-out reserves one pool up front (units remaining x the most one unit can cost); its units draw
   from the pool, so none of them can be refused once the pre-flight passed; the join releases the rest.
"""

import functools
import logging
from datetime import date, datetime
from decimal import Decimal

from django.conf import settings
from django.db import connection
from django.utils import timezone

from billing import rates
from billing.models import (
    BUDGET_MONTH_CONSTRAINT,
    ModelPrice,
    Reservation,
    ReservationKind,
    ReservationState,
)
from billing.months import month_of

logger = logging.getLogger(__name__)

HELD, SETTLED, RELEASED = ReservationState.HELD.value, ReservationState.SETTLED.value, ReservationState.RELEASED.value
ATTEMPT, FANOUT = ReservationKind.ATTEMPT.value, ReservationKind.FANOUT.value


# The client's cap: its own, else BUDGET_MONTHLY_CAP_USD. Read in the same statement as the check.
_CAP = "coalesce((SELECT monthly_cap_usd FROM jobs_client WHERE id = %(client)s), %(default_cap)s)"

# Step 2: the month's row, conditionally, then the reservation; `reserved` has a row only if it fit. `guard`
# is the caller's condition for reserving at all, read in the same statement (reserve_then).
_RESERVE_CTE = f"""
month AS (
    INSERT INTO billing_budgetmonth (client_id, month, spent, reserved)
    SELECT %(client)s, %(month)s, 0, %(amount)s WHERE %(amount)s <= {_CAP} AND {{guard}}
    ON CONFLICT ON CONSTRAINT {BUDGET_MONTH_CONSTRAINT} DO UPDATE
       SET reserved = billing_budgetmonth.reserved + EXCLUDED.reserved
     WHERE billing_budgetmonth.spent + billing_budgetmonth.reserved + EXCLUDED.reserved <= {_CAP}
    RETURNING id),
reserved AS (
    INSERT INTO billing_reservation (key, budget_id, job_id, kind, model, amount, state, unpriced, created_at)
    SELECT %(key)s, month.id, %(job)s, %(kind)s, %(model)s, %(amount)s, '{HELD}', false, %(at)s FROM month
    RETURNING id)
"""

# Step 5: a unit takes its reservation from its fan-out's pool; `reserved` has a row only if the pool had it.
_DRAW_CTE = f"""
pool AS (
    UPDATE billing_reservation SET amount = amount - %(amount)s
     WHERE key = %(pool)s AND kind = '{FANOUT}' AND state = '{HELD}' AND amount >= %(amount)s AND {{guard}}
    RETURNING id, budget_id),
reserved AS (
    INSERT INTO billing_reservation (key, budget_id, job_id, kind, model, amount, state, unpriced, parent_id, created_at)
    SELECT %(key)s, pool.budget_id, %(job)s, '{ATTEMPT}', %(model)s, %(amount)s, '{HELD}', false, pool.id, %(at)s
      FROM pool
    RETURNING id)
"""

_ONLY_THE_RESERVATION = "SELECT id FROM reserved"


@functools.lru_cache(maxsize=64)
def _sql(cte: str, guard: str, statement: str) -> str:
    return f"WITH {cte.format(guard=guard)} {statement}"


def reserve_then(statement: str = _ONLY_THE_RESERVATION, params: dict | None = None, *, client_id, job_id,
                 key: str, model: str, amount: Decimal, guard: str, at: datetime | None = None,
                 kind: str = ATTEMPT, pool: str | None = None) -> list | None:
    """Reserve `amount` against the client's month of `at` (now), or draw it from the fan-out `pool`, and
    run `statement` in the same SQL statement, after the reservation. The statement reads the CTE
    `reserved` (`INSERT ... SELECT ... FROM reserved`), so what it writes exists only if the reservation
    fit: the executor's intent is that statement (one statement, one commit: intent and reservation
    together or not at all, step 1). Returns the statement's rows, or None when nothing fits under the
    cap, or when `guard` is false. A check refused on conservative counters folds the month and is tried
    once more (step 4); a pool that has not enough left (more tries than planned) falls back to a
    reservation of its own.

    `guard` is the caller's SQL condition for reserving at all (it may read %(job)s), read in the same
    statement: a job's own (jobs.models.Job.NOT_CANCELLED_SQL: nothing is reserved for a cancelled job,
    closing the race of a cancel committed between the decision to pay and the intent), or "true"."""
    at = at or timezone.now()
    values = {**(params or {}), "client": client_id, "month": month_of(at), "amount": amount, "key": key,
              "job": job_id, "kind": kind, "model": model, "at": at, "pool": pool,
              "default_cap": settings.BUDGET_MONTHLY_CAP_USD}
    with connection.cursor() as cursor:
        if pool is not None:
            cursor.execute(_sql(_DRAW_CTE, guard, statement), values)
            rows = cursor.fetchall()
            if rows:
                return rows
        for last_try in (False, True):
            cursor.execute(_sql(_RESERVE_CTE, guard, statement), values)
            rows = cursor.fetchall()
            if rows:
                return rows
            if last_try or not fold(client_id=client_id, month=values["month"]):
                return None  # nothing (more) to fold: the refusal stands


def reserve(*, client_id, job_id, key: str, model: str, amount: Decimal, guard: str, at: datetime | None = None,
            kind: str = ATTEMPT) -> bool:
    """A reservation on its own (a fan-out's pool, tests, the benchmark). False: it does not fit."""
    return reserve_then(client_id=client_id, job_id=job_id, key=key, model=model, amount=amount, guard=guard,
                        at=at, kind=kind) is not None


_SETTLE_SQL = f"""
UPDATE billing_reservation
   SET state = '{SETTLED}', spent = coalesce(%(cost)s::numeric, amount), unpriced = (%(cost)s::numeric IS NULL),
       resolved_at = now()
 WHERE key = %(key)s AND state = '{HELD}'
RETURNING id
"""


def settle_cte(*, key: str, cost: Decimal | None, when: str) -> tuple[str, list]:
    """The settle (as `settle` does it) as one part (a CTE) of a caller's statement, applied only `when`
    (a condition on the statement's other parts: the attempt's end that it pays for)."""
    sql = (f"UPDATE billing_reservation SET state = '{SETTLED}', spent = coalesce(%s::numeric, amount),"
           f" unpriced = (%s::numeric IS NULL), resolved_at = now()"
           f" WHERE key = %s AND state = '{HELD}' AND {when} RETURNING id")
    return sql, [cost, cost, key]


def settle(*, key: str, cost: Decimal | None) -> bool:
    """The attempt's money is known: it is spent, at its actual cost, or at all of its reservation when
    nobody could price it (cost None: never claim less than may have been paid). Exactly once: False if
    it was not held (already settled or released, or never reserved). The month's counters take it at
    the next fold."""
    with connection.cursor() as cursor:
        cursor.execute(_SETTLE_SQL, {"key": key, "cost": cost})
        return cursor.fetchone() is not None


_RELEASE_SQL = f"""
UPDATE billing_reservation SET state = '{RELEASED}', resolved_at = now()
 WHERE key = %(key)s AND state = '{HELD}'
RETURNING id
"""


def release(*, key: str) -> bool:
    """The provider definitely did not charge (a refusal, a send proven absent, nothing sent), or a
    pool's units are done: the reservation goes back (at the next fold). Exactly once."""
    with connection.cursor() as cursor:
        cursor.execute(_RELEASE_SQL, {"key": key})
        return cursor.fetchone() is not None


_FOLD_SQL = f"""
WITH folded AS (
    UPDATE billing_reservation r SET folded = true
     WHERE r.budget_id = (SELECT id FROM billing_budgetmonth WHERE client_id = %(client)s AND month = %(month)s)
       AND NOT r.folded AND r.state <> '{HELD}'
    RETURNING r.budget_id, r.amount, coalesce(r.spent, 0) AS spent),
moved AS (SELECT budget_id, sum(amount) AS amount, sum(spent) AS spent FROM folded GROUP BY budget_id)
UPDATE billing_budgetmonth b SET spent = b.spent + moved.spent, reserved = b.reserved - moved.amount
  FROM moved WHERE b.id = moved.budget_id
RETURNING b.id
"""


def fold(*, client_id, month: date) -> bool:
    """Move the month's resolved reservations into its counters, each exactly once (the UPDATE marks
    them folded in the same statement that moves their money). True if anything moved."""
    with connection.cursor() as cursor:
        cursor.execute(_FOLD_SQL, {"client": client_id, "month": month})
        return cursor.fetchone() is not None


def fold_all() -> int:
    """Fold every month that has resolved reservations left (beat): keeps the counters close to the truth
    for whoever reads the rows. Returns how many months moved."""
    with connection.cursor() as cursor:
        cursor.execute(f"""SELECT DISTINCT b.client_id, b.month FROM billing_reservation r
                             JOIN billing_budgetmonth b ON b.id = r.budget_id
                            WHERE NOT r.folded AND r.state <> '{HELD}'""")
        months = cursor.fetchall()
    return sum(fold(client_id=client_id, month=month) for client_id, month in months)


_HOLD_UNPRICED_SQL = f"""
UPDATE billing_reservation SET unpriced = true WHERE key = %(key)s AND state = '{HELD}' AND NOT unpriced RETURNING id
"""


def hold_unpriced(*, key: str) -> bool:
    """The attempt's outcome is unknown and a person will decide (an `uncertain` attempt): its reservation
    stays held, and counts as unpriced until then (billing.selectors.UNPRICED_ATTEMPT_SQL). Runs in the
    transaction that makes the attempt uncertain, so the two never disagree."""
    with connection.cursor() as cursor:
        cursor.execute(_HOLD_UNPRICED_SQL, {"key": key})
        return cursor.fetchone() is not None


def keep_as_spent(*, keys) -> int:
    """A person decided about attempts whose outcome nobody knows (`uncertain`): they may have been paid,
    so their reservations become spent, unpriced. Returns how many moved."""
    return sum(settle(key=key, cost=None) for key in keys)


def fanout_reserve(*, client_id, job_id, key: str, units: int, unit_worst_case: Decimal, guard: str,
                   at: datetime | None = None) -> bool:
    """The pre-flight of a fan-out: one reservation of units x the most one unit can cost. False: it does
    not fit, and no unit may start. A repeat (the stage delivered again) reserves nothing more."""
    if Reservation.objects.filter(key=key).exists():
        return True
    amount = unit_worst_case * units
    return reserve(client_id=client_id, job_id=job_id, key=key, model="", amount=amount, guard=guard, at=at,
                   kind=FANOUT)


def fanout_release(*, key: str) -> bool:
    """The fan-out joined: what its units did not draw goes back."""
    return release(key=key)


def fanout_release_for_job(*, job_id) -> int:
    """The job ended before its fan-out joined (a cancel): every pool of it still held goes back."""
    keys = Reservation.objects.filter(job_id=job_id, kind=FANOUT, state=HELD).values_list("key", flat=True)
    return sum(release(key=key) for key in list(keys))


def model_price_set(*, model: str, price: dict | None) -> None:
    """The rate card's override for `model` (the admin's Models page): `price` as ModelPrice's fields, or
    None to drop the override (the models file's price, else the code's, applies again). Every process
    reads it within rates.OVERRIDES_CACHE_S; this one at once."""
    if price is None:
        ModelPrice.objects.filter(model=model).delete()
    else:
        ModelPrice.objects.update_or_create(model=model, defaults=price)
    rates.forget_overrides()
