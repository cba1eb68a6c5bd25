"""Reports that cost less (docs/design.md, "Reports and orders"): every chapter's prompt starts with the
same prefix (the system prompt, the client's scope line, the subject, the synthesis) marked as a cache
breakpoint, and the first chapter left goes out alone to write it, so the others read it at a tenth of
the input price. The prefix is one client's: another client sending the same subject reads nothing the
first wrote. The job engine runs in this process as a worker runs it (tests/support/engine.py), against
the sandbox, which caches like a provider. The sandbox's ledger stays the ground truth: every derived cost
equals its charge."""

import time
from decimal import Decimal

import pytest

from executor.models import Attempt
from jobs.kinds.report.reports import scope_tag
from tests.support.reports import CHAPTERS, SUBJECT, llm_calls, report_body
from tests.support.books import assert_books_balance

pytestmark = pytest.mark.django_db

# Long enough that the subject and the synthesis pass the sandbox's 1,024-token minimum (a token is four
# characters there): about 1,600 tokens with the synthesis.
LONG_SUBJECT = {**SUBJECT, "notes": "Ada keeps a garden by the river and reads late into the night. " * 90}
INPUT, WRITE, READ = Decimal("3"), Decimal("3.75"), Decimal("0.30")  # the sandbox's prices per million


def ended(engine, api, job_id: str, run: int | None = None) -> dict:
    """Run the job in process until it ends; the API's answer for it."""
    engine.run_job(job_id)
    job = api.job(job_id)
    assert run is None or job["run"] == run, job
    return job


def chapter_attempts(job_id, run=None) -> list[Attempt]:
    attempts = Attempt.objects.filter(job_id=job_id, step__startswith="chapter-").order_by("submitted_at")
    return list(attempts.filter(run=run) if run is not None else attempts)


def cached(attempt: Attempt) -> tuple[int, int]:
    usage = attempt.usage or {}
    return usage.get("cache_write_tokens", 0), usage.get("cache_read_tokens", 0)


def marked_block(attempt: Attempt) -> str:
    """The text of the block the chapter's prompt marked as its cache breakpoint, as it was sent."""
    [marked] = [block for block in attempt.request["messages"][0]["content"] if "cache_control" in block]
    return marked["text"]


def test_an_eight_chapter_report_writes_the_prefix_once_and_reads_it_seven_times(engine, ledger, api, mailbox, mail_to):
    mail_to(mailbox)
    created = api.create(report_body(input={"subject": LONG_SUBJECT, "chapters": CHAPTERS, "email": "ada@example.com"}),
                         key="cached-report")
    assert created.status_code == 201, created.content
    job = ended(engine, api, created.json()["id"])
    assert job["status"] == "succeeded", job

    chapters = chapter_attempts(job["id"])
    assert len(chapters) == 8
    writes = [a for a in chapters if cached(a)[0]]
    reads = [a for a in chapters if cached(a)[1]]
    assert len(writes) == 1 and len(reads) == 7, [(a.step, a.usage) for a in chapters]
    [lead] = writes
    assert lead.step == f"chapter-{CHAPTERS[0]}"  # the warm-up: the first chapter left, alone
    assert all(lead.finished_at <= other.submitted_at for other in reads)  # written before any read was sent
    prefix = cached(lead)[0]
    assert prefix >= 1024 and all(cached(a) == (0, prefix) for a in reads)  # the same prefix, byte for byte
    synthesis = Attempt.objects.get(job_id=job["id"], step="synthesis")
    assert cached(synthesis) == (0, 0)  # its prompt has no breakpoint
    [block] = {marked_block(a) for a in chapters}  # one prefix, byte for byte, and it starts with the client's tag
    assert block.startswith(f"Scope: {scope_tag(api.client_id)}\n\nSubject:\n")

    # The strict books: each call's derived cost (its usage at the rate card) equals the ledger's charge.
    charges = assert_books_balance(ledger)
    assert len(charges) == 9 and len(llm_calls(ledger)) == 9
    # What the cache saved, from the usage the ledger charged for: the prefix at full price eight times
    # against one write and seven reads.
    uncached = 8 * prefix * INPUT
    assert prefix * WRITE + 7 * prefix * READ < Decimal("0.25") * uncached
    assert len(mailbox.wait_for(1)) == 1


def _fail_one_chapter(engine, ledger, api, key: str) -> tuple[str, str]:
    """A report whose synthesis and lead chapter pass and one chapter after them is refused (a 400: no
    retry): it fails naming that chapter. Returns (job id, the chapter's key)."""
    ledger.faults([{"model": "llm", "action": "delay", "seconds": 0}, {"model": "llm", "action": "delay", "seconds": 0},
                   {"model": "llm", "action": "status_400", "message": "that chapter is not allowed"}])
    job_id = api.create(report_body(input={"subject": LONG_SUBJECT, "chapters": CHAPTERS, "email": "ada@example.com"}),
                        key=key).json()["id"]
    failed = ended(engine, api, job_id)
    assert failed["status"] == "failed" and failed["error"]["code"] == "CHAPTER_FAILED", failed
    [missing] = failed["error"]["chapters"]
    return job_id, missing


def test_a_resume_reads_the_prefix_while_it_is_still_cached(engine, ledger, api, mailbox, mail_to):
    mail_to(mailbox)
    job_id, missing = _fail_one_chapter(engine, ledger, api, "resume-warm")
    assert api.http.post(f"/v1/jobs/{job_id}/retry", headers=api.headers()).status_code == 202
    done = ended(engine, api, job_id, run=2)
    assert done["status"] == "succeeded", done

    [resumed] = chapter_attempts(job_id, run=2)
    assert resumed.step == f"chapter-{missing}"
    assert cached(resumed)[0] == 0 and cached(resumed)[1] >= 1024  # read: the cache was still warm
    assert {marked_block(a) for a in chapter_attempts(job_id, run=1)} == {marked_block(resumed)}  # across runs
    assert len(assert_books_balance(ledger)) == 9


def test_a_resume_writes_the_prefix_again_once_the_cache_has_expired(engine, ledger, api, mailbox, mail_to):
    mail_to(mailbox)
    ledger.cache_ttl(1.0)
    job_id, missing = _fail_one_chapter(engine, ledger, api, "resume-cold")
    time.sleep(1.5)  # past the cache's lifetime
    assert api.http.post(f"/v1/jobs/{job_id}/retry", headers=api.headers()).status_code == 202
    done = ended(engine, api, job_id, run=2)
    assert done["status"] == "succeeded", done

    [resumed] = chapter_attempts(job_id, run=2)
    assert cached(resumed)[0] >= 1024 and cached(resumed)[1] == 0  # written again: the entry had expired
    assert len(assert_books_balance(ledger)) == 9


def test_a_prefix_under_the_minimum_is_never_cached(engine, ledger, api, mailbox, mail_to):
    mail_to(mailbox)
    job = ended(engine, api, api.create(report_body(), key="short-prefix").json()["id"])  # a short subject
    assert job["status"] == "succeeded", job
    chapters = chapter_attempts(job["id"])
    assert len(chapters) == 8 and all(cached(a) == (0, 0) for a in chapters)
    marked = chapters[0].request["messages"][0]["content"][0]
    assert marked["cache_control"] == {"type": "ephemeral"}  # it was marked; the sandbox did not cache it
    assert len(assert_books_balance(ledger)) == 9


def test_the_same_subject_from_another_client_reads_nothing_the_first_wrote(engine, ledger, make_api, mailbox, mail_to):
    """Issue 37, finding 6: a provider's cache is per organisation, and payonce is one. Two clients send the
    same (personal) subject, one after the other, well inside the cache's lifetime: the second's chapters
    write a prefix of their own (its usage never shows that someone sent that subject lately, and the
    first never pays for its reads), and each client's chapters still read their own cache."""
    mail_to(mailbox)
    first, second = make_api("first"), make_api("second")
    body = report_body(input={"subject": LONG_SUBJECT, "chapters": CHAPTERS, "email": "ada@example.com"})
    jobs = {}
    for client in (first, second):
        created = client.create(body, key="same-subject")
        assert created.status_code == 201, created.content
        jobs[client.client_id] = ended(engine, client, created.json()["id"])
        assert jobs[client.client_id]["status"] == "succeeded", jobs[client.client_id]

    prefixes = {}
    for client in (first, second):
        chapters = chapter_attempts(jobs[client.client_id]["id"])
        [lead, *rest] = chapters
        assert lead.step == f"chapter-{CHAPTERS[0]}" and len(rest) == 7
        written, read = cached(lead)
        assert read == 0 and written >= 1024, (client.client_id, lead.usage)  # nothing of the other's read
        assert all(cached(a) == (0, written) for a in rest), [(a.step, a.usage) for a in rest]  # its own, read
        [prefixes[client.client_id]] = {marked_block(a) for a in chapters}
        assert prefixes[client.client_id].startswith(f"Scope: {scope_tag(client.client_id)}\n\n")
    assert prefixes[first.client_id] != prefixes[second.client_id]

    charges = assert_books_balance(ledger)  # every charge its attempt's, at the usage it reported
    assert len(charges) == 18 and len(llm_calls(ledger)) == 18
    assert len(mailbox.wait_for(2)) == 2
