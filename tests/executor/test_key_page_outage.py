"""fal's key page down while forged callbacks pour in, against the real `web` process (issue 38 item 3).

The web process runs as the Procfile starts it, with REAL_PROVIDERS on and FAL_WEBHOOK_JWKS_URL pointed at
a key page of this test's that answers 500 or answers nothing for 45 s. Twenty forged fal callbacks (no
key needed to send one) arrive at once, twice over; meanwhile another client's `GET /v1/whoami` must keep
its usual latency, the key page must be fetched at most once per web process, and the callbacks must be
answered 503 CALLBACK_UNVERIFIED (fal sends a genuine one again).
"""

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from jobs.services import client_create
from tests.conftest import WEB_STACK_ENV
from tests.support.procs import ProcfileProcess, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

WEB_PROCESSES = 2
STORM = 20


class KeyPage:
    """A key page that is down: `500` answers at once with a 500, `hang` reads the request and answers
    nothing for 45 s. Counts the fetches."""

    def __init__(self, mode: str):
        self.mode = mode
        self.fetches = 0
        self.lock = threading.Lock()
        page = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                with page.lock:
                    page.fetches += 1
                if page.mode == "hang":
                    time.sleep(45)
                    return
                self.send_response(500)
                self.send_header("Content-Length", "4")
                self.end_headers()
                self.wfile.write(b"down")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/.well-known/jwks.json"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(params=["500", "hang"])
def outage(request, transactional_db, django_db_blocker):
    page = KeyPage(request.param)
    env = {**WEB_STACK_ENV, "PORT": free_port(), "REAL_PROVIDERS": 1, "FAL_KEY": "fal-key-id:fal-key-secret", "FAL_WEBHOOK_JWKS_URL": page.url,
           "WEB_CONCURRENCY": WEB_PROCESSES, "PROVIDER_READ_TIMEOUT_S": 30}
    web = ProcfileProcess("web", env).start()
    web.page = page
    yield web
    web.stop()
    page.close()


def forged_callback(url: str, n: int) -> requests.Response:
    body = json.dumps({"request_id": f"forged-{n}", "status": "OK", "payload": {}}).encode()
    return requests.post(f"{url}/v1/callbacks/fal", data=body, timeout=60, headers={
        "Content-Type": "application/json", "X-Fal-Webhook-Request-Id": f"forged-{n}",
        "X-Fal-Webhook-User-Id": "someone", "X-Fal-Webhook-Timestamp": str(int(time.time())),
        "X-Fal-Webhook-Signature": "00" * 64})


def whoami_latency(url: str, key: str) -> float:
    started = time.monotonic()
    answer = requests.get(f"{url}/v1/whoami", headers={"Authorization": f"Bearer {key}"}, timeout=60)
    elapsed = time.monotonic() - started
    assert answer.status_code == 200, answer.text
    return elapsed


def fetch_counter(url: str) -> dict[str, float]:
    text = requests.get(f"{url}/metrics", timeout=30).text
    return {outcome: float(value) for outcome, value in
            re.findall(r'^payonce_key_page_fetches_total\{outcome="(\w+)"\} (\S+)$', text, re.M)}


@pytest.mark.alone  # measures other clients' latency against their usual: other tests' load would skew it
def test_a_forged_callback_storm_during_a_key_page_outage_leaves_other_clients_at_their_usual_latency(outage):
    key = client_create(name="bystander")["api_key"]
    before = [whoami_latency(outage.url, key) for _ in range(5)]
    counted_before = fetch_counter(outage.url)

    during: list[float] = []
    answers: list[requests.Response] = []
    storm_over = threading.Event()

    def bystander():
        while not storm_over.is_set():
            during.append(whoami_latency(outage.url, key))
            time.sleep(0.05)

    watcher = threading.Thread(target=bystander)
    watcher.start()
    try:
        for wave in range(2):  # the second wave finds the failure kept (or the fetch still under way)
            with ThreadPoolExecutor(STORM) as pool:
                answers += pool.map(lambda n: forged_callback(outage.url, n), range(wave * STORM, (wave + 1) * STORM))
            time.sleep(0.5)
        # A fetch under way ends within FAL_WEBHOOK_JWKS_TIMEOUT_S: keep measuring past it.
        time.sleep(1.0)
    finally:
        storm_over.set()
        watcher.join()

    print(f"\n{outage.page.mode}: whoami before {max(before):.3f}s max, during {max(during):.3f}s max "
          f"over {len(during)}, key page fetched {outage.page.fetches} times for {len(answers)} callbacks")
    assert {(a.status_code, a.json()["error"]["code"]) for a in answers} == {(503, "CALLBACK_UNVERIFIED")}
    assert len(during) >= 10
    assert max(during) < 1.0, sorted(during)[-5:]
    assert 1 <= outage.page.fetches <= WEB_PROCESSES  # one per web process, whatever came of it
    counted = fetch_counter(outage.url)
    assert counted.get("failed", 0) - counted_before.get("failed", 0) == outage.page.fetches
