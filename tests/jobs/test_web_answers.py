"""Rules of the real `web` process's answers outside any one endpoint's logic: a wrong method is a JSON 405
with `Allow` on every /v1/ route and on /metrics (never Django's HTML CSRF page), the spend month is ASCII
YYYY-MM within what a date can answer, a media job has no report, a report's output is its report, and the
report page is served under a strict Content-Security-Policy."""

import re
import uuid

import pytest
import requests
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.views import APIView

from jobs.services import client_create
from tests.support.http_api import HttpApi
from tests.support.reports import assert_strict_report_page_headers

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
# The routes that are plain Django views, and the methods each takes. A new one fails the walk below
# until it is listed here, so its wrong methods are checked too.
FUNCTION_VIEWS = {"job_events": {"GET"}, "provider_callback": {"POST"}, "metrics_view": {"GET", "HEAD"}}


# A value for each path converter the API's routes use; a converter not here fails the walk (KeyError).
SAMPLES = {"uuid": str(uuid.uuid4()), "slug": "sandbox", "template_name": "garden-plan", "int": "1"}


def routes():
    """Every route under /v1/ and /metrics: (a concrete path, the methods its view takes)."""
    found = []

    def walk(patterns, prefix):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, prefix + str(pattern.pattern))
                continue
            assert isinstance(pattern, URLPattern)
            route = prefix + str(pattern.pattern)
            if not (route.startswith("v1/") or route == "metrics"):
                continue
            path = "/" + re.sub(r"<(\w+):[^>]+>", lambda m: SAMPLES[m.group(1)], route)
            view_class = getattr(pattern.callback, "view_class", None)
            if view_class is not None and issubclass(view_class, APIView):
                allowed = {m.upper() for m in view_class.http_method_names if hasattr(view_class, m)} - {"OPTIONS"}
            else:
                name = pattern.callback.__name__
                assert name in FUNCTION_VIEWS, f"{route}: a function view the walk does not know ({name})"
                allowed = FUNCTION_VIEWS[name]
            found.append((path, allowed))

    walk(get_resolver().url_patterns, "")
    return found


def test_every_wrong_method_under_v1_and_on_metrics_is_a_json_405_with_allow(web_stack):
    api = HttpApi(web_stack.url, client_create(name="methods"))
    walked = routes()
    assert {"/v1/jobs", "/v1/spend", "/v1/orders", "/metrics"} <= {path for path, _ in walked}
    assert any(path.endswith("/events") for path, _ in walked)
    wrong = []
    for path, allowed in walked:
        for method in METHODS:
            if method in allowed:
                continue
            answer = requests.request(method, f"{web_stack.url}{path}", headers=api.headers(), timeout=10,
                                      allow_redirects=False)
            try:
                code = answer.json()["error"]["code"]
            except (ValueError, KeyError, TypeError):
                code = None
            allow = {m.strip() for m in answer.headers.get("Allow", "").split(",") if m.strip()}
            if answer.status_code != 405 or code != "METHOD_NOT_ALLOWED" or not allow or method in allow:
                wrong.append(f"{method} {path}: {answer.status_code} {answer.headers.get('Content-Type')} "
                             f"Allow={answer.headers.get('Allow')!r} {answer.text[:80]!r}")
    assert wrong == []


@pytest.mark.parametrize("month", ["9999-12", "２０２６-０１", "2026-01\n", "1999-12", "2026-13", "2026-1"])
def test_a_spend_month_outside_ascii_yyyy_mm_from_2000_01_to_9999_11_is_422(web_stack, month):
    api = HttpApi(web_stack.url, client_create(name="months"))
    answer = api.get("/v1/spend", month=month)
    assert answer.status_code == 422 and answer.json()["error"]["code"] == "INVALID_REQUEST", answer.text


def test_the_last_spend_month_a_date_can_answer_is_answered(web_stack):
    api = HttpApi(web_stack.url, client_create(name="last-month"))
    answer = api.get("/v1/spend", month="9999-11")
    assert answer.status_code == 200 and answer.json()["resets_at"] == "9999-12-01T00:00:00Z"


def test_a_page_limit_of_thousands_of_digits_is_422(web_stack):
    api = HttpApi(web_stack.url, client_create(name="long-limit"))
    answer = api.get("/v1/jobs", limit="9" * 4301)
    assert answer.status_code == 422 and answer.json()["error"]["code"] == "INVALID_REQUEST", answer.text


def test_the_report_of_a_media_job_is_404_not_a_report(web_stack):
    api = HttpApi(web_stack.url, client_create(name="media-only"))
    job_id = api.create({"kind": "media", "models": ["sandbox/video-keyed"],
                         "input": {"prompt": "no report", "render_s": 0}}, key="media").json()["id"]
    for accept in ("application/json", "text/markdown"):
        answer = api.http.get(f"{web_stack.url}/v1/jobs/{job_id}/report", timeout=10,
                              headers=api.headers(Accept=accept))
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "NOT_A_REPORT", answer.text


def test_a_succeeded_reports_output_is_a_303_to_its_report_for_the_api_and_its_text_for_staff(web_stack, engine):
    from tests.support.admin import login, staff
    from tests.support.reports import report_body

    api = HttpApi(web_stack.url, client_create(name="report-reader"))
    job_id = api.create(report_body(chapters=["sun", "moon"]), key="output-of-a-report").json()["id"]
    assert engine.run_job(job_id).status == "succeeded"  # the report runs here; the web process answers

    answer = api.http.get(f"{web_stack.url}/v1/jobs/{job_id}/output", headers=api.headers(), timeout=10,
                          allow_redirects=False)
    assert answer.status_code == 303 and answer.headers["Location"] == f"/v1/jobs/{job_id}/report", answer.text
    followed = api.http.get(f"{web_stack.url}/v1/jobs/{job_id}/output", headers=api.headers(), timeout=10)
    assert followed.status_code == 200 and followed.headers["Content-Type"].startswith("text/markdown")
    assert followed.text == api.http.get(f"{web_stack.url}/v1/jobs/{job_id}/report", headers=api.headers(),
                                         timeout=10).text and "sun" in followed.text.lower()

    staff("report-support", None)
    shown = login(web_stack.url, "report-support").get(f"{web_stack.url}/admin/jobs/job/{job_id}/output/", timeout=10)
    assert shown.status_code == 200 and shown.headers["Content-Type"].startswith("text/plain")
    assert shown.text == followed.text


def test_the_output_of_a_job_with_none_yet_is_409_job_not_succeeded_and_the_callbacks_are_in_the_schema(web_stack):
    api = HttpApi(web_stack.url, client_create(name="impatient"))
    job_id = api.create({"kind": "media", "models": ["sandbox/video-keyed"],
                         "input": {"prompt": "not yet", "render_s": 0}}, key="not-yet").json()["id"]  # no worker: queued
    answer = api.http.get(f"{web_stack.url}/v1/jobs/{job_id}/output", headers=api.headers(), timeout=10)
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["code"] == "JOB_NOT_SUCCEEDED" and answer.json()["error"]["status"] == "queued"
    other = HttpApi(web_stack.url, client_create(name="nosy"))
    assert other.http.get(f"{web_stack.url}/v1/jobs/{job_id}/output", headers=other.headers(), timeout=10).status_code == 404

    document = requests.get(f"{web_stack.url}/v1/schema", headers={"Accept": "application/vnd.oai.openapi+json"},
                            timeout=30).json()
    callback = document["paths"]["/v1/callbacks/{provider}"]["post"]
    assert callback["security"] == [] and {"200", "202", "400", "404", "409", "422"} <= set(callback["responses"])
    assert "409" in document["paths"]["/v1/jobs/{job_id}/output"]["get"]["responses"]


def test_a_link_that_opens_nothing_is_served_under_the_same_strict_content_security_policy(web_stack):
    pages = [requests.get(f"{web_stack.url}/r/not-a-token", timeout=10) for _ in range(2)]
    for page in pages:
        assert page.status_code == 404
        assert_strict_report_page_headers(page.headers, page.text)
    assert pages[0].headers["Content-Security-Policy"] != pages[1].headers["Content-Security-Policy"]  # a nonce each
