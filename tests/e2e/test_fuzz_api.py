"""schemathesis against the real `web` process's `/v1/schema`, with a real key: no 5xx, every answer as
the schema says (status code, content type, headers, body), and no request answered 4xx wrote a row or
can have reached a provider.

How "a 4xx wrote nothing" is decided: while schemathesis sends its requests, one at a time, only `web`
runs; no worker, beat or webhooks process takes the stack's broker, and the web process acts only on
requests. So whatever changes between just before a request and just after its answer is that request's
doing. tests/fuzz/hooks.py takes a snapshot before and after every request, from outside the web
process: every table of the test database (row count and a digest of the rows with their `xmin`, so an
update shows even when it writes the same values), every list in the stack's Redis broker database (the
`jobs` and `webhooks` Celery queues, where a message for a worker would wait) and the sandbox provider's
call log. Its `rejected_request_wrote_nothing` check fails a 4xx case whose snapshot changed, or after
which something changed before the next request. Every table rather than a list of the apps' models: a
table added later is watched without anyone remembering to add it.

Then a `worker` starts and runs what the 2xx answers queued, and the books must hold: every charge on
the sandbox's ledger belongs to a job that an answer of 201 created, and tests/support/books.py's rules.
The fuzzer cancels most of the jobs it creates (its stateful and fuzzing phases reuse the ids it got), so
before the worker starts the test adds a media job and an order of its own through the same API, behind
whatever the fuzzing left queued: they must succeed, which shows the worker drained that queue, and their
charges make the books' check one that has something to check.

FUZZ_SEED (printed) and FUZZ_MAX_EXAMPLES (per operation) choose the run, FUZZ_SCHEMATHESIS_ARGS adds
arguments to schemathesis (`--checks all`, say); `make fuzz-api` runs this test with more examples. The
seed is fixed by default, so that `make test` makes the same requests on every change.
"""

import json
import os
import shlex
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from jobs.models import Job, JobStatus
from jobs.services import client_create
from tests.conftest import WEB_STACK_ENV, purge_queue
from tests.support.books import assert_books_balance
from tests.support.http_api import HttpApi
from tests.support.procs import REPO_ROOT, ProcfileProcess, free_port, process_env

pytestmark = [pytest.mark.e2e, pytest.mark.fuzz, pytest.mark.django_db(transaction=True)]

SEED = int(os.environ.get("FUZZ_SEED", "20260101"))
# 100 per operation: about 2,200 requests, 50 s of the test's 60 s on a loaded 2-core machine.
MAX_EXAMPLES = int(os.environ.get("FUZZ_MAX_EXAMPLES", "100"))
EXTRA_ARGS = shlex.split(os.environ.get("FUZZ_SCHEMATHESIS_ARGS", ""))
CONFIG = REPO_ROOT / "tests" / "fuzz" / "schemathesis.toml"


def run_schemathesis(base_url: str, api_key: str, answers: Path) -> subprocess.CompletedProcess:
    """The schemathesis CLI with tests/fuzz/schemathesis.toml and its hooks, against the stack's web."""
    stack = process_env()
    env = process_env(FUZZ_WATCH_DATABASE_URL=stack["DATABASE_URL"], FUZZ_WATCH_SANDBOX_URL=stack["SANDBOX_URL"],
                      FUZZ_WATCH_BROKER_URL=WEB_STACK_ENV["BROKER_URL"], FUZZ_ANSWERS_PATH=answers)
    command = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(CONFIG), "--no-color", "run",
               f"{base_url}/v1/schema", "--header", f"Authorization: Bearer {api_key}",
               "--seed", str(SEED), "--max-examples", str(MAX_EXAMPLES), *EXTRA_ARGS]
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1800)


def wait_until_no_job_is_queued_or_running(timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        still = list(Job.objects.filter(status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).values_list("id", "status"))
        if not still:
            return
        assert time.monotonic() < deadline, f"still queued or running after {timeout}s: {still}"
        time.sleep(0.2)


def post_json(api: HttpApi, path: str, body: dict, **headers):
    return api.http.post(f"{api.base_url}{path}", data=json.dumps(body), timeout=10,
                         headers=api.headers(**{"Content-Type": "application/json", **headers}))


@pytest.fixture
def fuzz_web(transactional_db, sandbox):
    """A `web` process like the session's, whose event streams of open jobs close after 1 s instead of 8:
    with no worker up no fuzzed job ends, and schemathesis reads each stream it opens to its end."""
    web = ProcfileProcess("web", {**WEB_STACK_ENV, "PORT": free_port(), "SSE_MAX_S": 1}).start()
    yield web
    web.stop()


def test_fuzzed_requests_conform_to_the_schema_and_rejected_ones_write_and_pay_nothing(fuzz_web, ledger, tmp_path):
    web_stack = fuzz_web
    # Given: nothing left in the stack's queues by an earlier test, and a real client.
    for queue in ("jobs", "webhooks"):
        purge_queue(WEB_STACK_ENV["BROKER_URL"], queue)
    credentials = client_create(name="fuzz")
    answers_path = tmp_path / "answers.jsonl"

    # When: schemathesis runs every operation of the schema, with only `web` up.
    started = time.monotonic()
    run = run_schemathesis(web_stack.url, credentials["api_key"], answers_path)
    fuzz_s = time.monotonic() - started
    answers = [json.loads(line) for line in answers_path.read_text().splitlines()] if answers_path.exists() else []
    statuses = Counter(answer["status"] for answer in answers)
    print(f"schemathesis, seed {SEED}, {MAX_EXAMPLES} examples per operation: {len(answers)} requests in "
          f"{fuzz_s:.1f}s; statuses {dict(sorted(statuses.items()))}; by phase "
          f"{dict(Counter(answer['phase'] for answer in answers))}")
    if run.returncode == 0:  # on a failure the assertion below shows it all
        print(run.stdout[-3000:])

    # Then: no check failed (conformance, and the 4xx rule), and the run reached both answers.
    assert run.returncode == 0, f"schemathesis failed (seed {SEED}):\n{run.stdout[-30000:]}\n{run.stderr[-4000:]}"
    assert len(answers) >= 10 * MAX_EXAMPLES, "too few requests for the run to mean anything"
    assert sum(n for status, n in statuses.items() if 400 <= status < 500) > 0
    created = {a["job_id"] for a in answers if a["status"] == 201 and a["job_id"]}
    assert created, "no request created a job: the schema's examples no longer reach a real job"
    # Every operation was reached with its own headers, the event stream and orders included: a header the
    # schema does not declare is one schemathesis never sends.
    sent = {(a["operation"], header) for a in answers for header in a["headers"]}
    assert {("POST /v1/jobs", "idempotency-key"), ("GET /v1/jobs/{job_id}/events", "last-event-id"),
            ("GET /v1/jobs/{job_id}/events", "accept"), ("GET /v1/jobs/{job_id}/report", "accept")} <= sent
    reached = {a["operation"] for a in answers if 200 <= a["status"] < 300}
    assert {"POST /v1/orders", "GET /v1/spend", "GET /v1/jobs/{job_id}/events"} <= reached, reached
    named = {a["job_id"] for a in answers if 200 <= a["status"] < 300 and a["job_id"]}
    assert {str(job_id) for job_id in Job.objects.values_list("id", flat=True)} <= named

    # When: the test's own two jobs join the queue, and a worker runs it all.
    api, ours = HttpApi(web_stack.url, credentials), f"after-the-fuzzing-{uuid.uuid4()}"  # no fuzzed key is ours
    media = post_json(api, "/v1/jobs", {"kind": "media", "models": ["sandbox/video-keyed"],
                                        "input": {"prompt": "after the fuzzing", "render_s": 0}},
                      **{"Idempotency-Key": ours})
    order = post_json(api, "/v1/orders", {"payment_id": ours, "run_id": ours, "product": "after-the-fuzzing",
                                          "email": "buyer@example.com",
                                          "input": {"subject": {"name": "Ada"}, "chapters": ["sun"]}})
    assert (media.status_code, order.status_code) == (201, 201), (media.text, order.text)
    controls = {media.json()["id"], order.json()["job_id"]}
    created |= controls
    worker = ProcfileProcess("worker", {**WEB_STACK_ENV, "PROVIDER_CALLBACK_BASE_URL": web_stack.url}).start()
    try:
        wait_until_no_job_is_queued_or_running(timeout=60)
    finally:
        worker.stop()

    # Then: the queue was drained, and every charge belongs to a job an answer of 201 created.
    print(f"jobs after the worker: {dict(Counter((job.kind, job.status) for job in Job.objects.all()))}")
    assert set(Job.objects.filter(id__in=controls).values_list("status", flat=True)) == {JobStatus.SUCCEEDED}
    charges = assert_books_balance(ledger)
    paid_for = {charge["metadata"]["payonce_job"] for charge in charges}
    assert controls <= paid_for
    assert paid_for <= created, f"charges for jobs no answer of 201 created: {paid_for - created}"

    # Then: every job the run left, of every kind and ending (the order's report among them), answers
    # each read of its own without a 5xx and only with a status its operation declares.
    document = api.http.get(f"{web_stack.url}/v1/schema", headers={"Accept": "application/vnd.oai.openapi+json"},
                            timeout=30).json()
    kinds = set()
    for job in Job.objects.filter(client_id=credentials["client_id"]):
        kinds.add((job.kind, job.status))
        for suffix, accept in (("", "application/json"), ("/output", "*/*"), ("/report", "application/json"),
                               ("/report", "text/markdown"), ("/events", "text/event-stream")):
            answer = api.http.get(f"{web_stack.url}/v1/jobs/{job.id}{suffix}", headers=api.headers(Accept=accept),
                                  timeout=30, allow_redirects=False, stream=True)
            answer.close()  # an event stream of an open job would last SSE_MAX_S: its status is enough
            declared = document["paths"][f"/v1/jobs/{{job_id}}{suffix}"]["get"]["responses"]
            assert answer.status_code < 500 and str(answer.status_code) in declared, (job.kind, job.status, suffix,
                                                                                      answer.status_code)
    assert {("media", JobStatus.SUCCEEDED), ("report", JobStatus.SUCCEEDED)} <= kinds, kinds
