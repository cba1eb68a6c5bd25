"""The tenant: a client and its API keys, the floor of the stack (docs/architecture.md). Every other app
points down at these rows, in imports, foreign keys and raw SQL alike.

The tables keep the names they had when the models lived in `jobs` (`jobs_client`, `jobs_clientapikey`):
the models moved by state alone (accounts/migrations/0001_initial.py), so no row, key or constraint moved
with them."""

import uuid

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone
from rest_framework_api_key.models import AbstractAPIKey


class Client(models.Model):
    """A team that submits jobs. Authenticated by `ClientAPIKey`; sees only its own jobs."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200)
    # The budget cap per month (billing reads it); null means BUDGET_MONTHLY_CAP_USD.
    monthly_cap_usd = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    # Creates per second, a token bucket (jobs.api.limits); null means CLIENT_CREATES_PER_S and
    # CLIENT_CREATE_BURST, a rate of 0 no limit.
    creates_per_s = models.DecimalField(
        max_digits=9, decimal_places=3, null=True, blank=True, validators=[MinValueValidator(0)],
        help_text="POST /v1/jobs per second, on average; blank: CLIENT_CREATES_PER_S; 0: no limit.")
    create_burst = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(1_000_000)],
        help_text="Creates taken at once before the rate applies; blank: CLIENT_CREATE_BURST.")
    # Fair dispatch (jobs.dispatch; docs/api.md, "Limits"): jobs of this client in progress at once (null:
    # CLIENT_MAX_RUNNING; 0: no limit), and its share of the rotation against other clients with ready work.
    max_running = models.PositiveIntegerField(
        null=True, blank=True, validators=[MaxValueValidator(1_000_000)],
        help_text="Jobs in progress at once (a render waiting on its provider holds none); blank: "
                  "CLIENT_MAX_RUNNING; 0: no limit.")
    weight = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="Its share of the rotation: a client of weight 3 starts 3 jobs for each one of a client of "
                  "weight 1 while both have work waiting.")
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    # A Client is what DRF's request.user is for API calls (jobs.api.auth).
    is_authenticated = True
    is_anonymous = False

    class Meta:
        db_table = "jobs_client"  # its name from when it lived in jobs: the move touched no table

    def __str__(self):
        return f"{self.name} ({self.id})"


class ClientAPIKey(AbstractAPIKey):
    """An API key, shown once and stored as a SHA-512 hash (djangorestframework-api-key)."""

    client = models.ForeignKey(Client, on_delete=models.CASCADE, related_name="api_keys")

    class Meta(AbstractAPIKey.Meta):
        db_table = "jobs_clientapikey"  # as Client's: the name it had in jobs
        verbose_name = "client API key"
        verbose_name_plural = "client API keys"
