"""The rate card's overrides, spend per client per month, and every reservation, in the Django admin."""

from decimal import Decimal

from django.contrib import admin

from billing import rates
from billing.models import BudgetMonth, ModelPrice, Order, Reservation
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


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    """Orders with what each cost (its report job's attempts; unpriced ones counted) beside a re-run
    action that asks for a confirmation that it pays again."""

    list_display = ("payment_id", "client", "product", "run_id", "status", "job_status", "cost_usd",
                    "unpriced_attempts", "created_at")
    list_filter = ("status", "product")
    search_fields = ("payment_id", "run_id", "id", "job__id")
    list_select_related = ("client", "job")
    readonly_fields = [f.name for f in Order._meta.fields]
    actions = ["rerun"]

    def _cost(self, order) -> dict:
        from executor.selectors import attempts_for, public_attempts

        if not order.job_id:
            return {"total_usd": None, "unpriced_attempts": 0}
        return public_attempts(attempts_for([order.job_id]).get(order.job_id, []))[1]

    @admin.display(description="job")
    def job_status(self, order):
        return order.job.status if order.job_id else "—"

    @admin.display(description="cost (USD)")
    def cost_usd(self, order):
        return self._cost(order)["total_usd"] or "—"

    @admin.display(description="unpriced")
    def unpriced_attempts(self, order):
        return self._cost(order)["unpriced_attempts"]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Re-run the report (pays again)")
    def rerun(self, request, queryset):
        from django.contrib import messages
        from django.template.response import TemplateResponse

        from jobs.models import JobStatus
        from jobs.services import job_retry

        orders = list(queryset.select_related("job"))
        runnable = [o for o in orders if o.job_id and o.job.status in (JobStatus.FAILED, JobStatus.WAITING)]
        if request.POST.get("confirm") != "yes":
            return TemplateResponse(request, "admin/billing/order/rerun_confirm.html", {
                **self.admin_site.each_context(request), "title": "Re-run reports: this pays again",
                "orders": orders, "runnable": runnable, "action": "rerun",
                "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME, "opts": self.model._meta,
            })
        rerun = sum(1 for order in runnable if job_retry(job=order.job) is not None)
        skipped = len(orders) - rerun
        self.message_user(request, f"{rerun} report(s) re-run: their missing chapters are paid for again."
                          + (f" {skipped} skipped (only failed or waiting reports can be re-run)." if skipped else ""),
                          messages.SUCCESS if rerun else messages.WARNING)
        return None
