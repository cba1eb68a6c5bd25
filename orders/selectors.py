"""Reads of orders: what each product's orders, and each order's report, cost (the admin's spend page and
order list)."""

from datetime import datetime
from decimal import Decimal

from django.db import connection
from django.db.models import DecimalField, IntegerField
from django.db.models.expressions import RawSQL

from executor.selectors import UNPRICED_SQL
from orders.models import OrderStatus

SIX = Decimal("0.000001")

_BY_PRODUCT_SQL = f"""
SELECT o.product, count(*), count(*) FILTER (WHERE o.status = '{OrderStatus.PAID}'),
       count(*) FILTER (WHERE o.status = '{OrderStatus.DUPLICATE}'),
       coalesce(sum(cost.total), 0), coalesce(sum(cost.unpriced), 0)
  FROM orders_order o
  LEFT JOIN LATERAL (
      SELECT sum(a.cost_usd) AS total, count(*) FILTER (WHERE {UNPRICED_SQL}) AS unpriced
        FROM executor_attempt a WHERE a.job_id = o.job_id) cost ON true
 WHERE o.created_at >= %s AND o.created_at < %s {{client}}
 GROUP BY o.product ORDER BY o.product
"""


def orders_by_product(first: datetime, after: datetime, *, client_id=None) -> list[dict]:
    """Orders created in [first, after) by product: how many, paid and duplicate, and what their report
    jobs' attempts cost (priced ones summed; unpriced ones that may have been paid counted, as an order's
    own cost counts them). One statement; each order's attempts are found by their job's index."""
    sql = _BY_PRODUCT_SQL.format(client="AND o.client_id = %s" if client_id is not None else "")
    params = [first, after] + ([client_id] if client_id is not None else [])
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [{"product": product, "orders": orders, "paid": paid, "duplicate": duplicate,
                 "cost": Decimal(cost).quantize(SIX), "unpriced_attempts": unpriced}
                for product, orders, paid, duplicate, cost, unpriced in cursor.fetchall()]


def orders_with_cost(orders):
    """The orders with what each one's report job cost, as OrderAdmin once read it per row (public_attempts):
    `cost_total` (priced attempts, None with none) and `cost_unpriced`, computed in the list's own statement."""
    table = orders.model._meta.db_table
    return orders.annotate(
        cost_total=RawSQL(f"SELECT sum(a.cost_usd) FROM executor_attempt a WHERE a.job_id = {table}.job_id", (),
                          output_field=DecimalField(max_digits=12, decimal_places=6)),
        cost_unpriced=RawSQL(f"SELECT count(*) FROM executor_attempt a WHERE a.job_id = {table}.job_id"
                             f" AND {UNPRICED_SQL}", (), output_field=IntegerField()),
    )
