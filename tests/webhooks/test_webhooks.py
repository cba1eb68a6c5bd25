"""Webhooks on real processes: the `webhooks` worker as the Procfile starts it, the drainer, and a real
HTTP receiver on loopback that verifies every request with the standardwebhooks library."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from jobs.models import Job, JobStatus
from jobs.services import job_finish
from tests.conftest import WEBHOOK_TEST_ENV, media_body
from tests.support.procs import REPO_ROOT, ProcfileProcess, process_env
from tests.support.webhook_receiver import Answer, WebhookReceiver
from webhooks import services
from webhooks.models import Delivery, DeliveryAttempt, Endpoint

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def ended_job(api, url: str, status: str = JobStatus.FAILED) -> Delivery:
    """A job that just ended: its terminal event's delivery is written and its first try enqueued."""
    body = media_body()
    job_id = uuid.uuid4()
    Job.objects.create(
        id=job_id, client_id=api.client_id, idempotency_key=str(job_id), request_hash="0" * 64, kind="media",
        model_chain=body["models"], input=body["input"], policy={}, output_key=f"o/{job_id}.mp4",
        webhook_url=url, status=JobStatus.RUNNING,
    )
    assert job_finish(job_id=job_id, status=status, error={"code": "X", "message": "for the webhook test"})
    return Delivery.objects.get(job_id=job_id)


def delivered(ident: str) -> bool:
    return Delivery.objects.get(id=ident).status == "delivered"


# --- signing -------------------------------------------------------------------------------------------


def test_every_request_verifies_with_standardwebhooks_and_tampering_fails(webhooks_worker, api):
    with WebhookReceiver(api.webhook_secret) as receiver:
        delivery = ended_job(api, receiver.url)
        receiver.wait_for(lambda: delivered(delivery.id), message="delivered")

        [got] = receiver.requests
        assert got.verified
        assert got.webhook_id == delivery.id
        assert got.body == delivery.envelope.encode()  # the exact stored bytes
        envelope = Webhook(api.webhook_secret).verify(got.body, got.headers)
        assert envelope["id"] == delivery.id and envelope["type"] == "generation.failed"
        assert envelope["data"]["status"] == "failed"
        with pytest.raises(WebhookVerificationError):
            Webhook(api.webhook_secret).verify(got.body.replace(b"failed", b"succeeded"), got.headers)
        old = {**got.headers, "webhook-timestamp": str(int(time.time()) - 3600)}
        with pytest.raises(WebhookVerificationError):
            Webhook(api.webhook_secret).verify(got.body, old)
        with pytest.raises(WebhookVerificationError):
            Webhook(services.secret_generate()).verify(got.body, got.headers)


def test_during_a_rotation_either_secret_verifies(webhooks_worker, api):
    from accounts.models import Client

    new_secret = services.secret_rotate(client=Client.objects.get(id=api.client_id))
    with WebhookReceiver() as receiver:
        delivery = ended_job(api, receiver.url)
        receiver.wait_for(lambda: delivered(delivery.id), message="delivered")
        [got] = receiver.requests
        assert len(got.signature.split(" ")) == 2  # both secrets sign during the overlap
        assert receiver.verify(got.body, got.headers, secret=api.webhook_secret)
        assert receiver.verify(got.body, got.headers, secret=new_secret)
    # After the overlap only the new secret signs.
    Endpoint.objects.get(client_id=api.client_id).secrets.exclude(secret=new_secret).update(
        expires_at=timezone.now() - timedelta(seconds=1))
    assert services.signing_secrets(api.client_id) == [new_secret]


def test_rotate_webhook_secret_command_prints_a_new_secret(api):
    done = subprocess.run([sys.executable, "manage.py", "rotate_webhook_secret", api.client_id], cwd=REPO_ROOT,
                          env=process_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    secret = done.stdout.strip()
    assert secret.startswith("whsec_") and secret != api.webhook_secret
    assert set(services.signing_secrets(api.client_id)) == {secret, api.webhook_secret}


# --- retries, dead letters, replay -------------------------------------------------------------------


def test_a_receiver_failing_three_times_gets_it_on_the_fourth_with_one_webhook_id(drainer, api):
    with WebhookReceiver(api.webhook_secret) as receiver:
        receiver.answers = [Answer(500), Answer(503), Answer(502)]
        delivery = ended_job(api, receiver.url)
        receiver.wait_for(lambda: delivered(delivery.id), message="delivered on the 4th try")

        tries = receiver.for_id(delivery.id)
        assert len(tries) == 4
        assert {t.webhook_id for t in tries} == {delivery.id}
        assert len({t.timestamp for t in tries}) == 4  # each try signs its own timestamp
        assert all(t.verified for t in tries) and all(t.body == tries[0].body for t in tries)
    rows = list(DeliveryAttempt.objects.filter(delivery_id=delivery.id).values_list("number", "status_code"))
    assert rows == [(1, 500), (2, 503), (3, 502), (4, 200)]


def test_an_always_failing_receiver_leaves_a_dead_letter_that_replay_delivers(drainer, api):
    with WebhookReceiver(api.webhook_secret, default=Answer(500, body=b"receiver broke")) as receiver:
        delivery = ended_job(api, receiver.url)
        receiver.wait_for(lambda: Delivery.objects.get(id=delivery.id).status == "dead", message="dead")

        dead = Delivery.objects.get(id=delivery.id)
        assert dead.attempts == 1 + len(WEBHOOK_TEST_ENV["WEBHOOK_RETRY_SCHEDULE"].split(","))
        assert dead.envelope == delivery.envelope  # intact
        assert DeliveryAttempt.objects.filter(delivery=dead).last().response_body == "receiver broke"

        receiver.default = Answer(200)
        done = subprocess.run([sys.executable, "manage.py", "replay_deliveries", "--dead", "--id", delivery.id,
                               "--reason", "the receiver is fixed"],
                              cwd=REPO_ROOT, env=process_env(), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "Replay of dead letters: 1 sent again" in done.stdout, done.stderr
        receiver.wait_for(lambda: delivered(delivery.id), message="replayed and delivered")
        last = receiver.for_id(delivery.id)[-1]
        assert last.webhook_id == delivery.id and last.body == delivery.envelope.encode() and last.verified


def test_retry_after_is_honoured(drainer, api):
    with WebhookReceiver(api.webhook_secret) as receiver:
        receiver.answers = [Answer(429, headers={"Retry-After": "3"})]
        delivery = ended_job(api, receiver.url)
        receiver.wait_for(lambda: delivered(delivery.id), message="delivered after Retry-After")
        first, second = receiver.for_id(delivery.id)
        assert second.arrived - first.arrived >= 2.9  # not the schedule's 1 s


def test_410_disables_the_endpoint_and_its_deliveries_wait_until_it_is_enabled(drainer, api):
    endpoint = Endpoint.objects.get(client_id=api.client_id)
    with WebhookReceiver(api.webhook_secret) as receiver:
        Endpoint.objects.filter(id=endpoint.id).update(url=receiver.url)
        receiver.answers = [Answer(410)]
        first = ended_job(api, "")  # no webhook_url of its own: the client's endpoint
        receiver.wait_for(lambda: Endpoint.objects.get(id=endpoint.id).disabled_at is not None, message="disabled")
        second = ended_job(api, "")
        time.sleep(2.5)  # first-try grace and several drains: nothing may be sent while disabled
        assert len(receiver.requests) == 1
        assert {d.status for d in Delivery.objects.filter(id__in=[first.id, second.id])} == {"pending"}

        services.endpoint_enable(endpoint=Endpoint.objects.get(id=endpoint.id))
        receiver.wait_for(lambda: delivered(first.id) and delivered(second.id), message="both delivered")


# --- concurrency and crashes ---------------------------------------------------------------------------


def test_two_drainers_and_two_dispatchers_over_500_due_rows_send_none_twice_at_once(webhooks_worker, api, settings):
    settings.WEBHOOK_SEND_LEASE_S = 3
    second = ProcfileProcess("webhooks", env=WEBHOOK_TEST_ENV).start()  # a second dispatcher process
    try:
        with WebhookReceiver(api.webhook_secret, hold_s=0.02) as receiver:
            job = ended_job(api, receiver.url)
            now = timezone.now() - timedelta(seconds=1)
            Delivery.objects.bulk_create([
                Delivery(id=f"{job.job_id}:{n}:generation.failed", job_id=job.job_id, client_id=api.client_id, run=n,
                         event="generation.failed", url=receiver.url, envelope=json.dumps({"n": n}), next_attempt_at=now)
                for n in range(2, 501)
            ])
            receiver.wait_for(lambda: delivered(job.id), message="the first delivered")
            stop = threading.Event()

            def drain_loop():
                from webhooks.tasks import drain

                try:
                    while not stop.is_set():
                        drain()
                        time.sleep(0.05)
                finally:
                    connections.close_all()

            drainers = [threading.Thread(target=drain_loop) for _ in range(2)]
            for thread in drainers:
                thread.start()
            try:
                receiver.wait_for(lambda: Delivery.objects.filter(job_id=job.job_id, status="pending").count() == 0,
                                  timeout=120, message="all 500 delivered")
            finally:
                stop.set()
                for thread in drainers:
                    thread.join()

            assert Delivery.objects.filter(job_id=job.job_id, status="delivered").count() == 500
            assert not any(r.overlapped for r in receiver.requests)  # never sent twice at the same moment
            assert {r.webhook_id for r in receiver.requests} == set(
                Delivery.objects.filter(job_id=job.job_id).values_list("id", flat=True))
            assert all(r.verified for r in receiver.requests)
    finally:
        second.stop()


def test_a_crash_between_the_receivers_2xx_and_marking_delivered_sends_it_again_with_the_same_id(
        api, drainer, webhooks_worker):
    with WebhookReceiver(api.webhook_secret) as receiver:
        def crash_the_dispatcher(received):
            if len(receiver.requests) == 1:  # the receiver has the event; the row does not say so yet
                os.killpg(webhooks_worker.proc.pid, signal.SIGKILL)

        receiver.on_request = crash_the_dispatcher
        delivery = ended_job(api, receiver.url)
        receiver.wait_for(lambda: len(receiver.requests) >= 1, message="the first try")
        webhooks_worker.proc.wait(timeout=10)
        assert Delivery.objects.get(id=delivery.id).status == "pending"
        webhooks_worker.start()  # the dispatcher comes back; the lease of the dead try runs out
        receiver.wait_for(lambda: delivered(delivery.id), timeout=30, message="sent again and delivered")
        ids = [r.webhook_id for r in receiver.for_id(delivery.id)]
        assert ids == [delivery.id, delivery.id]  # at least once, under one id for the receiver to dedupe


# --- the SSRF guard at submit and at send ----------------------------------------------------------


@pytest.mark.parametrize("url", ["http://10.0.0.1/hook", "http://169.254.169.254/latest", "http://[::1]:9/x",
                                 "http://100.64.0.1/", "http://127.0.0.1:9/hook"])
def test_a_private_webhook_url_is_refused_at_submit(api, settings, url):
    settings.WEBHOOK_ALLOW_PRIVATE = False
    response = api.create(media_body(webhook_url=url))
    assert response.status_code == 422
    assert "webhook_url" in response.json()["error"]["fields"]


def test_a_private_target_is_refused_again_at_send_before_any_connection(api, settings, monkeypatch):
    settings.WEBHOOK_ALLOW_PRIVATE = False
    import socket

    def no_connection(*args, **kwargs):
        raise AssertionError("a connection was attempted to a refused target")

    delivery = ended_job(api, "http://10.0.0.1/hook")  # allowed when the job was made; refused now
    Delivery.objects.filter(id=delivery.id).update(next_attempt_at=timezone.now() - timedelta(seconds=1))
    monkeypatch.setattr(socket, "create_connection", no_connection)
    [[(ident, token)]] = services.deliveries_claim_due()
    # Dead at once: no try on the schedule would make a private address allowed.
    assert services.delivery_try(ident=ident, token=token) == "dead"
    [attempt] = DeliveryAttempt.objects.filter(delivery_id=ident)
    assert attempt.status_code is None and "refused by the SSRF guard" in attempt.error
    assert Delivery.objects.get(id=ident).status == "dead"


# --- dead letters in the admin ---------------------------------------------------------------------


def test_the_admin_lists_dead_letters_with_their_envelope_and_tries_and_replays_them(admin_client, api):
    from django.contrib.admin.utils import quote

    delivery = ended_job(api, "http://127.0.0.1:9/hooks")
    Delivery.objects.filter(id=delivery.id).update(status="dead", attempts=8, schedule_position=8)
    DeliveryAttempt.objects.create(delivery_id=delivery.id, number=8, webhook_timestamp=int(time.time()),
                                   url="http://127.0.0.1:9/hooks", error="send failed: connection refused")

    listing = admin_client.get("/admin/webhooks/delivery/?status__exact=dead")
    assert listing.status_code == 200 and delivery.id in listing.content.decode()
    page = admin_client.get(f"/admin/webhooks/delivery/{quote(delivery.id)}/change/").content.decode()
    assert "connection refused" in page and "generation.failed" in page

    chosen = {"action": "replay", "_selected_action": [delivery.id], "index": "0"}
    asked = admin_client.post("/admin/webhooks/delivery/", chosen)  # the confirmation first: nothing yet
    assert asked.status_code == 200 and Delivery.objects.get(id=delivery.id).status == "dead"
    replay = admin_client.post("/admin/webhooks/delivery/", {**chosen, "confirm": "yes", "reason": "receiver fixed"})
    assert replay.status_code == 302
    from operators.models import OperatorAction

    assert OperatorAction.objects.get().reason == "receiver fixed"
    replayed = Delivery.objects.get(id=delivery.id)
    assert (replayed.status, replayed.schedule_position, replayed.envelope) == ("pending", 0, delivery.envelope)


def test_a_polling_clients_jobs_make_no_delivery_and_no_dead_letter(engine, make_api, ledger):
    """A client with no endpoint URL, whose jobs name no webhook_url, has nothing to deliver: its jobs
    succeed, fail and are cancelled through the API and the engine and leave no delivery row (so no dead
    letter), while a client with a URL gets one row per event."""
    polling = make_api("poller")
    hooked = make_api("hooked", webhook_url="https://hooks.example.com/payonce")
    ended = []
    for api in (polling, hooked):
        done = api.create(media_body(input={"prompt": "x", "render_s": 0}), key="ok").json()["id"]
        refused = api.create(media_body(input={"prompt": "x", "render_s": 0, "fail_render": "refused"}),
                             key="refused").json()["id"]
        slow = api.create(media_body(input={"prompt": "x", "render_s": 60}), key="slow").json()["id"]
        assert api.http.post(f"/v1/jobs/{slow}/cancel", headers=api.headers()).status_code == 200
        ended.append({job_id: engine.run_job(job_id).status for job_id in (done, refused, slow)})
    assert [sorted(statuses.values()) for statuses in ended] == [["cancelled", "failed", "succeeded"]] * 2

    assert not Delivery.objects.filter(client_id=polling.client_id).exists()
    rows = Delivery.objects.filter(client_id=hooked.client_id)
    assert sorted(rows.values_list("event", flat=True)) == [
        "generation.cancelled", "generation.failed", "generation.succeeded"]
