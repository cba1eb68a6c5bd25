"""Who may do what in the admin, through the real `web` process: every admin URL of jobs, orders, dead
letters, deliveries, report templates and the spend page (list, page, output, a template version's page and
its preview, every bulk and single action, the confirmation's GET and its POST) for a staff user with no
permission, one who may only view, one per action permission (with view), and a superuser. Each answer is
403 or success exactly as the permission says; a refusal changes no row, writes no audit row, and pays
nothing (a `worker` runs the web stack's jobs, so a retry or re-run that slipped through would charge the
sandbox's ledger).

Before the fix a staff user with no permission at all opened any job's page and output, retried (paid
again) and cancelled jobs; a view-only one re-ran an order and replayed deliveries."""

import uuid
from dataclasses import dataclass

import pytest
from django.db import transaction

from accounts.models import Client
from executor.store import client_store
from jobs.models import Job, JobStatus, ReportTemplate
from jobs.kinds.report import templates
from jobs.kinds.report.reports import report_load
from jobs.services import client_create, job_create, job_finish
from operators.models import OperatorAction
from orders.models import Order
from orders.services import order_create
from tests.conftest import HOOK_URL
from tests.support.admin import login, staff
from webhooks.models import Delivery, DeliveryStatus
from webhooks.services import delivery_create

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

VIEW = ["jobs.view_job", "orders.view_order", "webhooks.view_deadletter", "webhooks.view_delivery",
        "billing.view_budgetmonth", "jobs.view_reporttemplate"]
PROFILES = {  # user -> the permissions they hold (superuser: all)
    "nobody": [],
    "viewer": VIEW,
    "canceller": [*VIEW, "jobs.cancel_job"],
    "retrier": [*VIEW, "jobs.retry_job"],
    "rerunner": [*VIEW, "orders.rerun_order"],
    "replayer": [*VIEW, "webhooks.replay_delivery"],
    "templater": [*VIEW, "jobs.change_reporttemplate"],  # moves a report template's `live` label
    "root": None,
}


@dataclass
class World:
    """One user's own rows, so that what one user may do never changes what the next one meets."""

    failed: Job  # retryable
    queued: Job  # cancellable
    done: Job  # with an output in the store
    order: Order  # its report failed: re-runnable
    letter: Delivery  # dead
    template: ReportTemplate  # two versions, live at v1


def make_world(tag: str) -> World:
    client = Client.objects.get(id=client_create(name=f"shop-{tag}", webhook_url=HOOK_URL)["client_id"])

    def job(key):
        made, _ = job_create(client=client, idempotency_key=key, data={
            "kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": key, "render_s": 0},
            "policy": {"attempts_per_model": 3, "fallback_on": []}, "metadata": {}})
        return Job.objects.get(id=made.id)

    failed, queued, done = job(f"{tag}-failed"), job(f"{tag}-queued"), job(f"{tag}-done")
    job_finish(job_id=failed.id, status=JobStatus.FAILED, error={"code": "ATTEMPTS_EXHAUSTED", "message": "x"})
    key = f"perm/{tag}.mp4"
    client_store(client.id).put(key, b"render bytes", content_type="video/mp4", metadata={"written_by": str(done.id)})
    job_finish(job_id=done.id, status=JobStatus.SUCCEEDED,
               output={"key": key, "written_by": str(done.id), "content_type": "video/mp4"})
    order, _ = order_create(client=client, data={
        "payment_id": f"pi-{tag}", "run_id": f"run-{tag}", "product": "natal-chart",
        "input": {"subject": {"name": "Ada"}, "chapters": ["sun", "moon"]}, "email": "buyer@example.com"})
    report_load(job=order.job)
    job_finish(job_id=order.job_id, status=JobStatus.FAILED, error={"code": "CHAPTER_FAILED", "message": "x"})
    with transaction.atomic():  # in the transaction of the change it reports, as the services write it
        delivery_create(job=failed, event="generation.needs_review", data={"id": str(failed.id)})
    letter = Delivery.objects.get(job=failed, event="generation.needs_review")
    Delivery.objects.filter(id=letter.id).update(status=DeliveryStatus.DEAD, attempts=8, last_error="HTTP 500")
    body = {"system": "Write for {{ subject.name }}.",
            "chapters": [{"key": "sun", "title": "Sun", "instruction": "The Sun."}]}
    first = templates.version_create(client=client, name="chart", body=body)
    templates.version_create(client=client, name="chart", body={**body, "max_output_tokens": 900}, live=False)
    return World(failed=Job.objects.get(id=failed.id), queued=Job.objects.get(id=queued.id), done=done,
                 order=Order.objects.get(id=order.id), letter=Delivery.objects.get(id=letter.id),
                 template=ReportTemplate.objects.get(id=first.template_id))


def state(w: World) -> tuple:
    """Every row an action could change, and the audit trail."""
    jobs = {job.id: (job.status, job.run) for job in Job.objects.filter(
        id__in=[w.failed.id, w.queued.id, w.done.id, w.order.job_id])}
    return (jobs, Delivery.objects.get(id=w.letter.id).status, ReportTemplate.objects.get(id=w.template.id).live,
            OperatorAction.objects.count())


def reads(w: World) -> list[tuple[str, str]]:
    """(name, path) of every page that only reads: view permission of its model."""
    return [
        ("jobs:list", "/admin/jobs/job/"),
        ("jobs:page", f"/admin/jobs/job/{w.failed.id}/change/"),
        ("jobs:output", f"/admin/jobs/job/{w.done.id}/output/"),
        ("orders:list", "/admin/orders/order/"),
        ("orders:page", f"/admin/orders/order/{w.order.id}/change/"),
        ("letters:list", "/admin/webhooks/deadletter/"),
        ("letters:page", f"/admin/webhooks/deadletter/{w.letter.id}/change/"),
        ("deliveries:list", "/admin/webhooks/delivery/"),
        ("spend", "/admin/billing/spend/"),
        ("templates:list", "/admin/jobs/reporttemplate/"),
        ("templates:page", f"/admin/jobs/reporttemplate/{w.template.id}/change/"),
        ("templates:version", f"/admin/jobs/reporttemplate/{w.template.id}/versions/2/"),
    ]


READ_NEEDS = {"jobs": "jobs.view_job", "orders": "orders.view_order", "letters": "webhooks.view_deadletter",
              "deliveries": "webhooks.view_delivery", "spend": "billing.view_budgetmonth",
              "templates": "jobs.view_reporttemplate"}


def acts(w: World) -> list[tuple[str, str, dict, str]]:
    """(name, path, the list action's POST fields or {}, the permission it needs) of every action."""
    return [
        ("retry:bulk", f"/admin/jobs/job/bulk/retry/?id={w.failed.id}", {}, "jobs.retry_job"),
        ("retry:selected", "/admin/jobs/job/", {"action": "retry_selected", "_selected_action": w.failed.id},
         "jobs.retry_job"),
        ("cancel:bulk", f"/admin/jobs/job/bulk/cancel/?id={w.queued.id}", {}, "jobs.cancel_job"),
        ("cancel:selected", "/admin/jobs/job/", {"action": "cancel_selected", "_selected_action": w.queued.id},
         "jobs.cancel_job"),
        ("replay:bulk", f"/admin/jobs/job/bulk/replay/?id={w.failed.id}", {}, "webhooks.replay_delivery"),
        ("replay:selected", "/admin/jobs/job/", {"action": "replay_selected", "_selected_action": w.failed.id},
         "webhooks.replay_delivery"),
        ("rerun:one", f"/admin/orders/order/{w.order.id}/rerun/", {}, "orders.rerun_order"),
        ("rerun:selected", "/admin/orders/order/", {"action": "rerun", "_selected_action": w.order.id},
         "orders.rerun_order"),
        ("letter:one", f"/admin/webhooks/deadletter/{w.letter.id}/replay/", {}, "webhooks.replay_delivery"),
        ("letter:matching", f"/admin/webhooks/deadletter/replay/?q={w.letter.job_id}", {}, "webhooks.replay_delivery"),
        ("letter:selected", "/admin/webhooks/deadletter/",
         {"action": "replay_selected", "_selected_action": w.letter.id}, "webhooks.replay_delivery"),
        ("delivery:selected", "/admin/webhooks/delivery/", {"action": "replay", "_selected_action": w.letter.id},
         "webhooks.replay_delivery"),
        ("live:one", f"/admin/jobs/reporttemplate/{w.template.id}/versions/2/live/", {}, "jobs.change_reporttemplate"),
    ]


def holds(perms: list[str] | None, perm: str) -> bool:
    return perms is None or perm in perms


def test_every_admin_url_answers_exactly_as_the_users_permissions_say_and_a_refusal_changes_and_pays_nothing(
        web_stack, engine, ledger):
    base = web_stack.url
    charges_before = len(ledger.ledger()["charges"])
    refusals = 0
    for name, perms in PROFILES.items():
        staff(name, perms)
        w = make_world(name)
        http = login(base, name)
        csrf = http.cookies["csrftoken"]

        for page, path in reads(w):
            answer = http.get(f"{base}{path}", timeout=10, allow_redirects=False)
            allowed = holds(perms, READ_NEEDS[page.split(":")[0]])
            assert answer.status_code == (200 if allowed else 403), (name, page, answer.status_code)
            if page == "jobs:output" and allowed:
                assert answer.content == b"render bytes"

        # A version's preview is posted (a subject is too large for a URL) but only reads: the view permission.
        before = state(w)
        path = f"/admin/jobs/reporttemplate/{w.template.id}/versions/2/"
        answer = http.post(f"{base}{path}", timeout=10, allow_redirects=False, headers={"Referer": f"{base}{path}"},
                           data={"csrfmiddlewaretoken": csrf, "subject": '{"name": "Ada"}', "model": "sandbox/llm"})
        allowed = holds(perms, READ_NEEDS["templates"])
        assert answer.status_code == (200 if allowed else 403), (name, "templates:preview", answer.status_code)
        assert ('data-testid="worst-total"' in answer.text) == allowed
        assert state(w) == before

        for action, path, fields, needs in acts(w):
            allowed = holds(perms, needs)
            before = state(w)
            if not fields:  # a confirmation page of its own: GET shows it, POST acts
                shown = http.get(f"{base}{path}", timeout=10, allow_redirects=False)
                assert shown.status_code == (200 if allowed else 403), (name, action, "GET", shown.status_code)
            post = {**fields, "csrfmiddlewaretoken": csrf, "confirm": "yes", "reason": f"{name} tries {action}"}
            answer = http.post(f"{base}{path}", data=post, timeout=10, allow_redirects=False,
                               headers={"Referer": f"{base}{path}"})
            if allowed:
                assert answer.status_code == 302, (name, action, answer.status_code, answer.text[:300])
                assert state(w) != before, (name, action, "allowed, but nothing changed")
                assert OperatorAction.objects.filter(who=name).exists()
            else:
                # A list action the user does not hold is refused too, not Django's silent "no action selected".
                assert answer.status_code == 403, (name, action, "POST", answer.status_code)
                assert state(w) == before, (name, action, "refused, but a row changed")
                assert not OperatorAction.objects.filter(who=name, reason=f"{name} tries {action}").exists()
                refusals += 1
            # Put the world back for the next action: a retried or cancelled job would not be retried again.
            w = make_world(f"{name}-{uuid.uuid4().hex[:6]}") if allowed else w
    assert refusals > 40

    # Nothing the refusals did was paid; the retries and re-runs that were allowed paid only for their
    # own new runs (each with an attempt row of its own), run here by the in-process engine.
    allowed_runs = Job.objects.filter(run__gt=1)
    for job in Job.objects.filter(run__gt=1, status__in=("queued", "running")):
        engine.run_job(job.id)
    new_charges = ledger.ledger()["charges"][charges_before:]
    paying_jobs = {str(job.id) for job in allowed_runs}
    assert {charge["metadata"].get("payonce_job") for charge in new_charges} <= paying_jobs
    refused_users = [name for name, perms in PROFILES.items()
                     if not holds(perms, "jobs.retry_job") and not holds(perms, "orders.rerun_order")]
    assert not Job.objects.filter(run__gt=1, client__name__startswith=tuple(f"shop-{n}" for n in refused_users)).exists()


def test_a_bulk_url_with_an_unknown_filter_or_no_filter_acts_on_nothing_unless_all_is_asked(web_stack):
    base = web_stack.url
    staff("ops", None)
    w = make_world("bulk")
    http = login(base, "ops")
    before = state(w)
    post = {"csrfmiddlewaretoken": http.cookies["csrftoken"], "confirm": "yes", "reason": "clean up"}
    # `status=failed` is not the list's parameter (`status__exact`): once it was ignored, and the retry
    # targeted every job.
    for query in ("?status=failed", "?status__exact=failed&sttus=x", "", "?all=", "?all_jobs=yes"):
        for method in ("get", "post"):
            answer = getattr(http, method)(f"{base}/admin/jobs/job/bulk/retry/{query}", data=post, timeout=10,
                                           headers={"Referer": base + "/admin/"})
            assert answer.status_code == 200 and answer.url.endswith("/admin/jobs/job/"), (query, method)
            assert "nothing was done" in answer.text, (query, method)
            assert state(w) == before
    # The list's own bulk link on an unfiltered list says all_jobs=1, and its preview counts every job.
    listing = http.get(f"{base}/admin/jobs/job/", timeout=10).text
    assert "/admin/jobs/job/bulk/retry/?all_jobs=1" in listing
    preview = http.get(f"{base}/admin/jobs/job/bulk/retry/?all_jobs=1", timeout=10)
    assert preview.status_code == 200 and "every job" in preview.text
    assert state(w) == before
    # A known filter acts on what it matches, and only that.
    done = http.post(f"{base}/admin/jobs/job/bulk/cancel/?status__exact=queued", data=post, timeout=10,
                     headers={"Referer": base + "/admin/"})
    assert done.status_code == 200
    assert Job.objects.get(id=w.queued.id).status == JobStatus.CANCELLED
    assert Job.objects.get(id=w.failed.id).status == JobStatus.FAILED
