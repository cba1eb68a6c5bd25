"""The executor's record of money spent: one `Attempt` row per attempt, written as it happens."""

from django.db import models
from django.db.models import Q
from django.utils import timezone

from config import conditions

# The names the attempt runner catches (executor.record.intend): each is a race it loses on purpose.
ATTEMPT_NUMBER_CONSTRAINT = "attempt_job_number"
ONE_OUT_PER_RUN_CONSTRAINT = "attempt_one_out_per_run"
# What an attempt's output_url says once its inline bytes are in the store: `stored:<the job's output key>`.
STORED_OUTPUT = "stored:"


class AttemptState(models.TextChoices):
    SUBMITTING = "submitting"  # intent: committed with its upstream key before the call goes out
    RUNNING = "running"  # the provider accepted it (and charged, where it charges on acceptance)
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # a definite end: refused, rate-limited, accepted then failed, given up
    UNCERTAIN = "uncertain"  # it may or may not have been accepted, and nothing can tell: a person decides


class Paid(models.TextChoices):
    """Whether an attempt was paid, as the API shows it (an attempt's `paid`)."""

    YES = "yes"  # the provider accepted it, or it records a cost
    UNKNOWN = "unknown"  # nobody knows whether a send landed: uncertain, or still submitting after a send
    NO = "no"  # refused before it was accepted, or never sent


# The one definition of "paid": each answer's condition, the first that holds wins, else Paid.NO. Read
# three ways from here (config.conditions): by Attempt.paid in Python, by executor.selectors.PAID_SQL in
# the raw statements that show attempts, and by the ORM (executor.render counts paid failures with
# PAID_YES). tests/executor/test_paid.py checks the three agree on every combination of the columns.
PAID_YES = Q(accepted_at__isnull=False) | Q(cost_usd__isnull=False)
PAID_UNKNOWN = Q(state=AttemptState.UNCERTAIN) | Q(state=AttemptState.SUBMITTING, sends__gt=0)
PAID_WHEN = ((Paid.YES, PAID_YES), (Paid.UNKNOWN, PAID_UNKNOWN))


class Attempt(models.Model):
    """One attempt to have a provider do a job's work, under the upstream key payonce-{job}-{number}.

    The number grows only after a definite end or a person's (or a rule's) decision to pay again; an
    unknown outcome sends the same key again (`sends` counts how often it went out).
    """

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="attempts")
    run = models.PositiveIntegerField()
    # The step of the run that owns the attempt: `submit` for a media render; a report's chapters each
    # have their own, so they may each have an attempt out at once.
    step = models.CharField(max_length=200, default="submit")
    number = models.PositiveIntegerField()
    provider = models.CharField(max_length=50)
    model = models.CharField(max_length=200)
    upstream_key = models.CharField(max_length=200)
    upstream_id = models.CharField(max_length=200, blank=True, default="")
    state = models.CharField(max_length=16, choices=AttemptState.choices, default=AttemptState.SUBMITTING)
    error_class = models.CharField(max_length=32, null=True, blank=True)
    error = models.TextField(null=True, blank=True)  # the provider's own words
    # What went out (a render's prompt, params and metadata; an LLM call's system, messages, max_tokens and
    # metadata): kept so a resend is byte-for-byte the same request. Nothing the provider answered.
    request = models.JSONField(default=dict)
    # The provider's ids for the references uploaded before the first send (null: not uploaded yet): a
    # resend of the key refers to the same ones.
    uploaded_inputs = models.JSONField(null=True, blank=True)
    # Where the finished work is. Set while `running`, it came with the submit's answer (the provider
    # answered with the finished work: nothing to poll for). Bytes a provider answered in its body are
    # kept here as a `data:` URL (paid for: a crash before the store write must not lose them) until the
    # store holds them; then only STORED_OUTPUT and the key (executor.services.media_stored).
    output_url = models.TextField(null=True, blank=True)
    # The model as the attempt went out with it (executor.registry.ModelSpec.snapshot: provider, kind,
    # content type, capabilities), written with its intent: it is waited on, cancelled, resolved and stored
    # by what it was sent as, whatever the catalog says later (a model disabled or removed while its
    # renders are out strands none of them). Null: an attempt written before it was kept, or never sent.
    spec = models.JSONField(null=True, blank=True)
    sends = models.PositiveIntegerField(default=0)
    # The HTTP status the provider answered the latest send with; null while it is out, or when no
    # answer came (a transport error, a crash): a send with no answer may still land.
    last_status = models.PositiveSmallIntegerField(null=True, blank=True)
    # Polls of the accepted attempt that failed in a row (they back off inside the attempt's deadline).
    poll_errors = models.PositiveIntegerField(default=0)
    # A text call's answer, kept with the attempt that paid for it: a step that crashed after the call
    # and before it saved the text reads it back here instead of paying again.
    answer = models.TextField(null=True, blank=True)
    usage = models.JSONField(null=True, blank=True)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    cost_source = models.CharField(max_length=16, null=True, blank=True)  # quoted, derived or local
    created_at = models.DateTimeField(default=timezone.now)
    submitted_at = models.DateTimeField(null=True, blank=True)  # the latest send
    accepted_at = models.DateTimeField(null=True, blank=True)
    # How long the provider said the work would take from acceptance: the first poll waits this long.
    expected_s = models.FloatField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # A definite failure that allows another try says when: back-off with jitter, or the Retry-After.
    retry_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            # One attempt per number, whatever the provider: the number is the upstream key
            # payonce-{job}-{n}, so two attempts with one number would be two decisions to pay under one
            # key. Two executions deciding to pay at once race on it; the loser sends nothing.
            models.UniqueConstraint(fields=["job", "number"], name=ATTEMPT_NUMBER_CONSTRAINT),
            # At most one attempt of a run's step out at a time (submitting or running): a second
            # execution that decided to pay while the first one's attempt is out loses here, before it
            # sends anything.
            models.UniqueConstraint(
                fields=["job", "run", "step"], name=ONE_OUT_PER_RUN_CONSTRAINT,
                condition=Q(state__in=[AttemptState.SUBMITTING, AttemptState.RUNNING]),
            ),
        ]
        indexes = [
            # A provider's callback names its generation: the doorbell finds the attempt by it.
            models.Index(fields=["provider", "upstream_id"], name="attempt_upstream_id"),
            # The uncertain attempts, few: the age of the oldest one waiting for a person (operators.metrics).
            models.Index(fields=["finished_at"], name="attempt_uncertain", condition=Q(state=AttemptState.UNCERTAIN)),
            # The attempts in flight, by provider and model: a limit of calls in flight counts them
            # (executor.in_flight), at most its N rows, whatever the table's size.
            models.Index(fields=["provider", "model"], name="attempt_in_flight",
                         condition=Q(state__in=[AttemptState.SUBMITTING, AttemptState.RUNNING])),
        ]
        ordering = ["number"]

    def __str__(self):
        return f"{self.upstream_key} {self.provider}/{self.model} ({self.state})"

    @property
    def paid(self) -> Paid:
        """As the API shows it: PAID_WHEN, evaluated on this instance."""
        return next((answer for answer, condition in PAID_WHEN if conditions.holds(condition, self)), Paid.NO)

    @property
    def model_name(self) -> str:
        return f"{self.provider}/{self.model}"


class ModelKind(models.TextChoices):
    VIDEO = "video"
    IMAGE = "image"
    TEXT = "text"  # a report's synthesis and chapters


class ModelConfig(models.Model):
    """A model added or overridden by an operator in the admin (executor.registry): over the code's models
    and the models file's, field by field. A blank field keeps what the layer below says of the model; a
    model no layer below knows needs its provider and kind. Its price is billing's (the rate card's
    override, edited on the same admin page)."""

    name = models.CharField(max_length=200, unique=True, help_text="provider/model, as a job names it")
    enabled = models.BooleanField(default=True, help_text="Off: a job naming the model is refused (422).")
    provider = models.CharField(max_length=40, blank=True, default="", help_text="The adapter; blank: as below.")
    kind = models.CharField(max_length=8, choices=ModelKind.choices, blank=True, default="")
    content_type = models.CharField(max_length=100, blank=True, default="")
    # Capabilities stated here, over the provider's: {"idempotency_key": true, "key_ttl_s": 86400, "lookup":
    # false, "asynchronous": true, "cancel": true, "callbacks": true, "unpaid_statuses": [429, 503],
    # "window_s": 1800, "resubmit_uncertain": false}; a key not stated is the provider's.
    capabilities = models.JSONField(null=True, blank=True)
    # The parameters a media job's input may carry: [{"name", "type": number|integer|string, "minimum",
    # "maximum", "nullable", "choices"}]; "any" takes anything unchecked; null: as below.
    params = models.JSONField(null=True, blank=True)
    note = models.CharField(max_length=300, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "model"

    def __str__(self):
        return self.name
