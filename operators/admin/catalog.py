"""The Models page: the models payonce knows, added or overridden without a release (executor.registry),
each with its price (the rate card's override, billing.rates) on the same form.

A row states only what it changes: a blank field keeps what the code and the models file say of the
model. The form refuses what the catalog would refuse (a provider with no adapter, a parameter of no
known type, a price that is not one), so a wrong row is refused where it is written, never at a job's
submit. Every process reads a saved row within MODELS_CACHE_S (the price within OVERRIDES_CACHE_S); this
one at once.
"""

from django import forms
from django.contrib import admin

from billing import rates
from billing.models import ModelPrice, PriceUnit
from billing.services import model_price_set
from executor import registry
from executor.models import ModelConfig

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

    def clean(self):
        data = super().clean()
        name = data.get("name")
        if not name:
            return data
        entry = {"enabled": data.get("enabled", True)}
        for field in ("provider", "kind", "content_type", "capabilities", "params"):
            if data.get(field) not in ("", None):
                entry[field] = data[field]
        try:
            below = registry.code_spec(name)
            in_file = registry.file_entries().get(name)
            if in_file is not None:
                below = registry.spec_from(name, in_file, below)
            registry.spec_from(name, entry, below)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None
        if data.get("price_override"):
            try:
                rates.rate_from(name, _as_file_price(data))
            except ValueError as exc:
                raise forms.ValidationError(f"Price: {exc}") from None
        return data

    def price(self) -> dict | None:
        """The price as ModelPrice's fields, or None: no override."""
        if not self.cleaned_data.get("price_override"):
            return None
        price = {field: self.cleaned_data.get(field) for field in _PRICE_FIELDS}
        price["free"] = bool(price["free"])
        price["unit"] = price["unit"] or ""
        return price


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


@admin.register(ModelConfig)
class ModelConfigAdmin(admin.ModelAdmin):
    form = ModelConfigForm
    list_display = ("name", "enabled", "provider", "kind", "content_type", "price", "updated_at")
    list_filter = ("enabled", "provider", "kind")
    search_fields = ("name",)
    fieldsets = (
        (None, {"fields": ("name", "enabled", "provider", "kind", "content_type", "note")}),
        ("What the provider does, and what the model takes", {"fields": ("capabilities", "params")}),
        ("Price", {"fields": ("price_override", "free", "input_per_mtok_usd", "output_per_mtok_usd",
                              "cache_write_per_mtok_usd", "cache_read_per_mtok_usd", "per_unit_usd", "unit",
                              "variants")}),
    )

    @admin.display(description="price")
    def price(self, row: ModelConfig) -> str:
        rate = rates.rate_for(row.name)
        if not rate.known:
            return "unknown (penalty tier)"
        if rate.free:
            return "free"
        if rate.priced_by_tokens:
            return f"${rate.input} in / ${rate.output} out per Mtok"
        return f"${rate.per_unit} per {rate.unit or 'unit'}" + (" (at most)" if rate.variants else "")

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        model_price_set(model=obj.name, price=form.price())
        registry.forget_models()  # this process at once; the others within MODELS_CACHE_S

    def delete_model(self, request, obj):
        name = obj.name
        super().delete_model(request, obj)
        model_price_set(model=name, price=None)
        registry.forget_models()

    def delete_queryset(self, request, queryset):
        names = list(queryset.values_list("name", flat=True))
        super().delete_queryset(request, queryset)
        for name in names:
            model_price_set(model=name, price=None)
        registry.forget_models()

