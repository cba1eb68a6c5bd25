"""Webhooks: a client's endpoint and signing secrets, the delivery outbox, and one row per try."""

from django.db import models
from django.utils import timezone


class Endpoint(models.Model):
    """Where a client's events go when a job names no `webhook_url` of its own."""

    client = models.OneToOneField("accounts.Client", on_delete=models.CASCADE, related_name="webhook_endpoint")
    url = models.CharField(max_length=2048, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    # A receiver that answers 410 Gone has said it wants nothing more: its deliveries wait (visible in
    # the admin) until an operator enables it again.
    disabled_at = models.DateTimeField(null=True, blank=True)
    disabled_reason = models.CharField(max_length=300, blank=True, default="")

    def __str__(self):
        return self.url or f"(no default URL) for {self.client_id}"


class SigningSecret(models.Model):
    """A signing secret (`whsec_` + base64 of 32 random bytes). Every secret that has not expired signs:
    after a rotation the old one keeps signing for 24 hours, so a receiver can switch without missing a
    verification (two signatures in the header)."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="secrets")
    secret = models.CharField(max_length=100)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.secret[:10]}... ({'expires ' + str(self.expires_at) if self.expires_at else 'current'})"


class WebhookEvent(models.TextChoices):
    """Every event a client's endpoint is sent (the envelope's `type`, the last part of its `webhook-id`):
    docs/api.md, "Webhooks", names the same ones (tests/webhooks/test_event_names.py holds them to each
    other). Not the `choices` of Delivery.event: the column stays as its migrations made it."""

    SUCCEEDED = "generation.succeeded"
    FAILED = "generation.failed"
    CANCELLED = "generation.cancelled"
    NEEDS_REVIEW = "generation.needs_review"  # the job waits for a person (an uncertain submit)


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    DEAD = "dead"


class Delivery(models.Model):
    """The transactional outbox: one row per event, written in the same transaction as the state change
    it reports, so an event exists if and only if the state changed
    (docs/design.md, "Webhooks: at least once, never blocking paid work").

    The id `{job_id}:{run}:{event}` is the `webhook-id` of every try; inserting it again does nothing.
    `envelope` keeps the exact bytes that are signed and sent, on every try and every replay.
    `next_attempt_at` is when the row is due, and, once a drainer or a dispatcher has taken it, its lease:
    pushed out while a try is under way, so no two processes send the row at once.
    """

    id = models.CharField(primary_key=True, max_length=200)
    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="deliveries")
    client = models.ForeignKey("accounts.Client", on_delete=models.CASCADE, related_name="deliveries")
    run = models.PositiveIntegerField()
    event = models.CharField(max_length=64)
    # The job's own webhook_url; empty means the client's endpoint URL as it is when the row is sent, so
    # fixing a client's broken endpoint reaches the deliveries waiting for it.
    url = models.CharField(max_length=2048, blank=True, default="")
    envelope = models.TextField()
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)  # tries, all time
    # Tries since the row was created or last replayed: the position in WEBHOOK_RETRY_SCHEDULE.
    schedule_position = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)
    # The trace of the job's run it reports (jobs.Job.trace_context): each try is a span of that trace.
    trace_context = models.CharField(max_length=55, null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["next_attempt_at"], name="delivery_due", condition=models.Q(status="pending")),
            models.Index(fields=["status", "created_at"], name="delivery_status_created"),
        ]
        verbose_name_plural = "deliveries"
        # Replaying (a delivery, a dead letter, a job's deliveries) sends a stored envelope again: an action
        # of its own, not implied by reading deliveries (operators.admin.webhooks, operators.admin.jobs).
        permissions = [("replay_delivery", "Can replay webhook deliveries (the stored envelope, same webhook-id)")]

    def __str__(self):
        return self.id


class DeliveryAttempt(models.Model):
    """One try of a delivery: when, how long, what came back (the body cut to 20 kB), or what failed."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="tries")
    number = models.PositiveIntegerField()
    attempted_at = models.DateTimeField(default=timezone.now)
    webhook_timestamp = models.BigIntegerField()
    url = models.CharField(max_length=2048)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    response_body = models.TextField(blank=True, default="")
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["number"]
        constraints = [models.UniqueConstraint(fields=["delivery", "number"], name="delivery_attempt_number")]

    def __str__(self):
        return f"{self.delivery_id} try {self.number}: {self.status_code or self.error[:40]}"


class DeadLetter(Delivery):
    """A delivery that ran out of tries (status `dead`), for the operators' dead letters admin: the same
    rows, listed on their own (operators.admin.webhooks.DeadLetterAdmin keeps only the dead ones)."""

    class Meta:
        proxy = True
        verbose_name = "dead letter"
        verbose_name_plural = "dead letters"
