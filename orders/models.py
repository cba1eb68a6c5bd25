"""Paid orders: a payment id from the payment provider becomes one report job, never two
(docs/design.md, "Orders")."""

import uuid

from django.db import models
from django.db.models import Q
from django.utils import timezone


class OrderStatus(models.TextChoices):
    PAID = "paid"  # a payment that makes a report
    DUPLICATE = "duplicate"  # a second payment for the same run and product: no report, the link again


ORDER_PAYMENT_CONSTRAINT = "order_client_payment"
ORDER_ONE_PAID_CONSTRAINT = "order_one_paid_per_run_product"


class Order(models.Model):
    """A paid order (docs/design.md, "Orders"): a payment id from the payment provider, the run it pays for
    and the product. One payment id is one order (a replay is the same order); one run and product is
    one report (a second payment for them is recorded as a duplicate and makes nothing)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    client = models.ForeignKey("accounts.Client", on_delete=models.PROTECT, related_name="orders")
    payment_id = models.CharField(max_length=255)
    run_id = models.CharField(max_length=255)
    product = models.CharField(max_length=100)
    input = models.JSONField()
    email = models.CharField(max_length=254)
    request_hash = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=OrderStatus.choices)
    job = models.OneToOneField("jobs.Job", on_delete=models.PROTECT, null=True, blank=True, related_name="order")
    duplicate_of = models.ForeignKey("self", on_delete=models.PROTECT, null=True, blank=True, related_name="duplicates")
    # A duplicate's email with the existing link: when it went, and to whom. Always the paid order's
    # email (the buyer of record), never the address the duplicate names (`email`, kept as given): a
    # personal report link goes only to the person it was made for.
    mailed_at = models.DateTimeField(null=True, blank=True)
    mailed_to = models.CharField(max_length=254, blank=True, default="", db_default="", verbose_name="link mailed to")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # A replayed webhook of the payment provider is the same order (orders.services.order_create).
            models.UniqueConstraint(fields=["client", "payment_id"], name=ORDER_PAYMENT_CONSTRAINT),
            # One report per run and product: a second payment for them, even racing the first, is a
            # duplicate (7 payments for one run once made 7 reports at 7 times the cost: seed 001).
            models.UniqueConstraint(fields=["client", "run_id", "product"], name=ORDER_ONE_PAID_CONSTRAINT,
                                    condition=Q(status=OrderStatus.PAID)),
        ]
        # Re-running an order's report starts a new run, which pays again: a permission of its own (operators.admin).
        permissions = [("rerun_order", "Can re-run orders' reports (pays again)")]
        ordering = ["-created_at"]

    def __str__(self):
        return f"order {self.payment_id} ({self.status})"
