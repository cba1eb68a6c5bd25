"""Orders in the Django admin: what each cost (its report job's attempts) beside a re-run, through the
operators' one confirmation (operators.adminkit) and audit row (operators.operations)."""

from django.contrib import admin
from django.http import Http404
from django.urls import path, reverse
from django.utils.html import format_html

from billing.selectors import money
from jobs.models import Job
from operators import adminkit
from operators.actions import BY_NAME, ORDERS
from orders.models import Order
from orders.selectors import orders_with_cost


@admin.register(Order)
class OrderAdmin(adminkit.ActionAdmin, admin.ModelAdmin):
    """Orders with what each cost (its report job's attempts; unpriced ones counted, all in the list's own
    statement) beside a re-run, over the selection or from one order's page: the shared confirmation
    (what it may reserve, that it pays again, a required reason) and an audit row (operators.operations)."""

    # Cost beside the order's status, to the left; ids and names clipped (whole in their title): a 1366 px
    # laptop screen shows every column (tests/operators/test_admin_browser.py measures it in chromium).
    list_display = ("payment", "client_name", "status", "job_status", "cost_usd", "unpriced_attempts", "product",
                    "run", "created")
    list_filter = ("status", "product")
    search_fields = ("payment_id", "run_id", "id", "job__id")
    list_select_related = ("client", "job")
    date_hierarchy = "created_at"  # the spend page links each product's orders of a month
    readonly_fields = [f.name for f in Order._meta.fields] + ["cost_usd", "unpriced_attempts"]
    offered_on = ORDERS  # the re-run: operators.actions (ActionAdmin)
    change_form_template = "admin/orders/order/change_form.html"

    def get_queryset(self, request):
        return orders_with_cost(super().get_queryset(request))

    @admin.display(description="payment id", ordering="payment_id")
    def payment(self, order):
        return adminkit.clipped(order.payment_id)

    @admin.display(description="client", ordering="client")
    def client_name(self, order):
        return adminkit.client_cell(order.client)  # list_select_related: no query per row

    @admin.display(description="job")
    def job_status(self, order):
        """The report job's status, linked to its page (the whole job id in the title)."""
        if not order.job_id:
            return "—"
        return format_html('<a href="{}" title="job {}">{}</a>', reverse("admin:jobs_job_change", args=[order.job_id]),
                           order.job_id, order.job.status)

    @admin.display(description="run id", ordering="run_id")
    def run(self, order):
        return adminkit.clipped(order.run_id)

    @admin.display(description="created", ordering="created_at")
    def created(self, order):
        return adminkit.compact_time(order.created_at)

    @admin.display(description="cost (USD)")
    def cost_usd(self, order):
        return money(order.cost_total) if order.job_id else "—"

    @admin.display(description="unpriced")
    def unpriced_attempts(self, order):
        return order.cost_unpriced or 0

    def has_add_permission(self, request):
        return False

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, {**(extra_context or {}), **adminkit.WIDE_LIST})

    def get_urls(self):
        own = [path("<uuid:order_id>/rerun/", self.admin_site.admin_view(self.rerun_view), name="orders_order_rerun")]
        return own + super().get_urls()

    def change_view(self, request, object_id, form_url="", extra_context=None):
        order = Order.objects.select_related("job").filter(pk=object_id).first() if adminkit.is_uuid(object_id) else None
        rerun_url = ""
        if order is not None and order.job_id and RERUN.applies(order.job) and self.may(request, RERUN):
            rerun_url = reverse("admin:orders_order_rerun", args=[order.id])
        return super().change_view(request, object_id, form_url, {**(extra_context or {}), "rerun_url": rerun_url})

    def rerun_view(self, request, order_id):
        """One order's re-run: the confirmation, then the re-run once a reason is given."""
        self.refuse_unless_may(request, RERUN)
        order = Order.objects.filter(id=order_id).first()
        if order is None:
            raise Http404("No such order.")
        back = reverse("admin:orders_order_change", args=[order.id])
        return adminkit.confirm_action(self, request, RERUN, Job.objects.filter(id=order.job_id),
                                       target=f"order {order.id} (payment {order.payment_id})", hidden=[], back=back)

    def act_on_selection(self, request, queryset, action):
        """The re-run over the selected orders' report jobs (ActionAdmin): only failed or waiting ones start
        a new run, whose chapters already written are read back, never paid for again."""
        across, selected, hidden = adminkit.selection(request, action.list_action)
        target = (f"orders matching {adminkit.describe_filter(request.GET) or 'every order'}" if across
                  else f"orders: ids={len(selected)} selected")
        jobs = Job.objects.filter(id__in=queryset.order_by().exclude(job=None).values("job_id"))
        return adminkit.confirm_action(self, request, action, jobs, target=target, hidden=hidden,
                                       back=request.get_full_path())


RERUN = BY_NAME["rerun"]  # an order's page offers it alone, beside the list's action
