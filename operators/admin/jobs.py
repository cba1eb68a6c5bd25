"""The operators' job views (docs/operating.md, "The admin"): the job list with every filter, the job page as one
timeline, and cancel / retry / replay, alone or in bulk over every job the current filter matches, each
through a confirmation with a count preview and a required reason, and an audit row (operators.operations).

Big tables: the list never counts the whole table (CappedPaginator), sorts on an index (job_created,
job_status_created) and searches by id, upstream key, idempotency key or metadata pair (jobs_search)."""

import json

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import DecimalField, OuterRef, Subquery, Sum
from django.http import FileResponse, Http404, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.functional import cached_property

from config import tracing
from executor.models import Attempt
from executor.store import client_store
from jobs import selectors
from jobs.kinds import KINDS
from jobs.models import Job
from operators import adminkit, operations
from operators.actions import JOBS
from operators.models import OperatorAction
from operators.operations import JobFilter, OperationRefused, month_range
from operators.timeline import SHOWN, job_summary, job_timeline, kind_facts, timeline_by_run


class CappedPaginator(Paginator):
    """Counts at most CAP + 1 rows (`SELECT count(*) FROM (... LIMIT CAP + 1)`): a list over millions of
    jobs answers at once, and says "more than CAP" instead of the exact figure. Narrow the filter, or use
    a bulk action's preview, for an exact count."""

    CAP = 10_000

    @cached_property
    def count(self):
        # Without the list's ORDER BY: the planner may then count from whichever index fits the filter
        # instead of walking job_created in order (kind=report: 132 ms -> 16 ms, bench/admin.py).
        return self.object_list.order_by().values("pk")[: self.CAP + 1].count()


class ModelFilter(admin.SimpleListFilter):
    """Jobs whose attempt chain names the model (first or a fallback). It lists the models the newest
    MODELS_FROM jobs name, not the whole rate card (33 models, most never used): a bounded read, the same
    over any size of table (1,000 rows read along job_created: 2 ms where they lie scattered, 16 ms for
    10,000, on bench/admin.py's 300,000 jobs). A model only older jobs name is still filtered on by its URL
    (?model=...), and listed once chosen."""

    title = "model"
    parameter_name = "model"
    MODELS_FROM = 1_000

    def lookups(self, request, model_admin):
        names = set(selectors.models_in_use(newest=self.MODELS_FROM))
        if self.value():
            names.add(self.value())
        return [(name, name) for name in sorted(names)]

    def queryset(self, request, queryset):
        return queryset.filter(model_chain__contains=[self.value()]) if self.value() else queryset


class ClientFilter(admin.RelatedFieldListFilter):
    """The clients that have jobs, by name and short id (two may share a name), not every client:
    Django's RelatedOnlyFieldListFilter would read every job for them (SELECT DISTINCT client_id)."""

    def field_choices(self, field, request, model_admin):
        return [(client.pk, f"{client.name} ({str(client.pk)[:8]})") for client in selectors.clients_with_jobs()]


class MonthFilter(admin.SimpleListFilter):
    """Jobs created in a UTC month (the months billing counts in)."""

    title = "month created"
    parameter_name = "month"

    def lookups(self, request, model_admin):
        today = timezone.now()
        months = []
        year, month = today.year, today.month
        for _ in range(14):
            months.append((f"{year:04d}-{month:02d}", f"{year:04d}-{month:02d}"))
            year, month = (year, month - 1) if month > 1 else (year - 1, 12)
        return months

    def queryset(self, request, queryset):
        if not self.value():
            return queryset
        try:
            first, after = month_range(self.value())
        except OperationRefused:
            return queryset.none()
        return queryset.filter(created_at__gte=first, created_at__lt=after)


class AttemptCost(Subquery):
    """What a job's attempts cost (priced ones; unpriced ones are on the job page), one index probe a row."""

    output_field = DecimalField(max_digits=12, decimal_places=6)

    def __init__(self):
        super().__init__(Attempt.objects.filter(job_id=OuterRef("pk")).order_by().values("job_id")
                         .annotate(total=Sum("cost_usd")).values("total"))


# The admin list's query parameters and the JobFilter field each one sets: a bulk action over "every job
# this filter matches" reads the same parameters the list was filtered with.
LIST_PARAMS = {"status__exact": "status", "kind__exact": "kind", "client__id__exact": "client", "model": "model",
               "month": "month", "q": "search"}
# The list's own parameters that are not filters (ordering, page, Django's "show all rows", its error
# flag): carried by a bulk link from the list, ignored by the action.
LIST_VIEW_PARAMS = {"o", "p", "e", "all", "_changelist_filters"}


def filter_from_params(params) -> JobFilter:
    values = {field: params.get(name, "") for name, field in LIST_PARAMS.items()}
    return JobFilter(**values, ids=params.getlist("id"))


def bulk_filter_from_params(params) -> JobFilter:
    """The jobs a bulk URL targets. A parameter the list does not know (`?status=running` for
    `status__exact`) is refused: ignoring it once made a bulk retry target every job. No filter at all
    means nothing unless `all_jobs=1` says "every job" on purpose (the list's bulk links add it to an
    unfiltered list; the CLI asks for --all)."""
    unknown = sorted(set(params) - set(LIST_PARAMS) - LIST_VIEW_PARAMS - {"id", "all_jobs"})
    if unknown:
        raise OperationRefused(f"unknown filter parameter{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)} "
                               f"(known: {', '.join([*LIST_PARAMS, 'id', 'all_jobs'])}); nothing was done")
    job_filter = filter_from_params(params)
    if job_filter.describe() == "every job" and params.get("all_jobs") != "1":
        raise OperationRefused("no filter: filter the list first, or add all_jobs=1 to mean every job; nothing was done")
    return job_filter


@admin.register(Job)
class JobAdmin(adminkit.ActionAdmin, admin.ModelAdmin):
    # What an operator reads first to the left, and nothing wider than it needs: a 1366 px laptop screen
    # shows every column (tests/operators/test_admin_browser.py measures it in chromium).
    list_display = ("short_id", "client_name", "status", "cost", "kind", "chain", "run", "created", "completed")
    list_filter = ("status", "kind", ("client", ClientFilter), ModelFilter, MonthFilter)
    search_fields = ("id",)  # shows the search box; the search itself is jobs_search (get_search_results)
    search_help_text = ("A job id, an upstream key (payonce-<job>-<n>), an idempotency key, "
                        "or a metadata pair key=value.")
    list_select_related = ("client",)
    list_per_page = 50
    ordering = ("-created_at", "-id")
    paginator = CappedPaginator
    show_full_result_count = False
    offered_on = JOBS  # its actions, list and bulk and buttons: operators.actions (ActionAdmin)
    change_list_template = "admin/jobs/job/change_list.html"

    # --- the list ---------------------------------------------------------------------------------------

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(attempts_cost=AttemptCost()).defer("input", "output", "policy")

    def get_search_results(self, request, queryset, search_term):
        return operations.jobs_search(queryset, search_term), False

    def lookup_allowed(self, lookup, value, request=None):
        return lookup in LIST_PARAMS or super().lookup_allowed(lookup, value, request)

    @admin.display(description="job", ordering="id")
    def short_id(self, job):
        return adminkit.short_id(job.id)

    @admin.display(description="client", ordering="client")
    def client_name(self, job):
        return adminkit.client_cell(job.client)  # list_select_related: no query per row

    @admin.display(description="models")
    def chain(self, job):
        """The first model, and how many fallbacks follow it; the whole chain in the title."""
        first, *fallbacks = job.model_chain or ["—"]
        shown = f"{first} +{len(fallbacks)}" if fallbacks else first
        return adminkit.clipped(shown, title=" -> ".join(job.model_chain or []))

    @admin.display(description="cost (USD)")
    def cost(self, job):
        return job.attempts_cost if job.attempts_cost is not None else "—"

    @admin.display(description="created", ordering="created_at")
    def created(self, job):
        return adminkit.compact_time(job.created_at)

    @admin.display(description="completed", ordering="completed_at")
    def completed(self, job):
        return adminkit.compact_time(job.completed_at)

    # --- permissions: reading needs view_job; each action its own permission (ActionAdmin.may) ---------

    def _refuse_unless_viewer(self, request):
        # Before any lookup: a staff user without view_job learns nothing, not even whether the id exists.
        if not self.has_view_permission(request):
            raise PermissionDenied("You need jobs.view_job")

    def changelist_view(self, request, extra_context=None):
        params = request.GET.copy()
        if not set(params) - LIST_VIEW_PARAMS:
            params["all_jobs"] = "1"  # the unfiltered list's bulk link means every job, said on purpose
        query = params.urlencode()
        bulk = [(reverse("admin:jobs_job_bulk", args=[action.name]) + f"?{query}", action.verb)
                for action in self.offered() if self.may(request, action)]
        return super().changelist_view(request, {**(extra_context or {}), **adminkit.WIDE_LIST,
                                                 "bulk_links": bulk, "count_cap": CappedPaginator.CAP})

    # --- the job page: its summary, then one timeline ---------------------------------------------------

    def get_urls(self):
        own = [
            path("bulk/<str:action>/", self.admin_site.admin_view(self.bulk_view), name="jobs_job_bulk"),
            path("<uuid:job_id>/output/", self.admin_site.admin_view(self.output_view), name="jobs_job_output"),
        ]
        return own + super().get_urls()

    def change_view(self, request, object_id, form_url="", extra_context=None):
        self._refuse_unless_viewer(request)
        job = Job.objects.select_related("client").filter(pk=object_id).first() if adminkit.is_uuid(object_id) else None
        if job is None:
            raise Http404("No such job.")
        # A report's output names no stored file (its link is the report's page): nothing to open here.
        output_url = reverse("admin:jobs_job_output", args=[job.id]) if _output_key(job) else ""
        entries, older_left_out = job_timeline(job, output_url=output_url,
                                               limit=None if request.GET.get("all") == "1" else SHOWN)
        summary = job_summary(job)
        one = f"?id={job.id}"
        return TemplateResponse(request, "admin/jobs/job/timeline.html", {
            **self.admin_site.each_context(request), "title": f"Job {job.id}", "job": job, "opts": Job._meta,
            "summary": summary, "report": kind_facts(job),  # the template's section is the report's
            "waiting": selectors.job_waiting(job), "trace_id": tracing.trace_id_of(job.trace_context),
            "input_text": _json_shown(job.input), "metadata_text": _json_shown(job.metadata),
            "entries": entries, "runs": timeline_by_run(entries, summary), "older_left_out": older_left_out,
            "actions": [(reverse("admin:jobs_job_bulk", args=[action.name]) + one, action.verb)
                        for action in self.offered() if action.applies(job) and self.may(request, action)],
        })

    def output_view(self, request, job_id):
        """The output file, for staff: the client's own store keys, as GET /v1/jobs/{id}/output serves it."""
        self._refuse_unless_viewer(request)
        job = Job.objects.filter(id=job_id).first()
        if job is not None and KINDS[job.kind].text is not None:
            return self._text(job)
        if job is None or not _output_key(job):
            raise Http404("No output.")
        store = client_store(job.client_id)
        url = store.presigned_url(job.output["key"])
        if url:
            return HttpResponseRedirect(url)
        try:
            handle = store.open(job.output["key"])
        except Exception:  # noqa: BLE001 (gone from the store, or the store is down: say so, no 500)
            raise Http404("The output cannot be read from the store now.") from None
        return FileResponse(handle, content_type=job.output.get("content_type"))

    @staticmethod
    def _text(job):
        """A kind whose output is a text (a report's sealed chapters: no store object): its Markdown, shown
        as text in the browser (text/markdown would be a download), or 404 while it is not sealed."""
        text = KINDS[job.kind].text(job)
        if text is None:
            raise Http404("The report is not sealed.")
        return HttpResponse(text, content_type="text/plain; charset=utf-8")

    # --- actions: on the selection, or on every job the filter matches ----------------------------------

    def bulk_view(self, request, action):
        """Every job the list's filter matches (the query string), or `?id=` ones: the preview, then the
        action once a reason is given."""
        action = self.offered_action(action)
        if action is None:
            raise Http404("No such action.")
        self.refuse_unless_may(request, action)
        try:
            job_filter = bulk_filter_from_params(request.GET)
            jobs = job_filter.jobs()
        except OperationRefused as exc:
            self.message_user(request, str(exc), level=messages.ERROR)
            return redirect("admin:jobs_job_changelist")
        query = request.GET.copy()
        query.pop("id", None)
        back = reverse("admin:jobs_job_changelist") + (f"?{query.urlencode()}" if query else "")
        if job_filter.ids and len(job_filter.ids) == 1:
            back = reverse("admin:jobs_job_change", args=[job_filter.ids[0]])
        return adminkit.confirm_action(self, request, action, jobs, target=job_filter.describe(), hidden=[],
                                       back=back)

    def act_on_selection(self, request, queryset, action):
        """A list action (ActionAdmin: each offered to holders of its permission alone) on the selected rows,
        or on every job the filter matches ("select all")."""
        across, selected, hidden = adminkit.selection(request, action.list_action)
        target = (filter_from_params(request.GET).describe() if across else f"ids={len(selected)} selected")
        # The list's queryset carries its page's joins and cost column; the action needs only which jobs.
        jobs = Job.objects.filter(pk__in=queryset.order_by().values("pk"))
        return adminkit.confirm_action(self, request, action, jobs, target=target, hidden=hidden,
                                       back=request.get_full_path())

    def has_add_permission(self, request):
        return False  # jobs come from clients (POST /v1/jobs or manage.py submit)

    def has_delete_permission(self, request, obj=None):
        return False  # a job is a money record: cancel it, never delete it


# A job's input on its page: its prompt and parameters as the client sent them, cut past this many
# characters (a report's input is a few kB; a prompt is bounded by the API's body limit anyway).
INPUT_SHOWN = 20_000


def _json_shown(value) -> str:
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= INPUT_SHOWN else text[:INPUT_SHOWN] + f"\n… ({len(text)} characters in all)"


def _output_key(job) -> str:
    """The store key of the job's output file; "" when it has none (a report's output is its link)."""
    return str(job.output.get("key") or "") if isinstance(job.output, dict) else ""


@admin.register(OperatorAction)
class OperatorActionAdmin(adminkit.RecordAdmin, admin.ModelAdmin):
    """The audit trail of operator actions: read only, never deleted."""

    list_display = ("started_at", "who", "via", "action", "target", "matched", "acted", "reason", "finished_at")
    list_filter = ("action", "via")
    search_fields = ("who", "reason", "target")
    readonly_fields = [f.name for f in OperatorAction._meta.fields]
    paginator = CappedPaginator
    show_full_result_count = False

