"""The Models page: the models payonce knows, added or overridden without a release (executor.registry),
each with its price (the rate card's override, billing.rates) on the same form, and its price drift when
one holds (billing.models.PriceDrift); and the price drifts' own list, where an operator clears one.

A row states only what it changes: a blank field keeps what the code and the models file say of the
model. The form refuses what the catalog would refuse, by the models file's own validator
(registry.check_entry), so a wrong row is refused where it is written, never at a job's submit. Every
process reads a saved row, and its price, within MODELS_CACHE_S; this one at once.

A price (and `free`) is money: editing it needs billing.change_modelprice, beside the model's own
permission, and a reason; each change leaves an audit row with the price before and after
(operators.operations.price_set). Without the billing permission the price fields are shown, not edited.
"""

from dataclasses import dataclass

from django import forms
from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html
from urllib.parse import urlencode

from billing import rates
from billing.models import ModelPrice, PriceDrift, PriceUnit
from executor import registry
from executor.models import ModelConfig
from operators import adminkit, operations

PRICE_PERMISSION = "billing.change_modelprice"

_PRICE_FIELDS = ("free", "input_per_mtok_usd", "output_per_mtok_usd", "cache_write_per_mtok_usd",
                 "cache_read_per_mtok_usd", "per_unit_usd", "unit", "variants")
_AMOUNT = dict(max_digits=12, decimal_places=6, min_value=0, required=False)


class ModelConfigForm(forms.ModelForm):
    price_override = forms.BooleanField(
        required=False, label="Override the price",
        help_text="Off: the models file's price, else the code's rate card (unknown: the penalty tier).")
    free = forms.BooleanField(required=False, help_text="Costs nothing (a local server): priced 0.")
    input_per_mtok_usd = forms.DecimalField(**_AMOUNT, label="Input, $ per million tokens")
    output_per_mtok_usd = forms.DecimalField(**_AMOUNT, label="Output, $ per million tokens")
    cache_write_per_mtok_usd = forms.DecimalField(**_AMOUNT, label="Cache write, $ per million tokens")
    cache_read_per_mtok_usd = forms.DecimalField(**_AMOUNT, label="Cache read, $ per million tokens")
    per_unit_usd = forms.DecimalField(**_AMOUNT, label="$ per unit")
    unit = forms.ChoiceField(choices=[("", "-")] + list(PriceUnit.choices), required=False)
    variants = forms.JSONField(required=False, help_text='A unit price by parameters: {"by": ["quality", "size"], '
                               '"prices": {"high,1024x1024": "0.167"}, "defaults": {"size": "1024x1024"}}.')
    price_reason = forms.CharField(required=False, max_length=500, label="Why the price changes",
                                   help_text="Required when the price changes: kept on the audit row.")
    # Whether this request may edit the price (billing.change_modelprice): set by ModelConfigAdmin.get_form.
    price_editable = True

    class Meta:
        model = ModelConfig
        fields = ("name", "enabled", "provider", "kind", "content_type", "capabilities", "params", "note")
        help_texts = {
            "capabilities": 'Over the provider\'s, e.g. {"key_ttl_s": 86400, "unpaid_statuses": [429, 503]}.',
            "params": 'e.g. [{"name": "size", "type": "string", "choices": ["1024x1024"]}, '
                      '{"name": "steps", "type": "integer", "minimum": 1, "maximum": 50}], or "any".',
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        name = self.instance.name if self.instance.pk else None
        price = ModelPrice.objects.filter(model=name).first() if name else None
        if price is not None:
            self.initial["price_override"] = True
            for field in _PRICE_FIELDS:
                self.initial[field] = getattr(price, field)
        if not self.price_editable:
            # Shown, not edited: a disabled field takes its initial value whatever is posted (Django's forms).
            for field in ("price_override", *_PRICE_FIELDS, "price_reason"):
                self.fields[field].disabled = True
                self.fields[field].help_text = "Needs the billing permission to change (billing.change_modelprice)."

    def clean(self):
        data = super().clean()
        name = data.get("name")
        if not name:
            return data
        if self.price_editable and self.price_changed() and not (data.get("price_reason") or "").strip():
            self.add_error("price_reason", "A price change is audited: say why.")
        if self.price_editable and data.get("price_override") and not _states_amount(data):
            # billing.models' model_price_states_amount refuses the row too; this names the fields.
            self.add_error("per_unit_usd", "An override states its price: $ per unit (or variants), input and "
                           "output per million tokens, or free. To keep the models file's or the code's price, "
                           "untick \"Override the price\".")
            return data
        entry = {"enabled": data.get("enabled", True)}
        for field in ("provider", "kind", "content_type", "capabilities", "params"):
            if data.get(field) not in ("", None):
                entry[field] = data[field]
        if data.get("price_override"):
            entry["price"] = _as_file_price(data)
        try:
            below = registry.code_spec(name)
            in_file = registry.file_entries().get(name)
            if in_file is not None:
                below = registry.spec_from(name, in_file, below)
            registry.check_entry(name, entry, below)  # the models file's validator: one for both
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None
        return data

    def price(self) -> dict | None:
        """The price as ModelPrice's fields, or None: no override."""
        if not self.cleaned_data.get("price_override"):
            return None
        price = {field: self.cleaned_data.get(field) for field in _PRICE_FIELDS}
        price["free"] = bool(price["free"])
        price["unit"] = price["unit"] or ""
        return price

    def price_changed(self) -> bool:
        return any(field in self.changed_data for field in ("price_override", *_PRICE_FIELDS))


def _states_amount(data: dict) -> bool:
    """Whether a price override states one (the same rule as ModelPrice's model_price_states_amount)."""
    return bool(data.get("free") or data.get("per_unit_usd") is not None or data.get("variants")
                or (data.get("input_per_mtok_usd") is not None and data.get("output_per_mtok_usd") is not None))


def _as_file_price(data: dict) -> dict:
    """The form's price in the models file's shape (one validation for both)."""
    names = {"input_per_mtok_usd": "input", "output_per_mtok_usd": "output",
             "cache_write_per_mtok_usd": "cache_write", "cache_read_per_mtok_usd": "cache_read",
             "per_unit_usd": "per_unit"}
    price = {short: str(data[field]) for field, short in names.items() if data.get(field) is not None}
    if data.get("unit"):
        price["unit"] = data["unit"]
    if data.get("free"):
        price["free"] = True
    if data.get("variants"):
        price["variants"] = data["variants"]
    return price


# --- every live model: the page's first table ------------------------------------------------------------
#
# A ModelConfig row is an operator's override, so the admin's own changelist showed only those ("0 models"
# on a fresh install, where every model comes from the code or the models file). The page's first table
# is every model the three layers name, read from them as a job's submit reads them (registry.model_spec,
# rates.rate_for), not from rows written to make a list: a row per catalog model would itself be an
# override (its `enabled` over the models file's). Django's list of the admin's own rows stays below it,
# with its filters, search, delete and edit links.

SOURCE_CODE, SOURCE_FILE, SOURCE_ADMIN = "code catalog", "models file", "admin override"


@dataclass(frozen=True)
class LiveModel:
    name: str
    provider: str
    kind: str
    sources: tuple[str, ...]  # the layers that state it, bottom first: the last one decides
    enabled: bool | None  # None: no layer knows it (an override of a name nothing else names)
    price: str
    price_source: str
    drift: str
    url: str  # its admin row's page, or the add page with its name filled in

    @property
    def source(self) -> str:
        return " + ".join(self.sources)


def live_models(*, query: str = "", enabled: str = "", provider: str = "", kind: str = "") -> list[LiveModel]:
    """Every model payonce knows, by name: the code's catalog, the models file's entries and the admin's rows
    (models and price overrides), each with what the layers make of it now. Filtered as the page's list
    filters ask (?q=, enabled__exact, provider__exact, kind__exact)."""
    rows = {row.name: row for row in ModelConfig.objects.all()}
    overrides = set(ModelPrice.objects.values_list("model", flat=True))
    in_file, file_prices = registry.file_entries(), registry.file_prices()
    code = set(registry.code_model_names())
    names = sorted(code | set(in_file) | set(rows) | overrides)
    if query:
        names = [name for name in names if query.lower() in name.lower()]
    drifts = {drift.model: drift for drift in PriceDrift.objects.filter(model__in=names)}
    found = []
    for name in names:
        spec = registry.model_spec(name)
        shape = spec or _shape(name, in_file.get(name), rows.get(name))
        on = spec is not None if shape is not None else None
        if (enabled and on != (enabled == "1")) or (provider and (shape and shape.provider) != provider) \
                or (kind and (shape and shape.kind) != kind):
            continue
        sources = tuple(label for label, here in ((SOURCE_CODE, name in code), (SOURCE_FILE, name in in_file),
                                                  (SOURCE_ADMIN, name in rows or name in overrides)) if here)
        price_source = (SOURCE_ADMIN if name in overrides else SOURCE_FILE if name in file_prices
                        else SOURCE_CODE if rates.rate_for(name).known else "none")
        row = rows.get(name)
        url = (reverse("admin:executor_modelconfig_change", args=[row.pk]) if row is not None
               else reverse("admin:executor_modelconfig_add") + "?" + urlencode({"name": name}))
        found.append(LiveModel(name, shape.provider if shape else name.partition("/")[0], shape.kind if shape else "—",
                               sources, on, price_words(name), price_source,
                               drift_words(drifts.get(name), short=True), url))
    return found


def _shape(name: str, file_entry: dict | None, row: ModelConfig | None) -> registry.ModelSpec | None:
    """A disabled model's provider and kind: the layers read as if it were enabled (None: none knows it)."""
    spec = registry.code_spec(name)
    for entry in (file_entry, registry.row_entry(row) if row is not None else None):
        if entry is None:
            continue
        try:
            spec = registry.spec_from(name, {**entry, "enabled": True}, spec)
        except ValueError:
            pass  # refused where it was written; the page shows what the layers below say
    return spec


def price_words(name: str) -> str:
    """A model's price as its jobs are reserved and charged now (billing.rates: the admin's override, else
    the models file's price, else the code's)."""
    rate = rates.rate_for(name)
    if not rate.known:
        return "unknown (penalty tier)"
    if rate.free:
        return "free"
    if rate.priced_by_tokens:
        return f"${rate.input} in / ${rate.output} out per Mtok"
    per_unit = rate.per_unit
    if per_unit is None and rate.variants:
        per_unit = max(rate.variants["prices"].values())
    if per_unit is None:
        return "no unit price (penalty tier)"
    return f"${per_unit} per {rate.unit or 'unit'}" + (" (at most)" if rate.variants else "")


@admin.register(ModelConfig)
class ModelConfigAdmin(admin.ModelAdmin):
    form = ModelConfigForm
    change_list_template = "admin/executor/modelconfig/change_list.html"
    list_display = ("name", "enabled", "provider", "kind", "content_type", "price", "drift", "updated_at")
    list_filter = ("enabled", "provider", "kind")
    search_fields = ("name",)
    readonly_fields = ("price_drift",)
    fieldsets = (
        (None, {"fields": ("name", "enabled", "provider", "kind", "content_type", "note")}),
        ("What the provider does, and what the model takes", {"fields": ("capabilities", "params")}),
        ("Price", {"fields": ("price_override", "free", "input_per_mtok_usd", "output_per_mtok_usd",
                              "cache_write_per_mtok_usd", "cache_read_per_mtok_usd", "per_unit_usd", "unit",
                              "variants", "price_reason", "price_drift")}),
    )

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        # A class per request: whether its price fields are editable is this user's permission.
        return type(form.__name__, (form,), {"price_editable": request.user.has_perm(PRICE_PERMISSION)})

    @admin.display(description="price")
    def price(self, row: ModelConfig) -> str:
        return price_words(row.name)

    def changelist_view(self, request, extra_context=None):
        params = request.GET
        live = live_models(query=params.get("q", "").strip(), enabled=params.get("enabled__exact", ""),
                           provider=params.get("provider__exact", ""), kind=params.get("kind__exact", ""))
        return super().changelist_view(request, {**(extra_context or {}), **adminkit.WIDE_LIST, "title": "Models",
                                                 "live_models": live,
                                                 "filtered": any(params.get(name) for name in (
                                                     "q", "enabled__exact", "provider__exact", "kind__exact"))})

    @admin.display(description="price drift")
    def drift(self, row: ModelConfig) -> str:
        return drift_words(PriceDrift.objects.filter(model=row.name).first(), short=True)

    @admin.display(description="price drift")
    def price_drift(self, row: ModelConfig) -> str:
        return drift_words(PriceDrift.objects.filter(model=row.name).first()) if row.pk else "—"

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if form.price_editable:
            operations.price_set(model=obj.name, price=form.price(), who=request.user.get_username(), via="admin",
                                 reason=form.cleaned_data.get("price_reason") or "")
        registry.forget_models()  # this process at once; the others within MODELS_CACHE_S

    def delete_model(self, request, obj):
        self._delete_prices(request, [obj.name])
        super().delete_model(request, obj)
        registry.forget_models()

    def delete_queryset(self, request, queryset):
        self._delete_prices(request, list(queryset.values_list("name", flat=True)))
        super().delete_queryset(request, queryset)
        registry.forget_models()

    def _delete_prices(self, request, names: list[str]) -> None:
        """A model's row deleted takes its price override with it only for a user who may change prices
        (audited); for any other, the override stays (the model's price does not change)."""
        if not request.user.has_perm(PRICE_PERMISSION):
            return
        for name in names:
            operations.price_set(model=name, price=None, who=request.user.get_username(), via="admin",
                                 reason=f"the model's row {name} was deleted")


def drift_words(drift: PriceDrift | None, *, short: bool = False) -> str:
    """A model's price drift as an operator reads it: none, or what was reserved, what it cost, since when,
    and what its reservations are taken at now."""
    if drift is None:
        return "—" if short else "none: every attempt settled within its reservation"
    live = drift.holds
    if short:
        return format_html('<strong class="errornote">up to ${} (reserved ${})</strong>', drift.highest_cost_usd,
                           drift.reserved_usd) if live else "cleared"
    if not live:
        return f"cleared{f' by {drift.cleared_by}' if drift.cleared_by else ''} (last seen {drift.last_seen_at:%Y-%m-%d %H:%M} UTC)"
    return format_html(
        '<strong class="errornote">Attempts settle above their reservation</strong>: reserved ${}, charged ${} '
        '(first seen {} UTC, {} time{} since). Its reservations are taken at no less than ${}, the highest cost '
        'seen, until the drift is cleared (Price drifts page). Fix the price, then clear it.',
        drift.reserved_usd, drift.cost_usd, f"{drift.first_seen_at:%Y-%m-%d %H:%M}", drift.drifts,
        "s" if drift.drifts != 1 else "", drift.highest_cost_usd)


@admin.register(PriceDrift)
class PriceDriftAdmin(adminkit.RecordAdmin, admin.ModelAdmin):
    """Models whose attempts settled above their reservation (billing.models.PriceDrift): read-only rows,
    written by the settles themselves; an operator with billing.change_modelprice clears one (audited)
    once the price is right."""

    list_display = ("model", "live", "reserved_usd", "cost_usd", "highest_cost_usd", "drifts", "first_seen_at",
                    "last_seen_at", "cleared_by")
    list_filter = ("cleared_at",)
    search_fields = ("model",)
    readonly_fields = [f.name for f in PriceDrift._meta.fields]
    actions = ["clear"]

    @admin.display(description="holds", boolean=True)
    def live(self, drift: PriceDrift) -> bool:
        return drift.holds

    def has_clear_permission(self, request):
        return self.has_view_permission(request) and request.user.has_perm(PRICE_PERMISSION)

    def changelist_view(self, request, extra_context=None):
        adminkit.refuse_unheld_action(self, request)
        return super().changelist_view(request, extra_context)

    @admin.action(description="Clear the selected price drifts…", permissions=["clear"])
    def clear(self, request, queryset):
        across, selected, hidden = adminkit.selection(request, "clear")
        target = f"price drifts: {', '.join(queryset.values_list('model', flat=True)[:5])}"
        drifts = PriceDrift.objects.filter(id__in=queryset.values("id"))
        return adminkit.confirm_or_act(
            self, request, back=request.get_full_path(),
            act=lambda **who_and_reason: operations.drifts_clear(drifts=drifts, target=target, via="admin",
                                                                 **who_and_reason),
            preview=lambda: operations.drifts_preview(drifts=drifts, target=target),
            title="Clear price drifts", verb="clear", hidden=hidden, back_label="Price drifts",
            skipped_why="already cleared",
            nothing_paid="the models' next reservations are taken at the rate card's worst case again; a settle "
                         "above its reservation starts a drift again")
