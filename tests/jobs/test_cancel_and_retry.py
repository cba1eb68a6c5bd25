"""Cancel and a person's retry through the API, the job engine run in this process as a worker runs it
(tests/support/engine.py), and the sandbox. Committed: the API's enqueue and cancel reach the engine on
commit, and run 2's steps are told from run 1's by their start, which SQL now() stamps (inside one
transaction it would not move)."""

import pytest
import requests

from jobs.models import Step
from tests.conftest import HOOK_URL, media_body
from tests.support.books import assert_books_balance
from webhooks.models import Delivery

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def api(make_api):
    """A client that takes webhooks: its jobs' events are outbox rows to check (no webhooks process runs)."""
    return make_api("acme", webhook_url=HOOK_URL)


def test_cancel_while_running_cancels_upstream_and_emits_one_event(engine, ledger, api):
    job_id = api.create(media_body(input={"prompt": "a long render", "render_s": 20}), key="c").json()["id"]
    engine.run(lambda: Step.objects.filter(job_id=job_id, name="submit", status="done").exists())
    submitted = Step.objects.get(job_id=job_id, name="submit")
    upstream_id = submitted.result["upstream_id"]

    response = api.http.post(f"/v1/jobs/{job_id}/cancel", headers=api.headers())

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "cancelled"
    assert response.json()["error"]["code"] == "CANCELLED"
    events = list(Delivery.objects.filter(job_id=job_id).values_list("id", flat=True))
    assert events == [f"{job_id}:1:generation.cancelled"]
    # The executor cancels the render upstream (the provider can): the stop the cancel sent runs at once,
    # ahead of the wait's next poll.
    [stop] = [m for m in engine.queue if m.name == "jobs.stop_upstream"]
    engine.run(only=lambda message: message is stop)
    assert requests.get(f"{ledger.url}/v1/generations/{upstream_id}", timeout=5).json()["status"] == "cancelled"
    again = api.http.post(f"/v1/jobs/{job_id}/cancel", headers=api.headers())
    assert again.status_code == 409 and again.json()["error"]["code"] == "JOB_TERMINAL"
    # The attempt is ended on the record too; then what is left of the job runs (its wait's next poll, not
    # waited for: whenever it comes, it finds the job cancelled), and nothing ends the job a second time.
    assert api.job(job_id)["attempts"][0]["state"] == "failed"
    engine.run_job(job_id, pauses=False)
    job = api.job(job_id)
    assert job["status"] == "cancelled" and job["attempts"][0]["error_class"] == "cancelled"
    assert Delivery.objects.filter(job_id=job_id).count() == 1
    assert len(assert_books_balance(ledger)) == 1


def test_cancel_after_success_is_409_job_terminal(engine, ledger, api):
    job_id = api.create(media_body(input={"prompt": "quick", "render_s": 0}), key="c").json()["id"]
    assert engine.run_job(job_id).status == "succeeded"
    response = api.http.post(f"/v1/jobs/{job_id}/cancel", headers=api.headers())
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "JOB_TERMINAL"
    assert api.job(job_id)["status"] == "succeeded"
    assert list(Delivery.objects.filter(job_id=job_id).values_list("event", flat=True)) == ["generation.succeeded"]
    assert len(assert_books_balance(ledger)) == 1


def test_a_person_retries_a_failed_job_and_it_fails_again_in_run_2(engine, ledger, api):
    ledger.faults([{"model": "video-keyed", "action": "status_422", "times": 2, "message": "duration must be 8s"}])
    job_id = api.create(media_body(), key="r").json()["id"]
    engine.run_job(job_id)
    failed = api.job(job_id)
    assert failed["status"] == "failed" and failed["run"] == 1
    assert failed["error"]["code"] == "INVALID_INPUT" and "duration must be 8s" in failed["error"]["message"]
    run1 = {row.name: row for row in Step.objects.filter(job_id=job_id, run=1)}

    retried = api.http.post(f"/v1/jobs/{job_id}/retry", headers=api.headers())

    assert retried.status_code == 202, retried.content
    assert retried.json()["run"] == 2 and retried.json()["status"] == "queued"
    engine.run_job(job_id)
    again = api.job(job_id)
    assert again["status"] == "failed" and again["run"] == 2, again
    assert again["error"]["code"] == "INVALID_INPUT"
    run2 = {row.name: row for row in Step.objects.filter(job_id=job_id, run=2)}
    assert set(run2) == set(run1)  # run 2 ran its steps afresh ...
    assert all(run2[name].started_at > run1[name].started_at for name in run2)  # ... after run 1's
    events = sorted(Delivery.objects.filter(job_id=job_id).values_list("id", flat=True))
    assert events == [f"{job_id}:1:generation.failed", f"{job_id}:2:generation.failed"]
    assert assert_books_balance(ledger) == []  # refusals are not charged


@pytest.mark.parametrize("end", ["succeeded", "cancelled"])
def test_retrying_a_succeeded_or_cancelled_job_is_409_and_changes_nothing(engine, ledger, api, end):
    job_id = api.create(media_body(input={"prompt": "x", "render_s": 0 if end == "succeeded" else 30}), key="e").json()["id"]
    if end == "cancelled":
        assert api.http.post(f"/v1/jobs/{job_id}/cancel", headers=api.headers()).status_code == 200
    assert engine.run_job(job_id).status == end  # and everything of it queued has run
    before = api.job(job_id)
    events_before = list(Delivery.objects.filter(job_id=job_id).values_list("id", flat=True))

    response = api.http.post(f"/v1/jobs/{job_id}/retry", headers=api.headers())

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "JOB_NOT_RETRYABLE"
    assert api.job(job_id) == before
    assert list(Delivery.objects.filter(job_id=job_id).values_list("id", flat=True)) == events_before
    assert_books_balance(ledger)


def test_cancel_and_retry_of_another_clients_job_are_404(make_api):
    acme, globex = make_api("acme"), make_api("globex")
    job_id = acme.create(media_body(), key="x").json()["id"]
    for action in ("cancel", "retry"):
        response = globex.http.post(f"/v1/jobs/{job_id}/{action}", headers=globex.headers())
        assert response.status_code == 404
    assert acme.job(job_id)["status"] in ("queued", "running", "succeeded")
