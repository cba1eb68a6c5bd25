"""A client's webhook endpoint and its signing secrets (Standard Webhooks `whsec_...`)."""

from django.db import models
from django.utils import timezone


class Endpoint(models.Model):
    """Where a client's events go when a job names no `webhook_url` of its own."""

    client = models.OneToOneField("jobs.Client", on_delete=models.CASCADE, related_name="webhook_endpoint")
    url = models.CharField(max_length=2048, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self):
        return self.url or f"(no default URL) for {self.client_id}"


class SigningSecret(models.Model):
    """A signing secret. The newest one signs; during a rotation the previous one signs too until it
    expires, so receivers can switch without missing a verification."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="secrets")
    secret = models.CharField(max_length=100)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    DEAD = "dead"


class Delivery(models.Model):
    """The transactional outbox: one row per event, written in the same transaction as the state change
    it reports, so an event exists if and only if the state changed (DESIGN.md, section 5).

    The id `{job_id}:{run}:{event}` is the `webhook-id` of every try; inserting it again does nothing.
    `envelope` keeps the exact bytes that are signed and sent.
    """

    id = models.CharField(primary_key=True, max_length=200)
    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="deliveries")
    client = models.ForeignKey("jobs.Client", on_delete=models.CASCADE, related_name="deliveries")
    run = models.PositiveIntegerField()
    event = models.CharField(max_length=64)
    # The job's own webhook_url; empty means the client's endpoint URL as it is when the row is sent, so
    # fixing a client's broken endpoint reaches the deliveries waiting for it.
    url = models.CharField(max_length=2048, blank=True, default="")
    envelope = models.TextField()
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["next_attempt_at"], name="delivery_due", condition=models.Q(status="pending")),
        ]
        verbose_name_plural = "deliveries"

    def __str__(self):
        return self.id
