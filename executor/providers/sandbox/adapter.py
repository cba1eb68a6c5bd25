"""Adapter for the sandbox provider (docs/sandbox.md, "Endpoints"), over HTTP with requests."""

from django.conf import settings

from executor.providers.base import (
    Completion,
    PollResult,
    ProviderError,
    Submission,
    WorkStatus,
    classify_http_error,
    parse_retry_after,
)
from executor import callbacks
from executor.providers import http, real
from executor.providers.anthropic import adapter as anthropic


def _seconds(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


class SandboxProvider:
    name = "sandbox"
    # The fields payonce sets in its requests (a render's and an LLM call's; `inputs` inside `params`): a job
    # parameter may not be named like one (executor.registry.input_problems).
    own_fields = ("model", "prompt", "request_id", "params", "inputs", "metadata", "callback_url",
                  "system", "messages", "max_tokens")

    def __init__(self, base_url: str | None = None):
        self.base_url = (base_url or settings.SANDBOX_URL).rstrip("/")

    def _call(self, method: str, path: str, **kwargs):
        url = path if path.startswith("http") else f"{self.base_url}{path}"
        response = http.send(method, url, base_url=self.base_url, **kwargs)
        if response.status_code >= 400:
            error = http.error_body(response).get("error") or {}
            kind, unknown = classify_http_error(response.status_code, refused=error.get("type") == "content_refused")
            raise ProviderError(
                kind,
                error.get("message") or http.fallback_message(response),
                status=response.status_code,
                retry_after=parse_retry_after(response.headers.get("Retry-After")),
                outcome_unknown=unknown,
            )
        return response

    @staticmethod
    def _submission(data: dict) -> Submission:
        return Submission(
            upstream_id=data["id"], status=WorkStatus(data.get("status", WorkStatus.RUNNING)), cost_usd=data.get("cost_usd"),
            output_url=(data.get("output") or {}).get("url"), error=(data.get("error") or {}).get("message"),
            raw=data, expected_s=_seconds(data.get("expected_s")),
        )

    def upload_input(self, model: str, payload: bytes, content_type: str) -> str:
        return http.json_answer(self._call("POST", "/v1/inputs", data=payload,
                                           headers={"Content-Type": content_type}))["id"]

    def submit(self, model: str, *, upstream_key: str, prompt: str, params: dict, metadata: dict,
               inputs: list[str]) -> Submission:
        # The job's params are nested under `params`, and payonce's `inputs` is set after them: no param can
        # replace a field payonce sets.
        if inputs:
            params = {**params, "inputs": inputs}
        body = {"model": model, "request_id": upstream_key, "prompt": prompt, "params": params, "metadata": metadata}
        callback_url = callbacks.callback_url(self.name)
        if callback_url:
            # A doorbell: polling stays the fallback (docs/design.md, "Callbacks are a doorbell").
            body["callback_url"] = callback_url
        return self._submission(http.json_answer(self._call("POST", "/v1/generations", json=body)))

    def poll(self, model: str, upstream_id: str) -> PollResult:
        data = http.json_answer(self._call("GET", f"/v1/generations/{upstream_id}"))
        output = data.get("output") or {}
        error = data.get("error") or {}
        return PollResult(
            status=WorkStatus(data["status"]),
            output_url=output.get("url"),
            content_type=output.get("content_type"),
            error=error.get("message"),
            error_class="refused" if error.get("type") == "content_refused" else None,
            cost_usd=data.get("cost_usd"),
            raw=data,
        )

    def lookup(self, model: str, *, upstream_key: str, metadata: dict, prompt: str, params: dict,
               submitted_at: float, inputs: list[str] | None = None) -> Submission | None:
        query = {"model": model, "metadata.upstream_key": upstream_key}
        found = http.json_answer(self._call("GET", "/v1/generations", params=query))["data"]
        return self._submission(found[0]) if found else None

    def cancel(self, model: str, upstream_id: str) -> None:
        self._call("POST", f"/v1/generations/{upstream_id}/cancel")

    def fetch(self, url: str) -> bytes:
        return self._call("GET", url).content

    def complete(self, model: str, *, system: str, messages: list[dict], max_tokens: int, upstream_key: str,
                 metadata: dict) -> Completion:
        body = {"model": model, "system": system, "messages": messages, "max_tokens": max_tokens,
                "metadata": metadata, "request_id": upstream_key}
        # An LLM call may take long (max_tokens of output): up to LLM_READ_TIMEOUT_S, not a render's 30 s.
        data = http.json_answer(self._call("POST", "/v1/messages", json=body, timeout=real.llm_timeout()))
        usage = data.get("usage") or {}
        return Completion(
            upstream_id=data["id"],
            text="".join(block.get("text", "") for block in data.get("content", []) if block.get("type") == "text"),
            stop_reason=data.get("stop_reason"),
            usage=anthropic.parse_usage(usage),  # the sandbox reports cached prefix tokens as Anthropic does
            raw=data,  # usage only: the cost is derived from the rate card (billing.rates)
        )
