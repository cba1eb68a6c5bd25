"""The fal adapter over real HTTP against a local server replaying fal's recorded wire formats, its webhook
check, and its replay mode with no network at all.

No database (but for the smoke command, which reads the catalog): these tests talk only to
tests.support.replay_server (or to nothing).
"""

import base64
import hashlib
import json
from urllib.parse import parse_qs

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.test import Client

from executor import callbacks
from executor.providers import real
from executor.providers.fal import adapter as fal
from executor.providers.base import ErrorClass, ProviderError, Usage
from executor.providers.fal import webhooks as fal_webhooks
from executor.providers.fal.adapter import CAPABILITIES, FalProvider
from executor.providers.fal.webhooks import verify_webhook
from executor.providers.fal.replay import REPLAY_MEDIA_PREFIX as FAL_REPLAY_MEDIA_PREFIX
from executor.providers.replay import REPLAY_PNG, fixture
import threading
import time

from tests.support.replay_server import DROP, Delayed, ReplayServer

FLUX_DEV = "fal-ai/flux/dev"
KLING = "fal-ai/kling-video/v2.5-turbo/pro/text-to-video"
REQUEST_ID = "764cabcf-b745-4b3e-ae38-1200304cf45b"
# Status, result and cancel live under the app id: the endpoint path (`/dev`) is not part of them.
REQUESTS = f"/fal-ai/flux/requests/{REQUEST_ID}"
LIGHTHOUSE = {"image_size": "landscape_4_3", "num_images": 1}
METADATA = {"payonce_job": "3f1c2b9e-job", "payonce_attempt": 2, "upstream_key": "payonce-3f1c2b9e-job-2"}
SENT_AT = 1749721307  # the recorded webhooks' X-Fal-Webhook-Timestamp


@pytest.fixture
def server():
    with ReplayServer() as running:
        yield running
        assert running.unexpected == [], f"requests nothing was scripted for: {running.unexpected}"


@pytest.fixture(autouse=True)
def fresh_jwks():
    fal_webhooks._jwks_cache.clear()
    yield
    fal_webhooks._jwks_cache.clear()


@pytest.fixture
def live(settings, server):
    """REAL_PROVIDERS on, fal pointed at the replay server with a key (read at call time), no callbacks."""
    settings.REAL_PROVIDERS = True
    settings.FAL_KEY = "fal-key-id:fal-key-secret"
    settings.FAL_BASE_URL = server.url
    settings.PROVIDER_CALLBACK_BASE_URL = "off"
    return server


def body_of(name: str) -> dict:
    return fixture(name)["body"]


def submit(provider, model=FLUX_DEV, *, prompt="a lighthouse at dusk", params=None, inputs=()):
    return provider.submit(model, upstream_key=METADATA["upstream_key"], prompt=prompt,
                           params=dict(LIGHTHOUSE if params is None else params), metadata=METADATA,
                           inputs=list(inputs))


def result_with(**body) -> dict:
    return {"status": 200, "headers": {"content-type": "application/json"}, "body": body}


# -- capabilities -----------------------------------------------------------------------------------


def test_capabilities_are_declared_as_fal_documents_them():
    assert (CAPABILITIES.idempotency_key, CAPABILITIES.lookup, CAPABILITIES.asynchronous, CAPABILITIES.cancel,
            CAPABILITIES.window_s, CAPABILITIES.resubmit_uncertain) == (False, False, True, True, None, False)
    # A 5xx to the submit may have queued a request: only a refusal is known to be unpaid.
    assert [status for status in (400, 401, 422, 429, 500, 502, 503, 504) if CAPABILITIES.answered_unpaid(status)] == [
        400, 401, 422, 429]
    assert FalProvider.name == "fal"


# -- submit -----------------------------------------------------------------------------------------


def test_submit_sends_the_input_with_the_key_and_nothing_of_ours(live):
    live.script("POST", f"/{FLUX_DEV}", "fal/submit_accepted")

    submission = submit(FalProvider())

    [sent] = live.requests
    assert (sent.method, sent.path, sent.query) == ("POST", "/fal-ai/flux/dev", "")
    assert sent.headers["Authorization"] == "Key fal-key-id:fal-key-secret"
    assert sent.json == {"prompt": "a lighthouse at dusk", "image_size": "landscape_4_3", "num_images": 1}
    # fal keeps neither an idempotency key nor metadata: nothing of ours beyond the input goes out.
    assert b"payonce" not in sent.body
    assert (submission.upstream_id, submission.status) == (REQUEST_ID, "running")
    assert submission.output_url is None and submission.cost_usd is None


def test_submit_asks_for_the_webhook_as_fal_webhook(live, monkeypatch):
    asked = []
    monkeypatch.setattr(callbacks, "callback_url",
                        lambda provider: asked.append(provider) or "https://payonce.example/v1/callbacks/fal")
    live.script("POST", f"/{KLING}", "fal/submit_accepted")

    submit(FalProvider(), KLING, params={"duration": "5"})

    assert asked == ["fal"]
    assert parse_qs(live.requests[0].query) == {"fal_webhook": ["https://payonce.example/v1/callbacks/fal"]}
    assert live.requests[0].path == f"/{KLING}"


@pytest.mark.parametrize("model", ["flux-dev", "fal-ai/", "fal-ai//dev", "fal-ai/flux?x=1", "workflows/someone",
                                   "../fal-ai/flux"])
def test_a_model_id_that_is_not_owner_and_app_is_refused_before_any_call(live, model):
    with pytest.raises(ProviderError) as raised:
        submit(FalProvider(), model)

    assert raised.value.kind == ErrorClass.INVALID_INPUT
    assert live.requests == []


def test_reference_media_are_refused_before_any_call(live):
    provider = FalProvider()

    with pytest.raises(ProviderError) as upload:
        provider.upload_input(FLUX_DEV, b"\x89PNG reference", "image/png")
    with pytest.raises(ProviderError) as with_inputs:
        submit(provider, inputs=["https://example.com/ref.png"])

    assert upload.value.kind == with_inputs.value.kind == ErrorClass.INVALID_INPUT
    assert "not supported" in upload.value.message
    assert live.requests == []


def test_without_a_key_real_mode_fails_before_any_call(settings, no_network):
    settings.REAL_PROVIDERS = True
    settings.FAL_KEY = ""

    with pytest.raises(ProviderError) as raised:
        submit(FalProvider())

    assert (raised.value.kind, raised.value.outcome_unknown) == (ErrorClass.AUTH, False)
    assert "FAL_KEY" in raised.value.message
    assert no_network == []


def test_submit_dropped_is_network_with_unknown_outcome(live):
    live.script("POST", f"/{FLUX_DEV}", DROP)

    with pytest.raises(ProviderError) as raised:
        submit(FalProvider())

    assert (raised.value.kind, raised.value.outcome_unknown, raised.value.never_sent) == (
        ErrorClass.NETWORK, True, False)


def test_a_submit_answered_without_request_id_is_an_unknown_outcome(live):
    live.script("POST", f"/{FLUX_DEV}", result_with(status="IN_QUEUE"))

    with pytest.raises(ProviderError) as raised:
        submit(FalProvider())

    assert (raised.value.kind, raised.value.outcome_unknown) == (ErrorClass.SERVER_ERROR, True)


def with_status(name: str, status: int) -> dict:
    recorded = fixture(name)
    recorded["status"] = status
    return recorded


@pytest.mark.parametrize(
    ("answer", "kind", "unknown", "retry_after", "words"),
    [
        ("fal/error_401_unauthorized", ErrorClass.AUTH, False, None, None),
        ("fal/error_403_forbidden", ErrorClass.AUTH, False, None, None),
        ("fal/error_403_user_locked", ErrorClass.UNAVAILABLE, False, None, None),
        ("fal/error_404_not_found", ErrorClass.UNAVAILABLE, False, None, None),
        ("fal/error_422_validation", ErrorClass.INVALID_INPUT, False, None, "prompt: Field required"),
        (with_status("fal/result_error_422_content_policy", 422), ErrorClass.REFUSED, False, None,
         "prompt: The content was flagged by a content checker."),
        ("fal/error_429_rate_limited", ErrorClass.RATE_LIMITED, False, 12.0, None),
        ("fal/error_500_internal", ErrorClass.SERVER_ERROR, True, None, None),
        ("fal/error_502_ingress", ErrorClass.SERVER_ERROR, True, None, "502 Bad Gateway"),
        ("fal/error_503_unavailable", ErrorClass.SERVER_ERROR, True, None, None),
        ("fal/error_504_timeout", ErrorClass.TIMEOUT, True, None, None),
    ],
    ids=["401", "403", "403-locked", "404", "422", "422-content-policy", "429", "500", "502-proxy", "503", "504"],
)
def test_submit_errors_keep_their_class_and_words(live, answer, kind, unknown, retry_after, words):
    live.script("POST", f"/{FLUX_DEV}", answer)
    recorded = fixture(answer) if isinstance(answer, str) else answer

    with pytest.raises(ProviderError) as raised:
        submit(FalProvider())

    assert raised.value.kind == kind
    assert raised.value.status == recorded["status"]
    assert raised.value.outcome_unknown is unknown
    assert raised.value.retry_after == retry_after
    if words is None:
        assert raised.value.message == recorded["body"]["detail"]
    else:
        assert words in raised.value.message


# -- poll -------------------------------------------------------------------------------------------


def test_poll_maps_every_status_and_reads_the_result_once_completed(live):
    live.script("GET", f"{REQUESTS}/status", "fal/status_in_queue", "fal/status_in_progress", "fal/status_completed")
    live.script("GET", REQUESTS, "fal/result_flux_dev")
    provider = FalProvider()

    queued, running, done = (provider.poll(FLUX_DEV, REQUEST_ID) for _ in range(3))

    assert (queued.status, queued.terminal, running.status) == ("running", False, "running")
    assert (done.status, done.terminal) == ("succeeded", True)
    assert done.output_url == body_of("fal/result_flux_dev")["images"][0]["url"]
    assert done.content_type == "image/jpeg"
    assert done.usage == Usage(units=2.1843)  # metrics.inference_time
    assert done.error is None and done.error_class is None and done.cost_usd is None
    assert [(r.method, r.path) for r in live.requests] == [("GET", f"{REQUESTS}/status")] * 3 + [("GET", REQUESTS)]
    assert all(r.headers["Authorization"] == "Key fal-key-id:fal-key-secret" for r in live.requests)


def test_poll_uses_the_app_id_without_the_endpoint_path(live):
    for app in ("fal-ai/kling-video", "workflows/someone/storyboard"):
        live.script("GET", f"/{app}/requests/{REQUEST_ID}/status", "fal/status_in_progress")
    provider = FalProvider()

    provider.poll(KLING, REQUEST_ID)
    provider.poll("workflows/someone/storyboard/run/fast", REQUEST_ID)

    assert [r.path for r in live.requests] == [f"/fal-ai/kling-video/requests/{REQUEST_ID}/status",
                                               f"/workflows/someone/storyboard/requests/{REQUEST_ID}/status"]


@pytest.mark.parametrize(
    ("result", "url", "content_type"),
    [
        (body_of("fal/result_kling_video"), "https://v3.fal.media/files/zebra/Ht5kQ9xR2mWn7bVc3pLsJ_output.mp4",
         "video/mp4"),
        ({"image": {"url": "https://v3.fal.media/files/lion/cut-out.png", "width": 512, "height": 512}},
         "https://v3.fal.media/files/lion/cut-out.png", "image/png"),
        ({"images": [{"url": "https://v3.fal.media/files/koala/a.webp"}, {"url": "https://v3.fal.media/files/b.jpg"}],
          "has_nsfw_concepts": [False, True]}, "https://v3.fal.media/files/koala/a.webp", "image/webp"),
    ],
    ids=["video.url", "image.url", "images[0].url"],
)
def test_output_url_forms(live, result, url, content_type):
    live.script("GET", f"{REQUESTS}/status", "fal/status_completed")
    live.script("GET", REQUESTS, result_with(**result))

    polled = FalProvider().poll(FLUX_DEV, REQUEST_ID)

    assert (polled.status, polled.output_url, polled.content_type) == ("succeeded", url, content_type)


def test_a_flagged_image_is_a_refusal(live):
    live.script("GET", f"{REQUESTS}/status", "fal/status_completed")
    live.script("GET", REQUESTS, "fal/result_flux_dev_nsfw")

    polled = FalProvider().poll(FLUX_DEV, REQUEST_ID)

    assert (polled.status, polled.error_class, polled.output_url) == ("failed", ErrorClass.REFUSED, None)
    assert "has_nsfw_concepts" in polled.error


def test_a_completion_without_an_output_url_failed(live):
    live.script("GET", f"{REQUESTS}/status", "fal/status_completed")
    live.script("GET", REQUESTS, result_with(images=[{"url": "data:image/jpeg;base64,/9j/4AAQ"}]))

    polled = FalProvider().poll(FLUX_DEV, REQUEST_ID)

    assert (polled.status, polled.output_url, polled.error_class) == ("failed", None, None)
    assert "without an output URL" in polled.error


def test_a_failed_completion_keeps_the_models_words_and_its_status(live):
    live.script("GET", f"{REQUESTS}/status", "fal/status_completed_server_error")
    live.script("GET", REQUESTS, "fal/result_error_503_runner")

    polled = FalProvider().poll(FLUX_DEV, REQUEST_ID)

    assert (polled.status, polled.error_class) == ("failed", None)  # the executor's default: a server error
    assert polled.error == "The runner disconnected unexpectedly during processing."
    # fal never charges a 5xx failure: what the executor needs to tell it from a paid one.
    assert (polled.raw["result_status"], polled.raw["error_type"]) == (503, "runner_disconnected")


def test_a_content_policy_failure_is_refused(live):
    live.script("GET", f"{REQUESTS}/status", "fal/status_completed_unprocessable")
    live.script("GET", REQUESTS, "fal/result_error_422_content_policy")

    polled = FalProvider().poll(FLUX_DEV, REQUEST_ID)

    assert (polled.status, polled.error_class) == ("failed", ErrorClass.REFUSED)
    assert polled.error == "prompt: The content was flagged by a content checker."
    assert polled.usage == Usage(units=0.412)


def test_a_validation_failure_is_invalid_input(live):
    live.script("GET", f"{REQUESTS}/status", "fal/status_completed_unprocessable")
    live.script("GET", REQUESTS, "fal/result_error_422_validation")

    polled = FalProvider().poll(FLUX_DEV, REQUEST_ID)

    assert (polled.status, polled.error_class) == ("failed", ErrorClass.INVALID_INPUT)
    assert polled.error == "num_inference_steps: Input should be less than or equal to 50"


def test_a_cancelled_request_is_cancelled(live):
    live.script("GET", f"{REQUESTS}/status", "fal/status_completed_cancelled")
    live.script("GET", REQUESTS, {"status": 499, "headers": {"content-type": "application/json"},
                                  "body": {"detail": "The request was cancelled by the client.",
                                           "error_type": "client_cancelled"}})

    polled = FalProvider().poll(FLUX_DEV, REQUEST_ID)

    assert (polled.status, polled.terminal) == ("cancelled", True)


def test_a_failed_completion_whose_result_cannot_be_read_keeps_the_status_words(live):
    live.script("GET", f"{REQUESTS}/status", "fal/status_completed_server_error")
    live.script("GET", REQUESTS, DROP)

    polled = FalProvider().poll(FLUX_DEV, REQUEST_ID)

    assert (polled.status, polled.error) == ("failed", "The runner disconnected unexpectedly during processing.")


def test_a_failure_the_status_does_not_report_is_read_from_the_result(live):
    live.script("GET", f"{REQUESTS}/status", "fal/status_completed")
    live.script("GET", REQUESTS, "fal/result_error_422_validation")

    polled = FalProvider().poll(FLUX_DEV, REQUEST_ID)

    assert (polled.status, polled.error_class) == ("failed", ErrorClass.INVALID_INPUT)


@pytest.mark.parametrize(
    ("answer", "kind"),
    [("fal/error_404_not_found", ErrorClass.UNAVAILABLE), ("fal/error_502_ingress", ErrorClass.SERVER_ERROR),
     ("fal/error_401_unauthorized", ErrorClass.AUTH)],
    ids=["404-expired", "502-proxy", "401"],
)
def test_a_result_that_cannot_be_read_is_a_poll_error_not_a_failed_render(live, answer, kind):
    # The status says the render completed without an error: a failed read is polled again.
    live.script("GET", f"{REQUESTS}/status", "fal/status_completed")
    live.script("GET", REQUESTS, answer)

    with pytest.raises(ProviderError) as raised:
        FalProvider().poll(FLUX_DEV, REQUEST_ID)

    assert raised.value.kind == kind


def test_a_poll_of_an_unknown_request_is_an_error(live):
    live.script("GET", f"{REQUESTS}/status", "fal/error_404_not_found")

    with pytest.raises(ProviderError) as raised:
        FalProvider().poll(FLUX_DEV, REQUEST_ID)

    assert raised.value.kind == ErrorClass.UNAVAILABLE


# -- cancel, lookup, fetch ----------------------------------------------------------------------------


def test_cancel_of_a_queued_request_and_of_one_already_completed(live):
    live.script("PUT", f"{REQUESTS}/cancel", "fal/cancel_requested", "fal/cancel_already_completed")
    provider = FalProvider()

    provider.cancel(FLUX_DEV, REQUEST_ID)
    provider.cancel(FLUX_DEV, REQUEST_ID)  # it ended first: nothing to stop, and no error

    assert [(r.method, r.path) for r in live.requests] == [("PUT", f"{REQUESTS}/cancel")] * 2
    assert all(r.headers["Authorization"] == "Key fal-key-id:fal-key-secret" for r in live.requests)


def test_cancel_of_an_unknown_request_raises(live):
    live.script("PUT", f"{REQUESTS}/cancel", "fal/error_404_not_found")

    with pytest.raises(ProviderError) as raised:
        FalProvider().cancel(FLUX_DEV, REQUEST_ID)

    assert raised.value.kind == ErrorClass.UNAVAILABLE


def test_lookup_never_proves_absence(live):
    with pytest.raises(ProviderError) as raised:
        FalProvider().lookup(FLUX_DEV, upstream_key=METADATA["upstream_key"], metadata=METADATA,
                             prompt="a lighthouse at dusk", params=LIGHTHOUSE, submitted_at=0.0)

    assert (raised.value.kind, raised.value.outcome_unknown) == (ErrorClass.SERVER_ERROR, True)
    assert live.requests == []


def test_fetch_never_sends_the_key_to_the_media_host(live):
    media = {"status": 200, "headers": {"content-type": "image/jpeg"}, "body": REPLAY_PNG}
    live.script("GET", "/files/koala/out.jpg", media, media)
    provider = FalProvider()

    # Same server, other origin: stands for v3.fal.media.
    public = provider.fetch(f"http://localhost:{live.port}/files/koala/out.jpg")
    under_base = provider.fetch(f"{live.url}/files/koala/out.jpg")

    assert public == under_base == REPLAY_PNG
    assert "Authorization" not in live.requests[0].headers
    assert live.requests[1].headers["Authorization"] == "Key fal-key-id:fal-key-secret"


# -- webhooks ---------------------------------------------------------------------------------------


def new_key() -> tuple[Ed25519PrivateKey, dict]:
    """A signing key and its public half as fal publishes its keys (a JWK)."""
    private = Ed25519PrivateKey.generate()
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return private, {"kty": "OKP", "crv": "Ed25519", "x": base64.urlsafe_b64encode(raw).rstrip(b"=").decode(),
                     "kid": "test", "use": "sig", "alg": "EdDSA"}


def signed(private: Ed25519PrivateKey, body: bytes, *, request_id=REQUEST_ID, user_id="user_2fK8mQ4xLz9RnT1",
           timestamp=SENT_AT) -> dict:
    message = "\n".join((request_id, user_id, str(timestamp), hashlib.sha256(body).hexdigest())).encode()
    return {"X-Fal-Webhook-Request-Id": request_id, "X-Fal-Webhook-User-Id": user_id,
            "X-Fal-Webhook-Timestamp": str(timestamp), "X-Fal-Webhook-Signature": private.sign(message).hex()}


def webhook_body(name: str = "fal/webhook_ok") -> bytes:
    return json.dumps(body_of(name)).encode()


def test_a_signed_webhook_verifies_and_answers_its_payload():
    private, jwk = new_key()
    _, other = new_key()
    jwks = {"keys": [other, {"kty": "RSA", "n": "x", "e": "AQAB"}, jwk]}  # fal may publish several keys
    ok, error = webhook_body(), webhook_body("fal/webhook_error")

    assert verify_webhook(ok, signed(private, ok), jwks=jwks, now=SENT_AT + 10) == body_of("fal/webhook_ok")
    payload = verify_webhook(error, signed(private, error), jwks=jwks, now=SENT_AT - 10)
    assert (payload["status"], payload["error"]) == ("ERROR", "Invalid status code: 422")
    # Header names as any framework hands them over.
    lower = {name.lower(): value for name, value in signed(private, ok).items()}
    assert verify_webhook(ok, lower, jwks=jwks, now=SENT_AT)["request_id"] == REQUEST_ID


def test_a_forged_body_does_not_verify():
    private, jwk = new_key()
    body = webhook_body()
    headers = signed(private, body)
    forged = body.replace(b'"OK"', b'"ERROR"')

    with pytest.raises(ValueError):
        verify_webhook(forged, headers, jwks={"keys": [jwk]}, now=SENT_AT)


def test_a_webhook_signed_by_an_unknown_key_does_not_verify():
    private, _ = new_key()
    _, published = new_key()
    body = webhook_body()

    with pytest.raises(ValueError):
        verify_webhook(body, signed(private, body), jwks={"keys": [published]}, now=SENT_AT)
    with pytest.raises(ValueError):
        verify_webhook(body, signed(private, body), jwks={"keys": []}, now=SENT_AT)


@pytest.mark.parametrize("now", [SENT_AT + 301, SENT_AT - 301], ids=["old", "future"])
def test_a_webhook_outside_five_minutes_does_not_verify(now):
    private, jwk = new_key()
    body = webhook_body()

    with pytest.raises(ValueError):
        verify_webhook(body, signed(private, body), jwks={"keys": [jwk]}, now=now)
    assert verify_webhook(body, signed(private, body), jwks={"keys": [jwk]}, now=SENT_AT + 300)


def test_a_webhook_with_a_missing_or_malformed_header_or_another_request_does_not_verify():
    private, jwk = new_key()
    body = webhook_body()
    headers = signed(private, body)
    elsewhere = signed(private, body, request_id="0b8c2f4e-91d3-4a7b-8e6f-5c2d1a9b3e70")

    for broken in ({k: v for k, v in headers.items() if k != "X-Fal-Webhook-User-Id"},
                   {**headers, "X-Fal-Webhook-Signature": "not hex"},
                   {**headers, "X-Fal-Webhook-Timestamp": "yesterday"},
                   elsewhere):  # signed, but the body is another request's
        with pytest.raises(ValueError):
            verify_webhook(body, broken, jwks={"keys": [jwk]}, now=SENT_AT)


def test_jwks_is_fetched_once_and_kept(settings, server):
    settings.REAL_PROVIDERS = True
    settings.FAL_WEBHOOK_JWKS_URL = f"{server.url}/.well-known/jwks.json"
    server.script("GET", "/.well-known/jwks.json", "fal/jwks")

    first = fal_webhooks.jwks()
    again = fal_webhooks.jwks(refresh=True)  # too soon after the fetch: served from what is kept

    assert first == again == body_of("fal/jwks")
    assert len(server.requests) == 1
    assert "Authorization" not in server.requests[0].headers


def test_jwks_without_an_ed25519_key_is_an_error(settings, server):
    settings.REAL_PROVIDERS = True
    settings.FAL_WEBHOOK_JWKS_URL = f"{server.url}/.well-known/jwks.json"
    server.script("GET", "/.well-known/jwks.json", result_with(keys=[{"kty": "RSA", "n": "x", "e": "AQAB"}]))

    with pytest.raises(ProviderError):
        fal_webhooks.jwks()


SERVER_ERROR = {"status": 500, "headers": {"content-type": "text/plain"}, "body": "down"}


@pytest.fixture
def key_page(settings, server):
    settings.REAL_PROVIDERS = True
    settings.FAL_WEBHOOK_JWKS_URL = f"{server.url}/.well-known/jwks.json"
    return server


def test_a_failed_key_page_is_kept_as_a_failure_no_second_fetch_within_the_interval(key_page):
    key_page.script("GET", "/.well-known/jwks.json", SERVER_ERROR)  # a second fetch would be `unexpected`

    for _ in range(20):  # a storm of forged callbacks, fal's key page answering 500
        with pytest.raises(ProviderError):
            fal_webhooks.jwks()
        with pytest.raises(ProviderError):
            fal_webhooks.jwks(refresh=True)

    assert len(key_page.requests) == 1


def test_the_key_page_is_fetched_again_once_the_interval_has_passed(key_page, monkeypatch):
    key_page.script("GET", "/.well-known/jwks.json", SERVER_ERROR, "fal/jwks")
    with pytest.raises(ProviderError):
        fal_webhooks.jwks()
    monkeypatch.setattr(fal_webhooks, "JWKS_MIN_INTERVAL_S", 0.0)

    assert fal_webhooks.jwks() == body_of("fal/jwks")
    assert len(key_page.requests) == 2


def test_a_slow_key_page_is_given_up_after_its_own_short_timeout(key_page, settings):
    settings.FAL_WEBHOOK_JWKS_TIMEOUT_S = 0.5
    settings.PROVIDER_READ_TIMEOUT_S = 30.0  # not this one
    key_page.script("GET", "/.well-known/jwks.json", Delayed(5, "fal/jwks"))

    started = time.monotonic()
    with pytest.raises(ProviderError):
        fal_webhooks.jwks()
    assert time.monotonic() - started < 2


def test_while_one_thread_fetches_the_others_are_refused_at_once_not_made_to_wait(key_page):
    key_page.script("GET", "/.well-known/jwks.json", Delayed(1.5, "fal/jwks"))
    fetched = []
    fetcher = threading.Thread(target=lambda: fetched.append(fal_webhooks.jwks()))
    fetcher.start()
    while not key_page.requests:  # the fetch is under way
        time.sleep(0.01)

    started = time.monotonic()
    with pytest.raises(ProviderError):
        fal_webhooks.jwks()
    with pytest.raises(ProviderError):
        fal_webhooks.jwks(refresh=True)
    refused_in = time.monotonic() - started
    fetcher.join()

    assert refused_in < 0.2
    assert fetched == [body_of("fal/jwks")] and len(key_page.requests) == 1
    assert fal_webhooks.jwks() == body_of("fal/jwks")  # then kept


def test_keys_past_their_ttl_are_served_while_a_thread_of_their_own_refreshes_them(key_page, monkeypatch):
    rotated = {"keys": [{"kty": "OKP", "crv": "Ed25519", "x": base64.urlsafe_b64encode(bytes(32)).decode()}]}
    key_page.script("GET", "/.well-known/jwks.json", "fal/jwks", Delayed(1, result_with(**rotated)))
    first = fal_webhooks.jwks()
    monkeypatch.setattr(fal_webhooks, "JWKS_TTL_S", 0.0)
    monkeypatch.setattr(fal_webhooks, "JWKS_MIN_INTERVAL_S", 0.0)

    started = time.monotonic()
    served = fal_webhooks.jwks()  # old: the refresh goes on elsewhere
    served_in = time.monotonic() - started
    monkeypatch.setattr(fal_webhooks, "JWKS_TTL_S", 3600.0)
    deadline = time.monotonic() + 5
    while fal_webhooks.jwks() != rotated and time.monotonic() < deadline:
        time.sleep(0.05)

    assert served == first == body_of("fal/jwks") and served_in < 0.2
    assert fal_webhooks.jwks() == rotated
    assert len(key_page.requests) == 2


def test_a_refresh_that_fails_keeps_the_keys_it_had(key_page, monkeypatch):
    key_page.script("GET", "/.well-known/jwks.json", "fal/jwks", SERVER_ERROR)
    kept = fal_webhooks.jwks()
    monkeypatch.setattr(fal_webhooks, "JWKS_MIN_INTERVAL_S", 0.0)

    assert fal_webhooks.jwks(refresh=True) == kept  # a forged signature is then refused as 400, not 503
    assert len(key_page.requests) == 2


# -- replay: REAL_PROVIDERS off -----------------------------------------------------------------------


@pytest.fixture
def replay_settings(settings):
    settings.REAL_PROVIDERS = False
    settings.FAL_KEY = ""
    settings.FAL_BASE_URL = "https://queue.fal.run"
    settings.PROVIDER_CALLBACK_BASE_URL = "off"
    return settings


def test_replay_answers_a_fal_model_without_network(replay_settings, no_network):
    provider = FalProvider()

    submission = submit(provider)
    again = submit(provider)
    other = submit(provider, prompt="a harbour at night")
    polled = provider.poll(FLUX_DEV, submission.upstream_id)
    payload = provider.fetch(polled.output_url)
    provider.cancel(FLUX_DEV, submission.upstream_id)
    video = provider.poll(KLING, submit(provider, KLING).upstream_id)
    keys = fal_webhooks.jwks()

    assert no_network == []
    assert submission.status == "running"  # IN_QUEUE...
    assert submission.upstream_id == again.upstream_id != other.upstream_id  # derived from model and input
    assert submission.raw["status_url"] == f"https://queue.fal.run/fal-ai/flux/requests/{submission.upstream_id}/status"
    assert (polled.status, polled.content_type) == ("succeeded", "image/png")  # ...COMPLETED after one poll
    assert polled.output_url == f"{FAL_REPLAY_MEDIA_PREFIX}{submission.upstream_id}/out-0.png"
    assert polled.usage.units > 0
    assert payload == REPLAY_PNG
    assert (video.status, video.content_type) == ("succeeded", "video/mp4")
    assert fal_webhooks.public_keys(keys)


def test_replay_leaves_paths_of_other_providers_alone(replay_settings, no_network):
    # A POST to an owner/app path that is neither on fal's hosts nor a fal-ai model is not taken as fal's.
    response = real.send("POST", "http://10.255.255.1:9/someone/app", base_url="http://10.255.255.1:9",
                         json={"prompt": "p"})

    assert response.status_code == 404
    assert no_network == []


# -- smoke_provider: one real render, here against the replay server standing in for fal ------------------


def test_smoke_provider_makes_one_fal_render_waits_for_it_and_prices_it(live, db, capsys):
    from django.core.management import call_command

    live.script("POST", f"/{FLUX_DEV}", "fal/submit_accepted")
    live.script("GET", f"{REQUESTS}/status", "fal/status_completed")
    live.script("GET", REQUESTS, "fal/result_flux_dev")
    call_command("smoke_provider", "fal", FLUX_DEV, "--i-will-spend-money")
    printed = json.loads(capsys.readouterr().out)
    assert (printed["model"], printed["upstream_id"], printed["status"]) == (f"fal/{FLUX_DEV}", REQUEST_ID, "succeeded")
    assert printed["output"] == body_of("fal/result_flux_dev")["images"][0]["url"]
    assert printed["cost_usd"] == "0.025000"  # square: one megapixel, the smoke's cheapest size
    [submitted] = [r for r in live.requests if r.method == "POST"]
    assert submitted.json["image_size"] == "square" and submitted.json["num_images"] == 1


def test_smoke_provider_refuses_a_media_provider_without_its_key(live, db, settings):
    from django.core.management import CommandError, call_command

    settings.FAL_KEY = ""
    with pytest.raises(CommandError, match="FAL_KEY"):
        call_command("smoke_provider", "fal", FLUX_DEV, "--i-will-spend-money")
    assert live.requests == []


@pytest.mark.django_db
def test_a_callback_refused_on_its_headers_alone_fetches_no_key(key_page):
    # A forged callback missing fal's headers, or signed too long ago, is refused before any key is needed:
    # a storm of them during a key-page outage makes no fetch at all (nothing is scripted: a fetch would show).
    stale = str(int(time.time()) - 3600)
    for headers in ({}, {"X-Fal-Webhook-Request-Id": "r", "X-Fal-Webhook-User-Id": "u",
                         "X-Fal-Webhook-Timestamp": stale, "X-Fal-Webhook-Signature": "00" * 64}):
        answer = Client().post("/v1/callbacks/fal", data=b'{"request_id": "r"}', content_type="application/json",
                               headers=headers)
        assert answer.status_code == 400, answer.content
        assert answer.json()["error"]["code"] == "CALLBACK_UNVERIFIED"
    assert key_page.requests == []
