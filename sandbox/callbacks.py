"""Callbacks: when a generation that named a `callback_url` ends, POST it there, the way Replicate's
webhooks call back (docs/sandbox.md, "Callbacks").

Signed per Standard Webhooks with SANDBOX_CALLBACK_SECRET. `webhook-id` is the generation's id and the
state it reports (`gen_000001.succeeded`): every try of one callback carries the same id, as Standard
Webhooks asks, so a receiver can tell a repeat from news. Sent once when the render ends (or is
cancelled), and again on a non-2xx or no answer, CALLBACK_TRIES times in all, CALLBACK_RETRY_S apart.
A render that had ended by the time its submit was answered (render_s 0) is not called back: the answer
told it. A callback is a doorbell and may be late, repeated or lost: pending callbacks are kept in memory only,
so a restart loses them (as a real provider's outage would).
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import hmac
import json
import os
import threading
import time
import urllib.error
import urllib.request

DEFAULT_SECRET = "whsec_c2FuZGJveC1jYWxsYmFjay1zZWNyZXQtZm9yLWRldmVsb3BtZW50"  # base64 of a dev secret
CALLBACK_TRIES = 3
CALLBACK_RETRY_S = (1.0, 4.0)
CALLBACK_TIMEOUT_S = 5.0
# Callbacks sent at once, as a provider's webhook service sends them side by side: one sender, a new
# connection and a receiver's answer at a time, fell minutes behind 10,000 renders ending within two minutes
# (bench/in_flight.py), and the jobs waited on the sandbox, not on payonce.
CALLBACK_SENDERS = int(os.environ.get("SANDBOX_CALLBACK_SENDERS") or 8)


def secret() -> str:
    return os.environ.get("SANDBOX_CALLBACK_SECRET") or DEFAULT_SECRET


def sign(whsec: str, message_id: str, timestamp: int, body: str) -> str:
    """The Standard Webhooks signature (v1: HMAC-SHA256 of `id.timestamp.body` under the base64 secret),
    written out with the standard library: this process never imports payonce's dependencies."""
    key = base64.b64decode(whsec.removeprefix("whsec_") + "==")
    digest = hmac.new(key, f"{message_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return f"v1,{base64.b64encode(digest).decode()}"


class Caller:
    """CALLBACK_SENDERS threads that send due callbacks, each taking the one due first."""

    def __init__(self, view):
        self.view = view  # view(generation_id, base_url) -> the generation as GET answers it
        self.secret = secret()
        self.lock = threading.Condition()
        self.due: list[tuple[float, int, str, str, str, int]] = []  # (at, seq, gen id, url, base, try)
        self.seq = 0
        self.sent: list[dict] = []  # what was sent, for GET /control/callbacks
        for n in range(max(1, CALLBACK_SENDERS)):
            threading.Thread(target=self._run, name=f"callbacks-{n}", daemon=True).start()

    def schedule(self, generation_id: str, url: str, base_url: str, at: float, attempt: int = 1) -> None:
        with self.lock:
            self.seq += 1
            heapq.heappush(self.due, (at, self.seq, generation_id, url, base_url, attempt))
            self.lock.notify()

    def log(self) -> list[dict]:
        with self.lock:
            return [dict(entry) for entry in self.sent]

    def reset(self) -> None:
        with self.lock:
            self.due.clear()
            self.sent.clear()

    def _run(self) -> None:
        while True:
            with self.lock:
                while not self.due or self.due[0][0] > time.time():
                    self.lock.wait(timeout=(self.due[0][0] - time.time()) if self.due else None)
                _, _, generation_id, url, base_url, attempt = heapq.heappop(self.due)
            self._send(generation_id, url, base_url, attempt)

    def _send(self, generation_id: str, url: str, base_url: str, attempt: int) -> None:
        view = self.view(generation_id, base_url)
        if view is None:  # reset meanwhile
            return
        body = json.dumps(view, separators=(",", ":"))
        message_id = f"{generation_id}.{view['status']}"
        now = int(time.time())
        request = urllib.request.Request(url, data=body.encode(), method="POST", headers={
            "Content-Type": "application/json",
            "webhook-id": message_id,
            "webhook-timestamp": str(now),
            "webhook-signature": sign(self.secret, message_id, now, body),
        })
        try:
            with urllib.request.urlopen(request, timeout=CALLBACK_TIMEOUT_S) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        except OSError:
            status = None
        with self.lock:
            self.sent.append({"generation_id": generation_id, "url": url, "try": attempt, "status": status,
                              "status_of_generation": view["status"], "at": time.time()})
        if (status is None or status >= 300) and attempt < CALLBACK_TRIES:
            self.schedule(generation_id, url, base_url, time.time() + CALLBACK_RETRY_S[attempt - 1], attempt + 1)
