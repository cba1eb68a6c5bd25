"""The webhook events a client's receiver is sent are one enum (webhooks.models.WebhookEvent), the same
as the events docs/api.md's "Webhooks" names, and an event outside it is refused before its row is
written."""

import re
from pathlib import Path

import pytest

from jobs import services as job_services
from jobs.models import JobStatus
from webhooks import services
from webhooks.models import WebhookEvent

ROOT = Path(__file__).resolve().parents[2]


def test_docs_name_the_enums_events():
    text = (ROOT / "docs" / "api.md").read_text()
    section = text.split("\n## Webhooks", 1)[1].split("\n## ", 1)[0]
    prose = section.split("```", 1)[0]  # the paragraph that names the events, before the envelope
    named = set(re.findall(r"`([a-z]+\.[a-z_]+)`", prose))
    assert named == set(WebhookEvent.values)


def test_every_terminal_status_has_its_event():
    assert {str(status) for status in job_services._EVENT_FOR} == {
        JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED}
    assert set(job_services._EVENT_FOR.values()) | {WebhookEvent.NEEDS_REVIEW} == set(WebhookEvent)


def test_an_event_outside_the_enum_is_refused_before_anything_is_written():
    # Once an `assert`, which python -O removes.
    with pytest.raises(ValueError, match="generation.started"):
        services.delivery_create(job=None, event="generation.started", data={})


def test_ending_a_job_in_a_status_that_is_not_terminal_is_refused():
    # Once an `assert`, which python -O removes.
    with pytest.raises(ValueError, match="running"):
        job_services.job_finish(job_id=None, status=JobStatus.RUNNING)


def test_the_typescript_clients_event_type_names_the_enums_events():
    # The client library knows payonce only by its HTTP API: its type of a webhook event spells them out.
    source = (ROOT / "clients" / "typescript" / "src" / "types.ts").read_text()
    interface = source.split("export interface WebhookEvent {", 1)[1].split("\n}", 1)[0]
    type_line = next(line for line in interface.splitlines() if line.strip().startswith("type:"))
    assert set(re.findall(r'"([a-z]+\.[a-z_]+)"', type_line)) == set(WebhookEvent.values)
