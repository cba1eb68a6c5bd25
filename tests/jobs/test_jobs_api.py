"""POST/GET /v1/jobs against real PostgreSQL: every row of the table in docs/design.md,
"One key and one body are one job"; bad input; isolation."""

import json

import pytest

from jobs.models import Job
from tests.conftest import media_body

# --- docs/design.md, "One key and one body are one job": one test per row ------------------------------


def test_new_key_is_201_with_the_job(api, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        response = api.create(media_body(metadata={"order": 7}), key="render-1")
    assert response.status_code == 201, response.content
    job = response.json()
    assert job["status"] == "queued"
    assert job["run"] == 1
    assert job["kind"] == "media"
    assert job["idempotency_key"] == "render-1"
    assert job["models"] == ["sandbox/video-keyed"]
    assert job["input"] == {"prompt": "a lighthouse at dusk", "render_s": 1}
    assert job["metadata"] == {"order": 7}
    assert job["output"] is None and job["error"] is None and job["attempts"] == []
    assert job["cost"] == {"total_usd": "0.000000", "unpriced_attempts": 0}
    assert job["output_key"] == f"outputs/{job['id']}/output.mp4"
    assert Job.objects.filter(id=job["id"], client_id=api.client_id).count() == 1
    # the run is enqueued once, on commit (the job.created log line is written on commit too)
    assert [c.__qualname__ for c in callbacks if "log_event" not in c.__qualname__] == [
        "job_enqueue_on_commit.<locals>.<lambda>"]


def test_same_key_same_body_is_202_with_the_same_job(api, django_capture_on_commit_callbacks):
    first = api.create(media_body(), key="render-1")
    with django_capture_on_commit_callbacks() as callbacks:
        replay = api.create(media_body(), key="render-1")
    assert first.status_code == 201
    assert replay.status_code == 202, replay.content
    # The same job as GET shows it (which alone adds why an open job waits).
    assert replay.json() == {k: v for k, v in api.job(first.json()["id"]).items() if k != "waiting"}
    assert Job.objects.count() == 1
    assert callbacks == []  # no new work: a replay enqueues nothing


def test_same_key_different_body_is_409(api):
    first = api.create(media_body(), key="render-1")
    other = api.create(media_body(input={"prompt": "a different film"}), key="render-1")
    assert first.status_code == 201
    assert other.status_code == 409
    assert other.json()["error"]["code"] == "IDEMPOTENCY_CONFLICT"
    assert other.json()["error"]["job_id"] == first.json()["id"]
    assert Job.objects.count() == 1


def test_no_key_is_400(api):
    response = api.create(media_body(), key=None)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "IDEMPOTENCY_KEY_MISSING"
    assert Job.objects.count() == 0


def test_invalid_body_is_422_with_field_errors(api):
    response = api.create({"kind": "media", "models": [], "input": {"render_s": -1}}, key="k")
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "INVALID_REQUEST"
    assert set(error["fields"]) == {"models"}
    response = api.create({"kind": "media", "models": ["sandbox/video-keyed"], "input": {"render_s": -1}}, key="k")
    assert response.status_code == 422
    assert set(response.json()["error"]["fields"]["input"]) == {"prompt", "render_s"}
    assert Job.objects.count() == 0


@pytest.mark.parametrize("authorization", [None, "Bearer nope.nope", "Bearer ", "Token abc.def", "Bearer no-dot"])
def test_no_or_bad_api_key_is_401(api, authorization):
    headers = {"Idempotency-Key": "k"}
    if authorization is not None:
        headers["Authorization"] = authorization
    response = api.http.post("/v1/jobs", data=json.dumps(media_body()), content_type="application/json", headers=headers)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "UNAUTHENTICATED"
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert Job.objects.count() == 0


def test_revoked_key_is_401(api):
    from accounts.models import ClientAPIKey

    ClientAPIKey.objects.filter(client_id=api.client_id).update(revoked=True)
    assert api.create(media_body()).status_code == 401


def test_body_over_the_limit_is_413(api, settings):
    body = media_body(metadata={"padding": "x" * settings.JOB_BODY_MAX_BYTES})
    response = api.create(body)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert Job.objects.count() == 0


# --- more of section 1 -------------------------------------------------------------------------------


def test_same_body_with_other_key_order_and_whitespace_is_a_replay(api):
    first = api.create(media_body(metadata={"a": 1, "b": [1, 2]}), key="k")
    raw = json.dumps(
        {"metadata": {"b": [1, 2], "a": 1}, "input": {"render_s": 1, "prompt": "a lighthouse at dusk"},
         "models": ["sandbox/video-keyed"], "kind": "media"},
        indent=4,
    )
    replay = api.create(None, key="k", raw=raw)
    assert (first.status_code, replay.status_code) == (201, 202)
    assert replay.json()["id"] == first.json()["id"]


def test_explicit_default_policy_is_the_same_request(api):
    first = api.create(media_body(), key="k")
    replay = api.create(media_body(policy={"attempts_per_model": 3, "fallback_on": ["unavailable", "exhausted"]}), key="k")
    assert (first.status_code, replay.status_code) == (201, 202)


def test_keys_are_per_client(make_api):
    acme, globex = make_api("acme"), make_api("globex")
    a = acme.create(media_body(), key="shared-key")
    b = globex.create(media_body(input={"prompt": "something else"}), key="shared-key")
    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["id"] != b.json()["id"]


def test_replay_of_an_ended_job_wakes_nothing(api, django_capture_on_commit_callbacks):
    job_id = api.create(media_body(), key="k").json()["id"]
    Job.objects.filter(id=job_id).update(status="succeeded")
    with django_capture_on_commit_callbacks() as callbacks:
        replay = api.create(media_body(), key="k")
    assert replay.status_code == 202
    assert replay.json()["status"] == "succeeded"
    assert callbacks == []


# --- bad input: the documented 4xx, never a 500, and no row written ---------------------------------------

BAD_BODIES = [
    ("malformed JSON", b'{"kind": "media", "models": [', 422, "INVALID_REQUEST"),
    ("not an object", b"[1, 2, 3]", 422, "INVALID_REQUEST"),
    ("empty body", b"", 422, "INVALID_REQUEST"),
    ("invalid UTF-8", b'{"kind": "\xff"}', 422, "INVALID_REQUEST"),
    ("NaN", b'{"kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": "x", "render_s": NaN}}', 422, "INVALID_REQUEST"),
    ("huge number", b'{"kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": "x", "render_s": 1e999}}', 422, "INVALID_REQUEST"),
    ("NUL in a string", json.dumps(media_body(metadata={"a": "x\u0000y"})).encode(), 422, "INVALID_REQUEST"),
    ("deep nesting", ('{"kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": "x"}, "metadata": '
                      + '{"a": ' * 40 + "1" + "}" * 40 + "}").encode(), 422, "INVALID_REQUEST"),
    ("kind is a number", json.dumps(media_body(kind=1)).encode(), 422, "INVALID_REQUEST"),
    ("unknown kind", json.dumps(media_body(kind="podcast")).encode(), 422, "INVALID_REQUEST"),
    ("models is a string", json.dumps(media_body(models="sandbox/video-keyed")).encode(), 422, "INVALID_REQUEST"),
    ("unknown model", json.dumps(media_body(models=["sandbox/video-typo"])).encode(), 422, "INVALID_REQUEST"),
    ("text model for media", json.dumps(media_body(models=["sandbox/llm"])).encode(), 422, "INVALID_REQUEST"),
    ("model twice", json.dumps(media_body(models=["sandbox/video-keyed"] * 2)).encode(), 422, "INVALID_REQUEST"),
    ("prompt is a number", json.dumps(media_body(input={"prompt": 5})).encode(), 422, "INVALID_REQUEST"),
    ("render_s is a string", json.dumps(media_body(input={"prompt": "x", "render_s": "2"})).encode(), 422, "INVALID_REQUEST"),
    ("input is a list", json.dumps(media_body(input=["x"])).encode(), 422, "INVALID_REQUEST"),
    ("attempts is a bool", json.dumps(media_body(policy={"attempts_per_model": True})).encode(), 422, "INVALID_REQUEST"),
    ("unknown fallback", json.dumps(media_body(policy={"fallback_on": ["always"]})).encode(), 422, "INVALID_REQUEST"),
    ("unknown top-level field", json.dumps({**media_body(), "polcy": {}}).encode(), 422, "INVALID_REQUEST"),
    ("output key escapes", json.dumps(media_body(output_key="../../etc/passwd")).encode(), 422, "INVALID_REQUEST"),
    ("absolute output key", json.dumps(media_body(output_key="/tmp/x.mp4")).encode(), 422, "INVALID_REQUEST"),
    ("dot-file output key", json.dumps(media_body(output_key="renders/.x.payonce.json")).encode(), 422, "INVALID_REQUEST"),
    ("webhook not http", json.dumps(media_body(webhook_url="ftp://example.com/x")).encode(), 422, "INVALID_REQUEST"),
    ("metadata is a list", json.dumps(media_body(metadata=[1])).encode(), 422, "INVALID_REQUEST"),
]


@pytest.mark.parametrize("raw,status,code", [case[1:] for case in BAD_BODIES], ids=[case[0] for case in BAD_BODIES])
def test_bad_body_gets_its_code_and_writes_nothing(api, raw, status, code):
    response = api.create(None, raw=raw)
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == code
    assert response.json()["error"]["message"]
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    "key",
    ["k" * 256, "clé-non-ascii", "has space", "tab\tkey", "\u00e9"],
    ids=["over-long", "non-ascii", "space", "tab", "latin-1"],
)
def test_invalid_idempotency_key_is_400(api, key):
    # Django's test client sends header values as given; a real client sends latin-1 bytes, which the
    # server decodes to the same characters.
    response = api.create(media_body(), key=key)
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "IDEMPOTENCY_KEY_INVALID"
    assert Job.objects.count() == 0


def test_longest_valid_key_is_accepted(api):
    assert api.create(media_body(), key="~" * 255).status_code == 201


def test_non_json_content_type_is_415(api):
    response = api.create(None, raw="kind=media", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "UNSUPPORTED_MEDIA_TYPE"
    assert Job.objects.count() == 0


# --- reading jobs --------------------------------------------------------------------------------------


def test_another_clients_job_is_404(make_api):
    acme, globex = make_api("acme"), make_api("globex")
    job_id = acme.create(media_body()).json()["id"]
    response = globex.get(f"/v1/jobs/{job_id}")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "NOT_FOUND"
    assert globex.get("/v1/jobs").json()["results"] == []
    assert acme.get(f"/v1/jobs/{job_id}").status_code == 200


def test_unknown_and_malformed_job_ids_are_json_404(api):
    for path in ("/v1/jobs/00000000-0000-0000-0000-000000000000", "/v1/jobs/not-a-uuid", "/v1/nothing-here"):
        response = api.get(path)
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "NOT_FOUND"


def test_list_is_newest_first_cursor_paginated_and_filtered(api):
    ids = [api.create(media_body(metadata={"n": n}), key=f"k{n}").json()["id"] for n in range(5)]
    Job.objects.filter(id=ids[1]).update(status="failed")
    page = api.get("/v1/jobs", limit=2).json()
    assert [job["id"] for job in page["results"]] == ids[::-1][:2]
    seen = [job["id"] for job in page["results"]]
    while page["next"]:
        page = api.http.get(page["next"], headers=api.headers()).json()
        seen += [job["id"] for job in page["results"]]
    assert seen == ids[::-1]
    failed = api.get("/v1/jobs", status="failed").json()["results"]
    assert [job["id"] for job in failed] == [ids[1]]
    bad = api.get("/v1/jobs", status="exploded")
    assert bad.status_code == 422


# --- SQL statements per request (kept minimal; reported in bench/README.md) -----------------------------


def test_sql_statements_per_request(api, django_assert_num_queries):
    with django_assert_num_queries(2):  # the key with its client; INSERT ... ON CONFLICT + read back
        created = api.create(media_body(), key="k")
    with django_assert_num_queries(2):  # the same two: the INSERT does nothing and reads the row
        replay = api.create(media_body(), key="k")
    with django_assert_num_queries(2):  # the key; the job
        api.get(f"/v1/jobs/{created.json()['id']}")
    with django_assert_num_queries(1):
        api.get("/v1/whoami")
    assert (created.status_code, replay.status_code) == (201, 202)


# --- the schema and docs -------------------------------------------------------------------------------


def test_openapi_schema_and_docs_are_served(db, client):
    schema = client.get("/v1/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    document = json.loads(schema.content)
    assert document["openapi"].startswith("3.")
    assert {"/v1/jobs", "/v1/jobs/{job_id}"} <= set(document["paths"])
    assert {"201", "202", "400", "409", "413", "422"} <= set(document["paths"]["/v1/jobs"]["post"]["responses"])
    docs = client.get("/v1/docs")
    assert docs.status_code == 200
    assert b"swagger" in docs.content.lower()


def test_a_database_that_is_down_answers_503_with_retry_after_not_500(api, monkeypatch):
    # The storm restarts PostgreSQL under load: a request that meets the outage gets a 503 the client
    # retries (the same Idempotency-Key gives the same job), never an INTERNAL_ERROR.
    from django.db import OperationalError

    from jobs import services as job_services

    def down(**kwargs):
        raise OperationalError("terminating connection due to administrator command")

    monkeypatch.setattr(job_services, "job_create", down)
    response = api.create(media_body(), key="db-down")
    assert response.status_code == 503, response.content
    assert response.json()["error"]["code"] == "DATABASE_UNAVAILABLE"
    assert response["Retry-After"] == "1"
