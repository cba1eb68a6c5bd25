"""The walking skeleton on real processes: a Celery worker and the sandbox provider, started by the suite."""

import pytest

from executor.store import client_store
from tests.conftest import media_body
from tests.support.books import assert_books_balance, charges_for
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_media_job_runs_to_success_and_pays_once(jobs_worker, ledger, api, django_capture_on_commit_callbacks):
    created = api.create(media_body(input={"prompt": "a lighthouse at dusk", "render_s": 2}), key="e2e-1")
    assert created.status_code == 201
    job_id = created.json()["id"]

    job, seen = wait_for(api, job_id, {"succeeded", "failed", "cancelled"})

    assert job["status"] == "succeeded", job
    assert seen[-2:] == ["running", "succeeded"]  # it was seen rendering, then done
    assert job["started_at"] and job["completed_at"] >= job["started_at"]
    # The sandbox's ledger is the ground truth: exactly one charge, under the job's first upstream key.
    charges = charges_for(ledger, job_id)
    assert len(charges) == 1, charges
    assert charges[0]["model"] == "video-keyed"
    assert charges[0]["request_id"] == f"payonce-{job_id}-1"
    assert charges[0]["metadata"] == {"payonce_job": job_id, "payonce_attempt": 1, "upstream_key": f"payonce-{job_id}-1"}
    # The output landed in the store, tagged with the job that wrote it.
    stored = client_store(api.client_id).head(job["output"]["key"])
    assert stored is not None and stored.complete
    assert stored.written_by == job_id == job["output"]["written_by"]
    download = api.http.get(f"/v1/jobs/{job_id}/output", headers=api.headers())
    assert download.status_code == 200
    assert b"".join(download.streaming_content)[:1] != b""

    # A replay after success answers 202 with the ended job, sends nothing to the broker (so nothing can
    # wake the job) and pays nothing more.
    with django_capture_on_commit_callbacks() as enqueued:
        replay = api.create(media_body(input={"prompt": "a lighthouse at dusk", "render_s": 2}), key="e2e-1")
    assert replay.status_code == 202
    assert replay.json()["id"] == job_id and replay.json()["status"] == "succeeded"
    assert enqueued == []
    jobs_worker.stop()  # whatever was in flight has finished
    assert api.job(job_id)["status"] == "succeeded"
    assert len(assert_books_balance(ledger)) == 1
