"""The report kind as the tests ask for it: a body (its subject and chapters), a client's template and a subject
for it, waiting for a report's run to end, the LLM calls it made in the sandbox, and the headers its page must
carry."""

import re
import time


CHAPTERS = ["sun", "moon", "rising", "venus", "mars", "jupiter", "saturn", "nodes"]
SUBJECT = {"name": "Ada Example", "born": "1990-04-12T06:30", "place": "Lyon"}

# A client's report template (docs/report-templates.md's garden plan, with a heading and a mail subject that
# print variables too), and a subject that fills it: the admin's preview tests read them.
GARDEN = {
    "name": "garden-plan",
    "system": "You are a garden designer writing for {{ subject.name }}. Write in Markdown, warmly and concretely.",
    "synthesis": "Sum up, in two paragraphs, what a garden for this plot and this person should be.",
    "chapters": [
        {"key": "soil", "title": "Your soil", "instruction": "Advise on the soil of a {{ subject.plot }} plot."},
        {"key": "plants", "title": "What to plant",
         "instruction": "Choose ten plants for {{ subject.climate }} weather."},
        {"key": "year", "title": "Your first year", "instruction": "Plan the first year, season by season."}],
    "max_output_tokens": 1200,
    "layout": {"title": "A garden for {{ subject.name }}", "chapter_heading": "{{ chapter.title }} ({{ chapter.key }})",
               "closing": "_Planned for {{ subject.name }}. Happy digging._"},
    "mail": {"subject": "Your garden plan is ready, {{ subject.name }}",
             "body": ("Hello {{ subject.name }},\n\nyour plan is here: {{ link }}\n\n"
                      "The link works for {{ link_days }} days.\n")},
    "page_title": "Your garden plan",
}
GARDEN_SUBJECT = {"name": "Ada", "plot": "clay", "climate": "maritime"}


def report_body(chapters=CHAPTERS, **overrides) -> dict:
    body = {"kind": "report", "models": ["sandbox/llm"],
            "input": {"subject": SUBJECT, "chapters": list(chapters), "email": "ada@example.com"}}
    body.update(overrides)
    return body


def wait_ended(api, job_id: str, timeout: float = 60.0, run: int | None = None) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = api.job(job_id)
        if job["status"] in ("succeeded", "failed", "cancelled", "waiting") and (run is None or job["run"] == run):
            return job
        assert time.monotonic() < deadline, f"report {job_id} still {job['status']}: {job.get('chapters')}"
        time.sleep(0.1)


def llm_calls(ledger) -> list[dict]:
    return [c for c in ledger.calls() if c["kind"] == "submit" and c.get("model") == "llm"]


def assert_strict_report_page_headers(headers, text: str) -> None:
    """The report page's headers (the browser test checks them on a sealed report's page)."""
    headers = {name.lower(): value for name, value in headers.items()}
    policy = dict(part.strip().split(" ", 1) for part in headers["content-security-policy"].split(";"))
    assert policy["default-src"] == "'none'" and policy["img-src"] == "'none'"
    assert policy["frame-ancestors"] == "'none'" and policy["base-uri"] == "'none'"
    assert policy["form-action"] == "'none'" and "script-src" not in policy
    nonce = re.fullmatch(r"'nonce-([A-Za-z0-9_-]{20,})'", policy["style-src"]).group(1)
    assert f'<style nonce="{nonce}">' in text
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"
