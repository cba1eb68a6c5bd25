"""Reads of what was spent: a client's month as GET /v1/spend and the admin show it."""

from datetime import date, datetime, time, timezone as dt_timezone
from decimal import Decimal

from django.conf import settings
from django.db import connection

from billing.models import BudgetMonth, ReservationKind, ReservationState
from billing.services import next_month
from executor.models import AttemptState

SIX = Decimal("0.000001")


def money(value) -> str:
    return str(Decimal(value or 0).quantize(SIX))


def cap_of(client) -> Decimal:
    return client.monthly_cap_usd if client.monthly_cap_usd is not None else settings.BUDGET_MONTHLY_CAP_USD


# Per model: what its settled attempts cost (an unpriced one counts at the whole reservation it kept),
# how many attempts reserved, and how many of those nobody could price: settled unpriced, or held for
# an attempt whose outcome is unknown.
_BY_MODEL_SQL = f"""
SELECT r.model,
       coalesce(sum(r.spent) FILTER (WHERE r.state = '{ReservationState.SETTLED}'), 0),
       count(*),
       count(*) FILTER (WHERE (r.state = '{ReservationState.SETTLED}' AND r.unpriced)
                           OR (r.state = '{ReservationState.HELD}' AND a.state = '{AttemptState.UNCERTAIN}'))
  FROM billing_reservation r
  LEFT JOIN executor_attempt a ON a.upstream_key = r.key
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
    """GET /v1/spend's answer for one client month (API.md): money as decimal strings, 6 places."""
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
