"""Tenant isolation through the real `web` process, the jobs run by the engine in this process
(tests/support/engine.py): two clients, alice and bob, on one stack. No client
reads, writes, squats or learns of another's outputs or jobs, whatever key or id it names; every refusal
is a clear 4xx before any row or charge (docs/design.md, "One key and one body are one job" and
"The output key: read back before paying")."""

import uuid

import pytest
import requests

from executor.store import client_store, get_store
from jobs.models import Job
from jobs.services import client_create
from tests.support.books import assert_books_balance
from tests.support.engine import EngineHttpApi

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def render(prompt: str = "a lighthouse at dusk", render_s: float = 0, **fields) -> dict:
    return {"kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": prompt, "render_s": render_s},
            **fields}


def reference_body(output_key: str) -> dict:
    body = render("in the style of this")
    body["input"]["references"] = [{"output_key": output_key, "content_type": "video/mp4"}]
    return body


@pytest.fixture
def alice(web_stack, engine, transactional_db):  # committed: the web process reads what this one writes
    return EngineHttpApi(web_stack.url, client_create(name="alice"), engine)


@pytest.fixture
def bob(web_stack, engine, transactional_db):
    return EngineHttpApi(web_stack.url, client_create(name="bob"), engine)


def finished(api: EngineHttpApi, body: dict, key: str) -> dict:
    created = api.create(body, key=key)
    assert created.status_code == 201, created.text
    job = api.wait(created.json()["id"])
    assert job["status"] == "succeeded", job
    return job


def job_ids() -> set[str]:
    return {str(job_id) for job_id in Job.objects.values_list("id", flat=True)}


def refused_before_anything(response, ledger, jobs_before: set[str], status: int, code: str):
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == code
    assert job_ids() == jobs_before  # no row for a refused request
    # Nothing paid for it: every charge belongs to a job that existed before.
    assert {c["metadata"]["payonce_job"] for c in ledger.ledger()["charges"]} <= jobs_before


# --- read: references ----------------------------------------------------------------------------------


def test_a_reference_to_another_clients_output_is_422_and_nothing_of_it_is_read(alice, bob, ledger):
    alices = finished(alice, render("alice's private film"), "a-1")
    jobs = job_ids()

    response = bob.create(reference_body(alices["output"]["key"]), key="b-1")

    refused_before_anything(response, ledger, jobs, 422, "INVALID_REQUEST")
    fields = response.json()["error"]["fields"]
    assert fields == {"input": {"references": [{"output_key": ["Not the output of one of your succeeded jobs."]}]}}
    assert [c for c in ledger.calls() if c["kind"] == "upload"] == []  # alice's bytes went nowhere
    assert len(assert_books_balance(ledger)) == 1


@pytest.mark.parametrize("key", ["nope/nothing.mp4", "../../etc/passwd", "/etc/passwd", "outputs/../../x.mp4",
                                 "outputs/.output.mp4.payonce.json", "clients/{alice}/outputs/{job}/output.mp4"])
def test_a_reference_naming_no_succeeded_output_of_ones_own_is_422_at_submit(alice, bob, ledger, key):
    alices = finished(alice, render(), "a-1")
    key = key.format(alice=alice.client_id, job=alices["id"])
    jobs = job_ids()
    for api in (alice, bob):  # the owner herself cannot name a path outside her outputs either
        response = api.create(reference_body(key), key=f"ref-{uuid.uuid4()}")
        refused_before_anything(response, ledger, jobs, 422, "INVALID_REQUEST")
        assert "references" in response.json()["error"]["fields"]["input"]


def test_a_reference_to_ones_own_job_still_running_is_422(alice, ledger):
    running = alice.create(render(render_s=2), key="a-running")
    assert running.status_code == 201
    jobs = Job.objects.count()
    response = alice.create(reference_body(running.json()["output_key"]), key="a-ref")
    assert response.status_code == 422 and Job.objects.count() == jobs
    alice.wait(running.json()["id"])  # the test's own job ends before the test does


def test_a_reference_to_ones_own_succeeded_output_is_uploaded_for_the_new_job(alice, ledger):
    first = finished(alice, render("the first cut"), "a-1")
    with client_store(alice.client_id).open(first["output"]["key"]) as handle:
        original = handle.read()

    finished(alice, reference_body(first["output"]["key"]), "a-2")

    [upload] = [c for c in ledger.calls() if c["kind"] == "upload"]
    sent = requests.get(f"{ledger.url}/v1/inputs/inp_000001/content", timeout=5).content
    assert sent == original and upload["kind"] == "upload"
    assert len(assert_books_balance(ledger)) == 2


def test_a_reference_that_cannot_be_read_at_send_time_ends_the_job_at_once_as_invalid_input(alice, ledger):
    first = finished(alice, render("the first cut"), "a-1")
    store = client_store(alice.client_id)
    # The object vanishes from the store after it was checked (an operator's cleanup, a lifecycle rule).
    root = get_store().root
    (root / store.prefix / first["output"]["key"]).unlink()

    created = alice.create(reference_body(first["output"]["key"]), key="a-2")
    assert created.status_code == 201
    job = alice.wait(created.json()["id"], timeout=10)

    assert job["status"] == "failed" and job["error"]["code"] == "INVALID_INPUT", job
    [attempt] = job["attempts"]
    assert (attempt["state"], attempt["error_class"]) == ("failed", "invalid_input")
    assert len(assert_books_balance(ledger)) == 1  # only the first job's render
    assert [c for c in ledger.calls() if c["kind"] in ("upload", "submit") and c.get("request_id") ==
            attempt["upstream_key"]] == []


# --- write: output keys ----------------------------------------------------------------------------------


def test_bob_writing_to_alices_explicit_and_default_keys_touches_nothing_of_hers(alice, bob, ledger):
    explicit = alice.create(render("alice, explicit key", render_s=1, output_key="films/launch.mp4"), key="a-1")
    default = alice.create(render("alice, default key", render_s=1), key="a-2")
    assert (explicit.status_code, default.status_code) == (201, 201)
    alices_default_key = default.json()["output_key"]

    # Bob names the very keys alice's running jobs render into: his own namespace, his own objects.
    b1 = bob.create(render("bob, same explicit key", output_key="films/launch.mp4"), key="b-1")
    b2 = bob.create(render("bob, alice's default key", output_key=alices_default_key), key="b-2")
    assert (b1.status_code, b2.status_code) == (201, 201), (b1.text, b2.text)

    jobs = [alice.wait(explicit.json()["id"]), alice.wait(default.json()["id"]),
            bob.wait(b1.json()["id"]), bob.wait(b2.json()["id"])]
    assert [job["status"] for job in jobs] == ["succeeded"] * 4, jobs
    for api, job in ((alice, jobs[0]), (alice, jobs[1]), (bob, jobs[2]), (bob, jobs[3])):
        stored = client_store(api.client_id).head(job["output_key"])
        assert stored.written_by == job["id"] == job["output"]["written_by"]
        got = api.get(f"/v1/jobs/{job['id']}/output")
        assert got.status_code == 200 and got.content
    assert len(assert_books_balance(ledger)) == 4  # one charge each


def test_bob_squatting_a_key_before_alice_uses_it_does_not_block_her(alice, bob, ledger):
    squat = finished(bob, render("bob squats", output_key="campaign/final.mp4"), "b-1")
    hers = finished(alice, render("alice's final", output_key="campaign/final.mp4"), "a-1")
    assert hers["output"]["written_by"] == hers["id"] != squat["id"]
    assert "conflict" not in str(hers).lower()
    assert len(assert_books_balance(ledger)) == 2


def test_a_second_job_of_the_same_client_on_a_held_key_is_409_before_anything_is_paid(alice, bob, ledger):
    first = alice.create(render(render_s=1, output_key="films/one.mp4"), key="a-1")
    assert first.status_code == 201
    jobs = job_ids()

    second = alice.create(render("another film, same key", output_key="films/one.mp4"), key="a-2")

    refused_before_anything(second, ledger, jobs, 409, "OUTPUT_KEY_CONFLICT")
    error = second.json()["error"]
    assert error["job_id"] == first.json()["id"] and error["output_key"] == "films/one.mp4"
    # Bob on the same key: no conflict, and nothing in his answers names alice's job.
    bobs = bob.create(render("bob's", output_key="films/one.mp4"), key="b-1")
    assert bobs.status_code == 201 and first.json()["id"] not in bobs.text
    for job_id in (first.json()["id"], bobs.json()["id"]):
        assert Job.objects.get(id=job_id) is not None
    alice.wait(first.json()["id"])
    bob.wait(bobs.json()["id"])
    assert len(assert_books_balance(ledger)) == 2


def test_the_default_key_of_another_job_of_ones_own_is_409(alice, ledger):
    first = finished(alice, render(), "a-1")
    second = alice.create(render("again", output_key=first["output_key"]), key="a-2")
    assert second.status_code == 409 and second.json()["error"]["code"] == "OUTPUT_KEY_CONFLICT"
    assert second.json()["error"]["job_id"] == first["id"]


# --- reading jobs: 401 and 404, outputs included ------------------------------------------------------------


def test_another_clients_job_and_its_output_are_404_and_no_key_is_401(alice, bob, ledger, web_stack):
    alices = finished(alice, render(), "a-1")
    for method, path in (("get", f"/v1/jobs/{alices['id']}"), ("get", f"/v1/jobs/{alices['id']}/output"),
                         ("post", f"/v1/jobs/{alices['id']}/cancel"), ("post", f"/v1/jobs/{alices['id']}/retry")):
        answer = getattr(bob, method)(path)
        assert answer.status_code == 404, (path, answer.text)
        assert answer.json()["error"]["code"] == "NOT_FOUND"
        anonymous = getattr(requests, method)(f"{web_stack.url}{path}", timeout=5)
        assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "UNAUTHENTICATED"
    assert bob.get("/v1/jobs").json()["results"] == []
    assert alice.get(f"/v1/jobs/{alices['id']}/output").status_code == 200
    assert alice.job(alices["id"])["status"] == "succeeded"  # bob's cancel and retry changed nothing
