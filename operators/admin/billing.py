"""Spend per client per month, and every reservation, in the Django admin; the
spend page (per client and per product for a month, and the last 12 months as a server-rendered SVG
chart)."""

import uuid
from datetime import date, timedelta
from decimal import Decimal
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import connection, transaction
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone

from accounts.models import Client
from billing.models import BudgetMonth, Reservation
from billing.months import month_of, next_month
from billing.selectors import (
    budget_totals,
    cap_of,
    clients_month_spend,
    money,
    month_totals,
    spend_by_month,
)
from operators.operations import OperationRefused, month_range
from orders.selectors import orders_by_product

# The admin index links the spend page and the dead letters (admin/payonce/index.html). Django's own
# index template comes first in the app template search (contrib.admin is the first app), so the link
# needs the site's index_template; a site that set one of its own keeps it.
if admin.site.index_template is None:
    admin.site.index_template = "admin/payonce/index.html"


class ReservationInline(admin.TabularInline):
    model = Reservation
    fields = ("key", "kind", "model", "state", "amount", "spent", "unpriced", "created_at", "resolved_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None):
        return False


# --- the spend chart: the last 12 months as inline SVG, drawn on the server -------------------------------

CHART_WIDTH, CHART_HEIGHT = 720, 240
CHART_TOP, CHART_BOTTOM, CHART_SIDE = 30, 36, 8  # room for the amounts above the bars, the months below


def short_money(value: Decimal) -> str:
    """A bar's label: cents from $1 on; below, the micro-dollars that matter (a sandbox render is $0.40,
    a short chapter $0.003126), never rounded to a misleading $0.00."""
    if value >= 1:
        return f"${value:,.2f}"
    if value == 0:
        return "$0"
    return "$" + str(value.quantize(Decimal("0.000001"))).rstrip("0").ljust(4, "0")


def spend_chart_svg(points: list[tuple[date, Decimal]], *, cap: Decimal | None = None) -> str:
    """The spend chart's SVG markup: one bar per (month, spent), its height in proportion to the highest
    bar (or to the cap, drawn as a line, when one client's cap is given), labelled with its month and
    amount. Pixels are floats; the amounts they stand for stay Decimal."""
    plot_height = CHART_HEIGHT - CHART_TOP - CHART_BOTTOM
    slot = (CHART_WIDTH - 2 * CHART_SIDE) / max(len(points), 1)
    peak = max([spent for _, spent in points] + ([cap] if cap else []) + [Decimal(0)])
    baseline = CHART_TOP + plot_height

    def height(amount: Decimal) -> float:
        return float(amount / peak) * plot_height if peak else 0.0

    bars = []
    for index, (month, spent) in enumerate(points):
        bar_height = height(spent)
        left = CHART_SIDE + index * slot
        bars.append({
            "month": f"{month:%Y-%m}", "spent": money(spent), "label": short_money(spent),
            "x": _px(left + slot * 0.15), "width": _px(slot * 0.7), "center": _px(left + slot / 2),
            "y": _px(baseline - bar_height), "height": _px(bar_height), "label_y": _px(baseline - bar_height - 6),
        })
    cap_line = None
    if cap:
        cap_y = baseline - height(cap)
        cap_line = {"y": _px(cap_y), "label_y": _px(cap_y - 4), "amount": money(cap), "label": short_money(cap)}
    return render_to_string("admin/billing/spend_chart.svg", {
        "bars": bars, "cap": cap_line, "width": CHART_WIDTH, "height": CHART_HEIGHT, "baseline": baseline,
        "month_y": baseline + 16, "right": CHART_WIDTH - CHART_SIDE, "side": CHART_SIDE,
    })


def _px(value: float) -> str:
    """A coordinate as SVG wants it, whatever the locale would do to a float in a template."""
    return f"{value:.2f}"


# --- spend per client month ---------------------------------------------------------------------------------


def _month_param(raw: str | None) -> str:
    """?month=YYYY-MM, default the current UTC month; a malformed one is OperationRefused."""
    if not raw:
        return f"{month_of(timezone.now()):%Y-%m}"
    month_range(raw)  # YYYY-MM as GET /v1/spend takes them, or OperationRefused
    return raw


def _previous_month(month: date) -> date:
    return (month.replace(day=1) - timedelta(days=1)).replace(day=1)


@admin.register(BudgetMonth)
class BudgetMonthAdmin(admin.ModelAdmin):
    """Spend per client per month: spent, reserved, unpriced attempts, the cap and the headroom under it;
    and the spend page (spend_view)."""

    list_display = ("client", "month", "spent_now", "reserved_now", "unpriced_attempts", "cap", "headroom")
    list_filter = ("month",)
    search_fields = ("client__name", "client__id")
    list_select_related = ("client",)
    readonly_fields = ("client", "month", "spent", "reserved")
    inlines = [ReservationInline]
    change_list_template = "admin/billing/budgetmonth/change_list.html"

    def get_changelist_instance(self, request):
        """The page's figures in one statement (billing.selectors.budget_totals), not two per row."""
        changelist = super().get_changelist_instance(request)
        rows = list(changelist.result_list)
        totals = budget_totals(ids=[row.id for row in rows])
        for row in rows:
            row.totals = totals.get(row.id)
        return changelist

    def _totals(self, row) -> tuple[Decimal, Decimal, int | None]:
        if getattr(row, "totals", None) is not None:
            return row.totals.spent, row.totals.reserved, row.totals.unpriced_attempts
        return (*month_totals(row), None)

    @admin.display(description="cap")
    def cap(self, row):
        return cap_of(row.client)

    @admin.display(description="spent")
    def spent_now(self, row):
        return self._totals(row)[0]

    @admin.display(description="reserved")
    def reserved_now(self, row):
        return self._totals(row)[1]

    @admin.display(description="unpriced attempts")
    def unpriced_attempts(self, row):
        unpriced = self._totals(row)[2]
        return "—" if unpriced is None else unpriced

    @admin.display(description="headroom")
    def headroom(self, row):
        spent, reserved, _ = self._totals(row)
        return max(cap_of(row.client) - spent - reserved, Decimal(0))

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False  # money moves only through the guard

    # --- the spend page -----------------------------------------------------------------------------------

    def spend_view(self, request):
        """/admin/billing/spend/ (_with_spend_page): ?month=YYYY-MM (default: this UTC month), ?client=<id>
        (default: every client)."""
        if not self.has_view_permission(request):
            raise PermissionDenied("You need billing.view_budgetmonth")
        try:
            month_text = _month_param(request.GET.get("month"))
        except OperationRefused as exc:
            self.message_user(request, str(exc), messages.ERROR)
            month_text = _month_param(None)
        first, after = month_range(month_text)
        month = first.date()
        client = _client_param(self, request)

        with transaction.atomic(), connection.cursor() as cursor:
            # These aggregates are short, but PostgreSQL's estimate of them is not: it JIT-compiles them,
            # which cost 355 ms of a 443 ms read on a million attempts (bench/admin.py). Off for this read.
            cursor.execute("SET LOCAL jit = off")
            spend = clients_month_spend(month, client=client)
            products = orders_by_product(first, after, client_id=client.id if client else None)
            by_month = spend_by_month(month, client_id=client.id if client else None)
        jobs_list = reverse("admin:jobs_job_changelist")
        for row in spend:
            row["usd"] = {name: money(row[name]) for name in ("spent", "reserved", "cap", "headroom")}
            row["jobs_url"] = f"{jobs_list}?{urlencode({'client__id__exact': row['client'].id, 'month': month_text})}"
            row["spend_url"] = "?" + urlencode({"month": month_text, "client": row["client"].id})
        orders_list = reverse("admin:orders_order_changelist")
        for row in products:
            query = {"product__exact": row["product"], "created_at__year": month.year, "created_at__month": month.month}
            if client is not None:
                query["client__id__exact"] = client.id
            row["orders_url"] = f"{orders_list}?{urlencode(query)}"
            row["cost_usd"] = money(row["cost"])
        chart = spend_chart_svg(by_month, cap=cap_of(client) if client else None)
        keep_client = {"client": client.id} if client else {}
        return TemplateResponse(request, "admin/billing/spend.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta,
            "title": f"Spend in {month_text}" + (f": {client.name}" if client else ""),
            "month": month_text, "client": client, "spend": spend, "products": products, "chart": chart,
            "totals": {
                "spent": money(sum((row["spent"] for row in spend), Decimal(0))),
                "reserved": money(sum((row["reserved"] for row in spend), Decimal(0))),
                "unpriced_attempts": sum(row["unpriced_attempts"] for row in spend),
            },
            "previous_url": "?" + urlencode({"month": f"{_previous_month(month):%Y-%m}", **keep_client}),
            "next_url": "?" + urlencode({"month": f"{next_month(month):%Y-%m}", **keep_client}),
            "all_clients_url": "?" + urlencode({"month": month_text}),
            "clients": Client.objects.order_by("name", "id").only("id", "name"),
        })


def _with_spend_page(site_urls):
    """The site's URLs with the spend page at the billing app's own address, /admin/billing/spend/ (a
    ModelAdmin's own URLs all sit under its model's, /admin/billing/budgetmonth/...)."""

    def get_urls():
        spend = admin.site.admin_view(admin.site._registry[BudgetMonth].spend_view)
        return [path("billing/spend/", spend, name="billing_spend"), *site_urls()]

    return get_urls


admin.site.get_urls = _with_spend_page(admin.site.get_urls)


def _client_param(model_admin, request) -> Client | None:
    raw = request.GET.get("client") or ""
    if not raw:
        return None
    try:
        client = Client.objects.filter(id=uuid.UUID(raw)).first()
    except ValueError:
        client = None
    if client is None:
        model_admin.message_user(request, f"No client has the id {raw!r}: showing every client.", messages.ERROR)
    return client


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
