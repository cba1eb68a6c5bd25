"""Adapter for Anthropic's Messages API (`POST /v1/messages`), a TextProvider.

Anthropic takes no caller-chosen request id and cannot be searched for an earlier call, so an unknown
outcome (a transport error, a 5xx, 529 overloaded) cannot be resolved: being a cheap per-chapter call,
it is resubmitted under a new upstream key (`resubmit_uncertain`) rather than held for a person.
Usage is reported with cache tokens apart: `input_tokens` already excludes them.
"""

import re


from executor.providers import http, real
from executor.providers.base import (
    CHEAP_LLM,
    Completion,
    ErrorClass,
    ProviderError,
    Usage,
    classify_http_error,
    parse_retry_after,
)

CAPABILITIES = CHEAP_LLM
API_VERSION = "2023-06-01"

# What each error type means for a 4xx (a 5xx is always an unknown outcome, whatever its type says).
_ERROR_CLASSES = {
    "authentication_error": ErrorClass.AUTH,
    "permission_error": ErrorClass.AUTH,
    "not_found_error": ErrorClass.UNAVAILABLE,
    "rate_limit_error": ErrorClass.RATE_LIMITED,
    "invalid_request_error": ErrorClass.INVALID_INPUT,
    "request_too_large": ErrorClass.INVALID_INPUT,
    # The account cannot pay: no retry of this model helps, but another provider may (fallback allowed).
    "billing_error": ErrorClass.UNAVAILABLE,
}
# A monthly spend limit answers 429 rate_limit_error, but waiting does not lift it until the next month.
_SPEND_LIMIT_CODES = {"enforced_spend_limit_reached"}
# An invalid_request_error that is a content-policy refusal rather than a malformed request.
_REFUSAL_WORDS = re.compile(r"usage polic|content polic|content filter|safety (system|filter)", re.IGNORECASE)


class AnthropicProvider(real.RealAdapter):
    """`read_timeout_s`: how long to wait for the answer (default: real.llm_timeout)."""

    name = "anthropic"
    capabilities = CAPABILITIES
    # The fields payonce sets in a call (executor.registry.input_problems refuses a parameter named like one).
    # No job parameter reaches `complete`: the whole body is payonce's.
    own_fields = ("model", "max_tokens", "messages", "system", "metadata")
    base_url_setting = "ANTHROPIC_BASE_URL"
    key_setting = "ANTHROPIC_API_KEY"

    def _headers(self, replaying: bool) -> dict:
        key = self.api_key
        if not key and not replaying:
            raise real.missing_key(self.name)
        headers = {"anthropic-version": API_VERSION, "content-type": "application/json"}
        if key:
            headers["x-api-key"] = key
        return headers

    def complete(self, model: str, *, system: str, messages: list[dict], max_tokens: int, upstream_key: str,
                 metadata: dict) -> Completion:
        # No idempotency key exists at Anthropic: upstream_key is not sent (it stays on our attempt row).
        body = {"model": model, "max_tokens": max_tokens, "messages": messages}
        if system:
            body["system"] = system
        job = (metadata or {}).get("payonce_job")
        if job:
            # Anthropic's only metadata field: an opaque id of the end user, for abuse reports.
            body["metadata"] = {"user_id": str(job)}
        replaying = real.replaying(self.replay)
        response = real.send("POST", f"{self.base_url}/v1/messages", base_url=self.base_url, replay=replaying,
                             headers=self._headers(replaying), json=body,
                             timeout=real.llm_timeout(self.read_timeout_s))
        if response.status_code >= 400:
            raise error_from(response)
        data = http.json_answer(response)
        usage = parse_usage(data.get("usage") or {})
        text = "".join(block.get("text", "") for block in data.get("content") or [] if block.get("type") == "text")
        stop_reason = data.get("stop_reason")
        if stop_reason == "refusal":
            # A 200 that refuses. It was paid for: the usage rides on the error for the attempt journal.
            error = ProviderError(ErrorClass.REFUSED, text or "the model refused to answer (stop_reason: refusal)",
                                  status=response.status_code)
            error.usage, error.upstream_id, error.raw = usage, data.get("id"), data
            raise error
        if "id" not in data or "content" not in data:
            raise ProviderError(ErrorClass.SERVER_ERROR, f"answer without id or content: {str(data)[:300]}",
                                status=response.status_code)
        return Completion(upstream_id=data["id"], text=text, stop_reason=stop_reason, usage=usage, raw=data)


def parse_usage(usage: dict) -> Usage:
    """Anthropic's input_tokens already excludes cache writes and reads, which it reports apart."""
    return Usage(
        input_tokens=usage.get("input_tokens") or 0,
        output_tokens=usage.get("output_tokens") or 0,
        cache_write_tokens=usage.get("cache_creation_input_tokens") or 0,
        cache_read_tokens=usage.get("cache_read_input_tokens") or 0,
    )


def error_from(response) -> ProviderError:
    """`{"type": "error", "error": {"type": ..., "message": ...}}` as a ProviderError of its class, with
    Anthropic's own message."""
    error = http.error_body(response).get("error")
    error = error if isinstance(error, dict) else {}
    error_type = error.get("type")
    message = error.get("message") or http.fallback_message(response)
    status = response.status_code
    refused = error_type == "invalid_request_error" and bool(_REFUSAL_WORDS.search(message))
    kind, unknown = classify_http_error(status, refused=refused)
    if not unknown and not refused:
        kind = _ERROR_CLASSES.get(error_type, kind)
        details = error.get("details") if isinstance(error.get("details"), dict) else {}
        if details.get("error_code") in _SPEND_LIMIT_CODES:
            kind = ErrorClass.UNAVAILABLE
    return ProviderError(kind, message, status=status, outcome_unknown=unknown,
                         retry_after=parse_retry_after(response.headers.get("retry-after")))
