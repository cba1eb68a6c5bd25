"""Adapter for OpenAI's image generation (`POST {OPENAI_BASE_URL}/images/generations`), a MediaProvider.

The call is synchronous: one request, whose answer is the finished image. The GPT image models answer it
as base64 in the body (`data[0].b64_json`); dall-e-3 answers a URL, valid for 60 minutes, unless asked for
`response_format: b64_json`. So `submit` answers a Submission already `succeeded`, with the decoded bytes
in `output` (or the URL in `output_url`), and there is never anything to poll.

OpenAI takes no idempotency key here (its own client sends none) and keeps nothing an earlier image can
be found by, so a reply lost after the request went out is an unknown outcome that a person resolves. It
is never resubmitted by rule: one image costs up to $0.25 (PRICES).

Models are named as OpenAI names them (`gpt-image-1`, `gpt-image-1-mini`, `dall-e-3`); the body is
`{**params, "model", "prompt", "n": 1}`: payonce's own fields are set after the job's parameters, so none
can replace them (a `model` parameter once sent gpt-image-1 high, billed as the mini model). payonce makes
one output per job, so `n` is always 1. Reference images are not taken: editing from references is
OpenAI's other endpoint (`POST /images/edits`, multipart), which this adapter does not call.

The key (OPENAI_API_KEY) goes only to OPENAI_BASE_URL, the same settings as the chat adapter's.
"""

import base64
import binascii
import hashlib
from dataclasses import dataclass
from decimal import Decimal

from executor.providers import http, openai_compat, real
from executor.providers.base import (
    Capabilities,
    ErrorClass,
    PollResult,
    ProviderError,
    Submission,
    Usage,
    WorkStatus,
)

# No key, no lookup, nothing to cancel, answered in one call. OpenAI's error codes say a 429 is a rate
# limit or an empty balance: a refusal. They say nothing of billing for any 5xx, and a 500 reads "the
# server had an error while processing your request": the image may have been made and billed. So every
# 5xx stays an unknown outcome, held for a person.
CAPABILITIES = Capabilities(idempotency_key=False, lookup=False, asynchronous=False, cancel=False,
                            unpaid_statuses=frozenset({429}))

# An image of high quality takes a minute or more to make, and nothing comes back before it is whole. A
# reply cut short was paid for and is then held for a person, so the wait is long (OpenAI's own client
# waits ten minutes).
IMAGE_READ_TIMEOUT_S = 300.0

# Codes of a 400 that refuses the content: the GPT image models' moderation (on the prompt, or on the
# image once made) and dall-e-3's safety system. The other codes are read as the chat adapter reads them.
_REFUSAL_CODES = {"moderation_blocked", "content_policy_violation"}
# A 400 that is an empty account, not a bad request (dall-e-3's billing limit).
_UNAVAILABLE_CODES = {"billing_hard_limit_reached"}

_CONTENT_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
# What the bytes say they are, whatever the answer says: (offset, signature, content type).
_SIGNATURES = ((0, b"\x89PNG\r\n\x1a\n", "image/png"), (0, b"\xff\xd8\xff", "image/jpeg"),
               (8, b"WEBP", "image/webp"))


# -- what each model takes, and what it costs ----------------------------------------------------------


@dataclass(frozen=True)
class Declared:
    """A parameter a model takes: its JSON type ("string" or "integer") and its allowed values or
    inclusive bounds."""

    name: str
    type: str
    choices: tuple[str, ...] | None = None
    minimum: int | None = None
    maximum: int | None = None


# OpenAI's images reference (the request of `images.generate`). `n` is payonce's own (always 1, one output
# per job: OpenAIImagesProvider.own_fields), declared here only as the one value payonce sends, so a job
# that always said `"n": 1` is still taken; `stream` and `partial_images` are left out on purpose: a
# streamed answer is not one JSON body.
_GPT_IMAGE_PARAMS = (
    Declared("size", "string", ("1024x1024", "1536x1024", "1024x1536", "auto")),
    Declared("quality", "string", ("low", "medium", "high", "auto")),
    Declared("background", "string", ("transparent", "opaque", "auto")),  # transparent: png or webp only
    Declared("moderation", "string", ("low", "auto")),
    Declared("output_format", "string", ("png", "jpeg", "webp")),
    Declared("output_compression", "integer", minimum=0, maximum=100),  # jpeg and webp only
    Declared("user", "string"),  # an end-user id, for OpenAI's abuse monitoring
    Declared("n", "integer", minimum=1, maximum=1),  # payonce's own (always 1), taken as 1 as it always was
)
_DALL_E_3_PARAMS = (
    Declared("size", "string", ("1024x1024", "1792x1024", "1024x1792")),
    Declared("quality", "string", ("standard", "hd")),
    Declared("style", "string", ("vivid", "natural")),
    Declared("response_format", "string", ("url", "b64_json")),
    Declared("user", "string"),
    Declared("n", "integer", minimum=1, maximum=1),
)
PARAMS: dict[str, tuple[Declared, ...]] = {
    "gpt-image-1": _GPT_IMAGE_PARAMS,
    "gpt-image-1-mini": _GPT_IMAGE_PARAMS,
    "dall-e-3": _DALL_E_3_PARAMS,
}

# What OpenAI uses for a parameter left out. `auto` lets OpenAI choose quality (and, for the GPT image
# models, size) after the call: priced as the dearest it could choose. dall-e-3's own reference gave
# `standard` as its default quality; the current one gives `auto` for every model, so an omitted
# dall-e-3 quality is priced as hd.
DEFAULTS: dict[str, dict] = {
    "gpt-image-1": {"size": "auto", "quality": "auto", "background": "auto", "moderation": "auto",
                    "output_format": "png", "output_compression": 100},
    "gpt-image-1-mini": {"size": "auto", "quality": "auto", "background": "auto", "moderation": "auto",
                         "output_format": "png", "output_compression": 100},
    "dall-e-3": {"size": "1024x1024", "quality": "auto", "style": "vivid", "response_format": "url"},
}

# Dollars per image, by (quality, size), as OpenAI publishes them, read on PRICES_READ. For the GPT image
# models this is the image's output tokens; the prompt's text tokens are billed on top (TEXT_INPUT_PER_MTOK).
PRICES_READ = "2026-12-03"
PRICES: dict[str, dict[tuple[str, str], Decimal]] = {
    "gpt-image-1": {
        ("low", "1024x1024"): Decimal("0.011"), ("low", "1024x1536"): Decimal("0.016"),
        ("low", "1536x1024"): Decimal("0.016"),
        ("medium", "1024x1024"): Decimal("0.042"), ("medium", "1024x1536"): Decimal("0.063"),
        ("medium", "1536x1024"): Decimal("0.063"),
        ("high", "1024x1024"): Decimal("0.167"), ("high", "1024x1536"): Decimal("0.25"),
        ("high", "1536x1024"): Decimal("0.25"),
    },
    "gpt-image-1-mini": {
        ("low", "1024x1024"): Decimal("0.005"), ("low", "1024x1536"): Decimal("0.006"),
        ("low", "1536x1024"): Decimal("0.006"),
        ("medium", "1024x1024"): Decimal("0.011"), ("medium", "1024x1536"): Decimal("0.015"),
        ("medium", "1536x1024"): Decimal("0.015"),
        ("high", "1024x1024"): Decimal("0.036"), ("high", "1024x1536"): Decimal("0.052"),
        ("high", "1536x1024"): Decimal("0.052"),
    },
    "dall-e-3": {  # a flat price per image: no tokens
        ("standard", "1024x1024"): Decimal("0.04"), ("standard", "1024x1792"): Decimal("0.08"),
        ("standard", "1792x1024"): Decimal("0.08"),
        ("hd", "1024x1024"): Decimal("0.08"), ("hd", "1024x1792"): Decimal("0.12"),
        ("hd", "1792x1024"): Decimal("0.12"),
    },
}
# Dollars per million tokens where OpenAI bills tokens: the prompt's text (input) and the image (output;
# what PRICES rounds per image). A generation has no image input tokens.
TEXT_INPUT_PER_MTOK = {"gpt-image-1": Decimal("5"), "gpt-image-1-mini": Decimal("2")}
IMAGE_OUTPUT_PER_MTOK = {"gpt-image-1": Decimal("40"), "gpt-image-1-mini": Decimal("8")}


def price_key(model: str, params: dict | None) -> tuple[str, str]:
    """(quality, size) a call on `model` with `params` is priced by, OpenAI's defaults filled in for what is
    left out or null (`auto` stays `auto`)."""
    params, defaults = params or {}, DEFAULTS.get(model, {})
    return (params.get("quality") or defaults.get("quality", "auto"),
            params.get("size") or defaults.get("size", "auto"))


def image_price(model: str, params: dict | None) -> Decimal | None:
    """The most one image on `model` with `params` can cost by the per-image table: where quality or size
    is `auto`, the dearest OpenAI could pick. None: not in the table (unpriced, never guessed)."""
    table = PRICES.get(model)
    if table is None:
        return None
    quality, size = price_key(model, params)
    found = [price for (q, s), price in table.items() if quality in ("auto", q) and size in ("auto", s)]
    return max(found) if found else None


def worst_case_usd(model: str, params: dict | None, prompt: str) -> Decimal | None:
    """The most one call can cost: the image, plus the prompt's text tokens where they are billed (a
    prompt has at most as many tokens as UTF-8 bytes)."""
    price = image_price(model, params)
    if price is None:
        return None
    rate = TEXT_INPUT_PER_MTOK.get(model, Decimal(0))
    return price + Decimal(len(prompt.encode())) * rate / Decimal(1_000_000)


# -- the adapter ---------------------------------------------------------------------------------------


class OpenAIImagesProvider(openai_compat.OpenAIAdapter):
    # Not "openai": that name is the chat adapter's (`openai/<model>` stays a chat model).
    name = "openai-images"
    capabilities = CAPABILITIES
    # The fields payonce sets in a generation (request_body): a job parameter may not be named like one
    # (executor.registry.input_problems), and request_body sets them after the parameters.
    own_fields = ("model", "prompt", "n")

    def _timeout(self) -> tuple[float, float]:
        connect, read = real.llm_timeout(self.read_timeout_s)
        if self.read_timeout_s is None:
            read = max(read, IMAGE_READ_TIMEOUT_S)
        return connect, read

    def upload_input(self, model: str, payload: bytes, content_type: str) -> str:
        raise ProviderError(ErrorClass.INVALID_INPUT,
                            "OpenAI's image generation takes no reference images (editing from references is "
                            "its /images/edits endpoint, which this adapter does not call)")

    def submit(self, model: str, *, upstream_key: str, prompt: str, params: dict, metadata: dict,
               inputs: list[str]) -> Submission:
        # Neither upstream_key nor metadata goes out: OpenAI keeps no key and no metadata on an image.
        if inputs:
            raise ProviderError(ErrorClass.INVALID_INPUT, "OpenAI's image generation takes no reference images")
        body = request_body(model, prompt, params)
        replaying = real.replaying(self.replay)
        response = real.send("POST", f"{self.base_url}/images/generations", base_url=self.base_url,
                             replay=replaying, headers=self._headers(replaying), json=body, timeout=self._timeout())
        if response.status_code >= 400:
            raise error_from(response)
        return submission(http.json_answer(response), response.headers, body)

    def poll(self, model: str, upstream_id: str) -> PollResult:
        # The image came back with the submit; OpenAI keeps nothing to ask about it afterwards.
        raise ProviderError(ErrorClass.SERVER_ERROR,
                            f"OpenAI's image generation is synchronous: nothing to poll for {upstream_id}",
                            outcome_unknown=True)

    def lookup(self, model: str, *, upstream_key: str, metadata: dict, prompt: str, params: dict,
               submitted_at: float, inputs: list[str] | None = None) -> Submission | None:
        # Absence can never be proven, so a lost reply stays unknown: never None.
        raise ProviderError(ErrorClass.SERVER_ERROR,
                            "OpenAI's image generation keeps nothing an earlier image can be looked up by",
                            outcome_unknown=True)

    def cancel(self, model: str, upstream_id: str) -> None:
        # By the time there is an id the image is made and billed. Saying so rather than doing nothing keeps
        # a caller from believing a cancel happened.
        raise ProviderError(ErrorClass.INVALID_INPUT,
                            "cannot cancel: OpenAI's image generation answers the finished image")

    def fetch(self, url: str) -> bytes:
        # dall-e-3's URLs are public, signed links on OpenAI's blob storage: the key goes only to the API.
        replaying = real.replaying(self.replay)
        headers = self._headers(replaying) if url.startswith(self.base_url + "/") else {}
        response = real.send("GET", url, base_url=self.base_url, replay=replaying, headers=headers)
        if response.status_code >= 400:
            raise error_from(response)
        return response.content


def request_body(model: str, prompt: str, params: dict | None) -> dict:
    """The JSON body of a generation: the job's parameters, then payonce's own fields over them (the model
    recorded and billed is the one sent). Refuses, before anything is sent, what would make more than one
    image or an answer that is not one JSON body."""
    params = dict(params or {})
    n = params.pop("n", 1)
    if isinstance(n, bool) or n != 1:
        raise ProviderError(ErrorClass.INVALID_INPUT, f"payonce makes one image per job: n must be 1, not {n!r}")
    if params.get("stream") or "partial_images" in params:
        raise ProviderError(ErrorClass.INVALID_INPUT, "a streamed answer is not taken: leave out stream and "
                                                      "partial_images")
    params.pop("stream", None)
    return {**params, "model": model, "prompt": prompt, "n": 1}


def submission(data: dict, headers, body: dict) -> Submission:
    """The finished image of an answer: its bytes (or URL), a deterministic id, the usage, and the body
    without its base64. A 2xx without a readable image was still paid for: an unknown outcome."""
    images = data.get("data")
    image = images[0] if isinstance(images, list) and images and isinstance(images[0], dict) else {}
    encoded, url = image.get("b64_json"), image.get("url")
    output = None
    if isinstance(encoded, str) and encoded:
        try:
            output = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            output = None
    if not output and not (isinstance(url, str) and url):
        raise ProviderError(ErrorClass.SERVER_ERROR, f"answer without an image: {str(_without_base64(data))[:300]}",
                            status=200, outcome_unknown=True)
    digest = hashlib.sha256(output if output else url.encode()).hexdigest()[:12]
    return Submission(
        upstream_id=headers.get("x-request-id") or f"{data.get('created', 0)}-{digest}",
        status=WorkStatus.SUCCEEDED,
        output=output,
        output_content_type=content_type_of(output, data.get("output_format") or body.get("output_format")),
        output_url=None if output else url,
        usage=usage_of(data.get("usage")),
        raw=_without_base64(data),
    )


def content_type_of(output: bytes | None, output_format: str | None) -> str:
    """What the bytes are by their signature, else what the answer (or the request) said; PNG when nothing
    says (the GPT image models' default, and what dall-e-3 makes)."""
    for offset, signature, content_type in _SIGNATURES:
        if output and output[offset:offset + len(signature)] == signature:
            return content_type
    return _CONTENT_TYPES.get(output_format or "png", "image/png")


def usage_of(usage) -> Usage:
    """One image made; the GPT image models also report their tokens (dall-e-3 reports none)."""
    usage = usage if isinstance(usage, dict) else {}
    return Usage(input_tokens=_count(usage.get("input_tokens")), output_tokens=_count(usage.get("output_tokens")),
                 units=1)


def _count(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _without_base64(data: dict) -> dict:
    """The answer as the journal keeps it: up to megabytes of base64 are the output, not its record."""
    images = data.get("data")
    if not isinstance(images, list):
        return dict(data)
    return {**data, "data": [{k: v for k, v in image.items() if k != "b64_json"} if isinstance(image, dict) else image
                             for image in images]}


def error_from(response) -> ProviderError:
    """OpenAI's `{"error": {"message", "type", "code"}}`, read as the chat adapter reads it, with the codes
    of image generation: moderation_blocked is refused, a billing limit is unavailable."""
    error = openai_compat.error_from(response)
    body = http.error_body(response).get("error")
    code = body.get("code") if isinstance(body, dict) else None
    if not error.outcome_unknown and code in _REFUSAL_CODES:
        error.kind = ErrorClass.REFUSED
    elif not error.outcome_unknown and code in _UNAVAILABLE_CODES:
        error.kind = ErrorClass.UNAVAILABLE
    return error

