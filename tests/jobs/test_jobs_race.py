"""Identical requests racing against a live server: one row, one 201
(docs/design.md, "One key and one body are one job")."""

import threading

import requests

from jobs.models import Job
from tests.conftest import media_body

CONCURRENCY = 50


def race(url: str, api_key: str, bodies: list[dict], key: str) -> list[requests.Response]:
    """POST every body at once (a barrier releases all threads together), each on its own connection."""
    barrier = threading.Barrier(len(bodies))
    responses: list = [None] * len(bodies)

    def post(index: int) -> None:
        session = requests.Session()
        barrier.wait()
        responses[index] = session.post(
            url, json=bodies[index], timeout=60,
            headers={"Authorization": f"Bearer {api_key}", "Idempotency-Key": key},
        )

    threads = [threading.Thread(target=post, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return responses


def test_50_identical_posts_make_one_job_and_one_201(live_server, make_api):
    api = make_api()
    responses = race(f"{live_server.url}/v1/jobs", api.api_key, [media_body()] * CONCURRENCY, key="same")
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [201] + [202] * (CONCURRENCY - 1), statuses
    assert len({r.json()["id"] for r in responses}) == 1
    assert Job.objects.filter(client_id=api.client_id).count() == 1


def test_50_different_bodies_on_one_key_make_one_job_and_49_conflicts(live_server, make_api):
    api = make_api()
    bodies = [media_body(input={"prompt": f"film number {n}"}) for n in range(CONCURRENCY)]
    responses = race(f"{live_server.url}/v1/jobs", api.api_key, bodies, key="same")
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [201] + [409] * (CONCURRENCY - 1), statuses
    winner = next(r for r in responses if r.status_code == 201).json()
    assert {r.json()["error"]["job_id"] for r in responses if r.status_code == 409} == {winner["id"]}
    jobs = list(Job.objects.filter(client_id=api.client_id))
    assert [str(job.id) for job in jobs] == [winner["id"]]
    assert jobs[0].input == winner["input"]
