"""Webhook endpoints, the delivery outbox and its tries, and the dead letters (deliveries that ran out of
tries): their envelope, every try, and replay, one or many, through the operators' one confirmation
(operators.adminkit) and audit row (operators.operations). A replay sends the stored envelope again and pays nothing."""

import json
import uuid

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models.functions import Length, Substr
from django.http import Http404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from operators import adminkit
from operators.actions import BY_NAME, DEAD_LETTERS, DELIVERIES
from webhooks.models import DeadLetter, Delivery, DeliveryAttempt, DeliveryStatus, Endpoint, SigningSecret
from webhooks.services import endpoint_enable

ERROR_TITLE = 2000  # characters of the last error in its cell's title (the whole on the dead letter's page)
BODY_SHOWN = 500  # characters of a try's response body on the page (the row keeps up to 20 kB)


def _search(queryset, term: str):
    """A job id finds its deliveries; anything else is a webhook-id or its start (`{job}:{run}:{event}`,
    so a run's deliveries too), both answered by an index."""
    term = (term or "").strip()
    if not term:
        return queryset
    try:
        return queryset.filter(job_id=uuid.UUID(term))
    except ValueError:
        return queryset.filter(id__startswith=term)


def _selection(request, action: str, noun: str) -> tuple[str, list]:
    """What a list action posted, as the audit target, and the fields the confirmation posts back."""
    across, selected, hidden = adminkit.selection(request, action)
    target = (f"{noun} matching {adminkit.describe_filter(request.GET) or 'every row'}" if across
              else f"{noun}: ids={len(selected)} selected")
    return target, hidden


class DeliveryAttemptInline(admin.TabularInline):
    model = DeliveryAttempt
    extra = 0
    can_delete = False
    fields = ("number", "attempted_at", "url", "status_code", "duration_ms", "error", "response_body")
    readonly_fields = fields


@admin.register(Delivery)
class DeliveryAdmin(adminkit.ActionAdmin, admin.ModelAdmin):
    list_display = ("id", "event", "status", "attempts", "last_status_code", "next_attempt_at", "created_at")
    list_filter = ("status", "event")
    search_fields = ("id", "job__id")
    readonly_fields = [f.name for f in Delivery._meta.fields]
    inlines = [DeliveryAttemptInline]
    offered_on = DELIVERIES  # the replay: operators.actions (ActionAdmin)

    def act_on_selection(self, request, queryset, action):
        target, hidden = _selection(request, action.list_action, "deliveries")
        return adminkit.confirm_action(self, request, action, queryset.select_related(None),  # ids only
                                       target=target, hidden=hidden, back=request.get_full_path())


# --- dead letters ---------------------------------------------------------------------------------------


@admin.register(DeadLetter)
class DeadLetterAdmin(adminkit.ActionAdmin, admin.ModelAdmin):
    """The deliveries that ran out of tries (only `dead` rows): who and what each was for, how it failed,
    its envelope and every try on its page, and replay, one, the selection or every match of the filter."""

    # One line a row on a 1366 px laptop screen (the status and the error were past its edge): the long
    # values (the webhook-id, the client, the error) are clipped to their column, whole in their title and
    # on the dead letter's own page; the job is its short id (adminkit's wide-list cells).
    list_display = ("webhook_id", "client_name", "job_link", "event", "tries", "status_code", "error_start",
                    "created")
    list_filter = ("event", ("client", admin.RelatedOnlyFieldListFilter))
    search_fields = ("id",)  # shows the search box; the search itself is _search (get_search_results)
    search_help_text = "A webhook-id (or its start) or a job id."
    list_select_related = ("client",)
    ordering = ("-created_at", "-id")
    offered_on = DEAD_LETTERS  # the replay, one or many: operators.actions (ActionAdmin)
    change_list_template = "admin/webhooks/deadletter/change_list.html"

    def get_queryset(self, request):
        # The envelope is read on a dead letter's own page, never for the list.
        return super().get_queryset(request).filter(status=DeliveryStatus.DEAD).defer("envelope")

    def get_search_results(self, request, queryset, search_term):
        return _search(queryset, search_term), False

    @admin.display(description="webhook-id", ordering="id")
    def webhook_id(self, row):
        return adminkit.clipped(row.id)

    @admin.display(description="client", ordering="client__name")
    def client_name(self, row):
        return adminkit.client_cell(row.client)

    @admin.display(description="job")
    def job_link(self, row):
        return format_html('<a href="{}">{}</a>', reverse("admin:jobs_job_change", args=[row.job_id]),
                           adminkit.short_id(row.job_id))

    @admin.display(description="tries", ordering="attempts")
    def tries(self, row):
        return row.attempts

    @admin.display(description="status", ordering="last_status_code")
    def status_code(self, row):
        """The HTTP status the receiver answered the last try with (none: no answer came)."""
        return row.last_status_code

    @admin.display(description="last error")
    def error_start(self, row):
        return adminkit.clipped(row.last_error, title=row.last_error[:ERROR_TITLE]) if row.last_error else None

    @admin.display(description="created", ordering="created_at")
    def created(self, row):
        return adminkit.compact_time(row.created_at)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False  # a dead letter changes only by a replay (its button, or the list's action)

    def has_delete_permission(self, request, obj=None):
        return False  # an event that happened: replay it, never delete it

    def changelist_view(self, request, extra_context=None):
        query = request.GET.urlencode()
        replay_all = (reverse("admin:webhooks_deadletter_replay_matching") + (f"?{query}" if query else "")
                      if self.may(request, REPLAY_DEAD) else "")
        return super().changelist_view(request, {**(extra_context or {}), **adminkit.WIDE_LIST,
                                                 "replay_matching_url": replay_all})

    # --- a dead letter's page ---------------------------------------------------------------------------

    def get_urls(self):
        own = [
            path("replay/", self.admin_site.admin_view(self.replay_matching_view),
                 name="webhooks_deadletter_replay_matching"),
            path("<path:object_id>/replay/", self.admin_site.admin_view(self.replay_one_view),
                 name="webhooks_deadletter_replay"),
        ]
        return own + super().get_urls()

    def change_view(self, request, object_id, form_url="", extra_context=None):
        if not self.has_view_permission(request):
            raise PermissionDenied("You need webhooks.view_deadletter")
        letter = DeadLetter.objects.select_related("client").filter(pk=unquote(object_id)).first()
        if letter is None:
            raise Http404("No such delivery.")
        tries = (DeliveryAttempt.objects.filter(delivery_id=letter.id).order_by("number").defer("response_body")
                 .annotate(body_start=Substr("response_body", 1, BODY_SHOWN), body_length=Length("response_body")))
        return TemplateResponse(request, "admin/webhooks/deadletter/page.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta, "title": f"Dead letter {letter.id}",
            "letter": letter, "dead": letter.status == DeliveryStatus.DEAD, "envelope": _pretty(letter.envelope),
            "tries": tries, "body_shown": BODY_SHOWN, "url": letter.url or _endpoint_url(letter),
            "job_url": reverse("admin:jobs_job_change", args=[letter.job_id]),
            "replay_url": (reverse("admin:webhooks_deadletter_replay", args=[quote(letter.id)])
                           if self.may(request, REPLAY_DEAD) else ""),
        })

    # --- replay: one, the selection, every match --------------------------------------------------------

    def replay_one_view(self, request, object_id):
        self.refuse_unless_may(request, REPLAY_DEAD)
        ident = unquote(object_id)
        if not Delivery.objects.filter(id=ident).exists():
            raise Http404("No such delivery.")
        page = reverse("admin:webhooks_deadletter_change", args=[quote(ident)])
        return self._confirm_and_replay(request, Delivery.objects.filter(id=ident), f"dead letter {ident}",
                                        hidden=[], back=page, done=reverse("admin:webhooks_deadletter_changelist"))

    def replay_matching_view(self, request):
        """Every dead letter the list's filter and search match (its query string), not only one page."""
        self.refuse_unless_may(request, REPLAY_DEAD)
        try:
            letters = self.get_changelist_instance(request).get_queryset(request)
        except IncorrectLookupParameters:
            raise Http404("Unknown filter.") from None
        query = request.GET.urlencode()
        back = reverse("admin:webhooks_deadletter_changelist") + (f"?{query}" if query else "")
        return self._confirm_and_replay(request, letters,
                                        f"dead letters matching {adminkit.describe_filter(request.GET) or 'every row'}",
                                        hidden=[], back=back)

    def act_on_selection(self, request, queryset, action):
        target, hidden = _selection(request, action.list_action, "dead letters")
        return self._confirm_and_replay(request, queryset, target, hidden=hidden, back=request.get_full_path())

    def _confirm_and_replay(self, request, letters, target, *, hidden, back, done=""):
        # the list's join of the client: the replay reads ids only
        return adminkit.confirm_action(self, request, REPLAY_DEAD, letters.select_related(None), target=target,
                                       hidden=hidden, back=back, done_url=done)


REPLAY_DEAD = BY_NAME["replay_dead"]  # a dead letter's page and the list's "every match" offer it too


def _pretty(envelope: str) -> str:
    """The stored envelope indented for reading (the bytes sent stay as stored); as stored if not JSON."""
    try:
        return json.dumps(json.loads(envelope), indent=2, ensure_ascii=False)
    except ValueError:
        return envelope


def _endpoint_url(letter) -> str:
    endpoint = Endpoint.objects.filter(client_id=letter.client_id).only("url").first()
    return f"(the client's endpoint) {endpoint.url}" if endpoint and endpoint.url else "(none: no URL was set)"


class SigningSecretInline(admin.TabularInline):
    model = SigningSecret
    extra = 0
    fields = ("created_at", "expires_at")
    readonly_fields = fields


@admin.register(Endpoint)
class EndpointAdmin(admin.ModelAdmin):
    list_display = ("client", "url", "disabled_at", "disabled_reason")
    list_filter = (("disabled_at", admin.EmptyFieldListFilter),)
    inlines = [SigningSecretInline]
    actions = ["enable"]

    @admin.action(description="Enable: take deliveries again (waiting ones are sent)")
    def enable(self, request, queryset):
        waiting = sum(endpoint_enable(endpoint=endpoint) for endpoint in queryset)
        self.message_user(request, f"Enabled; {waiting} waiting deliveries are due now.", messages.SUCCESS)
