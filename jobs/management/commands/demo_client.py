"""The demo client `make run` prints: created once, its key kept in var/demo_client.json (development only)."""

import json

from django.conf import settings
from django.core.management.base import BaseCommand

from jobs.models import Client, ClientAPIKey
from jobs.services import client_create


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
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(demo))
            path.chmod(0o600)
        client = Client.objects.get(id=demo["client_id"])
        base = settings.PUBLIC_BASE_URL
        self.stdout.write(f"Demo client {client.name} ({client.id})")
        self.stdout.write(f"  API key:        {demo['api_key']}")
        self.stdout.write(f"  webhook secret: {demo['webhook_secret']}")
        body = '{"kind": "media", "models": ["sandbox/video-keyed"], "input": {"prompt": "a lighthouse at dusk", "render_s": 2}}'
        post = (f"curl -s -w '\\nHTTP %{{http_code}}\\n' -X POST {base}/v1/jobs -H 'Authorization: Bearer {demo['api_key']}' "
                f"-H 'Content-Type: application/json' -d '{body}'")
        self.stdout.write("Try it once the stack is up. The same key twice is one job (201, then 202):")
        self.stdout.write(f"  {post} -H 'Idempotency-Key: demo-first-render'")
        self.stdout.write("A new key is a new job:")
        self.stdout.write(f'  {post} -H "Idempotency-Key: demo-$(date +%s)"')
        self.stdout.write("Your jobs, and what the provider charged:")
        self.stdout.write(f"  curl -s {base}/v1/jobs -H 'Authorization: Bearer {demo['api_key']}'")
        self.stdout.write(f"  curl -s {settings.SANDBOX_URL}/ledger")
