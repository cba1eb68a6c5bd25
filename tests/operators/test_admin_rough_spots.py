"""The admin's rough spots an operator met (issue 38), each on the real database through Django's test
client: the Models page lists every live model with its source and price; a price override with no
amount is refused (the form, and the database's constraint under it); a refusal is an admin page naming
the permission; one "API keys" entry; the index leads with what operators use; a job page's timeline keeps
the order things happened in within one instant and shows the job's input, metadata, key and times; a NUL
byte in any list's search or filter, or a bulk action's filter, is a 400, never a 500. The dead-letter
list's fit at 1366 px is measured in the browser (tests/operators/test_admin_browser.py)."""

import json
import re
from datetime import timedelta
from decimal import Decimal
from urllib.parse import quote

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import IntegrityError, transaction
from django.test import Client as DjangoClient
from django.urls import reverse
from django.utils import timezone

from billing import rates
from billing.models import ModelPrice, PriceDrift, Reservation
from executor import registry
from executor.models import Attempt, AttemptState, ModelConfig
from jobs.models import Job, JobStatus, Step, StepStatus
from jobs.services import job_finish
from operators import adminsite
from operators.admin.catalog import SOURCE_ADMIN, SOURCE_CODE, SOURCE_FILE, price_words
from operators.timeline import job_timeline
from tests.conftest import HOOK_URL, media_body

pytestmark = pytest.mark.django_db

MODELS = "/admin/executor/modelconfig/"
FILE_MODEL = "fal/fal-ai/flux/schnell"  # a fal model the code does not name: the models file adds it


def live_rows(page: str) -> dict[str, dict]:
    """The Models page's first table: per model, its cells and data attributes."""
    table = page.split('data-testid="live-models"')[1].split("</table>")[0]
    rows = {}
    for attrs, cells in re.findall(r'<tr (data-model="[^"]*"[^>]*)>(.*?)</tr>', table, re.S):
        data = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', attrs))
        texts = [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", cells, re.S)]
        enabled = re.search(r'data-enabled="([^"]*)"', cells).group(1)
        rows[data["model"]] = {"source": data["source"], "price_source": data["price-source"], "provider": texts[1],
                               "kind": texts[2], "enabled": enabled, "price": texts[5], "drift": texts[7]}
    return rows


@pytest.fixture
def catalog(tmp_path, fresh_catalog):
    """A models file adding a model and pricing a code one; admin rows disabling one and overriding a price."""
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": [
        {"name": FILE_MODEL, "provider": "fal", "kind": "image", "content_type": "image/jpeg",
         "price": {"per_unit": "0.003", "unit": "image"}},
        {"name": "sandbox/image-lookup", "price": {"per_unit": "0.05", "unit": "image"}},
    ]}))
    fresh_catalog.MODELS_FILE = str(path)
    ModelConfig.objects.create(name="sandbox/image-blind", enabled=False)
    ModelPrice.objects.create(model="sandbox/video-keyed", per_unit_usd=Decimal("0.45"), unit="render")
    now = timezone.now()
    PriceDrift.objects.create(model="sandbox/video-keyed", first_seen_at=now, last_seen_at=now,
                              reserved_usd=Decimal("0.40"), cost_usd=Decimal("0.50"), highest_cost_usd=Decimal("0.50"))
    registry.forget_models()
    rates.forget_overrides()
    return fresh_catalog


def test_the_models_page_lists_every_live_model_with_its_source_and_price(admin_client, catalog):
    response = admin_client.get(MODELS)
    assert response.status_code == 200
    page = response.content.decode()
    rows = live_rows(page)
    # Every model the code names is there (before: "0 models", the admin's rows alone), and the file's.
    assert set(registry.code_model_names()) | {FILE_MODEL} <= set(rows), set(registry.code_model_names()) - set(rows)
    assert f'data-testid="live-count">{len(rows)} models<' in page
    for name, row in rows.items():
        assert row["price"] == price_words(name), (name, row)
        assert row["price"] and "None" not in row["price"], (name, row)
    assert rows["sandbox/llm"] == {**rows["sandbox/llm"], "source": SOURCE_CODE, "price_source": SOURCE_CODE,
                                   "provider": "sandbox", "kind": "text", "enabled": "yes",
                                   "price": "$3 in / $15 out per Mtok"}
    assert rows[FILE_MODEL] == {**rows[FILE_MODEL], "source": SOURCE_FILE, "price_source": SOURCE_FILE,
                                "provider": "fal", "kind": "image", "enabled": "yes", "price": "$0.003 per image"}
    lookup = rows["sandbox/image-lookup"]
    assert (lookup["source"], lookup["price_source"], lookup["price"]) == (
        f"{SOURCE_CODE} + {SOURCE_FILE}", SOURCE_FILE, "$0.05 per image")
    blind = rows["sandbox/image-blind"]  # disabled in the admin: still listed, with its provider and kind
    assert (blind["source"], blind["enabled"], blind["kind"]) == (f"{SOURCE_CODE} + {SOURCE_ADMIN}", "no", "image")
    keyed = rows["sandbox/video-keyed"]
    assert (keyed["price_source"], keyed["price"]) == (SOURCE_ADMIN, "$0.450000 per render")
    assert keyed["drift"] == "up to $0.500000 (reserved $0.400000)"
    # A model with no admin row links to the add page with its name filled in: that is how its price is
    # overridden; one with a row, to the row.
    assert f'href="{reverse("admin:executor_modelconfig_add")}?name=sandbox%2Fllm"' in page
    blind_row = ModelConfig.objects.get(name="sandbox/image-blind")
    assert f'href="{reverse("admin:executor_modelconfig_change", args=[blind_row.pk])}"' in page

    found = live_rows(admin_client.get(MODELS, {"q": "fal/fal-ai/flux"}).content.decode())
    assert set(found) == {"fal/fal-ai/flux/dev", FILE_MODEL}
    assert set(live_rows(admin_client.get(MODELS, {"enabled__exact": "0"}).content.decode())) == {"sandbox/image-blind"}


def price_form(name: str, **fields) -> dict:
    return {"name": name, "enabled": "on", "provider": "", "kind": "", "content_type": "", "capabilities": "",
            "params": "", "note": "", "price_override": "on", "unit": "", "variants": "", "price_reason": "why",
            **fields}


def test_a_price_override_without_an_amount_is_refused_by_the_form_and_by_the_database(admin_client, fresh_catalog):
    add = reverse("admin:executor_modelconfig_add")
    # A new model added disabled: no layer gives it a kind, so the catalog's validator had no kind to hold
    # the price to, and the override was saved with no amount ("$None per image").
    disabled_new = {k: v for k, v in price_form("fal/fal-ai/some-new-model", unit="image").items() if k != "enabled"}
    for form in (price_form("sandbox/image-blind", unit="image"), disabled_new):
        response = admin_client.post(add, form)
        assert response.status_code == 200  # the form again, with its error; nothing saved
        assert "An override states its price" in response.content.decode(), form
        assert not ModelPrice.objects.exists() and not ModelConfig.objects.exists()
    # With an amount it is saved, and the page lists the price.
    response = admin_client.post(add, price_form("sandbox/image-blind", unit="image", per_unit_usd="0.05"))
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert ModelPrice.objects.get(model="sandbox/image-blind").per_unit_usd == Decimal("0.05")
    rates.forget_overrides()
    assert live_rows(admin_client.get(MODELS).content.decode())["sandbox/image-blind"]["price"] == "$0.050000 per image"
    # No other path can write one either: the table's constraint refuses the row.
    for fields in ({"unit": "image"}, {"input_per_mtok_usd": Decimal("1")}, {}):
        with pytest.raises(IntegrityError, match="model_price_states_amount"), transaction.atomic():
            ModelPrice.objects.create(model="sandbox/llm", **fields)
    ModelPrice.objects.create(model="sandbox/llm", free=True)


def staff(name: str, *perms: str):
    user = get_user_model().objects.create_user(name, f"{name}@example.com", "pw-" + name, is_staff=True)
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app, codename=codename))
    client = DjangoClient()
    client.force_login(user)
    return client


def test_a_refusal_in_the_admin_is_an_admin_page_naming_the_permission_and_the_api_stays_json(db):
    nobody = staff("nobody")
    for url, needed in (("/admin/jobs/job/", "jobs.view_job"),
                        ("/admin/executor/modelconfig/", "executor.view_modelconfig"),
                        ("/admin/billing/spend/", "billing.view_budgetmonth"),
                        ("/admin/jobs/job/bulk/retry/", "jobs.retry_job"),
                        ("/admin/webhooks/deadletter/", "webhooks.view_deadletter")):
        response = nobody.get(url)
        assert response.status_code == 403, url
        assert response["Content-Type"].startswith("text/html"), url
        page = response.content.decode()
        assert f"You need {needed}" in page or f"and {needed}" in page, (url, page[-1500:])
        assert 'id="site-name"' in page  # the admin's own header: an admin page, not a bare body
    viewer = staff("viewer", "jobs.view_job")
    refused = viewer.post("/admin/jobs/job/", {"action": "retry_selected", "_selected_action": []})
    assert refused.status_code == 403 and "retry_selected" in refused.content.decode()
    # Outside the admin a refusal is still the API's JSON (the project's handler403).
    from jobs.api.errors import json_permission_denied
    from django.test import RequestFactory
    answer = json_permission_denied(RequestFactory().get("/v1/jobs"))
    assert answer.status_code == 403 and json.loads(answer.content)["error"]["code"] == "FORBIDDEN"


def test_the_index_lists_one_api_keys_entry_and_leads_with_what_operators_use(admin_client):
    index = admin_client.get("/admin/").content.decode()
    assert index.count("API keys") + index.count("API Keys") == 1, re.findall(r"API [Kk]eys", index)
    assert "/admin/rest_framework_api_key/" not in index
    request = admin_client.get("/admin/").wsgi_request
    apps = admin.site.get_app_list(request)
    assert [app["app_label"] for app in apps][:5] == ["jobs", "accounts", "webhooks", "executor", "billing"]
    assert [model["object_name"] for model in apps[0]["models"]][0] == "Job"
    assert [model["object_name"] for model in apps[1]["models"]] == ["Client", "ClientAPIKey"]
    assert [model["object_name"] for model in apps[2]["models"]][0] == "DeadLetter"
    # In the page too, in that order: the Jobs app comes before any other app's table.
    assert "payonce admin" in index and "Django administration" not in index
    assert index.index('class="app-jobs') < min(index.index(f'class="app-{label}') for label in ("auth", "orders"))


def make_job(make_api, **body):
    api = make_api("alpha", webhook_url=HOOK_URL)
    response = api.create(media_body(**body), key="the-idempotency-key")
    assert response.status_code == 201, response.content
    return Job.objects.get(id=response.json()["id"])


def test_the_timeline_keeps_the_order_of_one_instant_and_the_page_shows_input_metadata_key_and_times(
        admin_client, make_api):
    job = make_job(make_api, metadata={"customer": "c7"})
    # Two transactions' instants: every row below shares one of them (PostgreSQL's now()).
    at, end = job.created_at + timedelta(seconds=1), job.created_at + timedelta(seconds=2)
    Job.objects.filter(id=job.id).update(started_at=at)
    # Two steps written done in one statement (jobs.engine.steps' marks: claimed and done at once), then the
    # step that sends the attempts, done at the same instant as they end.
    for name in ("check_output", "mark_running"):
        Step.objects.create(job=job, run=1, name=name, status=StepStatus.DONE, started_at=at, finished_at=at)
    Step.objects.create(job=job, run=1, name="submit", status=StepStatus.DONE, started_at=at, finished_at=end)
    for number in (1, 2, 3):
        Attempt.objects.create(job=job, run=1, number=number, provider="sandbox", model="video-keyed",
                               upstream_key=f"payonce-{job.id}-{number}", created_at=at, finished_at=end,
                               accepted_at=at if number == 3 else None,
                               state=AttemptState.SUCCEEDED if number == 3 else AttemptState.FAILED)
    job_finish(job_id=job.id, status=JobStatus.SUCCEEDED,
               output={"key": "out/x.mp4", "written_by": str(job.id), "content_type": "video/mp4"})
    Job.objects.filter(id=job.id).update(completed_at=end)
    job.refresh_from_db()
    titles = [entry.title for entry in job_timeline(job)[0] if entry.at in (at, end)]

    def head(number):
        return f"attempt {number} (sandbox/video-keyed, step submit, run 1)"

    # Before: by table (the job's end first, the step's, then the attempts newest first); now the order
    # the rows were written in, and each table's rows by their own number.
    assert titles == [
        "run 1 started", "step check_output claimed", "step check_output done", "step mark_running claimed",
        "step mark_running done", "step submit claimed",
        f"{head(1)}: intent written", f"{head(2)}: intent written", f"{head(3)}: intent written",
        f"{head(3)}: accepted", f"{head(1)}: failed", f"{head(2)}: failed", f"{head(3)}: succeeded",
        "step submit done", "output written", "ended succeeded"], titles

    page = admin_client.get(reverse("admin:jobs_job_change", args=[job.id])).content.decode()
    assert 'data-testid="idempotency-key"><code>the-idempotency-key</code>' in page
    times = re.sub(r"\s+", " ", page.split('data-testid="times">')[1].split("</td>")[0])
    assert f"created {job.created_at:%Y-%m-%d %H:%M:%S}" in times and f"finished {end:%Y-%m-%d %H:%M:%S}" in times
    assert f"started {at:%Y-%m-%d %H:%M:%S}" in times
    shown_input = page.split('data-testid="job-input">')[1].split("</pre>")[0]
    assert json.loads(shown_input.replace("&quot;", '"').replace("&#x27;", "'")) == job.input
    assert "&quot;customer&quot;: &quot;c7&quot;" in page.split('data-testid="job-metadata">')[1].split("</pre>")[0]


def nul_params(model_admin) -> list[dict]:
    """?q=<NUL>, and each of the list's filter parameters (or, with none, a field's) carrying a NUL."""
    names = []
    for each in model_admin.list_filter:
        field = each[0] if isinstance(each, tuple) else each
        names.append(f"{field}__exact" if isinstance(field, str) else getattr(field, "parameter_name", "") or "x")
    if not names:
        names = [f"{model_admin.model._meta.pk.name}__exact"]
    return [{"q": "\x00"}, {"q": "a\x00b"}] + [{name: "x\x00"} for name in names]


def test_a_nul_byte_in_any_lists_search_or_filter_or_a_bulk_filter_is_a_400(admin_client):
    lists = 0
    for model, model_admin in admin.site._registry.items():
        url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        for params in nul_params(model_admin):
            response = admin_client.get(url + "?" + "&".join(f"{k}={quote(v)}" for k, v in params.items()))
            assert response.status_code == 400, (url, params, response.status_code)
            assert "NUL byte" in response.content.decode()
        # A list action posted over a filter with a NUL (select across: "every row the filter matches").
        response = admin_client.post(url + "?q=%00", {"action": "delete_selected", "select_across": "1",
                                                     "index": "0", "_selected_action": ["1"]})
        assert response.status_code == 400, (url, response.status_code)
        lists += 1
    assert lists >= 15
    for action in ("cancel", "retry", "replay"):
        assert admin_client.get(f"/admin/jobs/job/bulk/{action}/?status=%00").status_code == 400
        assert admin_client.post(f"/admin/jobs/job/bulk/{action}/?client=x%00", {"confirm": "yes"}).status_code == 400
    assert admin_client.get("/admin/webhooks/deadletter/replay/?event=%00").status_code == 400
    assert admin_client.get("/admin/jobs/job/%00/change/").status_code == 400
    # The same lists without the NUL answer as before.
    assert admin_client.get("/admin/jobs/job/?q=abc").status_code == 200


def test_the_site_is_payonces_admin_site():
    assert isinstance(admin.site._wrapped if hasattr(admin.site, "_wrapped") else admin.site,
                      adminsite.PayonceAdminSite)


def test_the_job_page_shows_the_trace_of_its_run_or_why_there_is_none(admin_client, make_api):
    api = make_api("traced")
    created = api.create(media_body(), key="traced-1")  # in this process, where traces are off: no trace
    assert created.status_code == 201 and created.json()["trace_id"] is None, created.content
    job = Job.objects.get(id=created.json()["id"])
    page = admin_client.get(reverse("admin:jobs_job_change", args=[job.id])).content.decode()
    assert "none" in page.split('data-testid="trace-id">')[1].split("</span>")[0]
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    Job.objects.filter(id=job.id).update(trace_context=f"00-{trace_id}-00f067aa0ba902b7-01")
    page = admin_client.get(reverse("admin:jobs_job_change", args=[job.id])).content.decode()
    assert f'data-testid="trace-id"><code>{trace_id}</code> (run 1)' in page
    shown = api.get(f"/v1/jobs/{job.id}").json()
    assert shown["trace_id"] == trace_id  # the API's answer names the same
