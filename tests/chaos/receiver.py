"""The storm's webhook receiver: a client's endpoint that verifies every delivery with the standardwebhooks
library (each client's own secret, by the path it was given) and fails 30% of them with a 500, drawn from
the storm's seed."""

from __future__ import annotations

import random

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.support.webhook_receiver import Answer, WebhookReceiver

FAIL_SHARE = 0.30
FAILED = Answer(500, body=b'{"error": "the seeded 30%"}')


class FlakyReceiver(WebhookReceiver):
    def __init__(self, seed: int, host: str = "127.0.0.1"):
        # Past the seeded list every request fails (the default), so a storm that delivers far more than
        # planned shows as undelivered, never as passed.
        super().__init__(default=FAILED, host=host)
        rng = random.Random(f"receiver-{seed}")
        self.answers = [FAILED if rng.random() < FAIL_SHARE else Answer() for _ in range(200_000)]
        self.base = self.url.removesuffix("/hooks")
        self.secrets_by_path: dict[str, str] = {}
        # Checked on arrival: a signature's timestamp is only valid for minutes.
        self.on_request = lambda received: setattr(received, "own_secret", self.signed_for_its_path(received))

    def add_client(self, client: str, secret: str) -> str:
        self.secrets.append(secret)
        self.secrets_by_path[f"/hooks/{client}"] = secret
        return self.url_for(client)

    def url_for(self, client: str) -> str:
        return f"{self.base}/hooks/{client}"

    def signed_for_its_path(self, received) -> bool:
        """Signed with the secret of the client whose URL it was sent to (never another client's)."""
        secret = self.secrets_by_path.get(received.path)
        if secret is None:
            return False
        try:
            Webhook(secret).verify(received.body, received.headers)
            return True
        except WebhookVerificationError:
            return False
