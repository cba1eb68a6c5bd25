"""The demo client `make run` prints: created once, its key kept in var/demo_client.json (development only).
What it prints is also written to var/demo.txt, which `make run` prints again once every process answers
(config.devrun). The demo client is a polling client: it names no webhook URL, so its jobs make no
deliveries; it asks GET /v1/jobs/{id} or follows /v1/jobs/{id}/events instead."""

import json
import os
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from accounts.models import Client, ClientAPIKey
from jobs.services import client_create


def _write_private(path: Path, text: str) -> None:
    """Both files hold the demo key: readable by their owner only from the first byte."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as file:
        file.write(text)
    path.chmod(0o600)  # a file an earlier version wrote with the umask's mode


class Command(BaseCommand):
    help = "Create (or reuse) the demo client and print its API key and a ready curl line."

    def handle(self, *args, **options):
        path = settings.VAR_DIR / "demo_client.json"
        demo = None
        if path.exists():
            demo = json.loads(path.read_text())
            prefix = demo["api_key"].partition(".")[0]
            key = ClientAPIKey.objects.get_usable_keys().filter(prefix=prefix, client_id=demo["client_id"]).first()
            if key is None or not key.is_valid(demo["api_key"]):
                demo = None  # the database was reset: make a new one
        if demo is None:
            demo = client_create(name="demo")
            _write_private(path, json.dumps(demo))
        client = Client.objects.get(id=demo["client_id"])
        base = settings.PUBLIC_BASE_URL
        bearer = f"-H 'Authorization: Bearer {demo['api_key']}'"
        body = '{"kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": "a lighthouse at dusk", "render_s": 2}}'
        post = f"curl -s -w '\\nHTTP %{{http_code}}\\n' -X POST {base}/v1/jobs {bearer} -H 'Content-Type: application/json' -d '{body}'"
        lines = [
            f"Demo client {client.name} ({client.id}): a polling client (no webhook URL, so no deliveries)",
            f"  API key:        {demo['api_key']}",
            f"  webhook secret: {demo['webhook_secret']} (signs deliveries once the client names a webhook URL)",
            "Try it once the stack is up. The same key twice is one job (201, then 202):",
            f"  {post} -H 'Idempotency-Key: demo-first-render'",
            "A new key is a new job:",
            f'  {post} -H "Idempotency-Key: demo-$(date +%s)"',
            "Your jobs, and what the provider charged:",
            f"  curl -s {base}/v1/jobs {bearer}",
            f"  curl -s {settings.SANDBOX_URL}/ledger",
            f"The API: {base}/v1/docs   The admin: {base}/admin/ (.venv/bin/python manage.py createsuperuser first)",
        ]
        text = "\n".join(lines) + "\n"
        _write_private(settings.VAR_DIR / "demo.txt", text)
        self.stdout.write(text, ending="")
