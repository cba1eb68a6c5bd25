"""The executor against the sandbox over HTTP, the job engine run in this process as a worker runs it
(tests/support/engine.py): where money is spent. Every test reads the sandbox's ledger and checks that the
books balance. Under rollback: no second connection has to see a commit (the intent's guard lets the test
case's own block pass, executor.record.intend)."""

import base64
import uuid
from datetime import datetime, timedelta

import pytest
import requests
from django.utils import timezone

from executor.models import Attempt
from executor.store import client_store
from jobs.engine import runner
from jobs.engine.outcomes import Stop
from jobs.models import Job, Step
from tests.conftest import HOOK_URL, media_body
from tests.support.books import assert_books_balance
from webhooks.models import Delivery

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(make_api):
    """A client that takes webhooks: its jobs' events are outbox rows to check (no webhooks process runs)."""
    return make_api("acme", webhook_url=HOOK_URL)
ENDED = {"succeeded", "failed", "cancelled", "waiting"}


def submits(ledger, job_id=None) -> list[dict]:
    return [c for c in ledger.calls() if c["kind"] == "submit"
            and (job_id is None or (c["metadata"] or {}).get("payonce_job") == job_id)]


def attempts(job_id) -> list[Attempt]:
    return list(Attempt.objects.filter(job_id=job_id).order_by("number"))


def run_job(api, engine, body, key="x"):
    """Create the job through the API and run it in process until it ends; the API's answer for it."""
    response = api.create(body, key=key)
    assert response.status_code == 201, response.content
    engine.run_job(response.json()["id"])
    return api.job(response.json()["id"])


def run_again(api, engine, job_id: str, *, run: int) -> dict:
    """A person's retry through the API, run in process until the new run ends."""
    retried = api.http.post(f"/v1/jobs/{job_id}/retry", headers=api.headers())
    assert retried.status_code == 202, retried.content
    engine.run_job(job_id)
    done = api.job(job_id)
    assert done["run"] == run and done["status"] in ENDED, done
    return done


# --- unknown outcomes: resolved by what the provider can do ---------------------------------------------


def test_a_503_the_provider_declares_unpaid_ends_the_attempt_and_the_next_goes_out_under_key_2(
        engine, ledger, api):
    # The sandbox answers every status_* fault before accepting anything: a definite "no", a try, and the
    # next attempt under a new key (nothing was paid, so nothing is paid twice).
    ledger.faults([{"model": "video-keyed", "action": "status_503"}])
    job = run_job(api, engine, media_body())

    assert job["status"] == "succeeded", job
    sent = submits(ledger, job["id"])
    assert [(c["request_id"], c["status"]) for c in sent] == [
        (f"payonce-{job['id']}-1", 503), (f"payonce-{job['id']}-2", 202)]
    assert [(a["number"], a["state"], a["error_class"], a["paid"]) for a in job["attempts"]] == [
        (1, "failed", "server_error", "no"), (2, "succeeded", None, "yes")]
    assert len(assert_books_balance(ledger)) == 1


def test_a_keyed_model_answering_503_to_every_send_falls_back_after_attempts_per_model_tries(engine, ledger, api):
    # Issue 21, finding 2: a keyed provider that is down held every job for an hour, resending the same
    # key, with a fallback model in the chain. Every send answered 503 is unpaid: the chain moves on.
    ledger.faults([{"model": "video-keyed", "action": "status_503", "times": 50}])
    body = media_body(models=["sandbox/video-keyed", "sandbox/image-lookup"],
                      policy={"attempts_per_model": 3, "fallback_on": ["exhausted", "unavailable", "refused"]})
    job = run_job(api, engine, body)

    assert job["status"] == "succeeded", job
    assert [(a["number"], a["model"], a["state"], a["paid"]) for a in job["attempts"]] == [
        (1, "video-keyed", "failed", "no"), (2, "video-keyed", "failed", "no"), (3, "video-keyed", "failed", "no"),
        (4, "image-lookup", "succeeded", "yes")]
    assert [c["status"] for c in submits(ledger, job["id"]) if c["model"] == "video-keyed"] == [503] * 3
    charges = assert_books_balance(ledger)
    assert [(c["model"], c["metadata"]["upstream_key"]) for c in charges] == [  # the only charge
        ("image-lookup", f"payonce-{job['id']}-4")]


def test_an_unanswered_send_pins_the_key_so_later_503s_never_fall_back(engine, ledger, api):
    # The first send was accepted (charged) and its answer lost: whatever the resends of that key are told
    # speaks for the resend only. The key keeps going out; the fallback model, which would paid for the
    # same work a second time, is never called.
    ledger.faults([{"model": "video-keyed", "action": "accept_then_drop"},
                   {"model": "video-keyed", "action": "status_503", "times": 3}])
    body = media_body(models=["sandbox/video-keyed", "sandbox/image-lookup"],
                      policy={"attempts_per_model": 3, "fallback_on": ["exhausted", "unavailable", "refused"]})
    job = run_job(api, engine, body)

    assert job["status"] == "succeeded", job
    assert [(a["number"], a["model"], a["state"], a["paid"]) for a in job["attempts"]] == [
        (1, "video-keyed", "succeeded", "yes")]
    sent = submits(ledger, job["id"])
    assert {c["request_id"] for c in sent} == {f"payonce-{job['id']}-1"}
    assert [c["status"] for c in sent] == [None, 503, 503, 503, 202]  # the last one returns the first render
    assert all(c["model"] == "video-keyed" for c in sent)  # no charge, and no call, on the fallback model
    assert len(assert_books_balance(ledger)) == 1


def test_accept_then_drop_on_a_keyed_model_pays_once_and_succeeds(engine, ledger, api):
    ledger.faults([{"model": "video-keyed", "action": "accept_then_drop"}])
    job = run_job(api, engine, media_body())

    assert job["status"] == "succeeded", job
    assert [c["request_id"] for c in submits(ledger, job["id"])] == [f"payonce-{job['id']}-1"] * 2
    assert len(assert_books_balance(ledger)) == 1
    assert job["attempts"][0]["cost_usd"] == "0.400000" and job["cost"]["total_usd"] == "0.400000"


def test_a_keyed_attempt_is_resent_under_its_key_past_attempts_per_model_and_paid_once(engine, ledger, api):
    # Found by the storm (tests/chaos): both sends of the key were accepted (charged) and their answers
    # lost. The attempt was given up `failed` with no cost after attempts_per_model sends, its reservation
    # released, and the ledger held a charge payonce did not know of; with a second model in the chain
    # it would have paid again. A resend of the key costs nothing, so it goes out until it is answered.
    ledger.faults([{"model": "video-keyed", "action": "accept_then_drop", "times": 3}])
    body = media_body(models=["sandbox/video-keyed", "sandbox/image-lookup"],
                      policy={"attempts_per_model": 2, "fallback_on": ["exhausted", "unavailable"]})
    job = run_job(api, engine, body)

    assert job["status"] == "succeeded", job
    assert [(a["number"], a["model"], a["state"]) for a in job["attempts"]] == [(1, "video-keyed", "succeeded")]
    assert [c["request_id"] for c in submits(ledger, job["id"])] == [f"payonce-{job['id']}-1"] * 4
    assert len(assert_books_balance(ledger)) == 1


def keyed_answers_lost(api, ledger, engine, settings, *, times: int, **overrides) -> dict:
    """A keyed job with a fallback model whose first `times` sends are accepted and their answers lost,
    run with the settings `overrides` (and resends at most a second apart)."""
    settings.RETRY_BACKOFF_MAX_S = 1
    for name, value in overrides.items():
        setattr(settings, name, value)
    ledger.faults([{"model": "video-keyed", "action": "accept_then_drop", "times": times}])
    body = media_body(models=["sandbox/video-keyed", "sandbox/image-lookup"],
                      policy={"attempts_per_model": 2, "fallback_on": ["exhausted", "unavailable"]})
    return run_job(api, engine, body)


def test_a_keyed_attempt_unanswered_past_the_wait_deadline_is_still_resent_and_paid_once(engine, ledger, api, settings):
    # WAIT_DEADLINE_S bounds the wait for an accepted render; it is not a key's lifetime. The sandbox
    # remembers keys for ever, so the key goes out until it is answered.
    job = keyed_answers_lost(api, ledger, engine, settings, times=5, WAIT_DEADLINE_S=2)

    assert job["status"] == "succeeded", job
    first = Attempt.objects.get(job_id=job["id"], number=1)
    assert (first.finished_at - first.created_at).total_seconds() > 2  # answered past the deadline
    assert [(a["number"], a["model"], a["state"]) for a in job["attempts"]] == [(1, "video-keyed", "succeeded")]
    assert [c["request_id"] for c in submits(ledger, job["id"])] == [f"payonce-{job['id']}-1"] * 6
    assert len(assert_books_balance(ledger)) == 1


def test_a_keyed_attempt_unanswered_past_its_keys_lifetime_is_uncertain_and_held(engine, ledger, api, fresh_catalog):
    # Past key_ttl_s the provider may have forgotten the key: a resend could make (and bill) the render
    # again. Not failed (the money may be spent), not the next model (that would pay twice): a person.
    from billing.models import Reservation
    # The key's lifetime is the sandbox model's capability (executor.registry), read afresh (fresh_catalog).
    job = keyed_answers_lost(api, ledger, engine, fresh_catalog, times=50, SANDBOX_KEY_TTL_S=3)

    assert (job["status"], job["error"]["code"]) == ("waiting", "UNCERTAIN_SUBMIT"), job
    assert [(a["number"], a["model"], a["state"], a["paid"]) for a in job["attempts"]] == [
        (1, "video-keyed", "uncertain", "unknown")]
    sent = submits(ledger, job["id"])
    assert {c["request_id"] for c in sent} == {f"payonce-{job['id']}-1"}
    first = Attempt.objects.get(job_id=job["id"], number=1)
    ttl_ends = first.created_at + timedelta(seconds=3)
    assert len(sent) >= 2 and all(datetime.fromisoformat(c["at"]) < ttl_ends for c in sent)  # none past the TTL
    assert len(assert_books_balance(ledger)) == 1  # the provider kept one render for the key, however often sent
    assert Reservation.objects.get(key=f"payonce-{job['id']}-1").state == "held"  # the money is not released


def test_accept_then_drop_on_a_lookup_model_is_reconciled_without_a_second_submit(engine, ledger, api):
    ledger.faults([{"model": "image-lookup", "action": "accept_then_drop"}])
    job = run_job(api, engine, media_body(models=["sandbox/image-lookup"]))

    assert job["status"] == "succeeded", job
    assert len(submits(ledger, job["id"])) == 1  # no second submit: the lookup found it
    lookups = [c for c in ledger.calls() if c["kind"] == "lookup"]
    assert len(lookups) == 1 and lookups[0]["metadata"] == {"upstream_key": f"payonce-{job['id']}-1"}
    assert len(assert_books_balance(ledger)) == 1


def test_accept_then_drop_on_a_blind_model_holds_for_a_person_and_retry_pays_under_key_2(engine, ledger, api):
    ledger.faults([{"model": "image-blind", "action": "accept_then_drop"}])
    job = run_job(api, engine, media_body(models=["sandbox/image-blind"]))

    assert job["status"] == "waiting", job
    assert job["error"]["code"] == "UNCERTAIN_SUBMIT"
    assert job["attempts"][0]["state"] == "uncertain"
    assert job["cost"]["unpriced_attempts"] == 1  # it may have been paid; nobody can say for how much
    assert list(Delivery.objects.filter(job_id=job["id"]).values_list("id", flat=True)) == [
        f"{job['id']}:1:generation.needs_review"]
    assert len(assert_books_balance(ledger)) == 1
    assert len(submits(ledger, job["id"])) == 1  # held: nothing was sent again

    done = run_again(api, engine, job["id"], run=2)

    assert done["status"] == "succeeded", done
    assert [c["request_id"] for c in submits(ledger, job["id"])] == [
        f"payonce-{job['id']}-1", f"payonce-{job['id']}-2"]
    assert [a["state"] for a in done["attempts"]] == ["uncertain", "succeeded"]
    assert len(assert_books_balance(ledger)) == 2  # a person decided to pay again


def test_crash_after_accept_on_a_lookup_model_is_found_and_adopted_with_one_charge(engine, ledger, api):
    ledger.faults([{"model": "image-lookup", "action": "crash_after_accept"}])  # charged, then the provider dies
    job = run_job(api, engine, media_body(models=["sandbox/image-lookup"]))

    assert job["status"] == "succeeded", job
    assert len(submits(ledger, job["id"])) == 1
    [attempt] = attempts(job["id"])
    assert (attempt.state, attempt.sends) == ("succeeded", 1)
    assert len(assert_books_balance(ledger)) == 1


def test_crash_after_accept_on_a_blind_model_waits_for_a_person_with_one_charge(engine, ledger, api):
    ledger.faults([{"model": "image-blind", "action": "crash_after_accept"}])
    job = run_job(api, engine, media_body(models=["sandbox/image-blind"]))
    ledger.wait_healthy()  # the job holds at once; the provider is still coming back up

    assert job["status"] == "waiting" and job["error"]["code"] == "UNCERTAIN_SUBMIT", job
    assert len(submits(ledger, job["id"])) == 1  # never a silent second
    assert [a["state"] for a in job["attempts"]] == ["uncertain"]
    assert len(assert_books_balance(ledger)) == 1


def test_a_503_on_a_lookup_model_is_a_definite_no_and_the_next_attempt_needs_no_lookup(engine, ledger, api):
    # The sandbox declares its 503 unpaid: nothing of that send is on its way or accepted, so there is
    # nothing to look up (a 5xx an adapter does not declare is looked up first: test_money_invariants).
    ledger.faults([{"model": "image-lookup", "action": "status_503"}])
    job = run_job(api, engine, media_body(models=["sandbox/image-lookup"]))

    assert job["status"] == "succeeded", job
    assert [c["status"] for c in submits(ledger, job["id"])] == [503, 202]
    assert [c for c in ledger.calls() if c["kind"] == "lookup"] == []
    assert [(a["number"], a["state"], a["paid"]) for a in job["attempts"]] == [(1, "failed", "no"), (2, "succeeded", "yes")]
    assert len(assert_books_balance(ledger)) == 1


MEDIA_MODELS = ["sandbox/video-keyed", "sandbox/image-lookup", "sandbox/image-blind"]


@pytest.mark.parametrize("model", MEDIA_MODELS)
def test_a_render_paid_then_failed_is_not_paid_again_automatically(engine, ledger, api, model):
    # Issue 21, finding 1: a fail_render was paid up to 3 times by the attempt runner, and a person's retry
    # paid 3 more. A paid failure ends the run: only a person (or policy.paid_retries) pays again.
    ledger.faults([{"model": model.split("/")[1], "action": "fail_render", "message": "the render crashed", "times": 5}])
    body = media_body(models=[model, *[m for m in MEDIA_MODELS if m != model]],
                      policy={"attempts_per_model": 3, "fallback_on": ["exhausted", "unavailable", "refused"]})
    job = run_job(api, engine, body)

    assert (job["status"], job["error"]["code"]) == ("failed", "PAID_ATTEMPT_FAILED"), job
    [attempt] = job["attempts"]
    assert (attempt["state"], attempt["paid"]) == ("failed", "yes")
    price = attempt["cost_usd"]
    assert job["error"]["attempt"] == 1 and job["error"]["cost_usd"] == price
    assert "the render crashed" in job["error"]["message"] and job["error"]["provider_error"] == attempt["error"]
    assert len(assert_books_balance(ledger)) == 1  # one charge, on the record with its cost

    done = run_again(api, engine, job["id"], run=2)  # a person's decision: exactly one more charge
    assert (done["status"], done["error"]["code"]) == ("failed", "PAID_ATTEMPT_FAILED")
    charges = assert_books_balance(ledger)
    assert [c["metadata"]["upstream_key"] for c in charges] == [f"payonce-{job['id']}-1", f"payonce-{job['id']}-2"]


@pytest.mark.parametrize("model", MEDIA_MODELS)
def test_paid_retries_allows_one_more_paid_attempt_in_the_run_and_no_more(engine, ledger, api, model):
    ledger.faults([{"model": model.split("/")[1], "action": "fail_render", "message": "the render crashed", "times": 2}])
    body = media_body(models=[model], policy={"attempts_per_model": 3, "fallback_on": [], "paid_retries": 1})
    job = run_job(api, engine, body)

    assert (job["status"], job["error"]["code"]) == ("failed", "PAID_ATTEMPT_FAILED"), job
    assert [(a["number"], a["state"], a["paid"]) for a in job["attempts"]] == [(1, "failed", "yes"), (2, "failed", "yes")]
    assert job["error"]["attempt"] == 2
    assert len(assert_books_balance(ledger)) == 2  # at most two charges in the run

    done = run_again(api, engine, job["id"], run=2)  # a person's retry: exactly one more, which renders
    assert done["status"] == "succeeded", done
    charges = assert_books_balance(ledger)
    assert [c["metadata"]["payonce_attempt"] for c in charges] == [1, 2, 3]


def test_a_paid_retry_goes_to_the_same_model_and_succeeds_with_both_renders_on_the_record(engine, ledger, api):
    ledger.faults([{"model": "video-keyed", "action": "fail_render", "message": "the render crashed"}])
    job = run_job(api, engine, media_body(policy={"attempts_per_model": 3, "fallback_on": [], "paid_retries": 1}))

    assert job["status"] == "succeeded", job
    first, second = job["attempts"]
    assert (first["state"], first["error_class"], first["cost_usd"], first["paid"]) == (
        "failed", "server_error", "0.400000", "yes")
    assert "the render crashed" in first["error"]
    assert (second["upstream_key"], second["state"]) == (f"payonce-{job['id']}-2", "succeeded")
    assert job["cost"]["total_usd"] == "0.800000"
    assert len(assert_books_balance(ledger)) == 2  # both renders were paid (the rule allowed it), both on the record


# --- definite answers ----------------------------------------------------------------------------------


def test_a_422_refusal_fails_with_the_providers_words_and_a_retry_goes_out_as_key_2(engine, ledger, api):
    words = "duration_secs must be 8 when reference images are given"
    ledger.faults([{"model": "video-keyed", "action": "status_422", "message": words}])
    job = run_job(api, engine, media_body())

    assert job["status"] == "failed"
    assert job["error"]["code"] == "INVALID_INPUT" and job["error"]["message"] == words
    assert job["attempts"][0]["error"] == words and job["attempts"][0]["error_class"] == "invalid_input"
    assert ledger.ledger()["charges"] == []
    done = run_again(api, engine, job["id"], run=2)
    assert done["status"] == "succeeded", done
    assert [c["request_id"] for c in submits(ledger, job["id"])] == [
        f"payonce-{job['id']}-1", f"payonce-{job['id']}-2"]
    assert [a["number"] for a in done["attempts"]] == [1, 2]
    assert len(assert_books_balance(ledger)) == 1


def test_fallback_to_the_next_model_after_exhausted_attempts(engine, ledger, api):
    ledger.faults([{"model": "video-keyed", "action": "status_429", "times": 3, "seconds": 0.1}])
    body = media_body(models=["sandbox/video-keyed", "sandbox/image-lookup"],
                      policy={"attempts_per_model": 3, "fallback_on": ["exhausted"]})
    job = run_job(api, engine, body)

    assert job["status"] == "succeeded", job
    assert [(a["number"], a["model"], a["state"], a["error_class"]) for a in job["attempts"]] == [
        (1, "video-keyed", "failed", "rate_limited"),
        (2, "video-keyed", "failed", "rate_limited"),
        (3, "video-keyed", "failed", "rate_limited"),
        (4, "image-lookup", "succeeded", None),
    ]
    charges = assert_books_balance(ledger)
    assert [c["request_id"] for c in charges] == [f"payonce-{job['id']}-4"]  # a 429 is not paid


def test_an_auth_error_stops_the_chain_at_once(engine, ledger, api):
    ledger.faults([{"model": "video-keyed", "action": "status_401"}])
    job = run_job(api, engine, media_body(models=["sandbox/video-keyed", "sandbox/image-lookup"],
                                          policy={"fallback_on": ["exhausted", "unavailable", "refused"]}))

    assert job["status"] == "failed" and job["error"]["code"] == "PROVIDER_AUTH"
    assert len(submits(ledger)) == 1  # no retry, no fallback
    assert assert_books_balance(ledger) == []


@pytest.mark.parametrize("fallback", [False, True], ids=["no-fallback", "fallback"])
def test_an_expired_window_does_not_retry_the_same_model(engine, ledger, api, fallback):
    body = media_body(models=["sandbox/video-keyed", "sandbox/image-lookup"],
                      input={"prompt": "a long render", "render_s": 30},
                      policy={"attempts_per_model": 3, "window_s": 1, "paid_retries": 1 if fallback else 0,
                              "fallback_on": ["window_expired"] if fallback else []})
    job = run_job(api, engine, body)

    first = job["attempts"][0]
    assert (first["model"], first["state"], first["error_class"]) == ("video-keyed", "failed", "window_expired")
    keyed_submits = [c for c in submits(ledger, job["id"]) if c["model"] == "video-keyed"]
    assert len(keyed_submits) == 1  # the provider may bill the whole run: never again on this model
    generation = requests.get(f"{ledger.url}/v1/generations/gen_000001", timeout=5).json()
    assert generation["status"] == "cancelled"  # and the render was stopped upstream
    if fallback:
        # The chain moved on (the same window then expired on the next model too: one attempt each).
        assert [(a["model"], a["error_class"]) for a in job["attempts"]] == [
            ("video-keyed", "window_expired"), ("image-lookup", "window_expired")]
        assert job["status"] == "failed" and job["error"]["code"] == "WINDOW_EXPIRED"
        assert [c["model"] for c in submits(ledger, job["id"])] == ["video-keyed", "image-lookup"]
    else:
        assert job["status"] == "failed" and job["error"]["code"] == "WINDOW_EXPIRED"
        assert len(job["attempts"]) == 1
    assert_books_balance(ledger)


# --- the output key, read back before paying -----------------------------------------------------------


def unsent_job(api, **overrides) -> Job:
    """A job row as the API writes it, not yet enqueued: the test prepares the store first."""
    body = media_body(**overrides)
    job_id = uuid.uuid4()
    return Job.objects.create(
        id=job_id, client_id=api.client_id, idempotency_key=f"k-{job_id}", request_hash="0" * 64,
        kind="media", model_chain=body["models"], input=body["input"],
        policy={"attempts_per_model": 3, "fallback_on": []}, output_key=body.get("output_key", f"outputs/{job_id}/o.mp4"),
        metadata={}, lease_until=timezone.now() + timedelta(minutes=10),
    )


def test_output_already_written_by_this_job_is_success_with_no_provider_call(engine, ledger, api):
    job = unsent_job(api)
    client_store(job.client_id).put(job.output_key, b"rendered before a crash", content_type="video/mp4",
                    metadata={"written_by": str(job.id), "provider": "sandbox", "model": "video-keyed", "attempt": "1"})
    engine.run_job(job)
    done = api.job(str(job.id))

    assert done["status"] == "succeeded"
    assert done["output"]["written_by"] == str(job.id) and done["attempts"] == []
    assert ledger.calls() == [] and ledger.ledger()["charges"] == []


def test_output_written_by_another_job_is_a_conflict_with_no_provider_call(engine, ledger, api):
    job = unsent_job(api, output_key=f"renders/{uuid.uuid4()}/shared.mp4")
    other = str(uuid.uuid4())
    client_store(job.client_id).put(job.output_key, b"another job's film", content_type="video/mp4",
                    metadata={"written_by": other, "provider": "sandbox", "model": "video-keyed", "attempt": "1"})
    engine.run_job(job)
    done = api.job(str(job.id))

    assert done["status"] == "failed" and done["error"]["code"] == "OUTPUT_KEY_CONFLICT"
    assert ledger.calls() == []
    with client_store(job.client_id).open(job.output_key) as handle:
        assert handle.read() == b"another job's film"  # never overwritten


def test_a_key_the_store_cannot_hold_ends_the_job_upload_failed_before_anything_is_paid(ledger, api):
    # A 242-character part: the file store's metadata file for it would be 256 bytes long (ENAMETOOLONG);
    # The API refuses such a key at submit; a row that has one anyway (an older build) ends, never hangs.
    job = unsent_job(api, output_key="renders/" + "a" * 242)

    outcome = runner.run_stage(job_id=job.id, run=1, stage="prepare", owner="t")

    assert outcome == Stop("failed: UPLOAD_FAILED")
    job.refresh_from_db()
    assert job.status == "failed" and job.error["code"] == "UPLOAD_FAILED"
    assert ledger.calls() == [] and attempts(job.id) == []


# --- before the submit: pre-submit checks and inputs -------------------------------------------------------


def test_references_are_uploaded_to_the_provider_before_every_submit(engine, ledger, api):
    # A 429 (a definite end: a new attempt, which uploads the references again), then a lost answer
    # (unknown outcome: the same key again, so the same request, with the same inputs).
    ledger.faults([{"model": "video-keyed", "action": "status_429", "seconds": 0.1},
                   {"model": "video-keyed", "action": "accept_then_drop"}])
    png = b"\x89PNG\r\n\x1a\n reference"
    body = media_body(input={"prompt": "in this style", "render_s": 0,
                             "references": [{"data": base64.b64encode(png).decode(), "content_type": "image/png"}]})
    job = run_job(api, engine, body)

    assert job["status"] == "succeeded", job
    calls = [c for c in ledger.calls() if c["kind"] in ("upload", "submit")]
    assert [(c["kind"], c["request_id"]) for c in calls] == [
        ("upload", None), ("submit", f"payonce-{job['id']}-1"),
        ("upload", None), ("submit", f"payonce-{job['id']}-2"), ("submit", f"payonce-{job['id']}-2"),
    ]
    uploaded = requests.get(f"{ledger.url}/v1/inputs/inp_000001/content", timeout=5).content
    assert uploaded == png
    sent = Attempt.objects.get(job_id=job["id"], number=2).uploaded_inputs
    assert sent == ["inp_000002"]
    assert len(assert_books_balance(ledger)) == 1


def test_a_cancel_while_an_upload_waits_to_be_tried_again_releases_the_unsent_attempt(engine, ledger, api):
    # Found by the storm (tests/chaos): the upload failed (the send was given back, sends 0), the job was
    # cancelled during the back-off, the chain stopped at the cancel, and the intent stayed `submitting`
    # with its reservation held for good: money the client could never spend again.
    from billing.models import Reservation

    ledger.faults([{"model": "*", "action": "status_500", "on": "upload", "times": 6}])
    png = b"\x89PNG\r\n\x1a\n reference"
    body = media_body(input={"prompt": "in this style", "render_s": 0,
                             "references": [{"data": base64.b64encode(png).decode(), "content_type": "image/png"}]})
    response = api.create(body, key="cancel-while-uploading")
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    engine.start(Job.objects.get(id=job_id))
    engine.run(until=lambda: Attempt.objects.filter(job_id=job_id, sends=0, state="submitting").exists())
    assert api.http.post(f"/v1/jobs/{job_id}/cancel", headers=api.headers()).status_code == 200

    engine.run_job(job_id)  # the chain's pass after the back-off finds the job cancelled
    [attempt] = attempts(job_id)
    assert (attempt.state, attempt.error_class, attempt.cost_usd) == ("failed", "cancelled", None)
    assert Reservation.objects.get(key=attempt.upstream_key).state == "released"
    assert submits(ledger, job_id) == [] and assert_books_balance(ledger) == []

def test_a_pre_submit_check_refuses_before_anything_is_spent(ledger, api, settings, monkeypatch):
    settings.PRE_SUBMIT_CHECKS = ["executor.checks.blocked_subjects"]
    monkeypatch.setenv("BLOCKED_SUBJECTS", "Alice Example, Bob")
    job = unsent_job(api, input={"prompt": "a portrait of alice example", "render_s": 0})

    outcome = runner.run_stage(job_id=job.id, run=1, stage="prepare", owner="t")

    assert outcome == Stop("failed: PRE_SUBMIT_REFUSED")
    job.refresh_from_db()
    assert job.status == "failed" and job.error["code"] == "PRE_SUBMIT_REFUSED"
    assert "alice example" in job.error["message"].lower()
    [attempt] = attempts(job.id)
    assert (attempt.state, attempt.error_class, attempt.sends) == ("failed", "pre_submit_refused", 1)
    assert ledger.calls() == []
    assert Step.objects.get(job=job, name="submit").status == "failed"


@pytest.mark.parametrize("then, status, state", [
    ({"action": "status_429", "seconds": 0.1}, "succeeded", "succeeded"),  # not now: the same key again, later
    ({"action": "status_422"}, "succeeded", "succeeded"),  # a no that cannot speak for the earlier send
    ({"action": "refuse"}, "succeeded", "succeeded"),
])
def test_a_refused_resend_of_a_key_does_not_end_the_attempt_as_unpaid(engine, ledger, api, then, status, state):
    # Found by the storm (tests/chaos): the first send was accepted (charged) and its answer lost; the
    # resend of the same key was answered 429, and the attempt ended failed, released, while the ledger
    # held its charge.
    ledger.faults([{"model": "video-keyed", "action": "accept_then_drop"}, {"model": "video-keyed", **then}])
    body = media_body(models=["sandbox/video-keyed", "sandbox/image-lookup"],
                      policy={"attempts_per_model": 3, "fallback_on": ["exhausted", "unavailable", "refused"]})
    job = run_job(api, engine, body)

    assert job["status"] == status, job
    assert [(a["number"], a["model"], a["state"]) for a in job["attempts"]] == [(1, "video-keyed", state)]
    assert {c["request_id"] for c in submits(ledger, job["id"])} == {f"payonce-{job['id']}-1"}
    assert len(assert_books_balance(ledger)) == 1
