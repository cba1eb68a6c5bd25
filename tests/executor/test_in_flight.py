"""Calls in flight per provider and per model (executor.in_flight; docs/api.md, "Limits"): at most N at once,
shared by every client and worker, a call past it held back unsent (no intent, no key, nothing reserved). In
process with the engine (tests/support/engine.py), and through two worker processes with the sandbox's ledger
as the ground truth."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.core.exceptions import ImproperlyConfigured

from billing.models import Reservation
from config.env import env_limits
from executor import in_flight
from executor.models import Attempt
from jobs.models import Job
from jobs.services import client_create
from tests.conftest import WEB_STACK_ENV, media_body, purge_queue
from tests.support.books import assert_books_balance
from tests.support.overlap import most_at_once
from tests.support.http_api import HttpApi
from tests.support.procs import ProcfileProcess, procfile_command, stop_all


@pytest.mark.django_db
def test_a_call_past_the_limit_waits_unsent_and_goes_when_a_slot_frees(engine, api, ledger, settings):
    settings.PROVIDER_MAX_IN_FLIGHT = {"sandbox": 1}
    first = api.create(media_body(input={"prompt": "one", "render_s": 1}), key="one").json()["id"]
    second = api.create(media_body(input={"prompt": "two", "render_s": 1}), key="two").json()["id"]
    engine.start(Job.objects.get(id=first))
    engine.start(Job.objects.get(id=second))
    # Both submit steps have run once: one call is out, the other was held back with nothing written.
    engine.run(until=lambda: Attempt.objects.count() == 1 and len(engine.ran) >= 2)
    held = second if Attempt.objects.filter(job_id=first).exists() else first
    assert not Attempt.objects.filter(job_id=held).exists() and not Reservation.objects.filter(job_id=held).exists()
    engine.run_job(first)
    engine.run_job(second)
    attempts = list(Attempt.objects.order_by("created_at"))
    assert [a.state for a in attempts] == ["succeeded", "succeeded"]
    assert attempts[1].created_at >= attempts[0].finished_at  # the second went once the first had ended
    assert len(assert_books_balance(ledger)) == 2


@pytest.mark.django_db
def test_a_model_limit_counts_that_model_only(settings):
    settings.PROVIDER_MAX_IN_FLIGHT = {"sandbox/video-keyed": 2}
    assert in_flight.limits_for("sandbox", "video-keyed") == [("sandbox/video-keyed", 2)]
    assert in_flight.limits_for("sandbox", "image-lookup") == []
    settings.PROVIDER_MAX_IN_FLIGHT = {"sandbox": 4, "sandbox/video-keyed": 2}
    assert in_flight.limits_for("sandbox", "video-keyed") == [("sandbox", 4), ("sandbox/video-keyed", 2)]


@pytest.mark.parametrize("raw", ["sandbox", "sandbox=0", "=3", "sandbox=x", "sandbox=-1"])
def test_a_limit_that_cannot_be_read_refuses_to_start(monkeypatch, raw):
    monkeypatch.setenv("PROVIDER_MAX_IN_FLIGHT", raw)
    with pytest.raises(ImproperlyConfigured, match="PROVIDER_MAX_IN_FLIGHT"):
        env_limits("PROVIDER_MAX_IN_FLIGHT")


@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_a_provider_limit_of_three_holds_for_fifty_jobs_of_several_clients_on_two_workers(web_stack, ledger):
    purge_queue(WEB_STACK_ENV["BROKER_URL"], "jobs")
    env = {**WEB_STACK_ENV, "PROVIDER_MAX_IN_FLIGHT": "sandbox=3", "PROVIDER_CALLBACK_BASE_URL": web_stack.url}
    # Two worker processes, as on two machines: each its own Celery node name.
    workers = [ProcfileProcess("worker", env, command=procfile_command("worker").replace("jobs@%h", f"jobs{n}@%h"))
               for n in range(2)]
    for worker in workers:
        worker.launch()
    for worker in workers:
        worker.ready_within(60)
    try:
        clients = [HttpApi(web_stack.url, client_create(name=f"tenant-{n}")) for n in range(3)]
        bodies = [(clients[n % 3], media_body(input={"prompt": f"job {n}", "render_s": 0.5}), f"k{n}") for n in range(50)]
        with ThreadPoolExecutor(10) as pool:
            created = list(pool.map(lambda item: item[0].create(item[1], key=item[2]), bodies))
        assert {answer.status_code for answer in created} == {201}
        ended = [api.wait(answer.json()["id"], timeout=120) for (api, _, _), answer in zip(bodies, created)]
    finally:
        stop_all(workers)
    assert {job["status"] for job in ended} == {"succeeded"}
    attempts = list(Attempt.objects.all())
    assert len(attempts) == 50  # one each: a call held back wrote nothing
    # In flight from its intent to its end: never more than three at once, and three were reached.
    assert most_at_once([(a.created_at, a.finished_at) for a in attempts]) == 3
    charges = assert_books_balance(ledger)
    assert len(charges) == 50
