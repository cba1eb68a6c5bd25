"""The operators' audit record: one row per action an operator took from the admin or the CLI."""

import uuid

from django.db import models
from django.db.models import Q
from django.utils import timezone


class OperatorActionKind(models.TextChoices):
    CANCEL = "cancel"  # end open jobs (jobs.services.job_cancel)
    RETRY = "retry"  # a person's decision to pay again (jobs.services.job_retry)
    REPLAY = "replay"  # send a job's deliveries again, same webhook-id (nothing is paid)
    RERUN = "rerun"  # an order's report run again: its done chapters are kept, the rest are paid again
    REPLAY_DEAD = "replay_dead"  # dead letters sent again
    PRICE = "price"  # a model's price (or `free`) changed on the admin's Models page: a billing decision
    DRIFT_CLEAR = "drift_clear"  # a model's price drift cleared: its reservations go back to the rate card's
    # A report template's `live` label moved (jobs.kinds.report.templates.version_set_live): the orders and jobs
    # accepted from then on are written from another version; those accepted before keep theirs.
    TEMPLATE_LIVE = "template_live"


def action_kinds() -> list[tuple[str, str]]:
    """The audit row's kinds, as its `action` field's choices. A callable, so that the migrations name it
    rather than copy its list: a new kind (a new row of operators.actions) needs no migration."""
    return OperatorActionKind.choices


class OperatorAction(models.Model):
    """The audit row of an operator's action from the admin or the CLI (operators.operations): who, when,
    what, over which jobs, how many, why. Written before the action starts (so an action cut short by a
    crash still shows), and finished with what it did."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    action = models.CharField(max_length=16, choices=action_kinds)
    who = models.CharField(max_length=150)  # the admin user, or the CLI's --who (default: the OS user)
    via = models.CharField(max_length=16)  # "admin" or "cli"
    # What was acted on, as the operator chose it: the filter (status=failed, month=2026-10 ...) or ids.
    target = models.TextField()
    reason = models.TextField()
    matched = models.PositiveIntegerField()  # rows the target matched when the action started
    acted = models.PositiveIntegerField(default=0)  # rows the action changed (the others were skipped)
    # The preview the operator confirmed (counts, the worst case a retry reserves) and the first ids.
    detail = models.JSONField(default=dict)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # A bulk action without a why is refused by the database too, not only by the form.
            models.CheckConstraint(condition=~Q(reason=""), name="operator_action_reason_required"),
        ]
        indexes = [models.Index(fields=["-started_at"], name="operator_action_started")]
        ordering = ["-started_at"]

    def __str__(self):
        return f"{self.action} x{self.acted} by {self.who} at {self.started_at:%Y-%m-%d %H:%M}"


class ReadinessMark(models.Model):
    """The row /readyz writes to prove PostgreSQL accepts a write (operators.probes). A fixed number of
    slots (probes.SLOTS), each `web` process writing the one its host and pid hash to: the table never
    grows, whatever the number of processes over time, and probes of different processes rarely meet
    on one row (and when they do, an autocommitted upsert holds its row lock for microseconds)."""

    slot = models.PositiveSmallIntegerField(primary_key=True)
    marked_at = models.DateTimeField()
