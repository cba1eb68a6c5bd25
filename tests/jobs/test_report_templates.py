"""Report templates (docs/design.md, "Report templates"): a client's own product, its version pinned at submit,
its texts rendered in a sandbox, its worst case the budget's. The job engine runs in this process as a worker runs
it (tests/support/engine.py), against the sandbox, whose call log holds every prompt as it arrived: what is
compared with the template's texts here is what a provider was sent. The books are strict in each test.
(docs/report-templates.md runs the same product through real processes: tests/project/test_readme.py.)"""

import json
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.utils import timezone

from billing.models import Reservation
from executor.models import Attempt
from jobs.kinds.report import reports, templates
from jobs.kinds.report.reports import scope_tag
from jobs.models import Job, Report, ReportTemplate
from orders.models import Order
from tests.support.books import assert_books_balance
from tests.support.reports import llm_calls

pytestmark = pytest.mark.django_db

SUBJECT = {"name": "Ada", "plot": "clay", "climate": "maritime"}
# Long enough that the chapters' shared prefix passes the sandbox's 1,024-token cache minimum.
LONG_SUBJECT = {**SUBJECT, "notes": "Ada keeps bees, grows beans and reads late into the night. " * 90}
GARDEN = {
    "name": "garden-plan",
    "system": "You are a garden designer writing for {{ subject.name }}.",
    "synthesis": "Sum up a garden for a {{ subject.plot }} plot.",
    "chapters": [
        {"key": "soil", "title": "Your soil", "instruction": "Advise on the soil of a {{ subject.plot }} plot."},
        {"key": "plants", "title": "What to plant", "instruction": "Choose ten plants for {{ subject.climate }} weather."},
        {"key": "year", "title": "Your first year", "instruction": "Plan {{ subject.name }}'s first year."},
    ],
    "max_output_tokens": 900,
    "layout": {"title": "A garden for {{ subject.name }}", "chapter_heading": "{{ chapter.title }} ({{ chapter.key }})",
               "closing": "_Planned for {{ subject.name }}._"},
    "mail": {"subject": "{{ subject.name }}, your plan is ready", "body": "Read it: {{ link }}\n"},
    "page_title": "The garden plan of {{ subject.name }}",
}


def define(api, body=GARDEN, **overrides):
    return api.http.post("/v1/report-templates", data=json.dumps({**body, **overrides}),
                         content_type="application/json", headers=api.headers())


def report(api, key: str, subject=SUBJECT, **template) -> str:
    created = api.create({"kind": "report", "models": ["sandbox/llm"],
                          "input": {"subject": subject, "email": "ada@example.com",
                                    "template": {"name": "garden-plan", **template}}}, key=key)
    assert created.status_code == 201, created.content
    return created.json()["id"]


def prompts(ledger) -> list[dict]:
    """The LLM calls' prompts as the sandbox received them, in the order they arrived."""
    return [call["prompt"] for call in llm_calls(ledger)]


def instruction(prompt: dict) -> str:
    """What a prompt asked for: its message's text after the shared block (the subject, the synthesis)."""
    return prompt["messages"][0].rsplit("\n\n", 1)[1]


def test_a_three_chapter_template_writes_its_report_in_its_layout_from_exactly_the_rendered_prompts(
        engine, ledger, api, mailbox, mail_to):
    mail_to(mailbox)
    assert define(api).json() == {"name": "garden-plan", "version": 1, "live": True}
    job_id = report(api, "garden-1")
    assert api.job(job_id)["input"]["template"] == {"name": "garden-plan", "version": 1}  # pinned at submit
    engine.run_job(job_id)
    job = api.job(job_id)
    assert job["status"] == "succeeded", job
    assert [c["key"] for c in job["chapters"]] == ["soil", "plants", "year"]

    sent = prompts(ledger)
    assert len(sent) == 4
    assert {p["system"] for p in sent} == {"You are a garden designer writing for Ada."}
    subject = json.dumps(SUBJECT, sort_keys=True, ensure_ascii=False)
    assert sent[0]["messages"] == [f"Scope: {scope_tag(api.client_id)}\n\nSubject:\n{subject}\n\n"
                                   "Sum up a garden for a clay plot."]
    assert sorted(instruction(p) for p in sent[1:]) == sorted([
        "Advise on the soil of a clay plot.", "Choose ten plants for maritime weather.", "Plan Ada's first year."])
    synthesis = Report.objects.get(job_id=job_id).synthesis
    assert all(p["messages"][0].startswith(f"Scope: {scope_tag(api.client_id)}\n\nSubject:\n{subject}\n\n"
                                           f"Synthesis:\n{synthesis}\n\n") for p in sent[1:])
    assert {a.request["max_tokens"] for a in Attempt.objects.filter(job_id=job_id)} == {900}

    markdown = api.get(f"/v1/jobs/{job_id}/report").content.decode()
    headings = [line for line in markdown.splitlines() if line.startswith("#")]
    assert headings == ["# A garden for Ada", "## Your soil (soil)", "## What to plant (plants)",
                        "## Your first year (year)"]
    assert markdown.rstrip().endswith("_Planned for Ada._") and "_Figures:" not in markdown
    [mail] = mailbox.wait_for(1)
    assert mail["subject"] == "Ada, your plan is ready" and re.fullmatch(r"Read it: http://\S+/r/\S+\r?\n", mail["body"])
    page = api.http.get("/r/" + mail["body"].split("/r/", 1)[1].strip()).content.decode()
    assert "<title>The garden plan of Ada</title>" in page and "<h1>A garden for Ada</h1>" in page
    assert len(assert_books_balance(ledger)) == 4


def test_a_template_edited_while_its_report_runs_changes_nothing_of_that_report(engine, ledger, api, mail_to, mailbox):
    mail_to(mailbox)
    define(api)
    job_id = report(api, "garden-edited")
    # The report runs until its synthesis is written; then the template is edited (version 2, live).
    engine.start(Job.objects.get(id=job_id))
    engine.run(until=lambda: Attempt.objects.filter(job_id=job_id, step="synthesis", state="succeeded").exists(),
               job=job_id)
    edited = {**GARDEN, "system": "You are terse.", "chapters": [
        {**chapter, "instruction": "Say one word."} for chapter in GARDEN["chapters"]]}
    assert define(api, edited).json() == {"name": "garden-plan", "version": 2, "live": True}
    engine.run_job(job_id)
    assert api.job(job_id)["status"] == "succeeded"
    sent = prompts(ledger)
    assert len(sent) == 4 and {p["system"] for p in sent} == {"You are a garden designer writing for Ada."}
    assert "Say one word." not in {instruction(p) for p in sent}

    later = report(api, "garden-after-the-edit")  # a report accepted after the edit is written from version 2
    assert api.job(later)["input"]["template"] == {"name": "garden-plan", "version": 2}
    engine.run_job(later)
    assert {instruction(p) for p in prompts(ledger)[5:]} == {"Say one word."}
    assert len(assert_books_balance(ledger)) == 8


def test_a_failed_chapters_retry_reuses_the_pinned_version_pays_only_that_chapter_and_reads_the_cache(
        engine, ledger, api, mail_to, mailbox):
    mail_to(mailbox)
    define(api)
    job_id = report(api, "garden-retry", subject=LONG_SUBJECT)
    # The synthesis and the first chapter (alone, it writes the cache) pass; the next chapter is refused.
    ledger.faults([{"model": "llm", "action": "delay", "seconds": 0}, {"model": "llm", "action": "delay", "seconds": 0},
                   {"model": "llm", "action": "status_400", "message": "not this chapter"}])
    engine.run_job(job_id)
    failed = api.job(job_id)
    assert failed["status"] == "failed" and failed["error"]["code"] == "CHAPTER_FAILED", failed
    [missing] = failed["error"]["chapters"]
    refused = [p for p, call in zip(prompts(ledger), llm_calls(ledger)) if call["status"] == 400]
    assert len(refused) == 1

    define(api, {**GARDEN, "system": "You are terse."})  # edited before the person's retry: changes nothing
    retried = api.http.post(f"/v1/jobs/{job_id}/retry", headers=api.headers())
    assert retried.status_code == 202
    engine.run_job(job_id)
    done = api.job(job_id)
    assert done["status"] == "succeeded" and done["run"] == 2, done
    [again] = Attempt.objects.filter(job_id=job_id, run=2)
    assert again.step == f"chapter-{missing}"  # only the missing chapter is paid again
    assert prompts(ledger)[-1] == refused[0]  # byte for byte the prompt of run 1
    assert again.usage["cache_read_tokens"] >= 1024  # the cached prefix still matches
    assert len(assert_books_balance(ledger)) == 4  # the refusal was not charged


def test_a_missing_variable_and_a_reach_into_python_are_refused_and_nothing_is_stored_or_paid(api, ledger):
    for system in ("{{ ''.__class__ }}", "{{ subject.__class__.__mro__ }}", "{{ cycler.__init__.__globals__ }}",
                   "{% for x in subject %}{{ x }}{% endfor %}", "{{ subject.name.upper() }}", "{{ 'a' * 99999 }}"):
        refused = define(api, system=system)
        assert refused.status_code == 422, (system, refused.content)
        assert list(refused.json()["error"]["fields"]) == ["system"], refused.content
    assert not ReportTemplate.objects.exists()

    define(api)
    missing = api.create({"kind": "report", "models": ["sandbox/llm"],
                          "input": {"subject": {"name": "Ada", "plot": "clay"}, "email": "ada@example.com",
                                    "template": {"name": "garden-plan"}}}, key="no-climate")
    assert missing.status_code == 422
    [why] = missing.json()["error"]["fields"]["input"]["subject"]
    assert "'climate'" in why and "chapters.plants.instruction" in why
    order = api.http.post("/v1/orders", content_type="application/json", headers=api.headers(), data=json.dumps({
        "payment_id": "pi_no_climate", "run_id": "r-1", "product": "garden-plan",
        "input": {"subject": {"name": "Ada", "plot": "clay"}}, "email": "ada@example.com"}))
    assert order.status_code == 422 and "'climate'" in json.dumps(order.json())
    assert not Job.objects.exists() and not Order.objects.exists() and not Reservation.objects.exists()
    assert llm_calls(ledger) == [] and assert_books_balance(ledger) == []


def test_another_clients_template_is_404_and_never_written_from(api, make_api):
    define(api)
    bob = make_api("bob")
    assert bob.get("/v1/report-templates/garden-plan/versions/1").status_code == 404
    assert bob.get("/v1/report-templates").json() == []
    moved = bob.http.post("/v1/report-templates/garden-plan/live", data=json.dumps({"version": 1}),
                          content_type="application/json", headers=bob.headers())
    assert moved.status_code == 404
    named = bob.create({"kind": "report", "models": ["sandbox/llm"],
                        "input": {"subject": SUBJECT, "email": "bob@example.com", "template": {"name": "garden-plan"}}},
                       key="bobs")
    assert named.status_code == 422 and "no report template" in json.dumps(named.json())
    # Bob's own template of the same name is his alone.
    assert define(bob, system="Bob's.").json() == {"name": "garden-plan", "version": 1, "live": True}
    assert api.get("/v1/report-templates/garden-plan/versions/1").json()["system"] == GARDEN["system"]


def test_the_previews_worst_case_is_what_the_budget_reserves_for_the_same_report(engine, api, ledger, mail_to, mailbox):
    mail_to(mailbox)
    define(api)
    version_id = ReportTemplate.objects.get(name="garden-plan").versions.get(number=1).id
    worst = reports.preview(version_id=version_id, subject=SUBJECT, model="sandbox/llm",
                            client_id=api.client_id)["worst_case"]
    job_id = report(api, "garden-priced")
    # The synthesis's reservation, then the pre-flight's pool, read before any chapter draws from it.
    engine.start(Job.objects.get(id=job_id))
    engine.run(until=lambda: Reservation.objects.filter(job_id=job_id, kind="fanout").exists(), job=job_id)
    synthesis = Reservation.objects.get(job_id=job_id, kind="attempt")
    pool = Reservation.objects.get(job_id=job_id, kind="fanout")
    assert synthesis.amount == Decimal(worst["synthesis_usd"])
    assert pool.amount == Decimal(worst["per_chapter_usd"]) * 3
    assert synthesis.amount + pool.amount == Decimal(worst["total_usd"])
    engine.run_job(job_id)
    assert len(assert_books_balance(ledger)) == 4


def test_versions_are_read_as_written_and_live_moves_only_where_asked(api):
    define(api)
    assert define(api, max_output_tokens=500, live=False).json() == {"name": "garden-plan", "version": 2, "live": False}
    assert api.get("/v1/report-templates").json() == [{"name": "garden-plan", "live": 1, "versions": 2}]
    second = api.get("/v1/report-templates/garden-plan/versions/2").json()
    assert second["max_output_tokens"] == 500 and second["live"] is False and second["chapters"] == GARDEN["chapters"]
    moved = api.http.post("/v1/report-templates/garden-plan/live", data=json.dumps({"version": 2}),
                          content_type="application/json", headers=api.headers())
    assert moved.json() == {"name": "garden-plan", "live": 2}
    nowhere = api.http.post("/v1/report-templates/garden-plan/live", data=json.dumps({"version": 3}),
                            content_type="application/json", headers=api.headers())
    assert nowhere.status_code == 404
    subset = api.create({"kind": "report", "models": ["sandbox/llm"], "input": {
        "subject": SUBJECT, "email": "a@example.com", "template": {"name": "garden-plan", "version": 1},
        "chapters": ["year", "soil"]}}, key="subset")
    assert subset.json()["input"]["chapters"] == ["soil", "year"]  # the template's order
    assert subset.json()["input"]["template"] == {"name": "garden-plan", "version": 1}
    unknown = api.create({"kind": "report", "models": ["sandbox/llm"], "input": {
        "subject": SUBJECT, "email": "a@example.com", "template": {"name": "garden-plan"}, "chapters": ["moon"]}},
        key="unknown-chapter")
    assert unknown.status_code == 422 and "moon" in json.dumps(unknown.json())


def test_a_name_no_template_can_have_is_no_such_path_never_a_lookup(api):
    for path in ("/v1/report-templates/a%00b/versions/1", "/v1/report-templates/Garden/versions/1",
                 "/v1/report-templates/a%00b/live"):
        answer = api.http.post(path, data="{}", content_type="application/json", headers=api.headers()) \
            if path.endswith("/live") else api.get(path)
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "NOT_FOUND", (path, answer.content)


def test_a_text_cannot_grow_a_prompt_past_its_bounds(api, ledger):
    many = "{{ subject.notes }}" * 101
    refused = define(api, system=many)
    assert refused.status_code == 422 and "At most 100 variables" in refused.json()["error"]["fields"]["system"][0]
    define(api, system="{{ subject.notes }}" * 10)
    huge = api.create({"kind": "report", "models": ["sandbox/llm"], "input": {
        "subject": {**SUBJECT, "notes": "n" * 7000}, "email": "a@example.com", "template": {"name": "garden-plan"}}},
        key="huge")
    assert huge.status_code == 422 and "at most 64000" in json.dumps(huge.json())
    assert not Job.objects.exists() and llm_calls(ledger) == []


def test_a_subjects_line_break_cannot_open_a_section_or_break_the_mails_header():
    version = templates.Version.from_body("garden-plan", 1, {k: v for k, v in GARDEN.items() if k != "name"})
    shown = reports.layout_of(version, {**SUBJECT, "name": "Ada\n\n## Not a chapter\r\nBcc: x@example.com"},
                              ["soil"], link="https://example.com/r/t")
    assert shown["title"] == "A garden for Ada ## Not a chapter Bcc: x@example.com"
    assert "\n" not in shown["mail_subject"] and "\r" not in shown["mail_subject"]
    assert shown["headings"] == {"soil": "Your soil (soil)"}


def test_a_purge_keeps_the_templated_report_readable_and_its_version_named(engine, api, ledger, mail_to, mailbox):
    mail_to(mailbox)
    define(api)
    job_id = report(api, "garden-purged")
    engine.run_job(job_id)
    before = api.get(f"/v1/jobs/{job_id}/report").content
    Report.objects.filter(job_id=job_id).update(created_at=timezone.now() - timedelta(days=91))

    call_command("purge_personal_data", "--older-than", "90d")

    purged = Report.objects.get(job_id=job_id)
    assert purged.subject is None and "mail_body" not in purged.layout and "mail_subject" not in purged.layout
    assert api.job(job_id)["input"] == {"chapters": ["soil", "plants", "year"], "purged": True,
                                        "template": {"name": "garden-plan", "version": 1}}
    assert api.get(f"/v1/jobs/{job_id}/report").content == before  # the same report, still in its layout
    assert len(assert_books_balance(ledger)) == 4
