"""Report templates in the operators' admin (operators.admin.report_templates), through Django's test client on the
real database: the list across clients, a template's versions, a version as written (read only), its preview
(every prompt rendered for a sample subject, the worst case of jobs.kinds.report.reports.preview, no model
called, nothing written), bad input as form errors, who may see what, and `live` moved only through a
confirmation with a reason and an audit row. The browser test is tests/e2e/test_report_template_preview_browser.py."""

import json
import re
from decimal import Decimal
from html import unescape

import pytest
from django.test import Client as DjangoClient

from executor.models import Attempt
from jobs.kinds.report import reports
from jobs.models import Job, Report, ReportTemplate, ReportTemplateVersion
from operators.models import OperatorAction
from tests.support.admin import staff
from tests.support.reports import GARDEN
from tests.support.reports import GARDEN_SUBJECT as ADA

pytestmark = pytest.mark.django_db

LIST = "/admin/jobs/reporttemplate/"


def post_template(api, body: dict):
    """A version as a client writes one: POST /v1/report-templates."""
    answer = api.http.post("/v1/report-templates", data=json.dumps(body), content_type="application/json",
                           headers=api.headers())
    assert answer.status_code == 201, answer.content
    return answer.json()


@pytest.fixture
def garden(make_api):
    """acme's garden-plan at two versions, live still at v1 (v2 written with "live": false); globex's own
    template of another name, one version."""
    acme, globex = make_api("acme"), make_api("globex")
    assert post_template(acme, GARDEN) == {"name": "garden-plan", "version": 1, "live": True}
    v2 = {**GARDEN, "max_output_tokens": 1500, "live": False}
    assert post_template(acme, v2) == {"name": "garden-plan", "version": 2, "live": False}
    post_template(globex, {"name": "tea-reading", "system": "You read tea leaves for {{ subject.name }}.",
                           "chapters": [{"key": "cup", "title": "The cup", "instruction": "Read the cup."}]})
    template = ReportTemplate.objects.get(client_id=acme.client_id, name="garden-plan")
    return {"acme": acme, "globex": globex, "template": template,
            "other": ReportTemplate.objects.get(client_id=globex.client_id, name="tea-reading")}


def version_url(template, number: int) -> str:
    return f"/admin/jobs/reporttemplate/{template.id}/versions/{number}/"


def preview(http, template, number: int = 1, **fields):
    data = {"subject": json.dumps(ADA), "model": "sandbox/llm", **fields}
    return http.post(version_url(template, number), data)


def text_of(response) -> str:
    return unescape(response.content.decode())


def errors_of(response) -> str:
    """The page's form errors, as text."""
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", found)) for found in
                    re.findall(r'<ul class="errorlist[^"]*"[^>]*>.*?</ul>', response.content.decode(), re.S))


# --- the list and a template's page -----------------------------------------------------------------------


def test_the_list_shows_every_clients_templates_with_where_live_points_and_how_many_versions(admin_client, garden):
    response = admin_client.get(LIST)
    assert response.status_code == 200
    rows = {row.name: row for row in response.context["cl"].result_list}
    assert set(rows) == {"garden-plan", "tea-reading"}  # the admin is across clients
    garden_row = rows["garden-plan"]
    assert (garden_row.client.name, garden_row.live, garden_row.versions_count) == ("acme", 1, 2)
    assert (rows["tea-reading"].client.name, rows["tea-reading"].versions_count) == ("globex", 1)
    page = text_of(response)
    assert re.search(r'field-live_version">v1<', page) and re.search(r'field-version_count">2<', page)
    assert 'class="field-updated"' in page

    def listed(**params) -> set[str]:
        return {row.name for row in admin_client.get(LIST, params).context["cl"].result_list}

    assert listed(q="garden") == {"garden-plan"}
    assert listed(q="globex") == {"tea-reading"}  # by the client's name too
    assert listed(client__id__exact=garden["acme"].client_id) == {"garden-plan"}
    # The client filter lists the clients with a template, by name and short id.
    assert f"acme ({garden['acme'].client_id[:8]})" in page and f"globex ({garden['globex'].client_id[:8]})" in page


def test_a_templates_page_lists_its_versions_each_linked_and_marks_the_live_one(admin_client, garden):
    template = garden["template"]
    response = admin_client.get(f"{LIST}{template.id}/change/")
    assert response.status_code == 200
    versions = response.context["versions"]
    assert [(v["number"], v["live"], v["url"]) for v in versions] == [
        (2, False, version_url(template, 2)), (1, True, version_url(template, 1))]
    page = text_of(response)
    for number in (1, 2):
        assert f'<a href="{version_url(template, number)}">v{number}</a>' in page
    assert page.count('data-testid="live-mark"') == 1
    assert admin_client.get(f"{LIST}999999/change/").status_code == 404
    assert admin_client.get(f"{LIST}nope/change/").status_code == 404


def test_a_version_page_shows_the_version_as_written(admin_client, garden):
    response = admin_client.get(version_url(garden["template"], 2))
    assert response.status_code == 200
    page = text_of(response)
    for text in (GARDEN["system"], GARDEN["synthesis"], GARDEN["layout"]["title"], GARDEN["layout"]["closing"],
                 GARDEN["layout"]["chapter_heading"], GARDEN["mail"]["subject"], GARDEN["page_title"]):
        assert text in page, text
    assert GARDEN["mail"]["body"].split("\n")[0] in page
    for chapter in GARDEN["chapters"]:
        title, instruction = re.escape(chapter["title"]), re.escape(chapter["instruction"])
        assert re.search(rf'<tr data-chapter="{chapter["key"]}"><td><code>{chapter["key"]}</code></td><td><pre>'
                         rf'{title}</pre></td><td><pre>{instruction}</pre>', page)
    assert re.search(r'data-field="max_output_tokens"><th>max_output_tokens</th><td>\s*<pre>1500</pre>', page)  # v2's
    assert "not live (live is v1)" in page
    # Before any preview: the form, with the catalog's text models and ORDER_REPORT_MODEL chosen.
    form = response.context["form"]
    models = [name for name, _ in form.fields["model"].choices]
    assert "sandbox/llm" in models and "anthropic/claude-sonnet-4-5" in models
    assert "sandbox/video-keyed" not in models and "sandbox/image-lookup" not in models
    assert form["model"].value() == "sandbox/llm"
    assert [key for key, _ in form.fields["chapters"].choices] == ["soil", "plants", "year"]
    assert response.context["shown"] is None


def test_a_version_a_client_left_fields_out_of_says_what_a_report_uses_instead(admin_client, garden):
    template = garden["other"]  # globex's: no synthesis, layout, mail, page title or tokens written
    page = text_of(admin_client.get(version_url(template, 1)))
    assert re.search(r'data-field="synthesis"><th>synthesis</th><td>\s*<span class="fallback">not set: none', page)
    assert re.search(r'data-field="layout.title"><th>layout.title</th><td>\s*<span class="fallback">not set: the '
                     r"built-in's: Your report</span>", page)
    assert "synthesis 2000, each chapter 4000" in page  # the settings' (tests/settings.py keeps the defaults)


def test_another_clients_template_is_visible_but_nothing_offers_editing_a_version(admin_client, garden):
    other = garden["other"]
    before = list(ReportTemplateVersion.objects.values_list("id", "body").order_by("id"))
    page = text_of(admin_client.get(version_url(other, 1)))
    assert "You read tea leaves for {{ subject.name }}." in page and "globex" in page
    # The one form of the page's content is the preview's: no field of a version's body, no save.
    content = page.split('<div id="report-template-version"')[1]
    assert content.count("<form") == 1 and 'id="preview-form"' in content
    assert set(re.findall(r'<(?:textarea|input|select)[^>]* name="([^"]+)"', content)) == {
        "csrfmiddlewaretoken", "subject", "chapters", "model"}
    assert "_save" not in page and "Save" not in page
    # Django's own pages: no add, no delete; the change page is ours and takes no post; versions have no admin.
    assert admin_client.get(f"{LIST}add/").status_code == 403
    assert admin_client.get(f"{LIST}{other.id}/delete/").status_code == 403
    assert admin_client.post(f"{LIST}{other.id}/change/", {"name": "renamed", "live": 7}).status_code == 405
    assert admin_client.get("/admin/jobs/reporttemplateversion/").status_code == 404
    assert "Add report template" not in text_of(admin_client.get(LIST))
    assert list(ReportTemplateVersion.objects.values_list("id", "body").order_by("id")) == before
    assert ReportTemplate.objects.get(id=other.id).name == "tea-reading"


# --- the preview --------------------------------------------------------------------------------------------


def test_the_preview_renders_every_prompt_for_the_subject_and_the_worst_case_reports_preview_computes(
        admin_client, garden, ledger):
    template, acme = garden["template"], garden["acme"]
    attempts, jobs, calls = Attempt.objects.count(), Job.objects.count(), len(ledger.calls())

    response = preview(admin_client, template, 1)

    assert response.status_code == 200 and errors_of(response) == ""
    page = text_of(response)
    # Every prompt, rendered with the sample subject's values.
    assert "You are a garden designer writing for Ada. Write in Markdown" in page
    sections = dict(re.findall(r'<section data-chapter="([a-z]+)">(.*?)</section>', page, re.S))
    assert list(sections) == ["soil", "plants", "year"]
    assert "Advise on the soil of a clay plot." in sections["soil"]
    assert "Choose ten plants for maritime weather." in sections["plants"]
    assert "Your soil (soil)" in sections["soil"] and "What to plant (plants)" in sections["plants"]
    assert '"climate": "maritime"' in sections["year"]  # the subject every chapter's prompt carries
    synthesis = re.search(r'<pre data-testid="preview-synthesis">(.*?)</pre>', page, re.S).group(1)
    assert synthesis.endswith(GARDEN["synthesis"]) and '"name": "Ada"' in synthesis
    assert re.search(r'data-testid="preview-title">A garden for Ada<', page)
    assert re.search(r'data-testid="preview-page-title">Your garden plan<', page)
    assert "_Planned for Ada. Happy digging._" in page
    assert re.search(r'data-testid="preview-mail-subject">Your garden plan is ready, Ada<', page)
    assert "Hello Ada,\n\nyour plan is here: " in page

    # The worst case: what reports.preview says, called here on its own.
    expected = reports.preview(version_id=ReportTemplateVersion.objects.get(template=template, number=1).id,
                               subject=ADA, model="sandbox/llm", client_id=acme.client_id)["worst_case"]
    total = Decimal(re.search(r'data-testid="worst-total">\$([0-9.]+)<', page).group(1))
    assert total == expected["total_usd"] > 0
    assert Decimal(re.search(r'data-testid="worst-synthesis">\$([0-9.]+)<', page).group(1)) == expected["synthesis_usd"]
    per_chapter = Decimal(re.search(r'data-testid="worst-per-chapter">\$([0-9.]+)<', page).group(1))
    assert per_chapter == expected["per_chapter_usd"]
    assert re.search(r'data-testid="worst-chapters">3<', page)
    assert total == expected["synthesis_usd"] + 3 * per_chapter

    # No model was called and nothing was written.
    assert (Attempt.objects.count(), Job.objects.count(), Report.objects.count()) == (attempts, jobs, 0)
    assert len(ledger.calls()) == calls
    assert OperatorAction.objects.count() == 0


def test_a_chapter_subset_and_another_model_are_priced_as_the_preview_prices_them(admin_client, garden):
    template, acme = garden["template"], garden["acme"]
    model = "anthropic/claude-haiku-4-5"  # $1 / $5 per Mtok, where the sandbox's llm is $3 / $15
    response = preview(admin_client, template, 2, chapters=["year", "soil"], model=model)
    page = text_of(response)
    assert re.findall(r'<section data-chapter="([a-z]+)">', page) == ["soil", "year"]  # the template's order
    expected = reports.preview(version_id=ReportTemplateVersion.objects.get(template=template, number=2).id,
                               subject=ADA, model=model, client_id=acme.client_id, chapters=["soil", "year"])
    total = Decimal(re.search(r'data-testid="worst-total">\$([0-9.]+)<', page).group(1))
    assert total == expected["worst_case"]["total_usd"]
    assert re.search(r'data-testid="worst-chapters">2<', page) and f"Worst case at {model}" in page
    # A third of the sandbox's, for the same prompts: the chosen model's own rate card priced them.
    dearer = reports.preview(version_id=ReportTemplateVersion.objects.get(template=template, number=2).id,
                             subject=ADA, model="sandbox/llm", client_id=acme.client_id, chapters=["soil", "year"])
    assert abs(dearer["worst_case"]["total_usd"] - 3 * expected["worst_case"]["total_usd"]) <= Decimal("0.000003")


def test_a_subject_missing_a_variable_is_a_form_error_naming_it(admin_client, garden):
    response = preview(admin_client, garden["template"], 1, subject=json.dumps({"name": "Ada", "plot": "clay"}))
    assert response.status_code == 200
    assert response.context["shown"] is None
    assert errors_of(response).strip() == ("The template's chapters.plants.instruction cannot be written for this "
                                           "subject: the subject has no 'climate'.")
    assert 'data-testid="preview"' not in response.content.decode()


@pytest.mark.parametrize(("fields", "field", "says"), [
    ({"subject": "{name: Ada}"}, "subject", "Not JSON"),
    ({"subject": '{"name": NaN}'}, "subject", "NaN is not a JSON value"),
    ({"subject": "[" * 100_000}, "subject", "At most 64 KiB of text"),
    ({"subject": "[" * 20_000 + "]" * 20_000}, "subject", "Not JSON"),
    ({"subject": "[1, 2]"}, "subject", "a JSON object with at least one field"),
    ({"subject": "{}"}, "subject", "a JSON object with at least one field"),
    ({"subject": json.dumps({"name": "x" * 17_000})}, "subject", "At most 16384 bytes of JSON (17011 given)"),
    ({"subject": ""}, "subject", "This field is required"),
    ({"chapters": ["soil", "nope"]}, "chapters", "nope is not one of the available choices"),
    ({"model": "sandbox/video-keyed"}, "model", "sandbox/video-keyed is not one of the available choices"),
    ({"model": "nobody/nothing"}, "model", "nobody/nothing is not one of the available choices"),
])
def test_bad_input_is_a_form_error_on_its_field_never_a_500(admin_client, garden, fields, field, says):
    response = preview(admin_client, garden["template"], 1, **fields)
    assert response.status_code == 200
    assert response.context["shown"] is None
    assert list(response.context["form"].errors) == [field]
    assert says in errors_of(response), errors_of(response)


def test_a_version_that_does_not_exist_is_404_for_the_page_and_the_preview(admin_client, garden):
    template = garden["template"]
    assert admin_client.get(version_url(template, 3)).status_code == 404
    assert preview(admin_client, template, 3).status_code == 404
    assert admin_client.get(f"/admin/jobs/reporttemplate/{garden['other'].id + 1000}/versions/1/").status_code == 404


# --- who may see what, and moving live -------------------------------------------------------------------------


def logged_in(name: str, perms: list[str] | None) -> DjangoClient:
    http = DjangoClient()
    http.force_login(staff(name, perms))
    return http


def test_every_page_and_the_preview_need_the_view_permission(garden):
    template = garden["template"]
    nobody, viewer = logged_in("nobody", []), logged_in("viewer", ["jobs.view_reporttemplate"])
    pages = [LIST, f"{LIST}{template.id}/change/", version_url(template, 1)]
    for url in pages:
        refused = nobody.get(url)
        assert refused.status_code == 403 and "jobs.view_reporttemplate" in text_of(refused), url
        assert viewer.get(url).status_code == 200, url
    assert preview(nobody, template).status_code == 403
    shown = preview(viewer, template)
    assert shown.status_code == 200 and shown.context["shown"] is not None  # the preview is a read
    # A viewer is offered no move of `live`, and is refused one.
    assert 'data-testid="set-live"' not in text_of(viewer.get(version_url(template, 2)))
    live = f"{version_url(template, 2)}live/"
    for answer in (viewer.get(live), viewer.post(live, {"confirm": "yes", "reason": "try"})):
        assert answer.status_code == 403 and "jobs.change_reporttemplate" in text_of(answer)
    assert ReportTemplate.objects.get(id=template.id).live == 1
    assert OperatorAction.objects.count() == 0


def test_moving_live_goes_through_a_confirmation_with_a_reason_and_leaves_an_audit_row(garden):
    template = garden["template"]
    mover = logged_in("mover", ["jobs.view_reporttemplate", "jobs.change_reporttemplate"])
    page = text_of(mover.get(version_url(template, 2)))
    live = f"{version_url(template, 2)}live/"
    assert f'href="{live}" data-testid="set-live"' in page
    assert 'data-testid="set-live"' not in text_of(mover.get(version_url(template, 1)))  # v1 is live already

    confirm = mover.get(live)
    assert confirm.status_code == 200
    assert confirm.context["preview"].target == (f"report template garden-plan of acme ({garden['acme'].client_id}): "
                                                 "live v1 -> v2")
    assert "no report already accepted changes" in text_of(confirm)
    # No reason: refused on the page, nothing moved, no audit row.
    unreasoned = mover.post(live, {"confirm": "yes", "reason": "  "})
    assert unreasoned.status_code == 200 and "a reason is required" in text_of(unreasoned)
    assert ReportTemplate.objects.get(id=template.id).live == 1 and OperatorAction.objects.count() == 0

    done = mover.post(live, {"confirm": "yes", "reason": "v2's longer chapters are approved"})
    assert done.status_code == 302 and done.url == version_url(template, 2)
    assert ReportTemplate.objects.get(id=template.id).live == 2
    entry = OperatorAction.objects.get()
    assert (entry.action, entry.who, entry.via, entry.matched, entry.acted, entry.reason) == (
        "template_live", "mover", "admin", 1, 1, "v2's longer chapters are approved")
    assert (entry.detail["before"], entry.detail["after"]) == (1, 2)
    assert entry.finished_at is not None
    # The API says the same: the client's orders are written from v2 now.
    listed = garden["acme"].get("/v1/report-templates").json()
    assert listed == [{"name": "garden-plan", "live": 2, "versions": 2}]
    # Once live, the version's page offers no move, and a second one changes nothing (0 of 1).
    assert 'data-testid="set-live"' not in text_of(mover.get(version_url(template, 2)))
