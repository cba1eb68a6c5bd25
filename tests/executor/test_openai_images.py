"""OpenAI's image generation adapter over real HTTP against a local server replaying OpenAI's recorded wire
format, and its replay mode with no network at all.

No database: these tests talk only to tests.support.replay_server (or to nothing).
"""

import base64
import hashlib
from decimal import Decimal

import pytest

from executor.providers import real
from executor.providers.base import ErrorClass, ProviderError, Usage
from executor.providers.openai_images.adapter import (
    CAPABILITIES,
    DEFAULTS,
    IMAGE_READ_TIMEOUT_S,
    PARAMS,
    PRICES,
    OpenAIImagesProvider,
    image_price,
    price_key,
    worst_case_usd,
)
from executor.providers.replay import fixture
from tests.support.openai_images import PATH, PNG
from tests.support.replay_server import DROP, Delayed, ReplayServer

UNROUTABLE = "http://10.255.255.1:9"  # a private address nothing answers on
PROMPT = "a lighthouse at dusk"
METADATA = {"payonce_job": "3f1c2b9e-job", "payonce_attempt": 2, "upstream_key": "payonce-3f1c2b9e-job-2"}


@pytest.fixture
def server():
    with ReplayServer() as running:
        yield running
        assert running.unexpected == [], f"requests nothing was scripted for: {running.unexpected}"


@pytest.fixture
def live(settings, server):
    """REAL_PROVIDERS on, OpenAI pointed at the replay server, with a key (all read at call time)."""
    settings.REAL_PROVIDERS = True
    settings.OPENAI_API_KEY = "sk-proj-test-key"
    settings.OPENAI_BASE_URL = server.url + "/v1"
    return server


def submit(provider, model="gpt-image-1", *, prompt=PROMPT, params=None, inputs=()):
    params = {"size": "1024x1024", "quality": "medium"} if params is None else params
    return provider.submit(model, upstream_key=METADATA["upstream_key"], prompt=prompt, params=dict(params),
                           metadata=METADATA, inputs=list(inputs))


def answer_with(image: bytes, **body) -> dict:
    recorded = fixture("openai_images/images_generation")
    recorded["body"]["data"] = [{"b64_json": base64.b64encode(image).decode()}]
    recorded["body"].update(body)
    return recorded


def with_error(name: str, **changes) -> dict:
    recorded = fixture(name)
    recorded["body"]["error"].update(changes)
    return recorded


# -- capabilities ---------------------------------------------------------------------------------------


def test_capabilities_say_a_lost_reply_is_held_for_a_person():
    assert (CAPABILITIES.idempotency_key, CAPABILITIES.lookup, CAPABILITIES.asynchronous, CAPABILITIES.cancel,
            CAPABILITIES.resubmit_uncertain) == (False, False, False, False, False)
    # A 429 (and any other 4xx) is a refusal; no 5xx is documented as unbilled.
    assert [CAPABILITIES.answered_unpaid(status) for status in (400, 401, 429, 500, 502, 503, 504, None)] == [
        True, True, True, False, False, False, False, False]
    assert OpenAIImagesProvider.name == "openai-images"  # `openai/...` stays the chat adapter


# -- submit -----------------------------------------------------------------------------------------------


def test_request_shape_and_the_image_comes_back_decoded(live):
    live.script("POST", PATH, "openai_images/images_generation")

    submission = submit(OpenAIImagesProvider(), params={"size": "1024x1024", "quality": "medium",
                                                        "output_format": "png", "moderation": "low"})

    [sent] = live.requests
    assert (sent.method, sent.path) == ("POST", PATH)
    assert sent.headers["Authorization"] == "Bearer sk-proj-test-key"
    assert sent.json == {"model": "gpt-image-1", "prompt": PROMPT, "size": "1024x1024", "quality": "medium",
                         "output_format": "png", "moderation": "low", "n": 1}
    assert b"payonce" not in sent.body  # OpenAI keeps neither a key nor metadata on an image

    assert submission.status == "succeeded"
    assert submission.output == PNG and PNG.startswith(b"\x89PNG\r\n\x1a\n") and len(PNG) == 463
    assert submission.output_content_type == "image/png"
    assert submission.output_url is None
    assert submission.upstream_id == "req_5c1e9a7f3b2d4e6a8c0f1b3d5e7a9c2b"  # the x-request-id header
    assert submission.usage == Usage(input_tokens=17, output_tokens=1056, units=1)
    assert submission.cost_usd is None  # OpenAI quotes no cost: the rate card prices it
    # The journal keeps the answer without its base64, which is the output itself.
    assert submission.raw["data"] == [{}]
    assert submission.raw["usage"]["total_tokens"] == 1073 and submission.raw["created"] == 1752074012


def test_n_is_sent_as_one_and_anything_else_is_refused_before_sending(live):
    live.script("POST", PATH, "openai_images/images_generation")
    provider = OpenAIImagesProvider()

    submit(provider, params={"n": 1})
    for n in (2, 0, True, "1"):
        with pytest.raises(ProviderError) as raised:
            submit(provider, params={"n": n})
        assert raised.value.kind == ErrorClass.INVALID_INPUT
    for streamed in ({"stream": True}, {"partial_images": 2}):
        with pytest.raises(ProviderError) as raised:
            submit(provider, params=streamed)
        assert raised.value.kind == ErrorClass.INVALID_INPUT

    assert [r.json for r in live.requests] == [{"model": "gpt-image-1", "prompt": PROMPT, "n": 1}]


def test_an_answer_without_a_request_id_gets_a_deterministic_one(live):
    recorded = fixture("openai_images/images_generation")
    del recorded["headers"]["x-request-id"]
    live.script("POST", PATH, recorded, recorded)

    first, second = submit(OpenAIImagesProvider()), submit(OpenAIImagesProvider())

    assert first.upstream_id == second.upstream_id == f"1752074012-{hashlib.sha256(PNG).hexdigest()[:12]}"


@pytest.mark.parametrize(
    ("image", "output_format", "content_type"),
    [
        (b"\xff\xd8\xff\xe0\x00\x10JFIF\x00", "jpeg", "image/jpeg"),
        (b"RIFF\x24\x00\x00\x00WEBPVP8 ", "webp", "image/webp"),
        (b"\x89PNG\r\n\x1a\n\x00", "jpeg", "image/png"),  # the bytes say what they are
        (b"unrecognised bytes", "webp", "image/webp"),  # else what the answer says
    ],
    ids=["jpeg", "webp", "png-whatever-said", "said"],
)
def test_the_content_type_is_what_the_image_is(live, image, output_format, content_type):
    live.script("POST", PATH, answer_with(image, output_format=output_format))

    submission = submit(OpenAIImagesProvider(), params={"output_format": output_format})

    assert (submission.output, submission.output_content_type) == (image, content_type)


def test_dall_e_3_answers_a_url_and_no_bytes(live):
    live.script("POST", PATH, "openai_images/images_generation_url")

    submission = submit(OpenAIImagesProvider(), "dall-e-3",
                        params={"size": "1792x1024", "quality": "hd", "style": "natural"})

    assert live.requests[0].json == {"model": "dall-e-3", "prompt": PROMPT, "size": "1792x1024", "quality": "hd",
                                     "style": "natural", "n": 1}
    recorded = fixture("openai_images/images_generation_url")["body"]["data"][0]
    assert (submission.status, submission.output, submission.output_url) == ("succeeded", None, recorded["url"])
    assert submission.usage == Usage(units=1)  # dall-e-3 reports no tokens
    assert submission.raw["data"][0]["revised_prompt"] == recorded["revised_prompt"]


@pytest.mark.parametrize(
    "body",
    [{"created": 1752074012, "data": []}, {"created": 1752074012, "data": [{"b64_json": "not base64!"}]},
     {"created": 1752074012}],
    ids=["no-image", "bad-base64", "no-data"],
)
def test_a_2xx_without_a_readable_image_is_an_unknown_outcome(live, body):
    # OpenAI answered 200: the image may well have been made, and billed.
    live.script("POST", PATH, {"status": 200, "headers": {"content-type": "application/json"}, "body": body})

    with pytest.raises(ProviderError) as raised:
        submit(OpenAIImagesProvider())

    assert (raised.value.kind, raised.value.outcome_unknown) == (ErrorClass.SERVER_ERROR, True)


def test_references_are_refused_before_sending(live):
    provider = OpenAIImagesProvider()

    with pytest.raises(ProviderError) as uploaded:
        provider.upload_input("gpt-image-1", b"\x89PNG reference", "image/png")
    with pytest.raises(ProviderError) as submitted:
        submit(provider, inputs=["file-abc"])

    assert uploaded.value.kind == submitted.value.kind == ErrorClass.INVALID_INPUT
    assert "/images/edits" in uploaded.value.message
    assert live.requests == []


# -- errors -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "kind", "unknown", "retry_after"),
    [
        ("openai_images/images_error_400_moderation_blocked", ErrorClass.REFUSED, False, None),
        ("openai_images/images_error_400_content_policy", ErrorClass.REFUSED, False, None),
        ("openai_images/images_error_400_invalid_size", ErrorClass.INVALID_INPUT, False, None),
        (with_error("openai_images/images_error_400_invalid_size", code="billing_hard_limit_reached",
                    message="Billing hard limit has been reached"), ErrorClass.UNAVAILABLE, False, None),
        ("openai_images/images_error_401_invalid_api_key", ErrorClass.AUTH, False, None),
        (with_error("openai/error_404_model_not_found", message="The model `dall-e-3` does not exist or you do not "
                                                                "have access to it."),
         ErrorClass.UNAVAILABLE, False, None),
        ("openai_images/images_error_429_rate_limit", ErrorClass.RATE_LIMITED, False, 12.0),
        ("openai_images/images_error_429_insufficient_quota", ErrorClass.UNAVAILABLE, False, None),
        ("openai_images/images_error_500_server", ErrorClass.SERVER_ERROR, True, None),
        ("openai_images/images_error_503_overloaded", ErrorClass.SERVER_ERROR, True, None),
    ],
    ids=["400-moderation", "400-content-policy", "400-invalid", "400-billing", "401", "404-retired", "429",
         "429-quota", "500", "503"],
)
def test_errors_keep_their_class_and_words(live, answer, kind, unknown, retry_after):
    live.script("POST", PATH, answer)
    recorded = fixture(answer) if isinstance(answer, str) else answer

    with pytest.raises(ProviderError) as raised:
        submit(OpenAIImagesProvider())

    assert raised.value.kind == kind
    assert raised.value.message == recorded["body"]["error"]["message"]
    assert raised.value.status == recorded["status"]
    assert raised.value.outcome_unknown is unknown
    assert raised.value.retry_after == retry_after
    # An unknown outcome is never declared unpaid: with no key and no lookup, a person decides.
    assert CAPABILITIES.answered_unpaid(raised.value.status) is not unknown


def test_a_dropped_connection_is_network_with_an_unknown_outcome(live):
    live.script("POST", PATH, DROP)

    with pytest.raises(ProviderError) as raised:
        submit(OpenAIImagesProvider())

    assert (raised.value.kind, raised.value.outcome_unknown, raised.value.never_sent) == (
        ErrorClass.NETWORK, True, False)
    assert len(live.requests) == 1  # the request arrived: the image may have been made and billed


def test_no_answer_in_time_is_a_timeout_with_an_unknown_outcome(live):
    live.script("POST", PATH, Delayed(1.5, "openai_images/images_generation"))

    with pytest.raises(ProviderError) as raised:
        submit(OpenAIImagesProvider(read_timeout_s=0.3))

    assert (raised.value.kind, raised.value.outcome_unknown) == (ErrorClass.TIMEOUT, True)


def test_an_image_is_waited_for_longer_than_a_text(live, monkeypatch):
    from executor.providers import http

    timeouts = []
    real_send = http.send

    def spy(*args, **kwargs):
        timeouts.append(kwargs.get("timeout"))
        return real_send(*args, **kwargs)

    monkeypatch.setattr(http, "send", spy)
    live.script("POST", PATH, "openai_images/images_generation")

    submit(OpenAIImagesProvider())

    [(connect, read)] = timeouts
    assert read == max(real.llm_timeout()[1], IMAGE_READ_TIMEOUT_S) >= 300


def test_without_a_key_in_real_mode_nothing_is_sent(settings, no_network):
    settings.REAL_PROVIDERS = True
    settings.OPENAI_API_KEY = ""
    settings.OPENAI_BASE_URL = real.DEFAULT_OPENAI_BASE_URL

    with pytest.raises(ProviderError) as raised:
        submit(OpenAIImagesProvider())

    assert raised.value.kind == ErrorClass.AUTH and "OPENAI_API_KEY" in raised.value.message
    assert no_network == []


# -- poll, lookup, cancel, fetch ----------------------------------------------------------------------------


def test_poll_and_lookup_are_unknown_and_cancel_is_refused_without_a_call(live):
    provider = OpenAIImagesProvider()

    with pytest.raises(ProviderError) as polled:
        provider.poll("gpt-image-1", "req_5c1e9a7f3b2d4e6a8c0f1b3d5e7a9c2b")
    with pytest.raises(ProviderError) as looked_up:
        provider.lookup("gpt-image-1", upstream_key=METADATA["upstream_key"], metadata=METADATA, prompt=PROMPT,
                        params={}, submitted_at=0.0)
    with pytest.raises(ProviderError) as cancelled:
        provider.cancel("gpt-image-1", "req_5c1e9a7f3b2d4e6a8c0f1b3d5e7a9c2b")

    assert (polled.value.kind, polled.value.outcome_unknown) == (ErrorClass.SERVER_ERROR, True)
    assert "synchronous" in polled.value.message
    assert (looked_up.value.kind, looked_up.value.outcome_unknown) == (ErrorClass.SERVER_ERROR, True)
    assert (cancelled.value.kind, cancelled.value.outcome_unknown) == (ErrorClass.INVALID_INPUT, False)
    assert live.requests == []


def test_fetch_sends_the_key_only_to_the_api(live):
    media = {"status": 200, "headers": {"content-type": "image/png"}, "body": PNG}
    live.script("GET", "/private/img-abc.png", media)
    live.script("GET", "/v1/files/img-abc.png", media)
    provider = OpenAIImagesProvider()

    # Same server, other origin: stands for OpenAI's blob storage.
    public = provider.fetch(f"http://localhost:{live.port}/private/img-abc.png?se=2025-03-05T13%3A40%3A03Z&sig=x")
    private = provider.fetch(f"{live.url}/v1/files/img-abc.png")

    assert public == private == PNG
    assert "Authorization" not in live.requests[0].headers
    assert live.requests[0].query == "se=2025-03-05T13%3A40%3A03Z&sig=x"
    assert live.requests[1].headers["Authorization"] == "Bearer sk-proj-test-key"


def test_a_fetch_of_an_expired_link_fails(live):
    expired = {"status": 403, "headers": {"content-type": "application/xml"},
               "body": "<?xml version=\"1.0\"?><Error><Code>AuthenticationFailed</Code></Error>"}
    live.script("GET", "/private/img-abc.png", expired)

    with pytest.raises(ProviderError) as raised:
        OpenAIImagesProvider().fetch(f"http://localhost:{live.port}/private/img-abc.png")

    assert raised.value.status == 403 and "AuthenticationFailed" in raised.value.message


# -- replay: REAL_PROVIDERS off -------------------------------------------------------------------------------


@pytest.fixture
def replay_settings(settings):
    settings.REAL_PROVIDERS = False
    settings.OPENAI_API_KEY = ""
    settings.OPENAI_BASE_URL = UNROUTABLE + "/v1"
    return settings


def test_replay_answers_an_image_from_the_prompt_without_network(replay_settings, no_network):
    provider = OpenAIImagesProvider()

    first = submit(provider)
    again = submit(provider)
    other = submit(provider, prompt="a harbour at night")
    dall_e = submit(provider, "dall-e-3", params={"quality": "hd"})

    assert no_network == []
    assert first == again  # deterministic
    assert first.output != other.output and first.upstream_id != other.upstream_id
    assert first.output.startswith(b"\x89PNG\r\n\x1a\n") and first.output_content_type == "image/png"
    assert first.status == "succeeded" and first.output_url is None
    assert first.usage == Usage(input_tokens=5, output_tokens=1056, units=1)  # 20 characters, about 4 a token
    assert (first.raw["quality"], first.raw["size"]) == ("medium", "1024x1024")
    assert dall_e.output.startswith(b"\x89PNG") and dall_e.usage == Usage(units=1)
    assert "usage" not in dall_e.raw and "output_format" not in dall_e.raw


def test_replay_refuses_a_call_without_a_prompt(replay_settings, no_network):
    with pytest.raises(ProviderError) as raised:
        submit(OpenAIImagesProvider(), prompt="")

    assert (raised.value.kind, raised.value.status, raised.value.outcome_unknown) == (
        ErrorClass.INVALID_INPUT, 400, False)
    assert "prompt" in raised.value.message


# -- what each model takes and costs --------------------------------------------------------------------------


def test_every_declared_choice_of_quality_and_size_has_a_price():
    for model, table in PRICES.items():
        declared = {param.name: param for param in PARAMS[model]}
        qualities = [q for q in declared["quality"].choices if q != "auto"]
        sizes = [s for s in declared["size"].choices if s != "auto"]
        assert set(table) == {(q, s) for q in qualities for s in sizes}, model
        assert set(DEFAULTS[model]) <= set(declared), model


@pytest.mark.parametrize(
    ("model", "params", "key", "price"),
    [
        ("gpt-image-1", {"quality": "low", "size": "1024x1024"}, ("low", "1024x1024"), "0.011"),
        ("gpt-image-1", {"quality": "high", "size": "1536x1024"}, ("high", "1536x1024"), "0.25"),
        ("gpt-image-1", {}, ("auto", "auto"), "0.25"),  # auto may pick the dearest: high, 1536x1024
        ("gpt-image-1", {"size": "1024x1024"}, ("auto", "1024x1024"), "0.167"),
        ("gpt-image-1-mini", {"quality": "medium", "size": "1024x1536"}, ("medium", "1024x1536"), "0.015"),
        ("gpt-image-1-mini", {}, ("auto", "auto"), "0.052"),
        ("dall-e-3", {"quality": "standard"}, ("standard", "1024x1024"), "0.04"),
        ("dall-e-3", {}, ("auto", "1024x1024"), "0.08"),  # an omitted quality may be hd
        ("dall-e-3", {"quality": None, "size": None}, ("auto", "1024x1024"), "0.08"),  # null: OpenAI's default
        ("dall-e-3", {"quality": "hd", "size": "1024x1792"}, ("hd", "1024x1792"), "0.12"),
    ],
)
def test_prices_and_the_worst_case_of_auto(model, params, key, price):
    assert price_key(model, params) == key
    assert image_price(model, params) == Decimal(price)


def test_unknown_models_and_sizes_are_unpriced_never_guessed():
    assert image_price("gpt-image-9", {}) is None
    assert image_price("gpt-image-1", {"size": "1792x1024"}) is None
    assert worst_case_usd("gpt-image-9", {}, PROMPT) is None


def test_the_worst_case_adds_the_prompts_text_tokens():
    prompt = "é" * 1000  # 2,000 UTF-8 bytes: at most 2,000 tokens
    assert worst_case_usd("gpt-image-1", {"quality": "high", "size": "1024x1536"}, prompt) == Decimal("0.26")
    assert worst_case_usd("gpt-image-1-mini", {}, prompt) == Decimal("0.056")
    assert worst_case_usd("dall-e-3", {"quality": "hd"}, prompt) == Decimal("0.08")  # no tokens billed
