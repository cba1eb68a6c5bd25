"""Adapter for any OpenAI-compatible chat completions server (`POST {OPENAI_BASE_URL}/chat/completions`):
OpenAI itself, or vLLM, llama.cpp, Ollama... pointed at by OPENAI_BASE_URL (which includes the /v1).

Like Anthropic it has no caller-chosen request id and no lookup, so an unknown outcome is resubmitted under
a new upstream key (`resubmit_uncertain`). OpenAI's `prompt_tokens` INCLUDES cached tokens; Usage splits
them out so `input_tokens` never counts a token twice.
"""


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

_REFUSAL_CODES = {"content_policy_violation", "content_filter"}
# Codes (or types) that say more than the status does, for a 4xx.
_ERROR_CLASSES = {
    "invalid_api_key": ErrorClass.AUTH,
    "model_not_found": ErrorClass.UNAVAILABLE,
    # 429 insufficient_quota: the account is out of credit. Retrying this model cannot help; another may.
    "insufficient_quota": ErrorClass.UNAVAILABLE,
    "rate_limit_exceeded": ErrorClass.RATE_LIMITED,
}


class OpenAIAdapter(real.RealAdapter):
    """What OpenAI's endpoints share: OPENAI_BASE_URL and OPENAI_API_KEY, and a bearer key that a local
    server (a non-default base URL) may go without (the chat adapter and the images one)."""

    base_url_setting = "OPENAI_BASE_URL"  # with its /v1
    key_setting = "OPENAI_API_KEY"

    def _headers(self, replaying: bool) -> dict:
        key = self.api_key
        if not key and not replaying and not real.openai_is_local(self.base_url):
            raise real.missing_key(self.name)
        # A local server runs keyless: send no Authorization header at all rather than "Bearer ".
        return {"Authorization": f"Bearer {key}"} if key else {}


class OpenAICompatibleProvider(OpenAIAdapter):
    name = "openai"
    capabilities = CAPABILITIES
    # The fields payonce sets in a call (executor.registry.input_problems refuses a parameter named like one).
    # No job parameter reaches `complete`: the whole body is payonce's.
    own_fields = ("model", "messages", "max_tokens")

    def complete(self, model: str, *, system: str, messages: list[dict], max_tokens: int, upstream_key: str,
                 metadata: dict) -> Completion:
        # No idempotency key or metadata at chat completions: upstream_key stays on our attempt row.
        chat = [{"role": "system", "content": system}] if system else []
        chat += [{**message, "content": flatten_content(message.get("content"))} for message in messages]
        body = {"model": model, "messages": chat, "max_tokens": max_tokens}
        replaying = real.replaying(self.replay)
        response = real.send("POST", f"{self.base_url}/chat/completions", base_url=self.base_url,
                             replay=replaying, headers=self._headers(replaying), json=body,
                             timeout=real.llm_timeout(self.read_timeout_s))
        if response.status_code >= 400:
            raise error_from(response)
        data = http.json_answer(response)
        usage = parse_usage(data.get("usage") or {})
        choices = data.get("choices") or []
        if not choices or not isinstance(choices[0], dict):
            raise ProviderError(ErrorClass.SERVER_ERROR, f"answer without choices: {str(data)[:300]}",
                                status=response.status_code)
        choice = choices[0]
        message = choice.get("message") or {}
        finish_reason = choice.get("finish_reason")
        if finish_reason == "content_filter" or message.get("refusal"):
            # A 200 that refuses. It was paid for: the usage rides on the error for the attempt journal.
            error = ProviderError(
                ErrorClass.REFUSED,
                message.get("refusal") or f"the answer was withheld (finish_reason: {finish_reason})",
                status=response.status_code,
            )
            error.usage, error.upstream_id, error.raw = usage, data.get("id"), data
            raise error
        return Completion(upstream_id=data.get("id") or "", text=flatten_content(message.get("content")) or "",
                          stop_reason=finish_reason, usage=usage, raw=data)


def flatten_content(content):
    """A list of text blocks (the Anthropic-style messages payonce passes around) becomes one string: every
    OpenAI-compatible server takes a string, not all take content parts, and Anthropic-only keys such as
    `cache_control` must not reach them. Anything else goes through untouched."""
    if isinstance(content, list) and content and all(
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str) for part in content
    ):
        return "".join(part["text"] for part in content)
    return content


def parse_usage(usage: dict) -> Usage:
    """prompt_tokens includes the cached ones: split them out so input_tokens excludes cache reads."""
    prompt = usage.get("prompt_tokens") or 0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return Usage(
        input_tokens=max(prompt - cached, 0),
        output_tokens=usage.get("completion_tokens") or 0,
        cache_read_tokens=cached,
    )


def _retry_after(headers) -> float | None:
    """`retry-after-ms` (milliseconds) first, then `retry-after` (seconds), as OpenAI's own client reads them."""
    try:
        millis = float(headers.get("retry-after-ms") or "")
    except ValueError:
        millis = None
    if millis is not None and 0 <= millis < 86_400_000:
        return millis / 1000
    return parse_retry_after(headers.get("retry-after"))


def error_from(response) -> ProviderError:
    """`{"error": {"message", "type", "code"}}` (OpenAI, llama.cpp, Ollama) or a top-level
    `{"message", "type", "code"}` (vLLM) as a ProviderError of its class, with the server's own words."""
    data = http.error_body(response)
    error = data.get("error")
    if isinstance(error, str):
        error = {"message": error}
    elif not isinstance(error, dict):
        error = data if "message" in data else {}
    message = error.get("message") or http.fallback_message(response)
    code = str(error.get("code")) if error.get("code") is not None else None
    error_type = error.get("type")
    refused = code in _REFUSAL_CODES or error_type in _REFUSAL_CODES
    kind, unknown = classify_http_error(response.status_code, refused=refused)
    if not unknown and not refused:
        kind = _ERROR_CLASSES.get(code) or _ERROR_CLASSES.get(error_type) or kind
    return ProviderError(kind, message, status=response.status_code, outcome_unknown=unknown,
                         retry_after=_retry_after(response.headers))
