"""A model disabled or removed while its work is out (issue 37, finding 1): an attempt already out is waited on,
cancelled, resolved and settled with the spec it went out with (Attempt.spec), whatever the catalog says
afterwards; disabling a model refuses new work only; every sweep acts row by row.

The repro, through the real processes: three renders running, both models saved disabled on the admin's
Models page: the jobs stayed `running` for good, a cancel left its attempt `running` with its money held,
and the cancel sweep stopped at the first failing attempt, holding another client's reservation too."""

import logging
import time
from decimal import Decimal as D

import pytest
from django.conf import settings

from billing.models import Reservation
from executor import cancel, record, registry
from executor.llm import llm_call
from executor.models import Attempt, AttemptState, ModelConfig
from jobs.engine import runner
from jobs.engine.outcomes import JobFailure, Later
from jobs.models import Job
from jobs.services import job_cancel
from tests.conftest import media_body, purge_queue
from tests.support.waiting import wait_for
from tests.support.books import assert_books_balance
from tests.support.engine import media_job
from tests.support.procs import ProcfileProcess

pytestmark = pytest.mark.django_db


def disable(*names: str) -> None:
    """What saving the models disabled on the admin's Models page writes, read at once by this process."""
    for name in names:
        ModelConfig.objects.update_or_create(name=name, defaults={"enabled": False})
    registry.forget_models()
    assert all(registry.model_spec(name) is None for name in names)


def money(job) -> list[tuple]:
    return list(Reservation.objects.filter(job_id=job.id).order_by("key").values_list("state", "amount", "spent"))


def test_a_render_out_when_its_model_is_disabled_is_waited_on_and_settled_as_it_went_out(
        engine, api, ledger, fresh_catalog):
    job = media_job(api.client_id, input={"prompt": "out", "render_s": 1})
    engine.stage(job, "prepare")
    [attempt] = Attempt.objects.filter(job=job)
    assert attempt.state == AttemptState.RUNNING
    assert attempt.spec["capabilities"]["idempotency_key"] is True and attempt.spec["kind"] == "video"

    disable("sandbox/video-keyed")
    engine.stage(job, "wait")
    engine.stage(job, "finish")

    job.refresh_from_db()
    assert job.status == "succeeded", job.error
    attempt.refresh_from_db()
    assert (attempt.state, attempt.cost_usd, attempt.cost_source) == (AttemptState.SUCCEEDED, D("0.400000"), "quoted")
    assert money(job) == [("settled", D("0.400000"), D("0.400000"))]
    assert len(assert_books_balance(ledger)) == 1


def test_a_cancel_of_a_render_whose_model_was_disabled_stops_it_upstream_and_settles_it(engine, api, ledger, fresh_catalog):
    job = media_job(api.client_id, input={"prompt": "cancel me", "render_s": 30})
    engine.stage(job, "prepare")
    disable("sandbox/video-keyed")

    assert job_cancel(job=job)
    runner.stop_cancelled(job_id=job.id, run=job.run, owner="t")

    [attempt] = Attempt.objects.filter(job=job)
    assert (attempt.state, attempt.error_class) == (AttemptState.FAILED, "cancelled")
    assert [c["kind"] for c in ledger.calls()] == ["submit", "cancel"]  # stopped upstream, as it went out
    assert [state for state, *_ in money(job)] == ["settled"]
    assert len(assert_books_balance(ledger)) == 1


def test_an_unknown_outcome_on_a_disabled_model_is_resolved_by_its_key_and_paid_once(engine, api, ledger, fresh_catalog):
    # The first send's answer is lost after the sandbox charged it; then the model is disabled. The attempt
    # is already out: its key goes out again (as it went out: keyed), and the provider returns the same work.
    ledger.faults([{"model": "video-keyed", "action": "accept_then_drop"}])
    job = media_job(api.client_id, input={"prompt": "lost answer", "render_s": 0})
    engine.start(job)
    [first_pass] = engine.run(until=lambda: Attempt.objects.filter(job=job).exists())
    assert isinstance(first_pass.outcome, Later), first_pass  # the same key goes out again, after a back-off
    [attempt] = Attempt.objects.filter(job=job)
    assert (attempt.state, attempt.sends) == (AttemptState.SUBMITTING, 1)
    disable("sandbox/video-keyed")

    engine.run_job(job)
    job.refresh_from_db()
    assert job.status == "succeeded", job.error
    assert [a.number for a in Attempt.objects.filter(job=job)] == [1]
    assert len(assert_books_balance(ledger)) == 1


def test_a_queued_job_whose_model_was_disabled_falls_back_without_paying_it(engine, api, ledger, fresh_catalog):
    job = media_job(api.client_id, models=("sandbox/video-keyed", "sandbox/image-lookup"),
                    policy={"attempts_per_model": 3, "fallback_on": ["unavailable"]})
    disable("sandbox/video-keyed")

    engine.run_job(job)

    job.refresh_from_db()
    assert job.status == "succeeded", job.error
    rows = [(a.number, a.model_name, a.state, a.error_class, a.sends, a.paid) for a in Attempt.objects.filter(job=job)]
    assert rows == [(1, "sandbox/video-keyed", "failed", "unavailable", 0, "no"),
                    (2, "sandbox/image-lookup", "succeeded", None, 1, "yes")]
    assert [key for key, in Reservation.objects.filter(job_id=job.id).values_list("key")] == [f"payonce-{job.id}-2"]
    assert [c["model"] for c in assert_books_balance(ledger)] == ["image-lookup"]


def test_a_queued_job_whose_only_model_was_disabled_fails_unavailable_with_nothing_paid(engine, api, ledger, fresh_catalog):
    job = media_job(api.client_id)
    disable("sandbox/video-keyed")

    job = engine.run_job(job)
    assert (job.status, job.error["code"]) == ("failed", "PROVIDER_UNAVAILABLE")
    assert "disabled or no longer in the catalog" in job.error["message"]
    assert not Reservation.objects.filter(job_id=job.id).exists() and ledger.calls() == []


def test_an_llm_call_on_a_disabled_model_fails_unavailable_and_reserves_nothing(api, ledger, fresh_catalog):
    job = media_job(api.client_id, models=("sandbox/llm",))
    disable("sandbox/llm")
    with pytest.raises(JobFailure) as failed:
        llm_call(job, step="chapter-sun", model_name="sandbox/llm", system="s",
                 messages=[{"role": "user", "content": "c"}], max_tokens=100)
    assert failed.value.code == "PROVIDER_UNAVAILABLE"
    assert not Reservation.objects.filter(job_id=job.id).exists() and ledger.calls() == []


def test_the_cancel_sweep_skips_an_attempt_it_cannot_end_and_ends_the_others(engine, make_api, ledger, fresh_catalog,
                                                                            caplog):
    # Two clients' renders out, both jobs cancelled with nothing yet stopping them (the stop_upstream
    # message lost). The first attempt's row cannot be read by the code (its spec is not one); the sweep
    # logs it, skips it, and ends the other client's attempt and settles its money in the same pass.
    broken, fine = (media_job(make_api(name).client_id, input={"prompt": name, "render_s": 30})
                    for name in ("first", "second"))
    for job in (broken, fine):
        engine.stage(job, "prepare")
        assert job_cancel(job=job)
    Attempt.objects.filter(job=broken).update(spec={"provider": "sandbox"})
    assert Attempt.objects.filter(job=broken).first().id < Attempt.objects.filter(job=fine).first().id

    with caplog.at_level(logging.ERROR, logger="executor.cancel"):
        assert cancel.sweep_cancelled() == 2

    assert Attempt.objects.get(job=broken).state == AttemptState.RUNNING
    assert (Attempt.objects.get(job=fine).state, Attempt.objects.get(job=fine).error_class) == ("failed", "cancelled")
    assert [state for state, *_ in money(fine)] == ["settled"]
    assert any("could not end cancelled attempt" in r.getMessage() and r.exc_info for r in caplog.records)

    Attempt.objects.filter(job=broken).update(spec=registry.model_spec("sandbox/video-keyed").snapshot())
    cancel.sweep_cancelled()  # the row readable again: the next pass ends it
    assert Attempt.objects.get(job=broken).state == AttemptState.FAILED
    assert all(state == "settled" for state, *_ in money(broken))
    assert len(assert_books_balance(ledger)) == 2


def test_an_attempt_written_before_specs_were_kept_is_resolved_by_the_catalog_or_the_code(api, fresh_catalog):
    job = media_job(api.client_id)
    old = Attempt.objects.create(job=job, run=1, number=1, provider="sandbox", model="video-keyed",
                                 upstream_key=f"payonce-{job.id}-1", state=AttemptState.RUNNING, sends=1)
    disable("sandbox/video-keyed")
    assert record.attempt_spec(old).capabilities.cancel  # the catalog has lost it: the code's spec
    gone = Attempt.objects.create(job=job, run=1, number=2, provider="replicate", model="Not A Model Name",
                                  upstream_key=f"payonce-{job.id}-2", state=AttemptState.FAILED, sends=1)
    assert record.attempt_spec(gone).capabilities.lookup  # no catalog, no code: its adapter's own


@pytest.mark.e2e
def test_renders_out_when_the_admin_disables_their_models_end_and_a_cancel_settles(
        transactional_db, sandbox, ledger, api, admin_client, fresh_catalog):
    # The finding's own repro, through the processes: a worker (reading the catalog every half second),
    # three renders accepted, both models disabled on the admin's Models page, one job cancelled.
    purge_queue(settings.CELERY_BROKER_URL, "jobs")
    worker = ProcfileProcess("worker", env={"WORKER_CONCURRENCY": 8, "MODELS_CACHE_S": 0.5}).start()
    try:
        ids = []
        for n, model in enumerate(["sandbox/video-keyed", "sandbox/image-lookup", "sandbox/video-keyed"]):
            created = api.create(media_body(models=[model], input={"prompt": f"render {n}", "render_s": 4}), key=f"r{n}")
            assert created.status_code == 201, created.content
            ids.append(created.json()["id"])
        deadline = time.monotonic() + 20
        while Attempt.objects.filter(job_id__in=ids, state=AttemptState.RUNNING).count() < 3:
            assert time.monotonic() < deadline, list(Attempt.objects.values_list("state", flat=True))
            time.sleep(0.1)
        for name in ("sandbox/video-keyed", "sandbox/image-lookup"):
            saved = admin_client.post("/admin/executor/modelconfig/add/", {"name": name})  # enabled left unticked
            assert saved.status_code == 302, saved.content.decode()[:2000]
        assert ModelConfig.objects.filter(enabled=False).count() == 2
        cancelled = api.http.post(f"/v1/jobs/{ids[2]}/cancel", headers=api.headers())
        assert cancelled.status_code == 200, cancelled.content

        ended = [wait_for(api, job_id, {"succeeded", "failed", "cancelled", "waiting"}, timeout=30)[0] for job_id in ids]
        assert [job["status"] for job in ended] == ["succeeded", "succeeded", "cancelled"], ended
        deadline = time.monotonic() + 20
        while Attempt.objects.filter(job_id=ids[2], state__in=["submitting", "running"]).exists():
            assert time.monotonic() < deadline, "the cancelled job's attempt stayed out"
            time.sleep(0.2)
        assert not Reservation.objects.filter(state="held").exists()
        assert len(assert_books_balance(ledger)) == 3
        # Refused for new work: the models are off.
        refused = api.create(media_body(), key="after")
        assert refused.status_code == 422, refused.content
        assert "AttributeError" not in worker.output()
    finally:
        worker.stop()
    assert Job.objects.filter(status="running").count() == 0


def test_a_replay_after_its_model_was_disabled_is_the_same_job_not_a_422(api, fresh_catalog):
    # A careful client's POST whose answer was lost is sent again; meanwhile an operator disabled the model.
    # The job exists (and may be paid for): the replay answers it, as any replay does; a new key is refused.
    body = media_body(input={"prompt": "replayed", "render_s": 1})
    first = api.create(body, key="lost-answer")
    assert first.status_code == 201, first.content
    disable("sandbox/video-keyed")

    again = api.create(body, key="lost-answer")
    assert (again.status_code, again.json()["id"]) == (202, first.json()["id"]), again.content
    other = api.create({**body, "input": {"prompt": "another body", "render_s": 1}}, key="lost-answer")
    assert other.status_code == 409 and other.json()["error"]["code"] == "IDEMPOTENCY_CONFLICT"
    new = api.create(body, key="a-new-key")
    assert new.status_code == 422 and "models" in new.json()["error"]["fields"], new.content
    assert Job.objects.count() == 1
