"""A report template's preview in a real browser: an installed chromium (tests/support/browser.py), driven by
playwright (no browser download), against the real `web` process. An operator logs in, opens a client's
template version, types a sample subject, submits the preview and reads every prompt rendered and the worst
case, which is what jobs.kinds.report.reports.preview computes for the same version, subject and model; a
subject missing a field the template prints comes back as the form's error naming it. No model is called."""

import json
import re
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model

from accounts.models import Client
from executor.models import Attempt
from jobs.kinds.report import reports, templates
from jobs.models import Job
from jobs.services import client_create
from tests.support.browser import chromium
from tests.support.reports import GARDEN
from tests.support.reports import GARDEN_SUBJECT as ADA

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PASSWORD = "template-preview-password"
LAPTOP = {"width": 1366, "height": 768}


def test_an_operator_previews_a_version_in_the_browser_and_reads_the_worst_case_the_preflight_reserves(
        web_stack, ledger):
    # Given: a client's template, written as the API writes it, and an operator.
    client = Client.objects.get(id=client_create(name="garden-shop")["client_id"])
    body = {key: value for key, value in GARDEN.items() if key != "name"}
    version = templates.version_create(client=client, name="garden-plan", body=body)
    get_user_model().objects.create_superuser("ops", "ops@example.com", PASSWORD)
    expected = reports.preview(version_id=version.id, subject=ADA, model="sandbox/llm", client_id=client.id)
    attempts, jobs, calls = Attempt.objects.count(), Job.objects.count(), len(ledger.calls())
    url = f"{web_stack.url}/admin/jobs/reporttemplate/{version.template_id}/versions/1/"

    # Database work is done: playwright's sync API keeps an event loop in this thread from here on.
    with chromium() as browser:
        page = browser.new_page(viewport=LAPTOP)
        page.goto(f"{web_stack.url}/admin/login/?next=/admin/")
        page.fill("#id_username", "ops")
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        page.wait_for_selector("#site-name")

        page.goto(url)
        assert page.locator("[data-testid=version]").inner_text().startswith("v1")
        assert page.locator("tr[data-field=system] pre").inner_text() == GARDEN["system"]
        assert page.locator("[data-testid=chapters-written] tbody tr").count() == 3
        assert page.locator("#id_model").input_value() == "sandbox/llm"  # ORDER_REPORT_MODEL

        # When: a subject without `climate` is previewed, then the whole subject.
        page.fill("#id_subject", json.dumps({"name": "Ada", "plot": "clay"}))
        page.click("[data-testid=preview-submit]")
        page.wait_for_selector("ul.errorlist")
        assert "the subject has no 'climate'" in page.locator("ul.errorlist").inner_text()
        assert page.locator("[data-testid=worst-total]").count() == 0
        assert json.loads(page.locator("#id_subject").input_value()) == {"name": "Ada", "plot": "clay"}  # kept

        page.fill("#id_subject", json.dumps(ADA, indent=2))
        page.click("[data-testid=preview-submit]")
        page.wait_for_selector("[data-testid=worst-total]")

        # Then: every prompt with the subject's values, and the worst case the preview computes.
        assert page.locator("ul.errorlist").count() == 0
        system = page.locator("[data-testid=preview-system]").inner_text()
        assert system.startswith("You are a garden designer writing for Ada.")
        chapters = page.locator("section[data-chapter]")
        keys = [chapters.nth(n).get_attribute("data-chapter") for n in range(chapters.count())]
        assert keys == ["soil", "plants", "year"]
        soil = chapters.nth(0).locator("[data-testid=preview-chapter]").inner_text()
        assert "Advise on the soil of a clay plot." in soil
        assert page.locator("[data-testid=preview-title]").inner_text() == "A garden for Ada"
        total = page.locator("[data-testid=worst-total]").inner_text()
        assert re.fullmatch(r"\$[0-9]+\.[0-9]{6}", total)
        assert Decimal(total[1:]) == expected["worst_case"]["total_usd"] > 0
        assert page.locator("[data-testid=worst-chapters]").inner_text() == "3"
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")  # no sideways scroll

    # Nothing was paid or written: no attempt, no job, no call on the provider.
    assert (Attempt.objects.count(), Job.objects.count(), len(ledger.calls())) == (attempts, jobs, calls)
