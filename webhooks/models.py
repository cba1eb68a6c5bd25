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
