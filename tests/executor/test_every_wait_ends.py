"""Every wait ends, for every kind of provider (issue 37, finding 5): an attempt whose send's outcome nothing
settles (a key resent and never answered, lookups that cannot conclude) becomes `uncertain` after
UNKNOWN_OUTCOME_MAX_S, and its job waits for a person (UNCERTAIN_SUBMIT), as a blind provider's does at once;
the chain's fallback is not tried (the first provider may be doing, and billing, the work).

The repro: Replicate's base URL pointed at a socket that accepts and never replies. After 15 minutes the job
was still `running`, one attempt `submitting / paid unknown`, the lookup retried every 30 s with no
deadline, its fallback never tried, nothing on the timeline, no metric."""

import socket
import threading

import pytest
from prometheus_client.exposition import generate_latest

from billing.models import Reservation
from executor.models import Attempt, AttemptState
from jobs.models import Job
from operators.metrics import REGISTRY
from tests.support.engine import media_job

# Committed: the metrics read ages with SQL now(), which inside one transaction stays at its start.
pytestmark = pytest.mark.django_db(transaction=True)

FLUX = "replicate/black-forest-labs/flux-schnell"


@pytest.fixture
def silent_provider():
    """A server that accepts every connection and never answers a byte (until the test ends)."""
    listener = socket.create_server(("127.0.0.1", 0))
    held, stop = [], threading.Event()

    def accept():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    listener.close()


def gauge(name: str) -> float:
    line = next(line for line in generate_latest(REGISTRY).decode().splitlines() if line.startswith(f"{name} "))
    return float(line.split()[1])


def test_a_lookup_provider_that_never_answers_holds_the_job_for_a_person_within_the_bound(
        engine, settings, silent_provider, api, ledger, fresh_catalog):
    settings.REAL_PROVIDERS = True
    settings.REPLICATE_API_TOKEN = "r8_test_token"
    settings.REPLICATE_BASE_URL = silent_provider
    settings.PROVIDER_CONNECT_TIMEOUT_S = settings.PROVIDER_READ_TIMEOUT_S = 0.3
    settings.UNKNOWN_OUTCOME_MAX_S = 2
    settings.RETRY_BACKOFF_MAX_S = 0.5
    job = media_job(api.client_id, models=(FLUX, "sandbox/image-lookup"), input={"prompt": "never answered"},
                    policy={"attempts_per_model": 3, "fallback_on": ["exhausted", "unavailable"]})

    outcomes = engine.stage(job, "prepare", timeout=20)

    job.refresh_from_db()
    assert (job.status, job.error["code"]) == ("waiting", "UNCERTAIN_SUBMIT"), outcomes[-3:]
    [attempt] = Attempt.objects.filter(job=job)
    assert (attempt.model_name, attempt.state) == (FLUX, AttemptState.UNCERTAIN)
    assert "no answer settled this attempt within 2 s of its first send" in attempt.error
    assert "lookups could not conclude (timeout" in attempt.error
    assert attempt.paid == "unknown"
    assert list(Reservation.objects.filter(job_id=job.id).values_list("state", "unpriced")) == [("held", True)]
    assert ledger.calls() == []  # the fallback was never tried: the first provider may be doing the work
    assert gauge("payonce_oldest_uncertain_attempt_age_seconds") > 0


def test_a_keyed_provider_that_never_answers_holds_the_job_for_a_person_within_the_bound(
        engine, settings, api, ledger, fresh_catalog):
    # The sandbox remembers keys for ever, so only the bound ends it: every send of the key is held by the
    # provider for longer than payonce waits for an answer.
    settings.PROVIDER_READ_TIMEOUT_S = 0.3
    settings.UNKNOWN_OUTCOME_MAX_S = 2
    settings.RETRY_BACKOFF_MAX_S = 0.5
    ledger.faults([{"model": "video-keyed", "action": "delay", "seconds": 1, "times": 50, "on": "submit"}])
    job = media_job(api.client_id, models=("sandbox/video-keyed", "sandbox/image-lookup"),
                    policy={"attempts_per_model": 3, "fallback_on": ["exhausted", "unavailable"]})

    engine.stage(job, "prepare", timeout=20)

    job.refresh_from_db()
    assert (job.status, job.error["code"]) == ("waiting", "UNCERTAIN_SUBMIT")
    [attempt] = Attempt.objects.filter(job=job)
    assert attempt.state == AttemptState.UNCERTAIN and attempt.sends >= 2  # the key went out again first
    assert "within 2 s of its first send" in attempt.error
    assert {call["model"] for call in ledger.calls()} == {"video-keyed"}  # no fallback paid beside it


def test_the_oldest_running_job_is_a_metric(api, db):
    assert gauge("payonce_oldest_running_job_age_seconds") == 0
    job = media_job(api.client_id)
    Job.objects.filter(id=job.id).update(status="running", started_at=job.created_at)
    assert gauge("payonce_oldest_running_job_age_seconds") > 0
