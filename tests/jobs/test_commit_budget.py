"""The commit and statement budget of a job: where one statement joins the work of two modules to save a
commit (the attempt's intent inside billing's reservation, the provider's acceptance with the submit
step's done mark, a finished render's end with its settle and the wait step's done mark), the saving is a
rule, and this is its test. Whoever "simplifies" one of those statements into two learns why here.

Counted in this process, over the code the worker runs (the stages called as their tasks call them),
against the real database and the sandbox (or a provider's replayed answer) over HTTP: every statement Django sends (BEGIN and COMMIT
included), and every write commit (a transaction that wrote: an autocommit write, or a BEGIN ... COMMIT
with a write inside). bench/e2e_throughput.py measures the same figures over thousands of jobs.
"""

import re
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.models import Client, ClientAPIKey
from jobs import services
from jobs.api.serializers import JobCreateSerializer
from jobs.engine import outcomes, runner
from jobs.engine.steps import FirstStart
from jobs.models import JobStatus
from tests.conftest import HOOK_URL
from tests.support.openai_images import PATH as OPENAI_IMAGES_PATH
from tests.support.books import assert_books_balance
from tests.support.replay_server import ReplayServer

pytestmark = [pytest.mark.django_db(transaction=True)]

_LOCKING_READ = re.compile(r"\bFOR (NO KEY )?UPDATE\b|\bFOR (KEY )?SHARE\b")
_WRITE = re.compile(r"\b(INSERT|UPDATE|DELETE)\b")


def writes(sql: str) -> bool:
    """Whether a statement writes (an INSERT, UPDATE or DELETE anywhere in it, a CTE's included)."""
    return bool(_WRITE.search(_LOCKING_READ.sub("", sql)))


def write_commits(statements: list[str]) -> int:
    """How many transactions that wrote the statements commit: each autocommit write is one; a
    BEGIN ... COMMIT is one if anything inside it writes."""
    commits, in_block, block_wrote = 0, False, False
    for sql in statements:
        word = sql.strip().upper()
        if word == "BEGIN":
            in_block, block_wrote = True, False
        elif word == "COMMIT":
            commits += block_wrote
            in_block = False
        elif word == "ROLLBACK":
            in_block = False
        elif in_block:
            block_wrote = block_wrote or writes(sql)
        else:
            commits += writes(sql)
    return commits


def test_write_commits_counts_autocommit_writes_and_blocks_that_wrote():
    # The counter the budgets below rest on, on statements whose answer is known.
    assert write_commits(["SELECT 1", "INSERT INTO t VALUES (1)", "WITH w AS (UPDATE t SET a = 1 RETURNING 1) "
                          "SELECT 1", "SELECT * FROM t FOR UPDATE"]) == 2
    assert write_commits(["BEGIN", "SELECT 1", "UPDATE t SET a = 1", "DELETE FROM t", "COMMIT",
                          "BEGIN", "SELECT updated_at FROM t", "COMMIT", "BEGIN", "INSERT INTO t", "ROLLBACK"]) == 1


def media_job_statements(credentials: dict, key: str, *, models=("sandbox/video-keyed",),
                         input=None) -> list[str]:
    """What one media job costs from POST to its end: the API's two statements (the key with its client,
    the insert), then every stage as the worker runs it, inline until one would wait."""
    serializer = JobCreateSerializer(data={"kind": "media", "models": list(models),
                                           "input": input or {"prompt": "budget", "render_s": 0}})
    serializer.is_valid(raise_exception=True)
    prefix = credentials["api_key"].partition(".")[0]
    with CaptureQueriesContext(connection) as captured:
        client = ClientAPIKey.objects.get_usable_keys().select_related("client").get(prefix=prefix).client
        job, created = services.job_create(client=client, idempotency_key=key, data=dict(serializer.validated_data))
        assert created
        stages, index = ["prepare", "wait", "finish"], 0
        for _ in range(100):
            # The first stage as its doorbell runs it (jobs.engine.tasks): the job starts in its first
            # transaction, being the only choice there is (jobs.dispatch.job_start_first).
            first = FirstStart.ONLY_CHOICE if index == 0 else None
            outcome = runner.run_stage(job_id=job.id, run=1, stage=stages[index], owner="budget", start=first)
            if isinstance(outcome, (outcomes.Later, outcomes.Continue)):
                time.sleep(outcome.countdown)
                index += isinstance(outcome, outcomes.Continue)
                continue
            break
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error
    return [query["sql"] for query in captured.captured_queries]


def test_a_media_job_costs_six_write_commits_and_sixteen_statements(ledger):
    """The render is finished in the submit's answer (render_s 0), as on the benchmark:

    | # | statement | commit |
    | ---: | --- | :---: |
    | 1 | (web) the API key with its client | |
    | 2 | (web) the job's INSERT, reading an existing row in the same statement | 1 |
    | 3 | the job with its steps, and whether it has attempts | |
    | 4-8 | BEGIN; the job started under its client's start lock, being the only choice there is and having a slot (one call: jobs.dispatch.job_start_first); the output check's and mark_running's done marks (one INSERT); the submit step's lease; COMMIT | 2 |
    | 9 | the attempt's intent with its reservation (nothing is reserved for a cancelled job) | 3 |
    | 10 | the provider's acceptance and the submit step's done mark (one CTE) | 4 |
    | 11 | the attempt's end, its settle and the wait step's done mark (one CTE) | 5 |
    | 12-16 | BEGIN; the job's end; its outbox row; the store and finish steps' done marks (one INSERT); COMMIT | 6 |
    """
    credentials = services.client_create(name="budget", webhook_url=HOOK_URL)
    media_job_statements(credentials, "warm-up")  # the first job pays for caches (the rate card, the store)
    statements = media_job_statements(credentials, "counted")

    assert (write_commits(statements), len(statements)) == (6, 16), "\n".join(statements)
    assert len(assert_books_balance(ledger)) == 2  # one charge per job, each its attempt's


def test_an_image_answered_in_the_body_costs_six_write_commits_too(settings):
    """A synchronous provider answers the finished bytes (OpenAI's images, here a local server replaying its
    answer): the same six commits. The bytes stay on the attempt's row (the wait step's result names the
    row) until the store holds them, and leave it in the commit that marks the store step done: one
    statement more in a commit there is anyway (issue 37, finding 7: outputs live in the store), and
    one read of the row, where the bytes were once copied into the step's result instead.

    | # | statement | commit |
    | ---: | --- | :---: |
    | 1-11 | as a render finished at submit (above) | 1-5 |
    | 12 | the bytes, read from the attempt's row for the store | |
    | 13-18 | BEGIN; the attempt's bytes replaced by the stored key (only while it holds them); the job's end; its outbox row; the store and finish steps' done marks (one INSERT); COMMIT | 6 |
    """
    with ReplayServer() as openai:
        settings.REAL_PROVIDERS, settings.OPENAI_API_KEY = True, "sk-proj-test-key"
        settings.OPENAI_BASE_URL = openai.url + "/v1"
        openai.script("POST", OPENAI_IMAGES_PATH, "openai_images/images_generation", "openai_images/images_generation")
        credentials = services.client_create(name="budget", webhook_url=HOOK_URL)
        image = {"models": ["openai-images/gpt-image-1"], "input": {"prompt": "budget"}}
        media_job_statements(credentials, "warm-up", **image)
        statements = media_job_statements(credentials, "counted", **image)

    assert (write_commits(statements), len(statements)) == (6, 18), "\n".join(statements)
    assert len(openai.requests) == 2 and not openai.unexpected


def chapter_statements(credentials: dict, key: str) -> list[str]:
    """What the first chapter of a two-chapter report costs, as run_substep runs it after the stages
    before the fan-out (the synthesis, the pre-flight's pool): its sibling has not ended, so no join."""
    serializer = JobCreateSerializer(data={"kind": "report", "models": ["sandbox/llm"], "input": {
        "subject": {"name": "Ada"}, "chapters": ["sun", "moon"], "email": "ada@example.com"}})
    serializer.is_valid(raise_exception=True)
    client = Client.objects.get(id=credentials["client_id"])
    job, _ = services.job_create(client=client, idempotency_key=key, data=dict(serializer.validated_data))
    outcome = runner.run_stage(job_id=job.id, run=1, stage="prepare", owner="budget", start=FirstStart.ONLY_CHOICE)
    assert outcome == outcomes.FanOut("chapters", ["sun", "moon"]), outcome
    with CaptureQueriesContext(connection) as captured:
        outcome = runner.run_substep(job_id=job.id, run=1, stage="chapters", key="sun", owner="budget")
    assert outcome == outcomes.Stop("waiting for sibling sub-steps"), outcome
    return [query["sql"] for query in captured.captured_queries]


def test_a_report_chapter_costs_five_write_commits_and_fifteen_statements(ledger):
    """One chapter (jobs.kinds.report.recipe.write_chapter): one LLM call whose reservation is drawn from the fan-out's
    pool, the chapter kept, the step marked done:

    | # | statement | commit |
    | ---: | --- | :---: |
    | 1 | the job with its steps, and whether it has attempts | |
    | 2 | the chapter step's lease | 1 |
    | 3-4 | the report; whether the chapter is done already (from any run) | |
    | 5-6 | the step's earlier attempts in this run; the job's next attempt number | |
    | 7 | the attempt's intent with its reservation drawn from the pool (none for a cancelled job) | 2 |
    | 8-11 | BEGIN; the attempt's end with its usage and cost; its settle; COMMIT | 3 |
    | 12-13 | the chapter kept (never over a done one); its text read back | 4 |
    | 14 | the chapter step's done mark | 5 |
    | 15 | the sub-steps ended so far (the join waits for its sibling) | |
    """
    credentials = services.client_create(name="budget", webhook_url=HOOK_URL)
    chapter_statements(credentials, "warm-up")
    statements = chapter_statements(credentials, "counted")

    assert (write_commits(statements), len(statements)) == (5, 15), "\n".join(statements)
    assert_books_balance(ledger)
