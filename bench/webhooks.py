"""Benchmark: webhook deliveries per second through the `webhooks` worker, against a bare loop.

  payonce  1,000 due delivery rows, claimed by the drainer (webhooks.tasks.drain, as beat runs it) and
           sent by the `webhooks` worker as the Procfile starts it: lease, sign, SSRF-vetted POST, one
           attempt row, mark delivered
  ceiling  the same 1,000 signed payloads posted with requests from the same number of threads
           (WEBHOOK_CONCURRENCY, 8) to the same receiver, with nothing else
The receiver is a process of its own (bench/receiver.py). Target: payonce >= 0.5 of the ceiling.
Run: `.venv/bin/python bench/webhooks.py [--rows 1000]`.
"""

import argparse
import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.figures import record  # noqa: E402
from bench.stack import Stack  # noqa: E402
from tests.support.procs import REPO_ROOT, free_port  # noqa: E402

THREADS = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1000)
    args = parser.parse_args()

    stack = Stack(WEBHOOK_ALLOW_PRIVATE=1, WEBHOOK_CONCURRENCY=THREADS)
    credentials = stack.prepare()
    stack.configure_this_process()
    from django.utils import timezone

    from jobs.models import Job
    from webhooks import services
    from webhooks.models import Delivery
    from webhooks.tasks import drain

    port = free_port()
    receiver = subprocess.Popen([sys.executable, "bench/receiver.py", str(port)], cwd=REPO_ROOT)
    url = f"http://127.0.0.1:{port}/hooks"
    job_id = uuid.uuid4()
    try:
        for _ in range(50):
            try:
                requests.get(url, timeout=1)
                break
            except requests.RequestException:
                time.sleep(0.1)
        Job.objects.create(id=job_id, client_id=credentials["client_id"], idempotency_key=str(job_id),
                           request_hash="0" * 64, kind="media", model_chain=["sandbox/video-keyed"], input={},
                           policy={}, output_key="o", status="failed")
        envelopes = [json.dumps({"id": f"{job_id}:{n}:generation.failed", "type": "generation.failed",
                                 "data": {"n": n, "padding": "x" * 1500}}) for n in range(args.rows)]
        secrets = services.signing_secrets(credentials["client_id"])

        # The ceiling: the same signed payloads, the same threads, nothing else.
        def post_all(offset: int) -> None:
            session = requests.Session()
            for n in range(offset, args.rows, THREADS):
                ident, stamp = f"{job_id}:{n}:generation.failed", int(time.time())
                headers = {"content-type": "application/json", "webhook-id": ident, "webhook-timestamp": str(stamp),
                           "webhook-signature": services.sign(delivery_id=ident, timestamp=stamp, body=envelopes[n],
                                                              secrets_=secrets)}
                assert session.post(url, data=envelopes[n].encode(), headers=headers, timeout=15).status_code == 200

        threads = [threading.Thread(target=post_all, args=(i,)) for i in range(THREADS)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        ceiling = args.rows / (time.perf_counter() - started)

        stack.start("webhooks")
        due = timezone.now()
        Delivery.objects.bulk_create([
            Delivery(id=f"{job_id}:{n}:generation.failed", job_id=job_id, client_id=credentials["client_id"], run=n,
                     event="generation.failed", url=url, envelope=envelopes[n], next_attempt_at=due)
            for n in range(args.rows)
        ])
        pending = Delivery.objects.filter(job_id=job_id, status="pending")
        started = time.perf_counter()
        while pending.exists():
            drain()  # what beat runs every WEBHOOK_DRAIN_INTERVAL_S
            time.sleep(0.05)
        elapsed = time.perf_counter() - started
        delivered = Delivery.objects.filter(job_id=job_id, status="delivered").count()
        rate = delivered / elapsed
    finally:
        receiver.terminate()
        receiver.wait(timeout=10)
        stack.stop()
        Job.objects.filter(id=job_id).delete()

    print(f"{args.rows} deliveries, {THREADS} threads, receiver in its own process on loopback")
    print(f"ceiling  (bare requests loop, same signed payloads)   {ceiling:8.1f} deliveries/s")
    print(f"payonce  (drainer + webhooks worker as in the Procfile) {rate:8.1f} deliveries/s "
          f"({delivered} delivered)   ratio {rate / ceiling:.2f} (target >= 0.5)")
    record("deliveries/s, drainer + webhooks worker", rate, "deliveries/s", baseline=ceiling,
           baseline_is="ceiling: bare requests loop, same signed payloads", ratio=rate / ceiling,
           target="ratio >= 0.50", met=rate / ceiling >= 0.5)


if __name__ == "__main__":
    main()
