"""Billing owns the rate card's overrides, the budget of each client month and every reservation against
it (docs/design.md, "Money: cost, the rate card and the cap"). The cost of each attempt is the executor's record
(executor.Attempt); billing prices it and keeps the money it may still cost reserved until it is known.
"""


from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

BUDGET_MONTH_CONSTRAINT = "budget_client_month"
RESERVATION_KEY_CONSTRAINT = "reservation_key"
MODEL_PRICE_STATES_AMOUNT = "model_price_states_amount"


class PriceUnit(models.TextChoices):
    RENDER = "render"
    IMAGE = "image"
    SECOND = "second"


class ModelPrice(models.Model):
    """An override of the rate card in code (billing.rates), edited in the admin beside the model's own
    configuration (its Models page): one row per `provider/model`. Token prices are dollars per million
    tokens; media is priced per unit, or per unit by its parameters (`variants`)."""

    model = models.CharField(max_length=200, unique=True, help_text="provider/model, e.g. openai/gpt-4.1-mini")
    free = models.BooleanField(default=False, help_text="A model that costs nothing (a local server): priced 0.")
    input_per_mtok_usd = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    output_per_mtok_usd = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    cache_write_per_mtok_usd = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    cache_read_per_mtok_usd = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    per_unit_usd = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    unit = models.CharField(max_length=16, choices=PriceUnit.choices, blank=True, default="")
    # A unit price that depends on the job's parameters (an image's size and quality): {"by": [names],
    # "prices": {"value,value": "0.25"}, "defaults": {name: value}} (billing.rates.variant_price).
    variants = models.JSONField(null=True, blank=True)
    note = models.CharField(max_length=300, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(Q(input_per_mtok_usd__isnull=True) | Q(input_per_mtok_usd__gte=0))
                & (Q(output_per_mtok_usd__isnull=True) | Q(output_per_mtok_usd__gte=0))
                & (Q(cache_write_per_mtok_usd__isnull=True) | Q(cache_write_per_mtok_usd__gte=0))
                & (Q(cache_read_per_mtok_usd__isnull=True) | Q(cache_read_per_mtok_usd__gte=0))
                & (Q(per_unit_usd__isnull=True) | Q(per_unit_usd__gte=0)),
                name="model_price_not_negative",
            ),
            # An override states a price: free, a unit price (or a table of them), or input and output per
            # million tokens. One with no amount (the admin's form once saved one: "$None per image") made
            # its model's jobs reserve the penalty tier and record their cost as unpriced; no path (the
            # form, a service, a hand-written row) can write one now.
            models.CheckConstraint(
                condition=Q(free=True) | Q(per_unit_usd__isnull=False) | Q(variants__isnull=False)
                | (Q(input_per_mtok_usd__isnull=False) & Q(output_per_mtok_usd__isnull=False)),
                name=MODEL_PRICE_STATES_AMOUNT,
            ),
        ]
        verbose_name = "rate card override"

    def __str__(self):
        return self.model


class BudgetMonth(models.Model):
    """A client's UTC calendar month: what was spent and what is reserved. The invariant the guard keeps
    is `spent + reserved <= cap` (the client's monthly_cap_usd, else BUDGET_MONTHLY_CAP_USD).

    The counters are conservative between folds: a reservation that was settled or released keeps its
    whole amount in `reserved` until it is folded (billing.services.fold), when its actual cost moves to
    `spent`. So `spent + reserved` here is never less than the truth, and the truth (what GET /v1/spend
    shows) is these counters plus the unfolded reservations (billing.selectors.month_totals)."""

    client = models.ForeignKey("accounts.Client", on_delete=models.PROTECT, related_name="budget_months")
    month = models.DateField(help_text="The first day of the UTC month.")
    spent = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    reserved = models.DecimalField(max_digits=12, decimal_places=6, default=0)

    class Meta:
        constraints = [
            # One row per client month: the row every reservation of that month locks (billing.services).
            models.UniqueConstraint(fields=["client", "month"], name=BUDGET_MONTH_CONSTRAINT),
            models.CheckConstraint(condition=Q(spent__gte=0) & Q(reserved__gte=0), name="budget_not_negative"),
        ]
        ordering = ["-month"]

    def __str__(self):
        return f"{self.client_id} {self.month:%Y-%m}"


class ReservationKind(models.TextChoices):
    ATTEMPT = "attempt"  # one paid call, keyed by its upstream key
    FANOUT = "fanout"  # the pre-flight of parallel units: a pool they draw from


class ReservationState(models.TextChoices):
    HELD = "held"  # counted in `reserved`
    SETTLED = "settled"  # moved to `spent` (its actual cost, or all of it when nobody could price it)
    RELEASED = "released"  # given back: the provider did not charge, or a pool's remainder


class Reservation(models.Model):
    """Money held against a client month until it is known. Settled or released exactly once: every
    change is conditional on `held`."""

    key = models.CharField(max_length=255)
    # No foreign-key trigger on the hot path: every reservation takes its budget_id from the month row the
    # same statement locked and returned (billing.services), so it cannot name a month that is not there.
    budget = models.ForeignKey(BudgetMonth, on_delete=models.PROTECT, related_name="reservations",
                               db_constraint=False)
    # No constraint and no index on the job: a reservation is money on the record and outlives whatever
    # happens to the job's row, and its hot path (reserve, settle) pays for neither (bench/budget.py).
    job = models.ForeignKey("jobs.Job", on_delete=models.DO_NOTHING, related_name="reservations",
                            db_constraint=False, db_index=False)
    kind = models.CharField(max_length=16, choices=ReservationKind.choices, default=ReservationKind.ATTEMPT)
    model = models.CharField(max_length=200, blank=True, default="")
    # Held: what is reserved now (a pool's shrinks as its units draw). Settled or released: what was.
    amount = models.DecimalField(max_digits=12, decimal_places=6)
    state = models.CharField(max_length=16, choices=ReservationState.choices, default=ReservationState.HELD)
    # What moved to `spent` when it settled.
    spent = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    # Nobody could price it: settled, all of it moved to `spent`; held, its attempt's outcome is unknown and
    # it waits for a person (billing.services.hold_unpriced). Either way a month counts it as unpriced.
    unpriced = models.BooleanField(default=False)
    # A unit's reservation drawn from its fan-out's pool (nothing more was reserved for it).
    parent = models.ForeignKey("self", on_delete=models.PROTECT, null=True, blank=True, related_name="draws",
                               db_index=False)
    # Settled or released, and its money moved into the month's counters (BudgetMonth's docstring).
    folded = models.BooleanField(default=False, db_default=False)
    created_at = models.DateTimeField(default=timezone.now)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # One reservation per attempt (its upstream key) or per fan-out: reserving again reserves nothing.
            models.UniqueConstraint(fields=["key"], name=RESERVATION_KEY_CONSTRAINT),
            models.CheckConstraint(condition=Q(amount__gte=0), name="reservation_not_negative"),
        ]
        indexes = [
            # What a fold reads: the month's reservations not folded yet (those in flight, and those
            # resolved since the last fold: few, whatever the month's size). Its predicate is `folded`
            # alone, so settling or releasing (which changes `state`, no indexed column) is a HOT update
            # of the row (the table keeps room on its pages: migration 0002).
            models.Index(fields=["budget"], name="reservation_unfolded", condition=Q(folded=False)),
        ]

    def __str__(self):
        return f"{self.key} {self.amount} ({self.state})"


PRICE_DRIFT_MODEL_CONSTRAINT = "price_drift_model"


class PriceDrift(models.Model):
    """A model whose attempts settle above what was reserved for them: the rate card (a price, or `free`)
    says less than the provider charges (docs/design.md, "The cap holds whatever the price says").

    Written by the settle that first shows it, in the same statement (billing.services): from that commit
    on, every reservation of the model is taken at no less than `highest_cost_usd` (the reservation's own
    statement reads it), so a wrong price lets a client's spend past its cap by at most the calls that
    were already in flight when the drift was first seen. It holds until an operator clears it (with the
    billing permission, audited) or PRICE_DRIFT_HOLD_S after it was last seen."""

    model = models.CharField(max_length=200)
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    # The attempt that showed it first: what was reserved for it, and what it cost.
    reserved_usd = models.DecimalField(max_digits=12, decimal_places=6)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6)
    # The highest settled cost of the model since: the least its next reservations are taken at.
    highest_cost_usd = models.DecimalField(max_digits=12, decimal_places=6)
    drifts = models.PositiveIntegerField(default=1)  # settles above their reservation since first seen
    cleared_at = models.DateTimeField(null=True, blank=True)
    cleared_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        constraints = [
            # One row per model: the settle's upsert and every reservation's floor read it by name.
            models.UniqueConstraint(fields=["model"], name=PRICE_DRIFT_MODEL_CONSTRAINT),
        ]
        ordering = ["-last_seen_at"]
        verbose_name = "price drift"

    def __str__(self):
        return f"{self.model}: reserved {self.reserved_usd}, cost up to {self.highest_cost_usd}"

    @property
    def holds(self) -> bool:
        """Whether it still raises the model's reservations (the same rule as billing.services' floor)."""
        age_s = (timezone.now() - self.last_seen_at).total_seconds()
        return self.cleared_at is None and age_s < settings.PRICE_DRIFT_HOLD_S
