"""The real provider adapters (Anthropic, OpenAI-compatible, Replicate) over real HTTP against a local
server replaying the providers' recorded wire formats, and their replay mode with no network at all.

No database: these tests talk only to tests.support.replay_server (or to nothing).
"""

import json
import socket
from datetime import datetime

import pytest
import requests
from django.core.exceptions import ImproperlyConfigured

from executor.providers import real
from executor.providers.anthropic.adapter import CAPABILITIES as ANTHROPIC_CAPABILITIES
from executor.providers.anthropic.adapter import AnthropicProvider
from executor.providers.base import ErrorClass, ProviderError, Usage
from executor.providers.openai_compat import CAPABILITIES as OPENAI_CAPABILITIES
from executor.providers.openai_compat import OpenAICompatibleProvider
from executor.providers import PROVIDERS
from executor.providers.replay import PROVIDERS_DIR, REPLAY_PNG, fixture, fixtures_dir, mount_replay
from executor.providers.replicate.adapter import CAPABILITIES as REPLICATE_CAPABILITIES
from executor.providers.replicate.adapter import ReplicateProvider
from tests.support.procs import free_port
from tests.support.replay_server import DROP, Delayed, ReplayServer

UNROUTABLE = "http://10.255.255.1:9"  # TEST-NET-ish private address nothing answers on
FLUX = "black-forest-labs/flux-schnell"
FLUX_VERSION = "dp-4d0bcc010b3049749a251855f12800be"
PREDICTION_ID = "qxm7r9k2anrj00cmd5kb3ce1tc"
LIGHTHOUSE = {"aspect_ratio": "16:9", "output_format": "png"}
METADATA = {"payonce_job": "3f1c2b9e-job", "payonce_attempt": 2, "upstream_key": "payonce-3f1c2b9e-job-2"}


@pytest.fixture
def server():
    with ReplayServer() as running:
        yield running
        assert running.unexpected == [], f"requests nothing was scripted for: {running.unexpected}"


@pytest.fixture
def live(settings, server):
    """REAL_PROVIDERS on, every provider pointed at the replay server, with keys (all read at call time)."""
    settings.REAL_PROVIDERS = True
    settings.ANTHROPIC_API_KEY = "sk-ant-test-key"
    settings.ANTHROPIC_BASE_URL = server.url
    settings.OPENAI_API_KEY = "sk-proj-test-key"
    settings.OPENAI_BASE_URL = server.url + "/v1"
    settings.REPLICATE_API_TOKEN = "r8_test_token"
    settings.REPLICATE_BASE_URL = server.url
    return server


def body_of(name: str) -> dict:
    return fixture(name)["body"]


def timestamp(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def complete(provider, **overrides):
    model = overrides.pop("model", "claude-sonnet-4-5")
    call = {"system": "You write market reports.", "messages": [{"role": "user", "content": "Write chapter 1"}],
            "max_tokens": 8000, "upstream_key": METADATA["upstream_key"], "metadata": METADATA}
    call.update(overrides)
    return provider.complete(model, **call)


def submit(provider, model=FLUX, *, prompt="a lighthouse at dusk", params=None, inputs=()):
    return provider.submit(model, upstream_key=METADATA["upstream_key"], prompt=prompt,
                           params=dict(LIGHTHOUSE if params is None else params), metadata=METADATA,
                           inputs=list(inputs))


def lookup(provider, model=FLUX, *, submitted_at, prompt="a lighthouse at dusk", params=None):
    return provider.lookup(model, upstream_key=METADATA["upstream_key"], metadata=METADATA, prompt=prompt,
                           params=dict(LIGHTHOUSE if params is None else params), submitted_at=submitted_at)


def with_error(name: str, **changes) -> dict:
    """A recorded error answer with its error object (Anthropic/OpenAI) changed."""
    recorded = fixture(name)
    recorded["body"]["error"].update(changes)
    return recorded


# -- capabilities -----------------------------------------------------------------------------------


def test_capabilities_are_declared_as_the_providers_behave():
    assert ANTHROPIC_CAPABILITIES == OPENAI_CAPABILITIES
    assert (ANTHROPIC_CAPABILITIES.idempotency_key, ANTHROPIC_CAPABILITIES.lookup,
            ANTHROPIC_CAPABILITIES.asynchronous, ANTHROPIC_CAPABILITIES.cancel,
            ANTHROPIC_CAPABILITIES.resubmit_uncertain) == (False, False, False, False, True)
    assert (REPLICATE_CAPABILITIES.idempotency_key, REPLICATE_CAPABILITIES.lookup,
            REPLICATE_CAPABILITIES.asynchronous, REPLICATE_CAPABILITIES.cancel,
            REPLICATE_CAPABILITIES.window_s, REPLICATE_CAPABILITIES.resubmit_uncertain) == (
        False, True, True, True, 1800.0, False)
    assert AnthropicProvider.name == "anthropic"
    assert OpenAICompatibleProvider.name == "openai"
    assert ReplicateProvider.name == "replicate"


# -- Anthropic --------------------------------------------------------------------------------------


def test_anthropic_request_shape_and_usage_excludes_cache_tokens(live):
    live.script("POST", "/v1/messages", "anthropic/message")

    completion = complete(AnthropicProvider())

    [sent] = live.requests
    assert (sent.method, sent.path) == ("POST", "/v1/messages")
    assert sent.headers["x-api-key"] == "sk-ant-test-key"
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "Authorization" not in sent.headers
    assert sent.json == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 8000,
        "system": "You write market reports.",
        "messages": [{"role": "user", "content": "Write chapter 1"}],
        "metadata": {"user_id": "3f1c2b9e-job"},
    }
    assert b"payonce-3f1c2b9e-job-2" not in sent.body  # no idempotency key exists at Anthropic

    recorded = body_of("anthropic/message")
    assert completion.upstream_id == "msg_01Hk9zQyR3bVnE8sPjGx4fT2"
    assert completion.text == recorded["content"][0]["text"]
    assert completion.stop_reason == "end_turn"
    # input_tokens (21) already excludes the 1,870 written to and the 3,054 read from the cache.
    assert completion.usage == Usage(input_tokens=21, output_tokens=412, cache_read_tokens=3054,
                                     cache_write_tokens=1870)
    assert completion.cost_usd is None


def test_anthropic_omits_system_and_metadata_it_was_not_given(live):
    live.script("POST", "/v1/messages", "anthropic/message")

    complete(AnthropicProvider(), system="", metadata={})

    assert set(live.requests[0].json) == {"model", "max_tokens", "messages"}


def test_anthropic_joins_text_blocks_only(live):
    recorded = fixture("anthropic/message")
    recorded["body"]["content"] = [
        {"type": "thinking", "thinking": "Plan the chapter.", "signature": "EqQBCkYIBxgCKkB"},
        {"type": "text", "text": "Part one. "},
        {"type": "text", "text": "Part two."},
    ]
    live.script("POST", "/v1/messages", recorded)

    assert complete(AnthropicProvider()).text == "Part one. Part two."


@pytest.mark.parametrize(
    ("answer", "kind", "unknown", "retry_after"),
    [
        ("anthropic/error_401_authentication", ErrorClass.AUTH, False, None),
        (dict(with_error("anthropic/error_401_authentication", type="permission_error",
                         message="Your API key does not have permission to use the specified resource."),
              status=403), ErrorClass.AUTH, False, None),
        ("anthropic/error_404_not_found", ErrorClass.UNAVAILABLE, False, None),
        ("anthropic/error_400_invalid_request", ErrorClass.INVALID_INPUT, False, None),
        (with_error("anthropic/error_400_invalid_request",
                    message="Output blocked by content filtering policy"), ErrorClass.REFUSED, False, None),
        (dict(with_error("anthropic/error_400_invalid_request", type="billing_error",
                         message="Your credit balance is too low to access the Anthropic API."), status=402),
         ErrorClass.UNAVAILABLE, False, None),
        ("anthropic/error_429_rate_limit", ErrorClass.RATE_LIMITED, False, 17.0),
        ("anthropic/error_500_api", ErrorClass.SERVER_ERROR, True, None),
        ("anthropic/error_529_overloaded", ErrorClass.SERVER_ERROR, True, None),
    ],
    ids=["401", "403", "404", "400", "400-refusal", "402-billing", "429", "500", "529"],
)
def test_anthropic_errors_keep_their_class_and_words(live, answer, kind, unknown, retry_after):
    live.script("POST", "/v1/messages", answer)
    recorded = fixture(answer) if isinstance(answer, str) else answer

    with pytest.raises(ProviderError) as raised:
        complete(AnthropicProvider())

    assert raised.value.kind == kind
    assert raised.value.message == recorded["body"]["error"]["message"]
    assert raised.value.status == recorded["status"]
    assert raised.value.outcome_unknown is unknown
    assert raised.value.retry_after == retry_after


def test_anthropic_refusal_in_a_200_is_refused_and_keeps_its_usage(live):
    live.script("POST", "/v1/messages", "anthropic/message_refusal")

    with pytest.raises(ProviderError) as raised:
        complete(AnthropicProvider())

    assert raised.value.kind == ErrorClass.REFUSED
    assert raised.value.outcome_unknown is False
    assert raised.value.usage == Usage(input_tokens=38, output_tokens=5)  # paid for: the journal needs it
    assert raised.value.upstream_id == "msg_01Qf3MZr6tWb2YcKxN8pLd5V"


def test_anthropic_unreadable_200_is_an_unknown_outcome(live):
    live.script("POST", "/v1/messages", {"status": 200, "headers": {"content-type": "text/html"},
                                         "body": "<html>gateway says hi</html>"})

    with pytest.raises(ProviderError) as raised:
        complete(AnthropicProvider())

    assert (raised.value.kind, raised.value.outcome_unknown) == (ErrorClass.SERVER_ERROR, True)


def test_connection_dropped_mid_request_is_network_with_unknown_outcome(live):
    live.script("POST", "/v1/messages", DROP)

    with pytest.raises(ProviderError) as raised:
        complete(AnthropicProvider())

    assert raised.value.kind == ErrorClass.NETWORK
    assert raised.value.outcome_unknown is True
    assert len(live.requests) == 1  # the request did arrive: it may have been paid for


def test_no_answer_in_time_is_timeout_with_unknown_outcome(live, settings):
    live.script("POST", "/v1/messages", Delayed(1.5, "anthropic/message"))

    with pytest.raises(ProviderError) as raised:
        complete(AnthropicProvider(read_timeout_s=0.3))

    assert (raised.value.kind, raised.value.outcome_unknown) == (ErrorClass.TIMEOUT, True)


def test_text_calls_wait_longer_than_the_default_read_timeout(settings):
    # A long chapter is written before its first byte arrives: 30 s would cut paid work short.
    settings.PROVIDER_READ_TIMEOUT_S = 30.0
    assert real.llm_timeout() == (settings.PROVIDER_CONNECT_TIMEOUT_S, 120.0)
    settings.PROVIDER_READ_TIMEOUT_S = 300.0
    assert real.llm_timeout()[1] == 300.0
    assert real.llm_timeout(0.5)[1] == 0.5


def test_text_adapters_use_the_text_timeout(live, monkeypatch):
    from executor.providers import http

    timeouts = []
    real_send = http.send

    def spy(*args, **kwargs):
        timeouts.append(kwargs.get("timeout"))
        return real_send(*args, **kwargs)

    monkeypatch.setattr(http, "send", spy)
    live.script("POST", "/v1/messages", "anthropic/message")
    live.script("POST", "/v1/chat/completions", "openai/chat_completion")

    complete(AnthropicProvider())
    complete(OpenAICompatibleProvider())

    assert timeouts == [real.llm_timeout(), real.llm_timeout()]
    assert real.llm_timeout()[1] >= 120.0


def test_replicate_poll_timeout_follows_settings(live, settings):
    settings.PROVIDER_READ_TIMEOUT_S = 0.3
    live.script("GET", f"/v1/predictions/{PREDICTION_ID}", Delayed(1.5, "replicate/prediction_processing"))

    with pytest.raises(ProviderError) as raised:
        ReplicateProvider().poll(FLUX, PREDICTION_ID)

    assert raised.value.kind == ErrorClass.TIMEOUT


def test_anthropic_without_key_in_real_mode_fails_before_any_call(live, settings):
    settings.ANTHROPIC_API_KEY = ""

    with pytest.raises(ProviderError) as raised:
        complete(AnthropicProvider())

    assert raised.value.kind == ErrorClass.AUTH
    assert "ANTHROPIC_API_KEY" in raised.value.message
    assert live.requests == []


def test_constructor_overrides_settings(server, settings):
    settings.REAL_PROVIDERS = True
    settings.ANTHROPIC_API_KEY = ""
    settings.ANTHROPIC_BASE_URL = UNROUTABLE
    server.script("POST", "/v1/messages", "anthropic/message")

    complete(AnthropicProvider(base_url=server.url + "/", api_key="sk-ant-explicit"))

    assert server.requests[0].headers["x-api-key"] == "sk-ant-explicit"


# -- OpenAI-compatible ------------------------------------------------------------------------------


def test_openai_request_shape_and_usage_splits_cached_tokens(live):
    live.script("POST", "/v1/chat/completions", "openai/chat_completion")

    completion = complete(
        OpenAICompatibleProvider(), model="gpt-4.1-mini",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Write ", "cache_control": {"type": "ephemeral"}},
                                               {"type": "text", "text": "chapter 1"}]},
                  {"role": "assistant", "content": "Which market?"},
                  {"role": "user", "content": "Coastal rentals"}],
        max_tokens=4000,
    )

    [sent] = live.requests
    assert (sent.method, sent.path) == ("POST", "/v1/chat/completions")
    assert sent.headers["Authorization"] == "Bearer sk-proj-test-key"
    assert sent.json == {
        "model": "gpt-4.1-mini",
        "messages": [
            {"role": "system", "content": "You write market reports."},
            {"role": "user", "content": "Write chapter 1"},
            {"role": "assistant", "content": "Which market?"},
            {"role": "user", "content": "Coastal rentals"},
        ],
        "max_tokens": 4000,
    }
    assert b"payonce-3f1c2b9e-job-2" not in sent.body

    assert completion.upstream_id == "chatcmpl-BqR2xKcV8nZ3pLw0aJ5mYtE7uH1sD"
    assert completion.text == body_of("openai/chat_completion")["choices"][0]["message"]["content"]
    assert completion.stop_reason == "stop"
    # prompt_tokens 2,306 include the 1,920 cached ones: 386 fresh input tokens.
    assert completion.usage == Usage(input_tokens=386, output_tokens=301, cache_read_tokens=1920)


def test_openai_without_system_sends_only_the_messages(live):
    live.script("POST", "/v1/chat/completions", "openai/chat_completion")

    complete(OpenAICompatibleProvider(), system="")

    assert live.requests[0].json["messages"] == [{"role": "user", "content": "Write chapter 1"}]


def test_openai_compatible_local_server_runs_keyless(live, settings):
    settings.OPENAI_API_KEY = ""  # OPENAI_BASE_URL points at the local server, not api.openai.com
    recorded = fixture("openai/chat_completion")
    del recorded["body"]["usage"]["prompt_tokens_details"]  # local servers often report no cache details
    live.script("POST", "/v1/chat/completions", recorded)

    completion = complete(OpenAICompatibleProvider())

    assert "Authorization" not in live.requests[0].headers
    assert completion.usage == Usage(input_tokens=2306, output_tokens=301)


def test_openai_default_url_without_key_fails_before_any_call(settings, no_network):
    settings.REAL_PROVIDERS = True
    settings.OPENAI_API_KEY = ""
    settings.OPENAI_BASE_URL = real.DEFAULT_OPENAI_BASE_URL

    with pytest.raises(ProviderError) as raised:
        complete(OpenAICompatibleProvider())

    assert raised.value.kind == ErrorClass.AUTH
    assert "OPENAI_API_KEY" in raised.value.message
    assert no_network == []


def test_openai_content_filter_is_refused(live):
    live.script("POST", "/v1/chat/completions", "openai/chat_completion_content_filter")

    with pytest.raises(ProviderError) as raised:
        complete(OpenAICompatibleProvider())

    assert (raised.value.kind, raised.value.outcome_unknown) == (ErrorClass.REFUSED, False)
    assert raised.value.usage == Usage(input_tokens=57)


@pytest.mark.parametrize(
    ("answer", "kind", "unknown", "retry_after"),
    [
        ("openai/error_401_invalid_api_key", ErrorClass.AUTH, False, None),
        ("openai/error_404_model_not_found", ErrorClass.UNAVAILABLE, False, None),
        ("openai/error_400_invalid_request", ErrorClass.INVALID_INPUT, False, None),
        ("openai/error_400_content_policy", ErrorClass.REFUSED, False, None),
        (with_error("openai/error_400_content_policy", code="content_filter",
                    message="The response was filtered due to the prompt triggering content management policy."),
         ErrorClass.REFUSED, False, None),
        ("openai/error_429_rate_limit", ErrorClass.RATE_LIMITED, False, 2.0),
        ("openai/error_429_insufficient_quota", ErrorClass.UNAVAILABLE, False, None),
        ("openai/error_500_server", ErrorClass.SERVER_ERROR, True, None),
    ],
    ids=["401", "404", "400", "400-content-policy", "400-content-filter", "429", "429-quota", "500"],
)
def test_openai_errors_keep_their_class_and_words(live, answer, kind, unknown, retry_after):
    live.script("POST", "/v1/chat/completions", answer)
    recorded = fixture(answer) if isinstance(answer, str) else answer

    with pytest.raises(ProviderError) as raised:
        complete(OpenAICompatibleProvider())

    assert raised.value.kind == kind
    assert raised.value.message == recorded["body"]["error"]["message"]
    assert raised.value.status == recorded["status"]
    assert raised.value.outcome_unknown is unknown
    assert raised.value.retry_after == retry_after


def test_openai_compatible_server_errors_in_other_shapes(live):
    vllm = {"status": 400, "headers": {"content-type": "application/json"},
            "body": {"object": "error", "message": "This model's maximum context length is 8192 tokens.",
                     "type": "BadRequestError", "param": None, "code": 400}}
    throttled = {"status": 429, "headers": {"retry-after-ms": "250", "retry-after": "1"},
                 "body": {"error": {"message": "slow down", "type": "requests", "code": "rate_limit_exceeded"}}}
    live.script("POST", "/v1/chat/completions", vllm, throttled)

    with pytest.raises(ProviderError) as first:
        complete(OpenAICompatibleProvider())
    with pytest.raises(ProviderError) as second:
        complete(OpenAICompatibleProvider())

    assert (first.value.kind, first.value.message) == (ErrorClass.INVALID_INPUT,
                                                       "This model's maximum context length is 8192 tokens.")
    assert (second.value.kind, second.value.retry_after) == (ErrorClass.RATE_LIMITED, 0.25)


# -- Replicate --------------------------------------------------------------------------------------


def test_replicate_submit_to_a_model_sends_input_only(live):
    live.script("POST", f"/v1/models/{FLUX}/predictions", "replicate/prediction_starting")

    submission = submit(ReplicateProvider(), inputs=["https://api.replicate.com/v1/files/zl7tx4i1b2ygtfmvw0fy3wcbve"])

    [sent] = live.requests
    assert sent.headers["Authorization"] == "Bearer r8_test_token"
    assert sent.json == {"input": {"prompt": "a lighthouse at dusk", "aspect_ratio": "16:9", "output_format": "png",
                                   "input_images": ["https://api.replicate.com/v1/files/zl7tx4i1b2ygtfmvw0fy3wcbve"]}}
    # Replicate keeps neither an idempotency key nor metadata: nothing of ours beyond the input goes out.
    assert b"payonce" not in sent.body
    assert (submission.upstream_id, submission.status) == (PREDICTION_ID, "running")
    assert submission.output_url is None and submission.cost_usd is None


def test_replicate_submit_to_a_version(live):
    version = "5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa"
    live.script("POST", "/v1/predictions", "replicate/prediction_starting")

    submit(ReplicateProvider(), f"replicate/hello-world:{version}", params={"seed": 7})

    assert live.requests[0].json == {"version": version, "input": {"prompt": "a lighthouse at dusk", "seed": 7}}


def test_replicate_model_name_must_be_owner_and_name(live):
    with pytest.raises(ProviderError) as raised:
        submit(ReplicateProvider(), "flux-schnell")

    assert raised.value.kind == ErrorClass.INVALID_INPUT
    assert live.requests == []


def test_replicate_poll_maps_every_status(live):
    live.script("GET", f"/v1/predictions/{PREDICTION_ID}", "replicate/prediction_starting",
                "replicate/prediction_processing", "replicate/prediction_succeeded",
                "replicate/prediction_failed_nsfw", "replicate/prediction_canceled")
    provider = ReplicateProvider()

    starting, processing, succeeded, failed, canceled = (provider.poll(FLUX, PREDICTION_ID) for _ in range(5))

    assert (starting.status, starting.terminal) == ("running", False)
    assert processing.status == "running"
    assert succeeded.status == "succeeded"
    assert succeeded.output_url == body_of("replicate/prediction_succeeded")["output"][0]
    assert succeeded.content_type == "image/png"
    assert succeeded.usage == Usage(units=0.712843)
    assert failed.status == "failed"
    assert failed.error == "NSFW content detected. Try running it again, or try a different prompt."
    assert failed.error_class == "refused"
    assert canceled.status == "cancelled"
    assert all(r.headers["Authorization"] == "Bearer r8_test_token" for r in live.requests)


def test_replicate_failure_that_is_not_a_refusal_has_no_error_class(live):
    recorded = fixture("replicate/prediction_failed_nsfw")
    recorded["body"]["error"] = "CUDA out of memory. Tried to allocate 2.00 GiB"
    live.script("GET", f"/v1/predictions/{PREDICTION_ID}", recorded)

    result = ReplicateProvider().poll(FLUX, PREDICTION_ID)

    assert (result.status, result.error_class) == ("failed", None)


def test_replicate_single_url_output(live):
    recorded = fixture("replicate/prediction_succeeded")
    recorded["body"]["output"] = "https://replicate.delivery/xezq/abc/output.mp4"
    live.script("GET", f"/v1/predictions/{PREDICTION_ID}", recorded)

    result = ReplicateProvider().poll(FLUX, PREDICTION_ID)

    assert (result.output_url, result.content_type) == ("https://replicate.delivery/xezq/abc/output.mp4", "video/mp4")


def test_replicate_cancel(live):
    live.script("POST", f"/v1/predictions/{PREDICTION_ID}/cancel", "replicate/prediction_canceled")

    ReplicateProvider().cancel(FLUX, PREDICTION_ID)

    assert [(r.method, r.path) for r in live.requests] == [("POST", f"/v1/predictions/{PREDICTION_ID}/cancel")]


def test_replicate_fetch_sends_the_token_only_to_the_api(live):
    media = {"status": 200, "headers": {"content-type": "image/png"}, "body": REPLAY_PNG}
    live.script("GET", "/xezq/abc/out-0.png", media, media)
    provider = ReplicateProvider()

    # Same server, other origin: stands for replicate.delivery.
    public = provider.fetch(f"http://localhost:{live.port}/xezq/abc/out-0.png")
    private = provider.fetch(f"{live.url}/xezq/abc/out-0.png")

    assert public == private == REPLAY_PNG
    assert "Authorization" not in live.requests[0].headers
    assert live.requests[1].headers["Authorization"] == "Bearer r8_test_token"


def test_replicate_upload_input_is_multipart_and_returns_its_url(live):
    live.script("POST", "/v1/files", "replicate/file_upload")

    url = ReplicateProvider().upload_input(FLUX, b"\x89PNG reference", "image/png")

    [sent] = live.requests
    assert sent.headers["Content-Type"].startswith("multipart/form-data; boundary=")
    assert b'name="content"; filename="input.png"' in sent.body
    assert b"\x89PNG reference" in sent.body
    assert url == body_of("replicate/file_upload")["urls"]["get"]


@pytest.mark.parametrize(
    ("answer", "kind", "unknown", "retry_after"),
    [
        ("replicate/error_422_invalid_input", ErrorClass.INVALID_INPUT, False, None),
        ("replicate/error_401_unauthenticated", ErrorClass.AUTH, False, None),
        ("replicate/error_402_insufficient_credit", ErrorClass.UNAVAILABLE, False, None),
        ("replicate/error_404_not_found", ErrorClass.UNAVAILABLE, False, None),
        ("replicate/error_429_throttled", ErrorClass.RATE_LIMITED, False, 6.0),
        ("replicate/error_500_internal", ErrorClass.SERVER_ERROR, True, None),
    ],
    ids=["422", "401", "402", "404", "429", "500"],
)
def test_replicate_errors_keep_their_class_and_words(live, answer, kind, unknown, retry_after):
    live.script("POST", f"/v1/models/{FLUX}/predictions", answer)

    with pytest.raises(ProviderError) as raised:
        submit(ReplicateProvider())

    assert raised.value.kind == kind
    assert raised.value.message == body_of(answer)["detail"].strip()
    assert raised.value.status == fixture(answer)["status"]
    assert raised.value.outcome_unknown is unknown
    assert raised.value.retry_after == retry_after


def test_replicate_submit_dropped_is_network_with_unknown_outcome(live):
    live.script("POST", f"/v1/models/{FLUX}/predictions", DROP)

    with pytest.raises(ProviderError) as raised:
        submit(ReplicateProvider())

    assert (raised.value.kind, raised.value.outcome_unknown) == (ErrorClass.NETWORK, True)


# Replicate list reconciliation. The fixture listing (newest first): page 1 holds a different prompt
# (09:41:20), the same input on SDXL (09:41:15) and another aspect ratio (09:41:11); page 2 the prediction
# we made (09:41:07.512) and an identical one from 09:38:40.
SUBMITTED_AT = timestamp("2025-06-12T09:41:07.300Z")


def test_replicate_lookup_finds_the_match_on_the_second_page(live):
    live.script("GET", "/v1/predictions", "replicate/predictions_page_1", "replicate/predictions_page_2")

    found = lookup(ReplicateProvider(), submitted_at=SUBMITTED_AT)

    assert found is not None
    assert (found.upstream_id, found.status) == (PREDICTION_ID, "running")
    first, second = live.requests
    assert first.query == ""
    # `next` pointed at api.replicate.com: followed on our own base URL, with the same token.
    assert second.query == "cursor=cD0yMDI1LTA2LTEyKzA5JTNBNDElM0EwMi4wMDAwMDAlMkIwMCUzQTAw"
    assert second.headers["Authorization"] == "Bearer r8_test_token"


def test_replicate_lookup_matches_the_version_when_named(live):
    live.script("GET", "/v1/predictions", "replicate/predictions_page_1", "replicate/predictions_page_2",
                "replicate/predictions_page_1", "replicate/predictions_page_2")
    provider = ReplicateProvider()

    found = lookup(provider, f"{FLUX}:{FLUX_VERSION}", submitted_at=SUBMITTED_AT)
    other_version = lookup(provider, f"{FLUX}:0123456789abcdef", submitted_at=SUBMITTED_AT)

    assert found.upstream_id == PREDICTION_ID
    assert other_version is None


def test_replicate_lookup_ignores_older_predictions(live):
    # Submitted 62 s after our prediction was created: it, and the identical older one, are too old.
    live.script("GET", "/v1/predictions", "replicate/predictions_page_1", "replicate/predictions_page_2")

    found = lookup(ReplicateProvider(), submitted_at=timestamp("2025-06-12T09:42:09.600Z"))

    assert found is None
    assert len(live.requests) == 2  # stopped at the first prediction older than the window


def test_replicate_lookup_returns_none_when_absent_and_stops_paging(live):
    page_2 = fixture("replicate/predictions_page_2")
    page_2["body"]["results"] = [p for p in page_2["body"]["results"] if p["id"] != PREDICTION_ID]
    assert page_2["body"]["next"]  # there is a third page; reaching older predictions must stop the search
    live.script("GET", "/v1/predictions", "replicate/predictions_page_1", page_2)

    found = lookup(ReplicateProvider(), submitted_at=SUBMITTED_AT)

    assert found is None
    assert len(live.requests) == 2


def test_replicate_lookup_ignores_other_inputs_and_web_predictions(live):
    page_2 = fixture("replicate/predictions_page_2")
    page_2["body"]["results"][0]["source"] = "web"
    live.script("GET", "/v1/predictions", "replicate/predictions_page_1", page_2)

    assert lookup(ReplicateProvider(), submitted_at=SUBMITTED_AT) is None
    # Page 1's newest prediction holds this prompt and aspect ratio plus output_format: a listed input
    # that merely contains ours is not ours; the input must be equal.
    live.script("GET", "/v1/predictions", "replicate/predictions_page_1", "replicate/predictions_page_2")
    assert lookup(ReplicateProvider(), submitted_at=SUBMITTED_AT, prompt="a harbour at night",
                  params={"aspect_ratio": "16:9"}) is None


def test_replicate_lookup_without_next_page_is_absent(live):
    page = fixture("replicate/predictions_page_1")
    page["body"]["next"] = None
    live.script("GET", "/v1/predictions", page)

    assert lookup(ReplicateProvider(), submitted_at=SUBMITTED_AT) is None


# -- replay: REAL_PROVIDERS off -----------------------------------------------------------------------


@pytest.fixture
def replay_settings(settings):
    settings.REAL_PROVIDERS = False
    settings.ANTHROPIC_API_KEY = settings.OPENAI_API_KEY = settings.REPLICATE_API_TOKEN = ""
    settings.ANTHROPIC_BASE_URL = UNROUTABLE
    settings.OPENAI_BASE_URL = UNROUTABLE + "/v1"
    settings.REPLICATE_BASE_URL = UNROUTABLE
    return settings


def test_replay_answers_every_adapter_without_network(replay_settings, no_network):
    anthropic, openai, replicate = AnthropicProvider(), OpenAICompatibleProvider(), ReplicateProvider()

    message = complete(anthropic, messages=[{"role": "user", "content": "Chapter 3: pricing"}])
    again = complete(anthropic, messages=[{"role": "user", "content": "Chapter 3: pricing"}])
    chat = complete(openai, model="gpt-4.1-mini")
    image_url = replicate.upload_input(FLUX, b"reference bytes", "image/png")
    submission = submit(replicate, inputs=[image_url])
    polled = replicate.poll(FLUX, submission.upstream_id)
    payload = replicate.fetch(polled.output_url)
    replicate.cancel(FLUX, submission.upstream_id)
    found = lookup(replicate, submitted_at=SUBMITTED_AT)

    assert no_network == []
    assert message == again  # deterministic
    assert "Chapter 3: pricing" in message.text and message.stop_reason == "end_turn"
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    assert message.usage.cache_read_tokens == message.usage.cache_write_tokens == 0
    assert chat.text and chat.stop_reason == "stop" and chat.usage.output_tokens > 0
    assert image_url.startswith(UNROUTABLE + "/v1/files/")
    assert submission.status == "running"  # starting...
    assert (polled.status, polled.content_type) == ("succeeded", "image/png")  # ...succeeded after one poll
    assert polled.usage.units > 0
    assert payload == REPLAY_PNG and payload.startswith(b"\x89PNG\r\n\x1a\n")
    assert found is None  # an empty account: nothing to reconcile
    assert submit(replicate, inputs=[image_url]).upstream_id == submission.upstream_id


def test_replay_caps_output_at_max_tokens(replay_settings, no_network):
    completion = complete(AnthropicProvider(), max_tokens=5)
    chat = complete(OpenAICompatibleProvider(), max_tokens=5)

    assert (completion.stop_reason, completion.usage.output_tokens, len(completion.text)) == ("max_tokens", 5, 20)
    assert (chat.stop_reason, chat.usage.output_tokens) == ("length", 5)


def test_replay_never_touches_the_real_session_for_the_same_url(settings, server):
    settings.ANTHROPIC_BASE_URL = server.url
    settings.ANTHROPIC_API_KEY = "sk-ant-test-key"
    settings.REAL_PROVIDERS = False
    provider = AnthropicProvider()

    complete(provider)
    assert server.requests == []  # answered from fixtures

    settings.REAL_PROVIDERS = True  # same thread, same base URL: now the call goes out
    server.script("POST", "/v1/messages", "anthropic/message")
    assert complete(provider).upstream_id == "msg_01Hk9zQyR3bVnE8sPjGx4fT2"
    assert len(server.requests) == 1


def test_mount_replay_on_a_session(no_network):
    session = requests.Session()
    mount_replay(session, UNROUTABLE)

    ok = session.post(f"{UNROUTABLE}/v1/messages", json={"model": "claude-x", "max_tokens": 100,
                                                         "messages": [{"role": "user", "content": "hi"}]})
    bad = session.post(f"{UNROUTABLE}/v1/messages", json={"model": "claude-x", "messages": []})
    created = session.post(f"{UNROUTABLE}/v1/models/{FLUX}/predictions", json={"input": {"prompt": "p"}})
    media = session.get("https://replicate.delivery/replay/abc/out-0.png")

    assert no_network == []
    assert ok.status_code == 200 and ok.json()["type"] == "message" and ok.json()["model"] == "claude-x"
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    assert created.status_code == 201 and created.json()["status"] == "starting"
    assert created.json()["urls"]["get"] == f"{UNROUTABLE}/v1/predictions/{created.json()['id']}"
    assert media.content == REPLAY_PNG and media.headers["content-type"] == "image/png"


def test_fixtures_are_recorded_responses():
    # Each provider's recorded answers are in its own folder (executor/providers/<package>/fixtures/).
    files = sorted(path for spec in PROVIDERS for path in fixtures_dir(spec.package).glob("*.json"))
    assert len(files) >= 25
    for path in files:
        recorded = json.loads(path.read_text())
        assert set(recorded) == {"status", "headers", "body"}, path
        assert 200 <= recorded["status"] < 600
        assert all(name == name.lower() for name in recorded["headers"]), path
    assert (PROVIDERS_DIR / "FIXTURES.md").exists()


# -- REAL_PROVIDERS switch ----------------------------------------------------------------------------


@pytest.fixture
def no_keys(settings):
    settings.ANTHROPIC_API_KEY = settings.OPENAI_API_KEY = settings.REPLICATE_API_TOKEN = ""
    settings.OPENAI_BASE_URL = real.DEFAULT_OPENAI_BASE_URL
    return settings


def test_real_providers_on_without_any_key_refuses_to_start(no_keys):
    no_keys.REAL_PROVIDERS = True

    with pytest.raises(ImproperlyConfigured) as raised:
        real.check_real_providers()

    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "REPLICATE_API_TOKEN", "REAL_PROVIDERS"):
        assert name in str(raised.value)


def test_real_providers_off_or_with_a_key_starts(no_keys):
    no_keys.REAL_PROVIDERS = False
    assert real.check_real_providers() == set()

    no_keys.REAL_PROVIDERS = True
    no_keys.REPLICATE_API_TOKEN = "r8_x"
    assert real.check_real_providers() == {"replicate"}
    assert real.configured_providers() == {"replicate"}


def test_keyless_local_openai_server_counts_as_usable(no_keys):
    no_keys.REAL_PROVIDERS = True
    no_keys.OPENAI_BASE_URL = "http://127.0.0.1:8080/v1"

    assert real.check_real_providers() == {"openai", "openai-images"}  # both speak to that server
    assert real.configured_providers() == set()


def test_provider_is_usable(no_keys):
    no_keys.REAL_PROVIDERS = False
    assert all(real.provider_is_usable(name) for name in ("anthropic", "openai", "replicate"))
    assert real.real_providers_on() is False

    no_keys.REAL_PROVIDERS = True
    no_keys.ANTHROPIC_API_KEY = "sk-ant-x"
    assert real.real_providers_on() is True
    assert real.provider_is_usable("anthropic") is True
    assert real.provider_is_usable("openai") is False
    assert real.provider_is_usable("replicate") is False
    assert real.provider_is_usable("sandbox") is True  # not a real provider: not governed by the switch

    no_keys.OPENAI_BASE_URL = "http://127.0.0.1:11434/v1"  # Ollama, keyless
    assert real.provider_is_usable("openai") is True


# --- transport failures: never sent, or sent with no answer ------------------------------------------------


def test_a_refused_connection_is_known_never_sent_and_a_dropped_one_is_unknown():
    # A submit that never connected cannot have been accepted: a blind render need not wait for a person
    # (the storm's dead sandbox once made dozens of them `uncertain`). One that connected and got no
    # answer may have been accepted: its outcome stays unknown.
    import threading

    from executor.providers import http as provider_http

    closed = free_port()  # nothing listens there
    with pytest.raises(ProviderError) as refused:
        provider_http.send("POST", f"http://127.0.0.1:{closed}/v1/generations", base_url=f"http://127.0.0.1:{closed}",
                           json={})
    assert (refused.value.never_sent, refused.value.outcome_unknown) == (True, False)

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def read_then_hang_up():
        conn, _ = server.accept()
        conn.recv(65536)  # the request arrived
        conn.close()  # and no answer

    threading.Thread(target=read_then_hang_up, daemon=True).start()
    port = server.getsockname()[1]
    with pytest.raises(ProviderError) as dropped:
        provider_http.send("POST", f"http://127.0.0.1:{port}/v1/generations", base_url=f"http://127.0.0.1:{port}",
                           json={})
    server.close()
    assert (dropped.value.never_sent, dropped.value.outcome_unknown) == (False, True)
