"""Reads of what was spent: a client's month as GET /v1/spend and the admin show it."""

from datetime import date, datetime, time, timedelta
from datetime import timezone as dt_timezone
from decimal import Decimal
from typing import NamedTuple

from django.conf import settings
from django.db import connection

from billing.models import BudgetMonth, ReservationKind, ReservationState
from billing.months import next_month

SIX = Decimal("0.000001")


def money(value) -> str:
    return str(Decimal(value or 0).quantize(SIX))


def cap_of(client) -> Decimal:
    return client.monthly_cap_usd if client.monthly_cap_usd is not None else settings.BUDGET_MONTHLY_CAP_USD


# An attempt nobody could price, as a month counts it (GET /v1/spend, the admin, /metrics): its reservation
# was settled at its whole amount with no cost known, or is held for an attempt whose outcome nobody knows
# (Reservation.unpriced says both).
UNPRICED_ATTEMPT_SQL = f"r.kind = '{ReservationKind.ATTEMPT}' AND r.unpriced"

# Per model: what its settled attempts cost (an unpriced one counts at the whole reservation it kept),
# how many attempts reserved, and how many of those nobody could price.
_BY_MODEL_SQL = f"""
SELECT r.model,
       coalesce(sum(r.spent) FILTER (WHERE r.state = '{ReservationState.SETTLED}'), 0),
       count(*),
       count(*) FILTER (WHERE {UNPRICED_ATTEMPT_SQL})
  FROM billing_reservation r
 WHERE r.budget_id = %s AND r.kind = '{ReservationKind.ATTEMPT}'
 GROUP BY r.model ORDER BY r.model
"""


_UNFOLDED_SQL = f"""
SELECT coalesce(sum(coalesce(spent, 0)), 0), coalesce(sum(amount), 0) FROM billing_reservation
 WHERE budget_id = %s AND NOT folded AND state <> '{ReservationState.HELD}'
"""


def month_totals(budget: BudgetMonth | None) -> tuple[Decimal, Decimal]:
    """(spent, reserved) of a client month as they are now: the counters plus the reservations resolved
    since the last fold (billing.services, step 4). Read only."""
    if budget is None:
        return Decimal(0), Decimal(0)
    with connection.cursor() as cursor:
        cursor.execute(_UNFOLDED_SQL, [budget.id])
        unfolded_spent, unfolded_amount = cursor.fetchone()
    return budget.spent + unfolded_spent, budget.reserved - unfolded_amount


def month_spend(client, month: date) -> dict:
    """GET /v1/spend's answer for one client month (docs/api.md, "Spend: GET /v1/spend"): money as decimal strings, 6
    places."""
    budget = BudgetMonth.objects.filter(client_id=client.id, month=month).first()
    cap = cap_of(client)
    spent, reserved = month_totals(budget)
    by_model = []
    if budget is not None:
        with connection.cursor() as cursor:
            cursor.execute(_BY_MODEL_SQL, [budget.id])
            by_model = [{"model": model, "spent_usd": money(model_spent), "attempts": attempts,
                         "unpriced_attempts": unpriced}
                        for model, model_spent, attempts, unpriced in cursor.fetchall()]
    resets_at = datetime.combine(next_month(month), time(0), tzinfo=dt_timezone.utc)
    return {
        "month": f"{month:%Y-%m}",
        "resets_at": resets_at.isoformat().replace("+00:00", "Z"),
        "cap_usd": money(cap),
        "spent_usd": money(spent),
        "reserved_usd": money(reserved),
        "headroom_usd": money(max(cap - spent - reserved, Decimal(0))),
        "unpriced_attempts": sum(row["unpriced_attempts"] for row in by_model),
        "by_model": by_model,
    }


# --- the admin's spend page: many client months, and orders by product, each in one statement ------------

# The budget months the WHERE picks, each as month_totals and month_spend read it: the counters plus the
# reservations not folded yet (found by the partial index reservation_unfolded).
_TOTALS_SQL = f"""
WITH months AS (SELECT id, month, spent, reserved FROM billing_budgetmonth WHERE {{where}}),
unfolded AS (
    SELECT r.budget_id, sum(coalesce(r.spent, 0)) AS spent, sum(r.amount) AS amount
      FROM billing_reservation r
     WHERE r.budget_id IN (SELECT id FROM months) AND NOT r.folded AND r.state <> '{ReservationState.HELD}'
     GROUP BY r.budget_id){{unpriced_cte}}
SELECT m.id, m.month, m.spent + coalesce(u.spent, 0), m.reserved - coalesce(u.amount, 0), {{unpriced}}
  FROM months m LEFT JOIN unfolded u ON u.budget_id = m.id{{unpriced_join}}
"""

# ... and month_spend's count of attempts nobody could price, for all those months in one scan of their
# reservations (not one scan per month).
_UNPRICED_CTE = f""",
unpriced AS (
    SELECT r.budget_id, count(*) AS attempts
      FROM billing_reservation r
     WHERE r.budget_id IN (SELECT id FROM months) AND {UNPRICED_ATTEMPT_SQL}
     GROUP BY r.budget_id)"""


class MonthTotals(NamedTuple):
    month: date
    spent: Decimal
    reserved: Decimal
    unpriced_attempts: int


def budget_totals(*, ids=None, months: tuple[date, date] | None = None, client_id=None,
                  unpriced: bool = True) -> dict:
    """{budget month id: MonthTotals} as they are now (the figures month_totals and month_spend give one
    month at a time) for many months in one statement: the rows `ids`, or every month from months[0]
    through months[1], optionally of one client. Without `unpriced` (a chart needs only what was spent)
    the count is 0 and the months' settled reservations are not read at all."""
    where, params = [], []
    if ids is not None:
        where.append("id = ANY(%s)")
        params.append(list(ids))
    if months is not None:
        where.append("month BETWEEN %s AND %s")
        params.extend(months)
    if client_id is not None:
        where.append("client_id = %s")
        params.append(client_id)
    sql = _TOTALS_SQL.format(
        where=" AND ".join(where) or "true",
        unpriced_cte=_UNPRICED_CTE if unpriced else "",
        unpriced="coalesce(p.attempts, 0)" if unpriced else "0",
        unpriced_join=" LEFT JOIN unpriced p ON p.budget_id = m.id" if unpriced else "",
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return {row[0]: MonthTotals(*row[1:]) for row in cursor.fetchall()}


def clients_month_spend(month: date, *, client=None) -> list[dict]:
    """Every client with spend in `month` (or only `client`, spend or not), each as GET /v1/spend gives
    it: cap, spent, reserved, headroom, unpriced attempts (Decimals; `money` writes them as the API
    does). Two statements whatever the number of clients."""
    rows = BudgetMonth.objects.filter(month=month).select_related("client").order_by("client__name", "client_id")
    if client is not None:
        rows = rows.filter(client_id=client.id)
    rows = list(rows)
    if not rows and client is not None:
        rows = [BudgetMonth(client=client, month=month)]  # nothing reserved yet: all zeros, the whole cap free
    totals = budget_totals(ids=[row.id for row in rows if row.id is not None])
    nothing = MonthTotals(month, Decimal(0), Decimal(0), 0)
    spend = []
    for row in rows:
        figures = totals.get(row.id, nothing)
        cap = cap_of(row.client)
        spend.append({"client": row.client, "cap": cap, "spent": figures.spent, "reserved": figures.reserved,
                      "headroom": max(cap - figures.spent - figures.reserved, Decimal(0)),
                      "unpriced_attempts": figures.unpriced_attempts})
    return spend


def spend_by_month(last: date, *, count: int = 12, client_id=None) -> list[tuple[date, Decimal]]:
    """What was spent in each of the `count` months through `last` (every client's, or one's), oldest
    first, a month without spend as 0: the spend page's chart."""
    months = [last]
    while len(months) < count:
        months.insert(0, (months[0] - timedelta(days=1)).replace(day=1))
    spent = dict.fromkeys(months, Decimal(0))
    for figures in budget_totals(months=(months[0], last), client_id=client_id, unpriced=False).values():
        spent[figures.month] += figures.spent
    return list(spent.items())
