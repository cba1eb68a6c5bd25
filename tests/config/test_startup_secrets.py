"""Development-only secrets are never production's: with DEBUG off, `web`, `worker`, `webhooks` and
`beat` (as the Procfile starts them) refuse the repository's SECRET_KEY and say what to set; sandbox
callbacks are taken only while the sandbox is the configured provider; and a console-printed mail (a
worker's log) shows its report link redacted."""

import io
import json
import subprocess
import time
import uuid
from datetime import datetime, timezone

import pytest
import requests
from django.core.mail import EmailMessage
from standardwebhooks.webhooks import Webhook

from config.mail import EmailBackend as ConsoleEmailBackend
from config.startup import DEVELOPMENT_SECRET_KEY
from jobs.kinds.report.reports import report_link
from sandbox.callbacks import DEFAULT_SECRET as SANDBOX_DEVELOPMENT_SECRET
from tests.support.procs import REPO_ROOT, ProcfileProcess, free_port, procfile_command, process_env
from tests.support.reports import report_body

pytestmark = pytest.mark.django_db(transaction=True)


def without_secret_key(**overrides) -> dict:
    """The environment of a process as a fresh deployment would give it: no SECRET_KEY, no DEBUG."""
    env = process_env(**overrides)
    env.pop("SECRET_KEY", None)
    env.pop("DEBUG", None)
    return env


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["web", "worker", "webhooks", "beat"])
def test_a_process_with_debug_off_and_no_secret_key_refuses_to_start_and_says_why(name, tmp_path):
    env = without_secret_key(PORT=free_port(), PAYONCE_VAR_DIR=tmp_path)

    done = subprocess.run(["bash", "-c", f"exec {procfile_command(name)}"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=60)

    assert done.returncode != 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "refuses to start" in done.stdout + done.stderr and "SECRET_KEY" in done.stdout + done.stderr


@pytest.mark.e2e
def test_the_web_process_with_debug_on_starts_with_the_development_key(db):
    web = ProcfileProcess("web", {"PORT": free_port(), "DEBUG": "1", "SECRET_KEY": DEVELOPMENT_SECRET_KEY}).start()
    try:
        assert requests.get(f"http://127.0.0.1:{web.port}/v1/schema", timeout=5).status_code == 200
    finally:
        web.stop()


def _signed_sandbox_callback() -> tuple[str, dict]:
    message_id, at = f"msg-{uuid.uuid4()}", datetime.now(timezone.utc)
    text = json.dumps({"id": "gen-forged", "status": "succeeded"})
    return text, {"Content-Type": "application/json", "webhook-id": message_id,
                  "webhook-timestamp": str(int(at.timestamp())),
                  "webhook-signature": Webhook(SANDBOX_DEVELOPMENT_SECRET).sign(message_id, at, text)}


@pytest.mark.e2e
def test_sandbox_callbacks_are_404_when_real_providers_are_the_configured_ones(db):
    web = ProcfileProcess("web", {"PORT": free_port(), "REAL_PROVIDERS": "1", "ANTHROPIC_API_KEY": "sk-ant-test"}).start()
    try:
        body, headers = _signed_sandbox_callback()
        answer = requests.post(f"http://127.0.0.1:{web.port}/v1/callbacks/sandbox", data=body, headers=headers,
                               timeout=10)
    finally:
        web.stop()

    assert answer.status_code == 404 and answer.json()["error"]["code"] == "CALLBACK_NOT_CONFIGURED"


@pytest.mark.e2e
def test_sandbox_callbacks_are_still_verified_while_the_sandbox_is_the_provider(web_stack):
    body, headers = _signed_sandbox_callback()

    answer = requests.post(f"{web_stack.url}/v1/callbacks/sandbox", data=body, headers=headers, timeout=10)

    # Verified, and then: no attempt of ours has that generation (not CALLBACK_NOT_CONFIGURED).
    assert answer.json()["error"]["code"] == "CALLBACK_UNKNOWN_GENERATION"


# --- report links in console mail --------------------------------------------------------------------------


def test_the_console_mail_backend_prints_a_report_link_redacted(db, settings):
    settings.PUBLIC_BASE_URL = "http://127.0.0.1:8000"
    link = report_link(uuid.uuid4())
    stream = io.StringIO()

    ConsoleEmailBackend(stream=stream).send_messages(
        [EmailMessage("Your report is ready", f"Read it here:\n\n{link}\n", "a@example.com", ["b@example.com"])])

    printed = stream.getvalue()
    assert "Read it here" in printed and "/r/[redacted]" in printed
    assert link.split("/r/")[1] not in printed


def test_with_email_console_links_the_console_mail_shows_the_link_and_still_redacts_other_secrets(db, settings):
    import logging

    from config.logs import RedactFilter

    settings.PUBLIC_BASE_URL = "http://127.0.0.1:8000"
    settings.EMAIL_CONSOLE_LINKS = True
    link = report_link(uuid.uuid4())
    api_key = "Ab3dE5gH." + "x" * 32  # the shape of a client's API key
    mail = EmailMessage("Your report is ready", f"Read it here:\n\n{link}\n\nkey {api_key}\n", "a@example.com",
                        ["b@example.com"])
    stream = io.StringIO()
    logged = io.StringIO()
    handler = logging.StreamHandler(logged)
    handler.addFilter(RedactFilter(environ={}))  # as settings.LOGGING's handlers do
    logger = logging.getLogger("payonce.mail")
    logger.addHandler(handler)
    level, logger.level = logger.level, logging.INFO
    try:
        ConsoleEmailBackend(stream=stream).send_messages([mail])
        ConsoleEmailBackend().send_messages([mail])  # the log, through the redaction filter
        logging.getLogger("payonce.other").addHandler(handler)
        logging.getLogger("payonce.other").warning("a line quoting %s", link)  # elsewhere: still redacted
    finally:
        logger.removeHandler(handler)
        logging.getLogger("payonce.other").removeHandler(handler)
        logger.level = level

    for printed in (stream.getvalue(), logged.getvalue().split("a line quoting")[0]):
        assert link in printed, printed
        assert api_key not in printed and "key [redacted]" in printed
    assert link not in logged.getvalue().split("a line quoting")[1]


@pytest.mark.e2e
def test_a_worker_with_console_mail_never_writes_a_report_link_into_its_log(jobs_worker, api, ledger):
    created = api.create(report_body(chapters=["sun", "moon"]), key="console-mail")
    assert created.status_code == 201, created.content
    deadline = time.monotonic() + 60
    while (shown := api.job(created.json()["id"]))["status"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, shown
        time.sleep(0.1)
    assert shown["status"] == "succeeded" and shown["output"]["delivered"] is True
    token = shown["output"]["link"].split("/r/")[1]
    time.sleep(0.5)  # the worker's last lines reach its log

    log = jobs_worker.output()
    assert "/r/[redacted]" in log  # the mail was printed
    assert token not in log
