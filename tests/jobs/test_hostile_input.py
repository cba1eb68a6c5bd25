"""Hostile and careless input against the real `web` process: every bad input is a clear 4xx with the JSON
error body, before any row is written or anything is paid; no request can fill memory or disk."""

import base64
import json
import os
import re
import subprocess
import sys
import time
import uuid
from datetime import timedelta

import pytest
import requests
from django.utils import timezone

from executor.store import KEY_MAX_CHARS, PART_MAX_CHARS, client_store, get_store
from jobs.models import Job
from jobs.services import client_create
from tests.support.books import assert_books_balance
from tests.support.engine import EngineHttpApi
from tests.support.http_api import raw_exchange
from tests.support.procs import REPO_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

JOB_LIMIT = 256 * 1024  # JOB_BODY_MAX_BYTES's default, which the web process runs with
OTHER_LIMIT = 64 * 1024  # REQUEST_BODY_MAX_BYTES's default


def render(prompt: str = "a lighthouse at dusk", render_s: float = 0, **fields) -> dict:
    return {"kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": prompt, "render_s": render_s},
            **fields}


@pytest.fixture
def alice(web_stack, engine):
    """A client of the real web process; the jobs it waits for run on the in-process engine."""
    return EngineHttpApi(web_stack.url, client_create(name="alice"), engine)


def job_ids() -> set[str]:
    return {str(job_id) for job_id in Job.objects.values_list("id", flat=True)}


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    return error


def assert_nothing_written_or_paid(ledger, jobs_before: set[str]) -> None:
    assert job_ids() == jobs_before
    assert {c["metadata"]["payonce_job"] for c in ledger.ledger()["charges"]} <= jobs_before


def files_under(path) -> list[str]:
    return [os.path.join(d, f) for d, _, names in os.walk(path) for f in names]


# --- bodies: refused before they are read, cut at the limit, dropped when they stall ------------------------


def head(method: str, path: str, *lines: str) -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(f"{line}\r\n" for line in lines)
            + "\r\n").encode()


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/whoami", "/v1/no-such-path", "/admin/login/"])
def test_a_declared_length_over_the_limit_is_413_before_the_body_is_read(web_stack, ledger, path):
    # 1 GiB declared, no Authorization: the answer comes at once, with none of the body sent.
    status, headers, body, first_byte, closed = raw_exchange(
        web_stack.port, head("POST", path, "Content-Type: application/json", "Content-Length: 1073741824"))
    assert status == 413, body
    assert json.loads(body)["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert first_byte < 2.0 and closed  # no waiting for the body; the connection is dropped
    assert files_under(web_stack.tmpdir) == []
    assert job_ids() == set()


def test_a_64_mib_body_to_a_small_endpoint_is_refused_before_the_body_arrives(web_stack, ledger):
    status, _, body, first_byte, _ = raw_exchange(
        web_stack.port, head("POST", "/v1/whoami", f"Content-Length: {64 * 1024 * 1024}"),
        body_parts=[b"x" * 65536] * 1024)
    assert status == 413 and first_byte < 2.0
    assert json.loads(body)["error"]["limit_bytes"] == OTHER_LIMIT


def test_a_chunked_body_that_streams_past_the_limit_is_cut_at_the_limit(web_stack, alice, ledger):
    chunk = b"x" * 16384
    parts = [b"%x\r\n%s\r\n" % (len(chunk), chunk)] * 200  # 3.2 MB if it were all read
    status, _, body, _, closed = raw_exchange(
        web_stack.port,
        head("POST", "/v1/jobs", f"Authorization: Bearer {alice.api_key}", "Idempotency-Key: chunked",
             "Content-Type: application/json", "Transfer-Encoding: chunked"),
        body_parts=parts, pause_s=0.002)
    assert status == 413 and json.loads(body)["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert closed
    assert files_under(web_stack.tmpdir) == []
    assert_nothing_written_or_paid(ledger, set())


def test_a_body_that_stops_arriving_is_dropped_after_a_short_timeout(web_stack, alice, ledger):
    # 1,000 bytes declared, 10 sent: the web process runs with REQUEST_BODY_TIMEOUT_S=1.
    started = time.monotonic()
    status, _, body, _, closed = raw_exchange(
        web_stack.port,
        head("POST", "/v1/jobs", f"Authorization: Bearer {alice.api_key}", "Idempotency-Key: stalled",
             "Content-Type: application/json", "Content-Length: 1000") + b'{"kind": ',
        read_timeout=10)
    assert status == 408 and json.loads(body)["error"]["code"] == "REQUEST_TIMEOUT"
    assert time.monotonic() - started < 5 and closed
    assert_nothing_written_or_paid(ledger, set())


def test_a_body_just_under_the_limit_is_read_and_judged_on_its_content(alice, ledger):
    padding = "x" * (JOB_LIMIT - 200)
    response = alice.create({"kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": padding}})
    assert_error(response, 422, "INVALID_REQUEST")  # read and validated (the prompt is too long), not a 413
    assert "prompt" in response.json()["error"]["fields"]["input"]


# --- cursors, limits and pages --------------------------------------------------------------------------


def b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


CRAFTED_CURSORS = {
    "drf position 2026": "cD0yMDI2",
    "drf impossible date": b64("p=2026-13-45"),
    "drf x": b64("p=x"),
    "drf NUL": b64("p=\x00"),
    "drf SQL": b64("p=2026'; DROP TABLE jobs_job; --"),
    "impossible date": b64(json.dumps({"t": "2026-13-45", "i": str(uuid.uuid4()), "d": "next"})),
    "naive time": b64(json.dumps({"t": "2026-01-01T00:00:00", "i": str(uuid.uuid4()), "d": "next"})),
    "not a uuid": b64(json.dumps({"t": "2026-01-01T00:00:00+00:00", "i": "x' OR 1=1", "d": "next"})),
    "wrong direction": b64(json.dumps({"t": "2026-01-01T00:00:00+00:00", "i": str(uuid.uuid4()), "d": "up"})),
    "a list": b64("[1, 2]"),
    "not base64": "%%%%",
    "NUL": "\x00",
    "huge": "A" * 5000,
}


@pytest.mark.parametrize("cursor", list(CRAFTED_CURSORS.values()), ids=list(CRAFTED_CURSORS))
def test_a_crafted_cursor_is_422_with_the_json_error_body(alice, cursor):
    error = assert_error(alice.get("/v1/jobs", cursor=cursor), 422, "INVALID_REQUEST")
    assert "cursor" in error["fields"]


@pytest.mark.parametrize("limit", ["abc", "-1", "0", "201", "1.5", "", "٣"])
def test_a_limit_that_is_not_a_whole_number_from_1_to_200_is_422(alice, limit):
    error = assert_error(alice.get("/v1/jobs", limit=limit), 422, "INVALID_REQUEST")
    assert "limit" in error["fields"]


def test_pages_stop_at_about_a_megabyte_and_still_list_every_job_once(alice, ledger):
    # Ten jobs of 240 kB each (written as rows: the page bound is what is tested, not the renders).
    now = timezone.now()
    made = []
    for n in range(10):
        job = Job.objects.create(
            client_id=alice.client_id, idempotency_key=f"big-{n}", request_hash="0" * 64, kind="media",
            status="succeeded", model_chain=["sandbox/video-keyed"], input={"prompt": "x" * 240_000},
            policy={}, output_key=f"big/{n}.mp4", metadata={"n": n}, created_at=now - timedelta(seconds=n))
        made.append(str(job.id))
    seen, pages, url = [], 0, f"{alice.base_url}/v1/jobs?limit=200"
    while url:
        response = alice.http.get(url, headers=alice.headers(), timeout=10)
        assert response.status_code == 200
        assert len(response.content) <= 1024 * 1024 + 250_000  # one job past the bound at most
        page = response.json()
        seen += [job["id"] for job in page["results"]]
        pages += 1
        url = page["next"]
    assert seen == made and pages >= 3
    # And back again with `previous`: the jobs just before the last page, newest first.
    back = alice.http.get(page["previous"], headers=alice.headers(), timeout=10).json()
    start = len(made) - len(page["results"])
    assert back["results"] and [job["id"] for job in back["results"]] == made[start - len(back["results"]):start]
    assert back["next"]


def test_metadata_over_16_kib_is_422(alice, ledger):
    error = assert_error(alice.create(render(metadata={"blob": "x" * 17000})), 422, "INVALID_REQUEST")
    assert "metadata" in error["fields"]
    fits = alice.create(render(metadata={"blob": "x" * 16000}), key="fits")
    assert fits.status_code == 201
    alice.wait(fits.json()["id"])


# --- output keys: what every store can hold, and store errors are outcomes ----------------------------------


@pytest.mark.parametrize("key", [
    "renders/" + "a" * (PART_MAX_CHARS + 42),  # a 242-character part: its metadata file name is too long
    "/".join(["a" * 100] * 10),  # 1,009 characters
    "renders/film.mp4/", "renders/ film.mp4", "renders//film.mp4", "renders/é.mp4", "renders/../x.mp4",
])
def test_an_output_key_no_store_can_hold_is_422_at_submit(alice, ledger, key):
    error = assert_error(alice.create(render(output_key=key)), 422, "INVALID_REQUEST")
    assert "output_key" in error["fields"]
    assert_nothing_written_or_paid(ledger, set())


def test_the_longest_key_allowed_is_written_and_read_back(alice, ledger):
    key = "/".join(["k" * PART_MAX_CHARS] * 4) + "/" + "e" * (KEY_MAX_CHARS - 4 * (PART_MAX_CHARS + 1) - 4) + ".mp4"
    assert len(key) == KEY_MAX_CHARS
    created = alice.create(render(output_key=key))
    assert created.status_code == 201, created.text
    job = alice.wait(created.json()["id"])
    assert job["status"] == "succeeded", job
    assert alice.get(f"/v1/jobs/{job['id']}/output").status_code == 200
    assert len(assert_books_balance(ledger)) == 1


def test_a_store_error_after_paying_ends_the_job_upload_failed_never_running(alice, ledger, tmp_path, settings):
    # The output's directory is a link to a volume that is not mounted: reading finds nothing (so the
    # render is paid for), and every write fails (EEXIST) until the job gives up after
    # STORE_RETRY_WINDOW_S (2 s, as in the web stack's worker).
    settings.STORE_RETRY_WINDOW_S = 2
    blocker = get_store().root / client_store(alice.client_id).prefix / "blocked"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.symlink_to(tmp_path / "unmounted-volume")
    created = alice.create(render(output_key="blocked/film.mp4"))
    assert created.status_code == 201
    job = alice.wait(created.json()["id"], timeout=30)
    assert job["status"] == "failed" and job["error"]["code"] == "UPLOAD_FAILED", job
    assert [a["state"] for a in job["attempts"]] == ["succeeded"]  # it was paid, and the record says so
    assert len(assert_books_balance(ledger)) == 1


# --- headers and bodies that must be refused ---------------------------------------------------------------


def test_two_idempotency_key_headers_are_400_and_make_no_job(web_stack, alice, ledger):
    body = json.dumps(render()).encode()
    status, _, answer, _, _ = raw_exchange(web_stack.port, head(
        "POST", "/v1/jobs", f"Authorization: Bearer {alice.api_key}", "Idempotency-Key: K", "Idempotency-Key: K",
        "Content-Type: application/json", f"Content-Length: {len(body)}") + body)
    assert status == 400 and json.loads(answer)["error"]["code"] == "IDEMPOTENCY_KEY_INVALID"
    assert_nothing_written_or_paid(ledger, set())
    # One header with a comma in it is one valid key.
    single = alice.create(render(), key="K,K")
    assert single.status_code == 201
    alice.wait(single.json()["id"])


def test_equal_numbers_are_the_same_request(alice, ledger):
    first = alice.http.post(f"{alice.base_url}/v1/jobs", timeout=10, data=json.dumps(render(render_s=2)),
                            headers=alice.headers(**{"Idempotency-Key": "n", "Content-Type": "application/json"}))
    again = alice.http.post(f"{alice.base_url}/v1/jobs", timeout=10,
                            data=json.dumps(render(render_s=2)).replace('"render_s": 2', '"render_s": 2.0'),
                            headers=alice.headers(**{"Idempotency-Key": "n", "Content-Type": "application/json"}))
    assert '"render_s": 2.0' in again.request.body
    assert (first.status_code, again.status_code) == (201, 202)
    assert again.json()["id"] == first.json()["id"]
    alice.wait(first.json()["id"])
    assert len(assert_books_balance(ledger)) == 1


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/json; charset=latin-1",
                                          "application/json; charset=utf-16"])
def test_a_body_not_declared_as_utf8_json_is_415(web_stack, alice, ledger, content_type):
    headers = alice.headers(**{"Idempotency-Key": "ct"})
    if content_type:
        headers["Content-Type"] = content_type
    response = requests.post(f"{web_stack.url}/v1/jobs", data=json.dumps(render()).encode(), headers=headers,
                             timeout=10)
    assert_error(response, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert_nothing_written_or_paid(ledger, set())


def test_utf8_json_with_its_charset_spelled_out_is_accepted(alice, ledger):
    created = alice.create(render(), **{"Content-Type": "application/json; charset=UTF-8"})
    assert created.status_code == 201
    alice.wait(created.json()["id"])


def test_a_refused_webhook_url_never_says_what_its_host_resolves_to(alice, ledger):
    error = assert_error(alice.create(render(webhook_url="http://localhost:9/hooks")), 422, "INVALID_REQUEST")
    words = " ".join(error["fields"]["webhook_url"])
    assert "resolves to a private or reserved address" in words
    assert not re.search(r"127\.0\.0\.1|::1|\d+\.\d+\.\d+\.\d+", words), words
    assert_nothing_written_or_paid(ledger, set())


# --- a cancelled job's attempt ends too ---------------------------------------------------------------------


def test_cancelling_a_rendering_job_ends_its_attempt_with_its_class_and_duration(alice, ledger, engine):
    created = alice.create(render(render_s=30))
    job_id = created.json()["id"]
    engine.start(Job.objects.get(id=job_id))
    engine.run(lambda: [a["state"] for a in alice.job(job_id)["attempts"]] == ["running"])
    cancelled = alice.post(f"/v1/jobs/{job_id}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"

    # The web process's stop went to its own broker: the chain's next look, whenever it comes, finds the
    # job cancelled and stops the render (its pause is not waited for).
    engine.run_job(job_id, pauses=False)
    job = alice.job(job_id)
    assert job["status"] == "cancelled" and job["attempts"][0]["state"] != "running", job
    [attempt] = job["attempts"]
    assert (attempt["state"], attempt["error_class"]) == ("failed", "cancelled")
    assert attempt["duration_ms"] is not None and attempt["cost_usd"] == "0.400000"
    assert len(assert_books_balance(ledger)) == 1
    upstream = [c for c in ledger.calls() if c["kind"] == "cancel"]
    assert len(upstream) >= 1  # stopped upstream too


# --- the schema says what the API does ------------------------------------------------------------------


def test_the_schema_describes_pages_errors_outputs_and_the_key(web_stack):
    document = requests.get(f"{web_stack.url}/v1/schema", headers={"Accept": "application/vnd.oai.openapi+json"},
                            timeout=10).json()
    paths = document["paths"]
    listed = paths["/v1/jobs"]["get"]
    page_ref = listed["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert set(document["components"]["schemas"][page_ref]["properties"]) == {"next", "previous", "results"}
    limit = next(p for p in listed["parameters"] if p["name"] == "limit")["schema"]
    assert (limit["type"], limit["minimum"], limit["maximum"]) == ("integer", 1, 200)
    key = next(p for p in paths["/v1/jobs"]["post"]["parameters"] if p["name"] == "Idempotency-Key")
    assert key["required"] and (key["schema"]["minLength"], key["schema"]["maxLength"]) == (1, 255)
    assert {"400", "401", "409", "413", "415", "422"} <= set(paths["/v1/jobs"]["post"]["responses"])
    for path in ("/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel", "/v1/jobs/{job_id}/retry", "/v1/jobs/{job_id}/output"):
        for operation in paths[path].values():
            assert {"401", "404"} <= set(operation["responses"]), path
    output = paths["/v1/jobs/{job_id}/output"]["get"]["responses"]["200"]["content"]
    assert {"video/mp4", "image/png"} <= set(output)
    create = document["components"]["schemas"]["JobCreateRequest"]
    assert set(create["required"]) == {"kind", "models", "input"}


# --- the quick start ------------------------------------------------------------------------------------


def test_links_follow_port_when_public_base_url_is_unset():
    env = {k: v for k, v in os.environ.items() if k != "PUBLIC_BASE_URL"}
    env.update(PORT="9123", DJANGO_SETTINGS_MODULE="config.settings")
    printed = subprocess.run([sys.executable, "-c", "from django.conf import settings; print(settings.PUBLIC_BASE_URL)"],
                             cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    assert printed.strip() == "http://127.0.0.1:9123"


def test_the_demo_curl_line_sent_twice_is_one_job_201_then_202(web_stack, ledger, tmp_path, engine):
    from tests.support.procs import process_env

    env = process_env(PUBLIC_BASE_URL=web_stack.url, PAYONCE_VAR_DIR=tmp_path, DJANGO_SETTINGS_MODULE="config.settings")
    printed = subprocess.run([sys.executable, "manage.py", "demo_client"], cwd=REPO_ROOT, env=env,
                             capture_output=True, text=True, timeout=60, check=True).stdout
    fixed = next(line.strip() for line in printed.splitlines() if "Idempotency-Key: demo-first-render" in line)
    answers = [subprocess.run(["bash", "-c", fixed], capture_output=True, text=True, timeout=30).stdout
               for _ in range(2)]
    assert [answer.strip().rsplit("\n", 1)[1] for answer in answers] == ["HTTP 201", "HTTP 202"]
    first, second = (json.loads(answer.strip().rsplit("\n", 1)[0]) for answer in answers)
    assert first["id"] == second["id"]
    fresh = next(line.strip() for line in printed.splitlines() if 'Idempotency-Key: demo-$(date +%s)' in line)
    assert subprocess.run(["bash", "-c", fresh], capture_output=True, text=True, timeout=30).stdout.strip().endswith("HTTP 201")
    demo = EngineHttpApi(web_stack.url, json.loads((tmp_path / "demo_client.json").read_text()), engine)
    for job in demo.get("/v1/jobs").json()["results"]:
        demo.wait(job["id"])
    assert len(assert_books_balance(ledger)) == 2  # two jobs, one render each
