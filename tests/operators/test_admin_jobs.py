"""The operators' job admin on the real database: the list's filters and search, the job page's one
timeline, and cancel / retry / replay over every job a filter matches, each through its confirmation
(count preview, required reason) and one audit row. The browser test (tests/operators/test_admin_browser.py)
drives the same pages in chromium after a real end-to-end run."""

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from executor.models import Attempt, AttemptState
from jobs.models import Job, JobStatus, Step, StepStatus
from jobs.services import job_finish
from operators.models import OperatorAction
from tests.conftest import HOOK_URL, media_body
from webhooks.models import Delivery, DeliveryStatus

pytestmark = pytest.mark.django_db


def make_job(api, key, **overrides):
    response = api.create(media_body(**overrides), key=key)
    assert response.status_code == 201, response.content
    return Job.objects.get(id=response.json()["id"])


def attempt(job, number, state=AttemptState.FAILED, **fields):
    return Attempt.objects.create(job=job, run=job.run, number=number, provider="sandbox", model="video-keyed",
                                  upstream_key=f"payonce-{job.id}-{number}", state=state, **fields)


@pytest.fixture
def jobs(make_api):
    # Clients that take webhooks: their jobs' events are delivery rows (no webhooks process sends them).
    alpha, beta = make_api("alpha", webhook_url=HOOK_URL), make_api("beta", webhook_url=HOOK_URL)
    made = {
        "queued": make_job(alpha, "a-queued", metadata={"customer": "c7", "n": 7}),
        "failed": make_job(alpha, "a-failed", models=["sandbox/video-keyed", "sandbox/image-lookup"]),
        "done": make_job(alpha, "a-done"),
        "beta_queued": make_job(beta, "b-queued"),
    }
    attempt(made["failed"], 1, error_class="server_error", error="upstream said: 500 boom",
            usage={"seconds": 2}, cost_usd=Decimal("0.400000"), cost_source="quoted")
    attempt(made["failed"], 2, error_class="refused", error="the model refused")
    job_finish(job_id=made["failed"].id, status=JobStatus.FAILED,
               error={"code": "ATTEMPTS_EXHAUSTED", "message": "every try failed"})
    attempt(made["done"], 1, state=AttemptState.SUCCEEDED, cost_usd=Decimal("0.400000"), cost_source="quoted")
    Step.objects.create(job=made["done"], run=1, name="submit", status=StepStatus.DONE, lease_owner="jobs@h1",
                        finished_at=timezone.now())
    job_finish(job_id=made["done"].id, status=JobStatus.SUCCEEDED,
               output={"key": "out/x.mp4", "written_by": str(made["done"].id), "content_type": "video/mp4"})
    return {name: Job.objects.get(id=job.id) for name, job in made.items()}


def listed(admin_client, **params) -> set[str]:
    response = admin_client.get("/admin/jobs/job/", params)
    assert response.status_code == 200
    return {str(job.id) for job in response.context["cl"].result_list}


def test_the_list_filters_by_status_client_model_kind_and_month(admin_client, jobs):
    ids = {name: str(job.id) for name, job in jobs.items()}
    assert listed(admin_client) == set(ids.values())
    assert listed(admin_client, status__exact="queued") == {ids["queued"], ids["beta_queued"]}
    assert listed(admin_client, client__id__exact=str(jobs["beta_queued"].client_id)) == {ids["beta_queued"]}
    assert listed(admin_client, model="sandbox/image-lookup") == {ids["failed"]}
    assert listed(admin_client, kind__exact="report") == set()
    this_month = f"{timezone.now():%Y-%m}"
    assert listed(admin_client, month=this_month) == set(ids.values())
    assert listed(admin_client, month="2001-01") == set()


def test_the_search_finds_a_job_by_id_upstream_key_idempotency_key_and_metadata(admin_client, jobs):
    failed = str(jobs["failed"].id)
    assert listed(admin_client, q=failed) == {failed}
    assert listed(admin_client, q=f"payonce-{failed}-2") == {failed}
    assert listed(admin_client, q=f"payonce-{failed}-9") == set()  # no such attempt
    assert listed(admin_client, q="a-failed") == {failed}
    assert listed(admin_client, q="customer=c7") == {str(jobs["queued"].id)}
    assert listed(admin_client, q="n=7") == {str(jobs["queued"].id)}  # a number in the metadata
    assert listed(admin_client, q="customer=c8") == set()


def test_the_list_never_counts_the_whole_table(admin_client, jobs):
    with CaptureQueriesContext(connection) as queries:
        assert admin_client.get("/admin/jobs/job/").status_code == 200
    counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
    assert counts, "the list counts what it shows"
    assert all("LIMIT" in sql.upper() for sql in counts), counts


def test_the_job_page_is_one_timeline_in_time_order_with_the_providers_words(admin_client, jobs):
    failed = jobs["failed"]
    response = admin_client.get(f"/admin/jobs/job/{failed.id}/change/")
    assert response.status_code == 200
    entries = response.context["entries"]
    assert [entry.at for entry in entries] == sorted(entry.at for entry in entries)
    kinds = [entry.kind for entry in entries]
    assert kinds[0] == "job" and {"attempt", "delivery"} <= set(kinds)
    page = response.content.decode()
    for text in (f"payonce-{failed.id}-1", "upstream said: 500 boom", "server_error", "quoted", "$0.400000",
                 "ATTEMPTS_EXHAUSTED", f"{failed.id}:1:generation.failed"):
        assert text in page, text


def test_the_job_page_links_the_output(admin_client, jobs):
    page = admin_client.get(f"/admin/jobs/job/{jobs['done'].id}/change/").content.decode()
    assert f"/admin/jobs/job/{jobs['done'].id}/output/" in page
    assert "jobs@h1" in page  # the step's lease holder


def test_the_timeline_says_where_an_attempts_output_is_and_never_shows_inline_bytes(admin_client, jobs):
    # An image answered in the body is held on its attempt (a data: URL, megabytes) until the store has it,
    # then only the key stays (issue 37, finding 7); a provider's URL is shown as it is.
    done = jobs["done"]
    attempt(done, 2, state=AttemptState.SUCCEEDED, output_url="data:image/png;base64," + "A" * 400_000)
    attempt(done, 3, state=AttemptState.SUCCEEDED, output_url="stored:out/x.png")
    attempt(done, 4, state=AttemptState.SUCCEEDED, output_url="https://media.example.com/x.mp4")
    response = admin_client.get(f"/admin/jobs/job/{done.id}/change/")
    assert response.status_code == 200
    outputs = {entry.title.split(":")[0]: dict(entry.facts).get("output") for entry in response.context["entries"]
               if entry.kind == "attempt" and entry.title.endswith("succeeded")}
    assert outputs == {
        "attempt 1 (sandbox/video-keyed, step submit, run 1)": None,  # no output on its row: nothing said
        "attempt 2 (sandbox/video-keyed, step submit, run 1)": "answered in the body, held on this attempt until "
                                                               "the store has it",
        "attempt 3 (sandbox/video-keyed, step submit, run 1)": "answered in the body, now in the store at out/x.png",
        "attempt 4 (sandbox/video-keyed, step submit, run 1)": "https://media.example.com/x.mp4",
    }
    assert "A" * 1000 not in response.content.decode()


def test_a_bulk_cancel_over_a_filter_previews_needs_a_reason_and_writes_one_audit_row(admin_client, jobs):
    url = f"/admin/jobs/job/bulk/cancel/?client__id__exact={jobs['queued'].client_id}"
    preview = admin_client.get(url)
    assert preview.status_code == 200
    assert (preview.context["preview"].matched, preview.context["preview"].acting) == (3, 1)  # one alpha job open

    refused = admin_client.post(url, {"confirm": "yes", "reason": "  "})
    assert refused.status_code == 200 and refused.context["reason_error"]
    assert not OperatorAction.objects.exists()
    assert Job.objects.get(id=jobs["queued"].id).status == JobStatus.QUEUED

    done = admin_client.post(url, {"confirm": "yes", "reason": "customer asked to stop"})
    assert done.status_code == 302
    assert Job.objects.get(id=jobs["queued"].id).status == JobStatus.CANCELLED
    assert Job.objects.get(id=jobs["beta_queued"].id).status == JobStatus.QUEUED  # another client: untouched
    entry = OperatorAction.objects.get()
    assert (entry.action, entry.who, entry.via, entry.matched, entry.acted) == ("cancel", "admin", "admin", 3, 1)
    assert entry.reason == "customer asked to stop" and entry.finished_at is not None
    assert f"client={jobs['queued'].client_id}" in entry.target
    assert admin_client.get(f"/admin/operators/operatoraction/{entry.id}/change/").status_code == 200


def test_a_retry_says_it_pays_again_with_its_worst_case_and_starts_a_new_run(admin_client, jobs):
    failed = jobs["failed"]
    url = f"/admin/jobs/job/bulk/retry/?id={failed.id}"
    preview = admin_client.get(url)
    assert "This pays again" in preview.content.decode()
    # video-keyed $0.40 and image-lookup $0.04, each up to 3 tries (the default policy)
    assert preview.context["preview"].worst_case_usd == Decimal("1.320000")
    assert admin_client.post(url, {"confirm": "yes", "reason": "provider fixed"}).status_code == 302
    job = Job.objects.get(id=failed.id)
    assert (job.status, job.run) == (JobStatus.QUEUED, 2)
    assert OperatorAction.objects.get().detail["worst_case_usd"] == "1.320000"


def test_a_replay_resends_the_stored_deliveries_and_pays_nothing(admin_client, jobs):
    Delivery.objects.update(status=DeliveryStatus.DEAD, schedule_position=3)
    attempts_before = Attempt.objects.count()
    url = "/admin/jobs/job/bulk/replay/?status__exact=failed"
    preview = admin_client.get(url).context["preview"]
    assert (preview.matched, preview.deliveries) == (1, 1)
    assert admin_client.post(url, {"confirm": "yes", "reason": "receiver was down"}).status_code == 302
    replayed = Delivery.objects.get(job_id=jobs["failed"].id)
    assert (replayed.status, replayed.schedule_position) == (DeliveryStatus.PENDING, 0)
    assert Delivery.objects.get(job_id=jobs["done"].id).status == DeliveryStatus.DEAD  # not matched
    assert Attempt.objects.count() == attempts_before


def test_the_selection_actions_confirm_with_a_reason_too(admin_client, jobs):
    from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME

    chosen = {"action": "cancel_selected", ACTION_CHECKBOX_NAME: [str(jobs["beta_queued"].id)], "index": "0"}
    preview = admin_client.post("/admin/jobs/job/", chosen)
    assert preview.status_code == 200 and preview.context["preview"].acting == 1
    assert Job.objects.get(id=jobs["beta_queued"].id).status == JobStatus.QUEUED
    admin_client.post("/admin/jobs/job/", {**chosen, "confirm": "yes", "reason": "duplicate order"})
    assert Job.objects.get(id=jobs["beta_queued"].id).status == JobStatus.CANCELLED
    assert OperatorAction.objects.get().target == "ids=1 selected"


def test_a_bad_filter_value_is_refused_not_a_500(admin_client, jobs):
    response = admin_client.get("/admin/jobs/job/bulk/cancel/?month=2026-13")
    assert response.status_code == 302
    assert admin_client.get("/admin/jobs/job/bulk/explode/").status_code == 404
    assert admin_client.get("/admin/jobs/job/not-a-uuid/change/").status_code == 404


def test_a_report_that_failed_before_its_first_step_previews_a_retry_of_every_call(admin_client, api):
    from jobs.models import Report
    from tests.support.reports import CHAPTERS, report_body

    response = api.create(report_body(), key="early")
    job_id = response.json()["id"]
    assert not Report.objects.filter(job_id=job_id).exists()
    job_finish(job_id=job_id, status=JobStatus.FAILED, error={"code": "BUDGET_EXCEEDED", "message": "no room"})
    preview = admin_client.get(f"/admin/jobs/job/bulk/retry/?id={job_id}").context["preview"]
    # the synthesis and every chapter, each at its worst case: more than the chapters alone
    from billing import rates

    assert preview.worst_case_usd > rates.worst_case("sandbox/llm", max_tokens=4000) * len(CHAPTERS)


def test_a_job_with_thousands_of_rows_shows_its_newest_entries_and_all_on_demand(admin_client, jobs):
    from datetime import timedelta

    from operators.timeline import SHOWN

    job, start = jobs["done"], timezone.now()
    Attempt.objects.bulk_create([
        Attempt(job=job, run=1, number=n, provider="sandbox", model="video-keyed", upstream_key=f"payonce-{job.id}-{n}",
                state=AttemptState.FAILED, error_class="server_error", created_at=start + timedelta(seconds=n),
                finished_at=start + timedelta(seconds=n, milliseconds=500))
        for n in range(2, SHOWN + 12)])
    page = admin_client.get(f"/admin/jobs/job/{job.id}/change/")
    shown = page.context["entries"]
    assert len(shown) == SHOWN and page.context["older_left_out"]
    assert shown[-1].title.startswith(f"attempt {SHOWN + 11} ")  # the newest is there, the oldest are not
    assert f"payonce-{job.id}-2</dd>" not in page.content.decode()
    every = admin_client.get(f"/admin/jobs/job/{job.id}/change/?all=1")
    assert not every.context["older_left_out"] and f"payonce-{job.id}-2</dd>" in every.content.decode()


# --- the list on a laptop's screen: short ids, client names, what is in use ------------------------------


def test_the_list_shows_short_ids_and_client_names_in_as_many_statements_for_eight_jobs_as_for_four(
        admin_client, jobs, make_api):
    with CaptureQueriesContext(connection) as four:
        page = admin_client.get("/admin/jobs/job/").content.decode()
    failed = jobs["failed"]
    assert f'<span class="short-id" title="{failed.id}">{str(failed.id)[:8]}</span>' in page
    assert f'title="alpha ({failed.client_id})">alpha</span>' in page  # the name shown, the id in its title
    assert "sandbox/video-keyed +1" in page  # a chain's first model and how many fallbacks follow

    gamma = make_api("gamma")
    for n in range(4):
        make_job(gamma, f"g-{n}")
    with CaptureQueriesContext(connection) as eight:
        assert len(admin_client.get("/admin/jobs/job/").context["cl"].result_list) == 8
    assert len(eight) == len(four), [q["sql"] for q in eight.captured_queries]


def _choices(response, title: str) -> list[str]:
    [spec] = [spec for spec in response.context["cl"].filter_specs if spec.title == title]
    return [str(label) for _, label in spec.lookup_choices]


def test_the_filters_list_the_clients_with_jobs_and_the_models_the_newest_jobs_name(admin_client, jobs, make_api,
                                                                                    monkeypatch):
    from operators.admin.jobs import ModelFilter

    make_api("idle")  # a client with no job
    response = admin_client.get("/admin/jobs/job/")
    assert [label.split(" (")[0] for label in _choices(response, "client")] == ["alpha", "beta"]
    assert [label for label in _choices(response, "model")] == ["sandbox/image-lookup", "sandbox/video-keyed"]

    # Bounded: only the newest jobs are read for the models. An older job's model is still filtered on by URL.
    monkeypatch.setattr(ModelFilter, "MODELS_FROM", 1)
    assert _choices(admin_client.get("/admin/jobs/job/"), "model") == ["sandbox/video-keyed"]
    chosen = admin_client.get("/admin/jobs/job/", {"model": "sandbox/image-lookup"})
    assert _choices(chosen, "model") == ["sandbox/image-lookup", "sandbox/video-keyed"]
    assert {job.id for job in chosen.context["cl"].result_list} == {jobs["failed"].id}


# --- the job page's summary ----------------------------------------------------------------------------------


def test_the_job_page_opens_with_each_runs_attempts_paid_cost_and_outcome(admin_client, jobs):
    from jobs.services import job_retry

    failed = jobs["failed"]
    Attempt.objects.filter(job=failed, number=1).update(accepted_at=timezone.now())  # accepted, then failed: paid
    Step.objects.create(job=failed, run=1, name="submit", status=StepStatus.FAILED, finished_at=timezone.now(),
                        result={"error": {"code": "ATTEMPTS_EXHAUSTED", "message": "every try failed"}})
    job_retry(job=failed)
    failed.refresh_from_db()
    attempt(failed, 3, state=AttemptState.UNCERTAIN, sends=1)  # run 2: nobody knows whether it was paid
    attempt(failed, 4, state=AttemptState.SUCCEEDED, accepted_at=timezone.now())  # paid, not priced

    response = admin_client.get(f"/admin/jobs/job/{failed.id}/change/")
    summary = response.context["summary"]
    rows = list(Attempt.objects.filter(job=failed))
    for line in summary.lines:  # each run as the attempt rows say it (Attempt.paid, cost_usd)
        mine = [a for a in rows if a.run == line.run]
        assert (line.attempts, line.paid, line.paid_unknown) == (
            len(mine), sum(a.paid == "yes" for a in mine), sum(a.paid == "unknown" for a in mine))
        assert line.cost_usd == sum((a.cost_usd for a in mine if a.cost_usd is not None), Decimal(0))
    assert [(line.run, line.attempts, line.paid, line.outcome) for line in summary.lines] == [
        (1, 2, 1, "ended ATTEMPTS_EXHAUSTED; retried"), (2, 2, 1, "queued")]
    assert (summary.total.attempts, summary.total.paid, summary.total.cost_usd) == (4, 2, Decimal("0.400000"))
    assert (summary.lines[1].paid_unknown, summary.lines[1].unpriced) == (1, 2)  # both may have been paid
    page = response.content.decode()
    assert page.index('data-testid="runs"') < page.index('data-testid="timeline"')
    # The timeline folds by run: the earlier run closed, the current one open.
    assert '<details class="run" data-run="1">' in page and '<details class="run" data-run="2" open>' in page


def test_a_report_jobs_page_shows_its_link_recipient_mail_and_chapters_done_of_total(admin_client):
    from jobs.models import Report
    from jobs.kinds.report.reports import chapter_save, report_from_token, report_load
    from orders.models import Order
    from orders.services import order_create
    from tests.support.admin import make_client, media_job
    from tests.support.orders import order_data

    order, _ = order_create(client=make_client("shop"), data=order_data("pi_1"))
    url = f"/admin/jobs/job/{order.job_id}/change/"
    early = admin_client.get(url).context["report"]
    assert (early.link, early.recipient, early.chapters_done, early.chapters_total) == ("", "buyer@example.com", 0, 2)

    report = report_load(job=order.job)
    chapter_save(report=report, key="sun", text="warm", run=1, attempt=1)
    duplicate, _ = order_create(client=order.client, data={**order_data("pi_2"), "email": "else@example.com"})
    Order.objects.filter(id=duplicate.id).update(mailed_at=timezone.now(), mailed_to="buyer@example.com")
    response = admin_client.get(url)
    facts = response.context["report"]
    assert str(report_from_token(facts.link.rsplit("/r/", 1)[1]).job_id) == str(order.job_id)
    assert (facts.recipient, facts.order.id, facts.chapters_done, facts.chapters_total) == (
        "buyer@example.com", order.id, 1, 2)
    assert [c.key for c in facts.not_done] == ["moon"] and facts.mail_state == "info"
    page = response.content.decode()
    assert 'data-testid="chapters" data-done="1" data-total="2"' in page
    assert "the link mailed again to buyer@example.com" in page

    Report.objects.filter(job_id=order.job_id).update(sealed_at=timezone.now(),
                                                      delivery_error="SMTPServerDisconnected: x")
    assert admin_client.get(url).context["report"].mail_state == "wait"
    Report.objects.filter(job_id=order.job_id).update(delivered_at=timezone.now(), delivery_error="")
    assert admin_client.get(url).context["report"].mail.startswith("mailed ")
    render = media_job(order.client, "a-render")
    assert admin_client.get(f"/admin/jobs/job/{render.id}/change/").context["report"] is None  # not a report


def test_a_reports_output_is_its_link_so_the_output_url_is_404_not_a_500(admin_client):
    from orders.services import order_create
    from tests.support.admin import make_client
    from tests.support.orders import order_data

    order, _ = order_create(client=make_client("shop"), data=order_data("pi_1"))
    job_finish(job_id=order.job_id, status=JobStatus.SUCCEEDED,
               output={"report": "http://x/v1/jobs/1/report", "link": "http://x/r/t", "delivered": True})
    page = admin_client.get(f"/admin/jobs/job/{order.job_id}/change/").content.decode()
    assert f"/admin/jobs/job/{order.job_id}/output/" not in page
    assert admin_client.get(f"/admin/jobs/job/{order.job_id}/output/").status_code == 404
