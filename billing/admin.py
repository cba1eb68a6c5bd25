"""The rate card's overrides, spend per client per month, and every reservation, in the Django admin."""

from decimal import Decimal

from django.contrib import admin

from billing import rates
from billing.models import BudgetMonth, ModelPrice, Reservation
from billing.selectors import cap_of, month_totals


@admin.register(ModelPrice)
class ModelPriceAdmin(admin.ModelAdmin):
    list_display = ("model", "free", "input_per_mtok_usd", "output_per_mtok_usd", "cache_write_per_mtok_usd",
                    "cache_read_per_mtok_usd", "per_unit_usd", "unit", "updated_at")
    search_fields = ("model",)

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        rates.forget_overrides()  # this process at once; the others within OVERRIDES_CACHE_S


class ReservationInline(admin.TabularInline):
    model = Reservation
    fields = ("key", "kind", "model", "state", "amount", "spent", "unpriced", "created_at", "resolved_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(BudgetMonth)
class BudgetMonthAdmin(admin.ModelAdmin):
    """Spend per client per month: spent, reserved, the cap and the headroom under it."""

    list_display = ("client", "month", "spent_now", "reserved_now", "cap", "headroom")
    list_filter = ("month",)
    search_fields = ("client__name", "client__id")
    list_select_related = ("client",)
    readonly_fields = ("client", "month", "spent", "reserved")
    inlines = [ReservationInline]

    @admin.display(description="cap")
    def cap(self, row):
        return cap_of(row.client)

    @admin.display(description="spent")
    def spent_now(self, row):
        return month_totals(row)[0]

    @admin.display(description="reserved")
    def reserved_now(self, row):
        return month_totals(row)[1]

    @admin.display(description="headroom")
    def headroom(self, row):
        spent, reserved = month_totals(row)
        return max(cap_of(row.client) - spent - reserved, Decimal(0))

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False  # money moves only through the guard


@admin.register(Reservation)
class ReservationAdmin(admin.ModelAdmin):
    list_display = ("key", "kind", "model", "state", "amount", "spent", "unpriced", "created_at")
    list_filter = ("state", "kind")
    search_fields = ("key", "job__id")
    readonly_fields = [f.name for f in Reservation._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
