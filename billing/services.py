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
6. The cap holds whatever the price says. A settle above its reservation is a price drift: the same
   statement records it on the model's PriceDrift row, and every later reservation of that model reads
   the row in its own statement and is taken at no less than the highest cost seen. So a wrong price (or
   a model wrongly `free`) lets a month's spend past its cap by at most what the attempts already in
   flight when the drift was first seen overshoot it; the settle itself is never refused (the provider
   has charged: the record says so).
"""

import functools
import logging
from datetime import date, datetime
from decimal import Decimal

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from billing import rates
from billing.models import (
    BUDGET_MONTH_CONSTRAINT,
    PRICE_DRIFT_MODEL_CONSTRAINT,
    ModelPrice,
    Reservation,
    ReservationKind,
    ReservationState,
)
from billing.months import month_of
from config.metrics import count

logger = logging.getLogger(__name__)

HELD, SETTLED, RELEASED = ReservationState.HELD.value, ReservationState.SETTLED.value, ReservationState.RELEASED.value
ATTEMPT, FANOUT = ReservationKind.ATTEMPT.value, ReservationKind.FANOUT.value


# The client's cap: its own, else BUDGET_MONTHLY_CAP_USD. Read in the same statement as the check.
_CAP = "coalesce((SELECT monthly_cap_usd FROM jobs_client WHERE id = %(client)s), %(default_cap)s)"

# Step 6: a model whose price drifted is reserved at no less than the highest cost seen (read in the
# reservation's own statement, so a drift committed a moment ago holds for the very next reservation, in
# every process).
_FLOOR = f"""
(SELECT highest_cost_usd FROM billing_pricedrift
  WHERE model = %(model)s AND cleared_at IS NULL AND last_seen_at > now() - %(drift_hold)s * interval '1 second')
"""
_AMOUNT = f"amount AS (SELECT greatest(%(amount)s::numeric, coalesce({_FLOOR}, 0)) AS v)"

# Step 2: the month's row, conditionally, then the reservation; `reserved` has a row only if it fit. `guard`
# is the caller's condition for reserving at all, read in the same statement (reserve_then).
_RESERVE_CTE = f"""
{_AMOUNT},
month AS (
    INSERT INTO billing_budgetmonth (client_id, month, spent, reserved)
    SELECT %(client)s, %(month)s, 0, amount.v FROM amount WHERE amount.v <= {_CAP} AND {{guard}}
    ON CONFLICT ON CONSTRAINT {BUDGET_MONTH_CONSTRAINT} DO UPDATE
       SET reserved = billing_budgetmonth.reserved + EXCLUDED.reserved
     WHERE billing_budgetmonth.spent + billing_budgetmonth.reserved + EXCLUDED.reserved <= {_CAP}
    RETURNING id),
reserved AS (
    INSERT INTO billing_reservation (key, budget_id, job_id, kind, model, amount, state, unpriced, created_at)
    SELECT %(key)s, month.id, %(job)s, %(kind)s, %(model)s, amount.v, '{HELD}', false, %(at)s FROM month, amount
    RETURNING id)
"""

# Step 5: a unit takes its reservation from its fan-out's pool; `reserved` has a row only if the pool had it.
_DRAW_CTE = f"""
{_AMOUNT},
pool AS (
    UPDATE billing_reservation SET amount = billing_reservation.amount - amount.v FROM amount
     WHERE key = %(pool)s AND kind = '{FANOUT}' AND state = '{HELD}' AND billing_reservation.amount >= amount.v
       AND {{guard}}
    RETURNING id, budget_id),
reserved AS (
    INSERT INTO billing_reservation (key, budget_id, job_id, kind, model, amount, state, unpriced, parent_id, created_at)
    SELECT %(key)s, pool.budget_id, %(job)s, '{ATTEMPT}', %(model)s, amount.v, '{HELD}', false, pool.id, %(at)s
      FROM pool, amount
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
              "default_cap": settings.BUDGET_MONTHLY_CAP_USD, "drift_hold": settings.PRICE_DRIFT_HOLD_S}
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


# Step 6: a settle above its reservation records the drift on the model's row in the same statement. A
# drift that was cleared, or not seen for PRICE_DRIFT_HOLD_S (the settle's `live_after`), starts again
# from this attempt.
_LIVE = "(d.cleared_at IS NULL AND d.last_seen_at > (SELECT live_after FROM settle))"
_DRIFT_CTE = f"""
settle_drift AS (
    INSERT INTO billing_pricedrift AS d (model, first_seen_at, last_seen_at, reserved_usd, cost_usd,
                                         highest_cost_usd, drifts, cleared_by)
    SELECT model, now(), now(), amount, spent, spent, 1, '' FROM settle WHERE spent > amount AND model <> ''
    ON CONFLICT ON CONSTRAINT {PRICE_DRIFT_MODEL_CONSTRAINT} DO UPDATE SET
       last_seen_at = now(),
       drifts = CASE WHEN {_LIVE} THEN d.drifts + 1 ELSE 1 END,
       highest_cost_usd = CASE WHEN {_LIVE} THEN greatest(d.highest_cost_usd, EXCLUDED.highest_cost_usd)
                               ELSE EXCLUDED.highest_cost_usd END,
       first_seen_at = CASE WHEN {_LIVE} THEN d.first_seen_at ELSE now() END,
       reserved_usd = CASE WHEN {_LIVE} THEN d.reserved_usd ELSE EXCLUDED.reserved_usd END,
       cost_usd = CASE WHEN {_LIVE} THEN d.cost_usd ELSE EXCLUDED.cost_usd END,
       cleared_at = NULL, cleared_by = ''
    RETURNING first_seen_at = now() AS first)
"""


def settle_cte(*, key: str, cost: Decimal | None, when: str) -> tuple[str, list]:
    """The settle (as `settle` does it, its drift's record included) as two parts (CTEs named `settle` and
    `settle_drift`) of a caller's statement, applied only `when` (a condition on the statement's other
    parts: the attempt's end that it pays for). The caller selects SETTLE_DRIFT_COLUMNS and hands them
    to `drift_noticed` after the statement."""
    sql = (f"settle AS (UPDATE billing_reservation SET state = '{SETTLED}', spent = coalesce(%s::numeric, amount),"
           f" unpriced = (%s::numeric IS NULL), resolved_at = now()"
           f" WHERE key = %s AND state = '{HELD}' AND {when}"
           f" RETURNING id, budget_id, model, amount, spent, now() - %s * interval '1 second' AS live_after),"
           f" {_DRIFT_CTE}")
    return sql, [cost, cost, key, settings.PRICE_DRIFT_HOLD_S]


# What a statement with settle_cte's parts selects for drift_noticed: (budget, model, reserved, spent, first).
SETTLE_DRIFT_COLUMNS = ("(SELECT budget_id FROM settle)", "(SELECT model FROM settle)", "(SELECT amount FROM settle)",
                        "(SELECT spent FROM settle)", "(SELECT bool_or(first) FROM settle_drift)")
_SETTLE_SQL, _ = settle_cte(key="", cost=None, when="true")
_SETTLE_SQL = f"WITH {_SETTLE_SQL} SELECT {', '.join(SETTLE_DRIFT_COLUMNS)} FROM settle"


def settle(*, key: str, cost: Decimal | None) -> bool:
    """The attempt's money is known: it is spent, at its actual cost, or at all of its reservation when
    nobody could price it (cost None: never claim less than may have been paid). Exactly once: False if
    it was not held (already settled or released, or never reserved). The month's counters take it at
    the next fold. A cost above the reservation is settled as it is (the provider charged it) and is a
    price drift (step 6)."""
    with connection.cursor() as cursor:
        cursor.execute(_SETTLE_SQL, [cost, cost, key, settings.PRICE_DRIFT_HOLD_S])
        row = cursor.fetchone()
    if row is None:
        return False
    drift_noticed(key, *row)
    return True


def drift_noticed(key: str, budget_id, model: str | None, reserved: Decimal | None, spent: Decimal | None,
                  first: bool | None) -> None:
    """After a settle above its reservation: fold its month at once, in the settle's transaction, and say
    it once that commits. Between folds a month's counters keep a settled reservation's amount, which is
    stricter than the truth only while no settle exceeds its amount: folding now makes the next
    reservation's check read what was spent, so no call reserved after the drift was seen passes the cap
    on counters that understate it. Then an error log line names the model, the attempt and both amounts,
    with payonce_price_drifts_total (operators.metrics shows every model's drift from its row, and the
    admin's Models page beside the price). Nothing to do otherwise."""
    if first is None or spent is None or reserved is None or spent <= reserved:
        return
    _fold_budget(budget_id)
    transaction.on_commit(lambda: count("price_drifts", seen="first" if first else "again"))
    transaction.on_commit(lambda: logger.error(
        "price.drift: %s settled at $%s over its reservation of $%s (%s): the rate card says less than the provider "
        "charges; its reservations are now taken at no less than the highest cost seen", model, spent, reserved, key,
        extra={"event": "price.drift", "model": model, "upstream_key": key, "reserved_usd": str(reserved),
               "cost_usd": str(spent), "first": bool(first)}))


def reservation_floor(model: str) -> Decimal:
    """The least a reservation of `model` is taken at while its price drifted (0 without a drift): what the
    reservation statement reads itself (step 6), for a caller that prices a whole plan (a fan-out's
    pre-flight, the admin's preview of a retry)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT coalesce({_FLOOR}, 0)", {"model": model, "drift_hold": settings.PRICE_DRIFT_HOLD_S})
        return cursor.fetchone()[0]


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
     WHERE r.budget_id = coalesce(%(budget)s, (SELECT id FROM billing_budgetmonth
                                                 WHERE client_id = %(client)s AND month = %(month)s))
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
        cursor.execute(_FOLD_SQL, {"client": client_id, "month": month, "budget": None})
        return cursor.fetchone() is not None


def _fold_budget(budget_id) -> None:
    """Fold one month by its row's id (a drift's settle: billing.services step 6)."""
    with connection.cursor() as cursor:
        cursor.execute(_FOLD_SQL, {"client": None, "month": None, "budget": budget_id})


def fold_all() -> int:
    """Fold every month that has resolved reservations left (beat): keeps the counters close to the truth
    for whoever reads the rows. Returns how many months moved."""
    with connection.cursor() as cursor:
        cursor.execute(f"""SELECT DISTINCT b.client_id, b.month FROM billing_reservation r
                             JOIN billing_budgetmonth b ON b.id = r.budget_id
                            WHERE NOT r.folded AND r.state <> '{HELD}'""")
        months = cursor.fetchall()
    moved = 0
    for client_id, month in months:
        try:  # month by month: one that cannot be folded is logged and skipped, never the others
            moved += fold(client_id=client_id, month=month)
        except DatabaseError:
            logger.exception("billing: could not fold %s's month %s; skipped", client_id, month)
            count("sweep_errors", sweep="fold")
    return moved


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
                   at: datetime | None = None, model: str = "") -> bool:
    """The pre-flight of a fan-out: one reservation of units x the most one unit (a call of `model`) can
    cost, the model's drift floor included. False: it does not fit, and no unit may start. A repeat (the
    stage delivered again) reserves nothing more."""
    if Reservation.objects.filter(key=key).exists():
        return True
    amount = max(unit_worst_case, reservation_floor(model) if model else Decimal(0)) * units
    return reserve(client_id=client_id, job_id=job_id, key=key, model="", amount=amount, guard=guard, at=at,
                   kind=FANOUT)


def fanout_release(*, key: str) -> bool:
    """The fan-out joined: what its units did not draw goes back."""
    return release(key=key)


def fanout_release_for_job(*, job_id) -> int:
    """The job ended before its fan-out joined (a cancel): every pool of it still held goes back."""
    keys = Reservation.objects.filter(job_id=job_id, kind=FANOUT, state=HELD).values_list("key", flat=True)
    return sum(release(key=key) for key in list(keys))


def price_drift_clear(*, drifts, who: str) -> int:
    """An operator decided (the rate card is right now, or the provider's charge was a one-off): the drifts
    stop raising their models' reservations. Returns how many were live. A settle above its reservation
    starts one again."""
    return drifts.filter(cleared_at__isnull=True).update(cleared_at=timezone.now(), cleared_by=who[:150])


def model_price(model: str) -> dict | None:
    """The rate card's override of `model` (ModelPrice's fields, amounts as strings), or None."""
    row = ModelPrice.objects.filter(model=model).first()
    return None if row is None else price_words({field: getattr(row, field) for field in MODEL_PRICE_FIELDS})


def price_words(price: dict) -> dict:
    """A price (ModelPrice's fields) as an audit row keeps it: amounts as 6-place strings, so a price saved
    again unchanged compares equal to the stored one."""
    return {field: (str(value.quantize(rates.MICRO)) if isinstance(value, Decimal) else value)
            for field, value in price.items()}


MODEL_PRICE_FIELDS = ("free", "input_per_mtok_usd", "output_per_mtok_usd", "cache_write_per_mtok_usd",
                      "cache_read_per_mtok_usd", "per_unit_usd", "unit", "variants")


def model_price_set(*, model: str, price: dict | None) -> None:
    """The rate card's override for `model` (the admin's Models page): `price` as ModelPrice's fields, or
    None to drop the override (the models file's price, else the code's, applies again). Every process
    reads it within MODELS_CACHE_S (billing.rates); this one at once."""
    if price is None:
        ModelPrice.objects.filter(model=model).delete()
    else:
        ModelPrice.objects.update_or_create(model=model, defaults=price)
    rates.forget_overrides()
