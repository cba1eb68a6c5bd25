"""The page behind the emailed link, in a real browser: an installed chromium (tests/support/browser.py),
driven by playwright (no browser download), against the real `web` process, at a phone's size, with
nothing fetched from anywhere but payonce itself."""

from urllib.parse import urlsplit

import pytest

from jobs.kinds.report.reports import link_token
from jobs.services import client_create
from tests.support.browser import chromium
from tests.support.http_api import HttpApi
from tests.support.reports import CHAPTERS, assert_strict_report_page_headers, report_body

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_report_page_reads_on_a_phone_with_every_chapter_in_order_and_nothing_fetched_elsewhere(
        web_stack, web_worker, ledger):
    api = HttpApi(web_stack.url, client_create(name="reader"))
    job_id = api.create(report_body(), key="read-me").json()["id"]
    assert api.wait(job_id, timeout=60)["status"] == "succeeded"
    with chromium() as browser:
        read_on_a_phone(browser, web_stack, job_id)


def read_on_a_phone(browser, web_stack, job_id):
    page = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=3, is_mobile=True)
    fetched, console = [], []
    page.on("request", lambda request: fetched.append(request.url))
    page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
    response = page.goto(f"{web_stack.url}/r/{link_token(job_id)}")

    assert response.status == 200
    assert_strict_report_page_headers(response.all_headers(), response.text())
    # Styled under the policy: the page's one inline style applied (no violation reported by the browser).
    assert page.evaluate("getComputedStyle(document.querySelector('main')).maxWidth") == "672px"  # 42rem
    assert page.evaluate("getComputedStyle(document.body).fontSize") == "17px"
    sections = page.locator("section[data-chapter]")
    assert sections.count() == 8
    assert [sections.nth(n).get_attribute("data-chapter") for n in range(8)] == CHAPTERS
    for n in range(8):
        assert sections.nth(n).is_visible() and len(sections.nth(n).inner_text()) > 100
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")  # no sideways scroll
    assert page.locator("[data-testid=figures]").inner_text().startswith("Figures:")
    assert {urlsplit(url).netloc for url in fetched} == {urlsplit(web_stack.url).netloc}  # no CDN, no font
    page.get_by_role("link", name=CHAPTERS[3].capitalize()).click()  # the contents jump to a chapter
    assert page.url.endswith(f"#{CHAPTERS[3]}")
    assert [line for line in console if "Content Security Policy" in line or "Content-Security-Policy" in line] == []


def test_a_tampered_or_foreign_link_is_404(web_stack):
    with chromium() as browser:
        page = browser.new_page()
        for token in ("nothing", link_token("00000000-0000-0000-0000-000000000000")[:-2] + "xx",
                      link_token("00000000-0000-0000-0000-000000000000")):
            response = page.goto(f"{web_stack.url}/r/{token}")
            assert response.status == 404
            assert "does not open a report" in page.content()
