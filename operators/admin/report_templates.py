"""Report templates in the admin (docs/design.md, "Report templates"): every client's templates, each one's
versions, a version as it was written, and its preview: every prompt rendered for a sample subject, with the
worst case at a model's rate card (jobs.kinds.report.reports.preview: the pre-flight's own functions, calling
no model and writing nothing).

Read only for what a template says: a client writes its templates through the API, and a version is immutable
(a job pinned it at submit: an edit here would change reports already sold), so the admin adds, edits and
deletes none. The one change it offers is moving a template's `live` label, an operator's decision: it needs
jobs.change_reporttemplate beside the view permission, a reason, and leaves an audit row
(operators.operations.template_live_set, through the templates' own service)."""

import json

from django import forms
from django.conf import settings
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import Http404, HttpResponseNotAllowed
from django.template.response import TemplateResponse
from django.urls import path, reverse

from accounts.models import Client
from executor import registry
from executor.models import ModelKind
from jobs.api.serializers import METADATA_MAX_BYTES
from jobs.kinds.report import reports, templates
from jobs.models import ReportTemplate, ReportTemplateVersion
from operators import adminkit, operations

VIEW_PERMISSION = "jobs.view_reporttemplate"
# Moving `live` is a change of the template's row (its versions never change): Django's own change permission
# on it, which the admin's edit form never uses (ReportTemplateAdmin is a RecordAdmin: there is no such form).
LIVE_PERMISSION = "jobs.change_reporttemplate"

# The preview's sample subject: as large as a report's subject may be (the API's bound, on its compact JSON),
# and the text posted at most four times that (an indented subject is larger than its compact form): a bound
# on what is parsed before anything is checked.
SUBJECT_MAX_BYTES = METADATA_MAX_BYTES
SUBJECT_TEXT_MAX_BYTES = 4 * METADATA_MAX_BYTES


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")  # NaN, Infinity: Python's json takes them, JSON does not


class PreviewForm(forms.Form):
    """A sample subject (a JSON object, bounded as a report's), the chapters (none ticked: all of them, as a
    report naming none) and the model whose rate card prices the worst case (the catalog's text models)."""

    subject = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 8, "cols": 90, "spellcheck": "false"}), strip=False,
        help_text=f'A JSON object, as a report\'s input.subject: {{"name": "Ada"}} (at most '
                  f"{SUBJECT_MAX_BYTES // 1024} KiB). Every field the template prints must be in it.")
    chapters = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple,
                                         help_text="None ticked: every chapter, in the template's order.")
    model = forms.ChoiceField(help_text="Priced at its rate card now; no model is called.")

    def __init__(self, *args, keys: list[str], models: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.keys = keys
        self.fields["chapters"].choices = [(key, key) for key in keys]
        self.fields["model"].choices = [(name, name) for name in models]

    def clean_subject(self) -> dict:
        text = self.cleaned_data["subject"]
        if len(text.encode("utf-8")) > SUBJECT_TEXT_MAX_BYTES:
            raise forms.ValidationError(f"At most {SUBJECT_TEXT_MAX_BYTES // 1024} KiB of text.")
        try:
            subject = json.loads(text, parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
            raise forms.ValidationError(f"Not JSON: {exc}.") from None
        if not isinstance(subject, dict) or not subject:
            raise forms.ValidationError("The subject is a JSON object with at least one field.")
        size = len(json.dumps(subject, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
        if size > SUBJECT_MAX_BYTES:
            raise forms.ValidationError(f"At most {SUBJECT_MAX_BYTES} bytes of JSON ({size} given), as a report's.")
        return subject

    def clean_chapters(self) -> list[str] | None:
        chosen = set(self.cleaned_data["chapters"])  # each is one of the version's keys (the field's choices)
        return [key for key in self.keys if key in chosen] or None  # in the template's order, as a job's


def text_models() -> list[str]:
    return registry.model_names(kind=ModelKind.TEXT)


class TemplateClientFilter(admin.RelatedFieldListFilter):
    """The clients that have a template, by name and short id (two may share a name), not every client."""

    def field_choices(self, field, request, model_admin):
        clients = Client.objects.filter(id__in=ReportTemplate.objects.values("client_id")).order_by("name", "id")
        return [(client.pk, f"{client.name} ({str(client.pk)[:8]})") for client in clients]


@admin.register(ReportTemplate)
class ReportTemplateAdmin(adminkit.RecordAdmin, admin.ModelAdmin):
    """Every client's report templates (the admin is across clients). No add, change or delete (RecordAdmin):
    a template's page lists its versions, a version's page shows it and previews it."""

    list_display = ("name", "client_name", "live_version", "version_count", "updated")
    list_filter = (("client", TemplateClientFilter),)
    search_fields = ("name", "client__name")
    list_select_related = ("client",)
    ordering = ("client__name", "name", "id")

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(versions_count=Count("versions"))

    @admin.display(description="client", ordering="client__name")
    def client_name(self, template):
        return adminkit.client_cell(template.client)  # list_select_related: no query per row

    @admin.display(description="live", ordering="live")
    def live_version(self, template):
        return f"v{template.live}"

    @admin.display(description="versions", ordering="versions_count")
    def version_count(self, template):
        return template.versions_count

    @admin.display(description="updated", ordering="updated_at")
    def updated(self, template):
        return adminkit.compact_time(template.updated_at)

    # --- permissions: reading needs the view permission; moving `live` the change permission too ------------

    def _refuse_unless_viewer(self, request):
        # Before any lookup: a staff user without the permission learns nothing, not even whether the id exists.
        if not self.has_view_permission(request):
            raise PermissionDenied(f"You need {VIEW_PERMISSION}")

    def may_set_live(self, request) -> bool:
        return self.has_view_permission(request) and request.user.has_perm(LIVE_PERMISSION)

    # --- a template's page, a version's page and its preview ------------------------------------------------

    def get_urls(self):
        own = [
            path("<int:template_id>/versions/<int:number>/", self.admin_site.admin_view(self.version_view),
                 name="jobs_reporttemplate_version"),
            path("<int:template_id>/versions/<int:number>/live/", self.admin_site.admin_view(self.live_view),
                 name="jobs_reporttemplate_live"),
        ]
        return own + super().get_urls()

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The template and its versions, each linked to its page. A read: nothing here is posted."""
        self._refuse_unless_viewer(request)
        if request.method != "GET":
            return HttpResponseNotAllowed(["GET"])
        template = (ReportTemplate.objects.select_related("client").filter(pk=object_id).first()
                    if str(object_id).isdigit() else None)
        if template is None:
            raise Http404("No such report template.")
        # At most REPORT_TEMPLATE_VERSIONS_MAX rows, read without their bodies (tens of KiB each): no pagination.
        versions = template.versions.order_by("-number").only("number", "created_at")
        return TemplateResponse(request, "admin/jobs/reporttemplate/page.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta, "template": template,
            "title": f"Report template {template.name}",
            "versions": [{"number": row.number, "created_at": row.created_at, "live": row.number == template.live,
                          "url": reverse("admin:jobs_reporttemplate_version", args=[template.id, row.number])}
                         for row in versions],
        })

    def version_view(self, request, template_id, number):
        """A version as written, and its preview: the form (GET), or the preview for what was posted. A read,
        posted because a subject is too large for a URL; it calls no model and writes nothing."""
        self._refuse_unless_viewer(request)
        row = self._version(template_id, number)
        template = row.template
        keys = [chapter["key"] for chapter in row.body.get("chapters") or ()]
        form = PreviewForm(request.POST if request.method == "POST" else None, keys=keys, models=text_models(),
                           initial={"model": settings.ORDER_REPORT_MODEL})
        shown = None
        if form.is_valid():
            data = form.cleaned_data
            try:
                shown = reports.preview(version_id=row.id, subject=data["subject"], model=data["model"],
                                        client_id=template.client_id, chapters=data["chapters"])
            except templates.TemplateProblem as problem:
                form.add_error("subject", f"The template's {problem.field} cannot be written for this subject: "
                                          f"{problem.message}")
            except KeyError as exc:  # the form offers the version's keys only; the preview says so too
                form.add_error("chapters", f"Not a chapter of {template.name} v{row.number}: {exc}.")
        may_set_live = self.may_set_live(request) and row.number != template.live
        return TemplateResponse(request, "admin/jobs/reporttemplate/version.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta,
            "title": f"{template.name} v{row.number}", "template": template, "row": row,
            "live": row.number == template.live, "written": written(row.body), "body_json": _pretty(row.body),
            "form": form, "shown": shown,
            "template_url": reverse("admin:jobs_reporttemplate_change", args=[template.id]),
            "live_url": (reverse("admin:jobs_reporttemplate_live", args=[template.id, row.number])
                         if may_set_live else ""),
        })

    def live_view(self, request, template_id, number):
        """Point the template's `live` label at this version: the shared confirmation (a required reason), then
        the move and its audit row (operators.operations.template_live_set)."""
        if not self.may_set_live(request):  # the confirmation (GET) as well as the move (POST)
            raise PermissionDenied(f"You need {VIEW_PERMISSION} and {LIVE_PERMISSION}")
        row = self._version(template_id, number)
        template = row.template
        back = reverse("admin:jobs_reporttemplate_version", args=[template.id, row.number])
        return adminkit.confirm_or_act(
            self, request, back=back,
            act=lambda **who_and_reason: operations.template_live_set(template=template, number=row.number,
                                                                     via="admin", **who_and_reason),
            preview=lambda: operations.template_live_preview(template=template, number=row.number),
            title=f"Make v{row.number} of {template.name} live", verb="move the live label of", hidden=[],
            back_label=f"{template.name} v{row.number}", skipped_why="live already points at this version",
            nothing_paid=f"no report already accepted changes (each job pinned its version at submit); the orders "
                         f"and jobs accepted from now on that name {template.name} without a version are written "
                         f"from v{row.number}.")

    @staticmethod
    def _version(template_id: int, number: int) -> ReportTemplateVersion:
        row = (ReportTemplateVersion.objects.select_related("template__client")
               .filter(template_id=template_id, number=number).first())
        if row is None:
            raise Http404("No such version.")
        return row


def written(body: dict) -> list[dict]:
    """A version's fields as its client wrote them, in the API's order; one it left out says so, with what a
    report uses instead (the built-in template's text, or the settings' output tokens)."""
    layout, mail = body.get("layout") or {}, body.get("mail") or {}
    default = templates.DEFAULT_BODY
    tokens = body.get("max_output_tokens")

    def field(name: str, value, fallback=None) -> dict:
        return {"name": name, "value": value, "fallback": fallback}

    return [
        field("system", body.get("system")),
        field("synthesis", body.get("synthesis"),
              "none: no synthesis call; the chapters' shared block holds the subject alone"),
        field("chapters", body.get("chapters") or []),  # each a key, a title and an instruction: a table of its own
        field("max_output_tokens", tokens, f"synthesis {settings.REPORT_SYNTHESIS_MAX_TOKENS}, each chapter "
                                           f"{settings.REPORT_CHAPTER_MAX_TOKENS} (the settings')"),
        field("layout.title", layout.get("title"), f"the built-in's: {default['layout']['title']}"),
        field("layout.chapter_heading", layout.get("chapter_heading"),
              f"the built-in's: {default['layout']['chapter_heading']}"),
        field("layout.closing", layout.get("closing"), "none"),
        field("layout.figures", layout.get("figures"), "false (no figures line under the title)"),
        field("mail.subject", mail.get("subject"), f"the built-in's: {default['mail']['subject']}"),
        field("mail.body", mail.get("body"), f"the built-in's: {default['mail']['body']}"),
        field("page_title", body.get("page_title"),
              f"the layout's title (the built-in's page title without a layout: {default['page_title']})"),
    ]


def _pretty(body: dict) -> str:
    return json.dumps(body, indent=2, ensure_ascii=False)
