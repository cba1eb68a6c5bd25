"""Waiting costs little (docs/design.md, "Waiting costs little"): polls on a back-off schedule, and provider callbacks
that wake the waiting step at once, verified, idempotent, and only a doorbell.

Real processes: the `web` process (it takes the callbacks), a `worker`, and the sandbox, which calls back
the way Replicate's webhooks do. `params.expected_s` makes the sandbox announce a duration other than the
render's, so a test can tell a job woken by its callback from one that waited for its scheduled poll.
"""

import json
import time
import uuid
from datetime import datetime, timezone

import pytest
import requests

from executor import policy
from executor.models import Attempt
from jobs.models import Step
from jobs.services import client_create
from tests.support.books import assert_books_balance
from tests.support.callbacks import signed
from tests.support.http_api import HttpApi


@pytest.fixture
def api(web_stack, web_worker):
    return HttpApi(web_stack.url, client_create(name="waiter"))


def render(key: str, api: HttpApi, **params) -> str:
    body = {"kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": "a slow render", **params}}
    created = api.create(body, key=key)
    assert created.status_code == 201, created.text
    return created.json()["id"]


def polls_of(ledger, job_id: str) -> list[dict]:
    [attempt] = Attempt.objects.filter(job_id=job_id)
    return [c for c in ledger.calls() if c["kind"] == "poll" and c["generation_id"] == attempt.upstream_id
            and c["model"]]


def call_back(web_stack, body: str, headers: dict, provider: str = "sandbox") -> requests.Response:
    return requests.post(f"{web_stack.url}/v1/callbacks/{provider}", data=body, headers=headers, timeout=10)


@pytest.mark.e2e
def test_a_callback_before_the_scheduled_poll_wakes_the_job_at_once(api, ledger):
    # The render takes 1 s; the sandbox says 60: without its callback the first poll would be at 60 s.
    started = time.monotonic()
    job_id = render("early", api, render_s=1, expected_s=60)
    job = api.wait(job_id, timeout=20)
    took = time.monotonic() - started

    assert job["status"] == "succeeded", job
    assert took < 15, took  # woken by the doorbell, not by the 60 s schedule
    [callback] = [c for c in ledger.callbacks() if c["status_of_generation"] == "succeeded"]
    assert callback["status"] == 202  # rung
    assert len(polls_of(ledger, job_id)) == 1  # the step still read the provider's answer, once
    assert len(assert_books_balance(ledger)) == 1


@pytest.mark.e2e
def test_a_callback_that_never_comes_still_ends_in_success_through_polling(api, ledger):
    ledger.faults([{"model": "video-keyed", "action": "drop_callback"}])
    job_id = render("dropped", api, render_s=1, expected_s=3)
    job = api.wait(job_id, timeout=30)

    assert job["status"] == "succeeded", job
    assert ledger.callbacks() == []
    assert len(polls_of(ledger, job_id)) == 1  # the first poll, at the expected 3 s, found it done
    assert len(assert_books_balance(ledger)) == 1


@pytest.mark.e2e
def test_a_callback_crossing_a_slow_poll_pays_once_and_ends_once(api, ledger):
    # The scheduled poll and the callback both come at ~2 s; the poll is held 1.5 s by the sandbox, so
    # the woken pass polls while the scheduled one is still out (whichever runs first).
    ledger.faults([{"model": "video-keyed", "action": "delay", "on": "poll", "seconds": 1.5}])
    job_id = render("crossing", api, render_s=2)
    job = api.wait(job_id, timeout=30)
    time.sleep(2)  # let the slower of the two passes finish too

    assert job["status"] == "succeeded", job
    [attempt] = Attempt.objects.filter(job_id=job_id)
    assert attempt.state == "succeeded" and attempt.cost_usd is not None
    assert Step.objects.get(job_id=job_id, name="wait").status == "done"
    assert Step.objects.filter(job_id=job_id, name="finish").count() == 1
    assert 1 <= len(polls_of(ledger, job_id)) <= 3
    assert api.job(job_id)["status"] == "succeeded"
    assert len(assert_books_balance(ledger)) == 1


@pytest.mark.e2e
def test_a_callback_after_the_job_ended_changes_nothing(api, ledger, web_stack):
    job_id = render("after", api, render_s=0)
    assert api.wait(job_id)["status"] == "succeeded"
    [attempt] = Attempt.objects.filter(job_id=job_id)
    before = (attempt.state, attempt.finished_at, attempt.cost_usd)
    calls = len(ledger.calls())

    body, headers = signed({"id": attempt.upstream_id, "status": "succeeded"}, message_id=f"late-{uuid.uuid4()}")
    answer = call_back(web_stack, body, headers)

    assert (answer.status_code, answer.json()) == (200, {"status": "ended"})
    attempt.refresh_from_db()
    assert (attempt.state, attempt.finished_at, attempt.cost_usd) == before
    time.sleep(1)
    assert len(ledger.calls()) == calls  # nothing was woken: no poll
    assert len(assert_books_balance(ledger)) == 1


@pytest.mark.e2e
def test_forged_old_unknown_and_repeated_callbacks_change_nothing_and_get_a_4xx(api, ledger, web_stack):
    job_id = render("forged", api, render_s=30, expected_s=30)
    api.wait(job_id, statuses={"running"}, until=lambda j: j["attempts"] and j["attempts"][0]["state"] == "running")
    [attempt] = Attempt.objects.filter(job_id=job_id)
    payload = {"id": attempt.upstream_id, "status": "succeeded"}
    calls = len(ledger.calls())

    body, headers = signed(payload, secret="whsec_" + "Zm9yZ2VkLXNlY3JldC1ub3QtdGhlLXNhbmRib3hz")
    forged = call_back(web_stack, body, headers)
    body, headers = signed(payload, at=datetime.fromtimestamp(time.time() - 600, timezone.utc))
    old = call_back(web_stack, body, headers)
    body, headers = signed(payload)
    tampered = call_back(web_stack, body.replace("succeeded", "failed"), headers)
    unsigned = call_back(web_stack, json.dumps(payload), {"Content-Type": "application/json"})
    body, headers = signed({"id": "gen_999999", "status": "succeeded"})
    unknown = call_back(web_stack, body, headers)
    body, headers = signed(payload, secret="whsec_" + "cmVwbGljYXRlLWlzLW5vdC1jb25maWd1cmVkLWhlcmU")
    unconfigured = call_back(web_stack, body, headers, provider="replicate")

    assert [r.status_code for r in (forged, old, tampered, unsigned)] == [400] * 4
    assert {r.json()["error"]["code"] for r in (forged, old, tampered, unsigned)} == {"CALLBACK_UNVERIFIED"}
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "CALLBACK_UNKNOWN_GENERATION")
    assert (unconfigured.status_code, unconfigured.json()["error"]["code"]) == (404, "CALLBACK_NOT_CONFIGURED")
    time.sleep(1)
    assert len(ledger.calls()) == calls  # nothing was woken: not one poll
    attempt.refresh_from_db()
    assert attempt.state == "running"

    # A genuine message wakes the step once; its repeat (the same webhook-id) is taken as seen.
    body, headers = signed(payload, message_id=f"genuine-{uuid.uuid4()}")
    first = call_back(web_stack, body, headers)
    repeat = call_back(web_stack, body, headers)
    assert (first.status_code, first.json()) == (202, {"status": "rung"})
    assert (repeat.status_code, repeat.json()) == (200, {"status": "duplicate"})
    deadline = time.monotonic() + 10
    while len(polls_of(ledger, job_id)) < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1)
    assert len(polls_of(ledger, job_id)) == 1  # the doorbell cost one poll, which found it still running
    attempt.refresh_from_db()
    assert attempt.state == "running"  # the callback's word "succeeded" changed no record
    assert api.post(f"/v1/jobs/{job_id}/cancel").status_code == 200


@pytest.mark.e2e
def test_without_an_expected_duration_the_fallback_polls_back_off(api, ledger):
    # No duration said, and the callback asked for is lost: polling is the fallback, its gaps starting
    # at POLL_CALLBACK_FACTOR x POLL_INTERVAL_S (4 x 0.5 s here) and doubling: 2, 4, 8 s, not every 0.5 s.
    ledger.faults([{"model": "video-keyed", "action": "drop_callback"}])
    job_id = render("backoff", api, render_s=7, expected_s=None)
    assert api.wait(job_id, timeout=40)["status"] == "succeeded"

    polls = polls_of(ledger, job_id)
    at = [datetime.fromisoformat(p["at"].replace("Z", "+00:00")).timestamp() for p in polls]
    gaps = [later - earlier for earlier, later in zip(at, at[1:])]
    assert len(polls) == 3, len(polls)  # at 2, 4 and 8 s; one per 0.5 s would be 16
    assert 1.5 < gaps[0] < 3 and gaps[1] > gaps[0] * 1.5, gaps


# --- the schedule itself (executor.policy) ---------------------------------------------------------------


def schedule(render_s: float, *, expected_s: float | None, interval_s: float = 2.0, cap_s: float = 30.0,
             window_s: float = 3600.0) -> list[float]:
    """When a render of `render_s` is polled, following next_poll_s from acceptance until a poll finds it done."""
    waited, polls = 0.0, []
    while True:
        if policy.poll_due(waited_s=waited, expected_s=expected_s, interval_s=interval_s):
            polls.append(round(waited, 2))
            if waited >= render_s or waited > window_s:
                return polls
        waited += policy.next_poll_s(waited_s=waited, expected_s=expected_s, interval_s=interval_s, cap_s=cap_s,
                                     left_s=window_s - waited + 0.05)


def test_the_poll_schedule_doubles_its_gaps_up_to_the_cap():
    assert schedule(60, expected_s=None) == [2, 4, 8, 16, 32, 62]  # 6 polls for a 60 s render, not 30
    assert len(schedule(300, expected_s=None)) == 14  # 5 minutes: capped at 30 s gaps, not 150 polls
    assert schedule(60, expected_s=60) == [60]  # the provider said how long: one poll
    assert schedule(70, expected_s=60) == [60, 62, 64, 68, 76]  # late: back off again from the expected end
    assert schedule(5000, expected_s=None, window_s=100)[-1] == 100.05  # never past the window


def test_a_pass_before_the_expected_duration_asks_nothing():
    assert not policy.poll_due(waited_s=10, expected_s=60, interval_s=2)
    assert policy.poll_due(waited_s=59.5, expected_s=60, interval_s=2)
    assert not policy.poll_due(waited_s=0, expected_s=None, interval_s=2)  # right after the submit
    assert policy.poll_due(waited_s=2, expected_s=None, interval_s=2)
    assert policy.next_poll_s(waited_s=10, expected_s=60, interval_s=2, cap_s=30, left_s=3600) == 50


@pytest.mark.e2e
def test_a_callback_wakes_the_running_attempt_when_a_provider_id_names_two(api, ledger):
    # A sandbox reset starts its generation ids again: the second job's render gets the first one's id.
    first = render("first", api, render_s=0)
    assert api.wait(first)["status"] == "succeeded"
    ledger.reset()
    started = time.monotonic()
    second = render("second", api, render_s=1, expected_s=60)
    job = api.wait(second, timeout=20)

    assert job["status"] == "succeeded", job
    assert time.monotonic() - started < 15  # woken by its callback, not left to the 60 s schedule
    ids = {a.job_id: a.upstream_id for a in Attempt.objects.all()}
    assert ids[uuid.UUID(first)] == ids[uuid.UUID(second)]  # the case this is about
