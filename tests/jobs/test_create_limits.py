"""Creates per second, per client (jobs.api.limits; docs/api.md, "Limits"): a token bucket in Redis, shared by
every web process. Over it, POST /v1/jobs is `429 RATE_LIMITED` with Retry-After and nothing is written;
the same request after it, under the same key, is taken. Through the real web process and the client
library: the library waits the 429 out and makes one job, paid once."""

import time

import pytest
from payonce_client import Payonce

from accounts.models import Client
from jobs.models import Job
from tests.conftest import media_body
from tests.support.books import assert_books_balance

pytestmark = pytest.mark.django_db


def test_past_the_burst_a_create_is_429_with_retry_after_and_writes_nothing(api, make_api):
    Client.objects.filter(id=api.client_id).update(creates_per_s=1, create_burst=2)
    assert api.create(media_body(), key="one").status_code == 201
    assert api.create(media_body(), key="two").status_code == 201
    refused = api.create(media_body(), key="three")
    assert refused.status_code == 429, refused.content
    assert refused.json()["error"]["code"] == "RATE_LIMITED" and int(refused["Retry-After"]) >= 1
    assert Job.objects.filter(client_id=api.client_id).count() == 2
    # Another client's bucket is its own.
    assert make_api("bob").create(media_body(), key="three").status_code == 201
    time.sleep(int(refused["Retry-After"]))
    assert api.create(media_body(), key="three").status_code == 201  # the same request, after the wait, is taken


def test_a_rate_of_zero_is_no_limit(api):
    Client.objects.filter(id=api.client_id).update(creates_per_s=0, create_burst=1)
    assert {api.create(media_body(), key=f"k{n}").status_code for n in range(5)} == {201}


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_the_library_waits_a_429_out_and_makes_one_job_paid_once(web_stack, web_worker, ledger, make_api):
    account = make_api("limited")
    Client.objects.filter(id=account.client_id).update(creates_per_s=0.5, create_burst=1)
    with Payonce(base_url=web_stack.url, api_key=account.api_key) as po:
        first = po.jobs.create(kind="media", models=["sandbox/video-keyed"], input={"prompt": "a", "render_s": 0})
        began = time.monotonic()
        second = po.jobs.create(kind="media", models=["sandbox/video-keyed"], input={"prompt": "b", "render_s": 0})
        waited = time.monotonic() - began
        assert waited >= 1.0, waited  # it was told to wait (Retry-After: 2 at half a create per second)
        assert second.replayed is False  # the 429 wrote nothing: the retry made the job
        assert {po.jobs.wait(job.id, timeout=30).status for job in (first, second)} == {"succeeded"}
    assert Job.objects.filter(client_id=account.client_id).count() == 2
    charges = assert_books_balance(ledger)
    assert sorted(c["metadata"]["payonce_job"] for c in charges) == sorted([first.id, second.id])
