"""Outputs live in the store, not the database (issue 37, finding 7). A synchronous provider answers the
finished bytes in its body (OpenAI's images: megabytes of base64). They were paid for, so the attempt's
row keeps them until the store holds them (a crash before the store write must not lose them); the wait
step's result only names the row, and once the output is stored the row keeps the stored key instead.

An OpenAI image job runs as the worker runs it (the stages called in this process, against the real
database and store), OpenAI being a local server replaying its recorded answer
(tests/executor/test_openai_images.py): its request log is the proof that nothing was asked twice.
"""

import pytest
from django.db import connection

from accounts.models import Client
from executor import services as executor
from executor.models import STORED_OUTPUT, Attempt
from executor.providers import http
from executor.store import client_store
from jobs import services
from jobs.api.serializers import JobCreateSerializer
from jobs.engine import runner
from jobs.kinds import media
from jobs.models import Job, JobStatus, Step
from tests.support.openai_images import PATH, PNG
from tests.support.replay_server import ReplayServer

pytestmark = [pytest.mark.django_db(transaction=True)]

MODEL = "openai-images/gpt-image-1"


@pytest.fixture
def openai(settings):
    """REAL_PROVIDERS on, OpenAI's image endpoint a local server that has one image to answer with."""
    with ReplayServer() as server:
        settings.REAL_PROVIDERS = True
        settings.OPENAI_API_KEY = "sk-proj-test-key"
        settings.OPENAI_BASE_URL = server.url + "/v1"
        server.script("POST", PATH, "openai_images/images_generation")
        yield server
        assert server.unexpected == [], f"requests nothing was scripted for: {server.unexpected}"


def image_job(api) -> Job:
    serializer = JobCreateSerializer(data={"kind": "media", "models": [MODEL], "input": {
        "prompt": "a lighthouse at dusk", "quality": "medium", "size": "1024x1024"}})
    serializer.is_valid(raise_exception=True)
    client = Client.objects.get(id=api.client_id)
    job, created = services.job_create(client=client, idempotency_key="image", data=dict(serializer.validated_data))
    assert created
    return job


def run(job: Job, stage: str = "prepare"):
    """The stage as its task runs it: a synchronous provider's answer needs no wait, so the stages after
    it run inline, to the end."""
    return runner.run_stage(job_id=job.id, run=job.run, stage=stage, owner=f"test-{stage}")


def inline_bytes_left(job: Job) -> tuple[int, int]:
    """(attempts, step results) of the job that still hold a `data:` URL, as the tables have them."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM executor_attempt WHERE job_id = %s AND output_url LIKE 'data:%%'",
                       [job.id])
        attempts = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM jobs_step WHERE job_id = %s AND result::text LIKE '%%data:%%'",
                       [job.id])
        steps = cursor.fetchone()[0]
    return attempts, steps


def served(api, job: Job) -> bytes:
    response = api.get(f"/v1/jobs/{job.id}/output")
    assert response.status_code == 200, response
    return b"".join(response.streaming_content)


def test_an_image_answered_in_the_body_ends_in_the_store_and_nowhere_in_the_database(openai, api):
    job = image_job(api)

    run(job)

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert len(openai.requests) == 1  # paid once
    stored = client_store(job.client_id).head(job.output_key)
    assert stored is not None and stored.written_by == str(job.id) and stored.content_type == "image/png"
    assert served(api, job) == PNG
    assert inline_bytes_left(job) == (0, 0)
    [attempt] = Attempt.objects.filter(job=job)
    assert attempt.output_url == f"{STORED_OUTPUT}{job.output_key}"  # where the bytes went
    wait = Step.objects.get(job=job, name="wait").result
    assert wait["output_on_attempt"] is True and wait["output_url"] is None  # a reference, never the bytes


class WorkerDied(Exception):
    """The worker died between two statements (the process is gone; its transaction rolled back)."""


@pytest.mark.parametrize("bytes_cleared", [False, True], ids=["row-holds-the-bytes", "row-cleared-already"])
def test_a_store_step_run_again_after_the_write_succeeds_without_asking_the_provider(openai, api, monkeypatch,
                                                                                     bytes_cleared):
    # Given: the image is stored, and the worker dies before the commit that marks the store step done
    # (the job's end: jobs.kinds.media.finish), so the store step runs again on the next pass.
    job = image_job(api)
    real_finish = services.job_finish

    def die(**kwargs):
        raise WorkerDied

    monkeypatch.setattr(media.services, "job_finish", die)
    with pytest.raises(WorkerDied):
        run(job)
    monkeypatch.setattr(media.services, "job_finish", real_finish)
    assert client_store(job.client_id).head(job.output_key).complete  # written, ...
    assert not Step.objects.filter(job=job, name="store_output").exists()  # ... not marked done
    [attempt] = Attempt.objects.filter(job=job)
    assert http.is_data_url(attempt.output_url)  # the bytes left the row in no commit: it holds them still
    if bytes_cleared:  # as a store step whose clear had committed apart from its mark would leave it
        executor.media_stored(job, Step.objects.get(job=job, name="wait").result, {"key": job.output_key})

    # When: the run resumes where it stopped (jobs.engine.runner.resume_point: the finish stage).
    job.refresh_from_db()
    run(job, stage=job_stage(job))

    # Then: it ends with the stored image, and OpenAI was asked once, ever.
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert len(openai.requests) == 1
    assert served(api, job) == PNG
    assert inline_bytes_left(job) == (0, 0)


def job_stage(job: Job) -> str:
    return media.RECIPE.stages[runner.resume_point(job)].name


def test_a_wait_result_written_with_the_bytes_in_it_is_still_stored(openai, api, monkeypatch):
    # Given: a job whose wait step's result holds the image as a `data:` URL, as results were written before
    # they named the attempt's row, and whose store step has not run (the worker died just before it).
    job = image_job(api)
    real_store = executor.media_store

    def die(*args):
        raise WorkerDied

    monkeypatch.setattr(media.executor, "media_store", die)
    with pytest.raises(WorkerDied):
        run(job)
    monkeypatch.setattr(media.executor, "media_store", real_store)
    [attempt] = Attempt.objects.filter(job=job)
    wait = Step.objects.get(job=job, name="wait")
    old = {key: value for key, value in wait.result.items() if key != "output_on_attempt"}
    Step.objects.filter(id=wait.id).update(result={**old, "output_url": attempt.output_url})

    job.refresh_from_db()
    run(job, stage=job_stage(job))

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert len(openai.requests) == 1
    assert served(api, job) == PNG
    # The attempt lets go of its copy; the old result keeps its own (it was written so, and is left so).
    assert inline_bytes_left(job) == (0, 1)
