"""The report kind as the tests ask for it: a body (its subject and chapters), waiting for a report's
run to end, the LLM calls it made in the sandbox, and the headers its page must carry."""

import re
import time


CHAPTERS = ["sun", "moon", "rising", "venus", "mars", "jupiter", "saturn", "nodes"]
SUBJECT = {"name": "Ada Example", "born": "1990-04-12T06:30", "place": "Lyon"}


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
