"""Adapter for fal's queue API (`https://queue.fal.run`), a MediaProvider.

What fal's published reference says (docs.fal.ai and fal.ai/docs: the Queue API reference, "Asynchronous
inference", "Webhooks", "Model Errors", "Request Error Types", "Reliability", the Model APIs FAQ and
pricing page, and the official Python client fal_client; read 2026-12-03), and what is done with it here:

- Submit: `POST {base}/{model_id}` with `Authorization: Key <FAL_KEY>` and the model's input as the JSON
  body, here `{**params, "prompt": prompt}` (payonce's own fields over the job's parameters);
  `?fal_webhook=<url>` asks for a call when the request ends.
  The answer is `{"status": "IN_QUEUE", "request_id", "response_url", "status_url", "cancel_url",
  "queue_position"}`. A model id is `owner/app` and an optional endpoint path (`fal-ai/flux/dev`); the
  status, result and cancel URLs name only the owner and the app (`fal-ai/flux/requests/{id}/status`).
  They are built here from the model and the request id, as fal_client builds them, because the port
  polls with nothing else.
- Status: `GET .../requests/{id}/status` answers IN_QUEUE or IN_PROGRESS (HTTP 202), then COMPLETED (200)
  with `metrics.inference_time` (seconds the runner worked: Usage.units, as Replicate's predict_time is;
  fal bills these models per image, megapixel or video second, not by it) and, when the request failed,
  `error` and `error_type` (request_timeout, runner_disconnected, client_cancelled...).
- Result: `GET .../requests/{id}` answers the model's output, or the model's own error with its status
  (422 with `detail: [{"loc", "msg", "type"}]`; `type: content_policy_violation` is a content refusal).
  fal keeps it for an hour after completion (6 minutes when it is 10 KB or more). The output is the first
  of `images[].url`, `image.url`, `video.url`. FLUX models flag images in `has_nsfw_concepts`: a flagged
  image is a refusal, and a paid one (fal bills the output it made).
- Cancel: `PUT .../requests/{id}/cancel` answers 202 CANCELLATION_REQUESTED (a queued request is removed
  and never runs; a running one is signalled) or 400 ALREADY_COMPLETED (nothing left to stop).
- Billing: only successful outputs are billed; "server errors (HTTP 500+) are never charged", nor time in
  the queue; a 422 may be charged when a runner worked before the error was found.

Capabilities. fal documents no idempotency key and no field for our metadata: neither `upstream_key` nor
`metadata` is sent, and a submit sent again after a lost answer makes (and bills) a second request. Nor
does it document a way to find a lost submit: the Platform API lists an endpoint's requests as they end,
so a request still queued is not listed and absence is never proven. So `lookup` is False, and an
unknown outcome is held for a person. A 5xx answer to the submit itself is not declared unpaid: "never
charged" is said of requests that fail, and a submit whose answer was lost on the way (a proxy's 502) may
have queued a request that then succeeds and is billed. The queue holds any number of requests (over the
account's concurrency limit they wait), so a 429 is rare; like every 4xx it refused before accepting.

Reference media are not supported (`upload_input` refuses): fal's upload is a signed two-step upload to
another host, and the key goes to the base URL only. A caller passes a public URL in `params` instead
(`image_url`, as the model names it).

Webhooks are signed with ED25519 and checked by executor.providers.fal.webhooks.
"""

import mimetypes
import re
from urllib.parse import quote, urlsplit


from executor import callbacks
from executor.providers import http, real
from executor.providers.base import (
    Capabilities,
    ErrorClass,
    PollResult,
    ProviderError,
    Submission,
    Usage,
    WorkStatus,
    classify_http_error,
    parse_retry_after,
)

# No key, no lookup: an unknown outcome waits for a person. fal's queue has no documented run limit, so the
# attempt's window is the executor's own. 429 is named for the reader: every 4xx is unpaid already.
CAPABILITIES = Capabilities(idempotency_key=False, lookup=False, asynchronous=True, cancel=True,
                            unpaid_statuses=frozenset({429}), callbacks=True)

# Apps under a namespace keep it in their app id (`workflows/owner/app`), as fal_client has them.
_NAMESPACES = ("workflows", "comfy")
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_REFUSAL_TYPE = "content_policy_violation"
_REFUSAL_WORDS = re.compile(r"nsfw|content (policy|checker|filter|moderation)|flagged by a content", re.IGNORECASE)
_CANCELLED_TYPE = "client_cancelled"
# A key that is valid on an account that may not spend (its balance exhausted, or locked by fal): another
# provider may serve the job, this one will not until someone acts.
_LOCKED = re.compile(r"user is locked", re.IGNORECASE)



class FalProvider(real.RealAdapter):
    name = "fal"
    capabilities = CAPABILITIES
    # The fields payonce sets in a submit (the model in the path, fal_webhook in the query): a job parameter may
    # not be named like one (executor.registry.input_problems).
    own_fields = ("model", "prompt", "fal_webhook")

    base_url_setting = "FAL_BASE_URL"
    key_setting = "FAL_KEY"

    # -- HTTP ------------------------------------------------------------------------------------------

    def _send(self, method: str, url: str, **kwargs):
        """One call, its HTTP error statuses returned. The key goes with calls under the base URL only:
        output files on fal.media are public, and nothing else of fal's is called."""
        replaying = real.replaying(self.replay)
        headers = dict(kwargs.pop("headers", None) or {})
        if url.startswith(self.base_url + "/"):
            key = self.api_key
            if not key and not replaying:
                raise real.missing_key(self.name)
            if key:
                headers["Authorization"] = f"Key {key}"
        return real.send(method, url, base_url=self.base_url, replay=replaying, headers=headers, **kwargs)

    def _call(self, method: str, url: str, **kwargs):
        response = self._send(method, url, **kwargs)
        if response.status_code >= 400:
            raise error_from(response)
        return response

    def _request_url(self, model: str, upstream_id: str) -> str:
        return f"{self.base_url}/{app_id(model)}/requests/{quote(upstream_id, safe='')}"

    # -- the port --------------------------------------------------------------------------------------

    def upload_input(self, model: str, payload: bytes, content_type: str) -> str:
        raise _no_references()

    def submit(self, model: str, *, upstream_key: str, prompt: str, params: dict, metadata: dict,
               inputs: list[str]) -> Submission:
        # fal keeps neither an idempotency key nor metadata: neither upstream_key nor metadata is sent.
        check_model(model)
        if inputs:
            raise _no_references()
        query = {}
        webhook = callbacks.callback_url(self.name)
        if webhook:
            # A doorbell when the request ends (docs/design.md, "Callbacks are a doorbell"); polling stays the
            # fallback.
            query["fal_webhook"] = webhook
        response = self._call("POST", f"{self.base_url}/{model}", params=query or None,
                              json=request_input(prompt, params))
        return submission(http.json_answer(response))

    def poll(self, model: str, upstream_id: str) -> PollResult:
        url = self._request_url(model, upstream_id)
        state = http.json_answer(self._call("GET", url + "/status"))
        if state.get("status") != "COMPLETED":
            # IN_QUEUE, IN_PROGRESS, or a status fal may add: still waited on, inside the attempt's window.
            return PollResult(status=WorkStatus.RUNNING, raw=state)
        usage = usage_of(state)
        if not (state.get("error") or state.get("error_type")):
            response = self._send("GET", url)
            if response.status_code < 400:
                return completed(state, http.json_answer(response), usage)
            if not model_error(response.status_code):
                raise error_from(response)  # our read of the result failed, not the render: polled again
            # The status said nothing of a failure the model answered (an app that does not report it).
        else:
            try:
                response = self._send("GET", url)
            except ProviderError:
                response = None  # the model's own words are lost; the status's will do
        return failed(state, response, usage)

    def lookup(self, model: str, *, upstream_key: str, metadata: dict, prompt: str, params: dict,
               submitted_at: float, inputs: list[str] | None = None) -> Submission | None:
        """fal has no way to find a lost submit (capability `lookup` is False): absence is never proven."""
        raise ProviderError(ErrorClass.SERVER_ERROR, "fal has no lookup: a lost submit cannot be found or ruled out",
                            outcome_unknown=True)

    def cancel(self, model: str, upstream_id: str) -> None:
        response = self._send("PUT", self._request_url(model, upstream_id) + "/cancel")
        if response.status_code == 400 and http.error_body(response).get("status") == "ALREADY_COMPLETED":
            return  # it ended first: nothing is left to stop
        if response.status_code >= 400:
            raise error_from(response)

    def fetch(self, url: str) -> bytes:
        return self._call("GET", url).content


def check_model(model: str) -> list[str]:
    """The segments of a fal model id, `owner/app[/path...]` (or `workflows/owner/app[/...]`); a model id
    that is not one is refused before anything is sent."""
    parts = model.split("/") if isinstance(model, str) else []
    least = 3 if parts and parts[0] in _NAMESPACES else 2
    if len(parts) < least or not all(_SEGMENT.fullmatch(part) for part in parts):
        raise ProviderError(ErrorClass.INVALID_INPUT, f"fal model must be owner/app[/path], not {model!r}")
    return parts


def app_id(model: str) -> str:
    """Where a request's status, result and cancel live: the model id without its endpoint path
    (`fal-ai/flux/dev` -> `fal-ai/flux`)."""
    parts = check_model(model)
    return "/".join(parts[: 3 if parts[0] in _NAMESPACES else 2])


def request_input(prompt: str, params: dict) -> dict:
    """The submit's body: the job's parameters, then payonce's own fields over them."""
    return {**(params or {}), "prompt": prompt}


def submission(data: dict) -> Submission:
    request_id = data.get("request_id")
    if not isinstance(request_id, str) or not request_id:
        # A 2xx that names no request: fal may well have queued one, which nobody can now poll or cancel.
        raise ProviderError(ErrorClass.SERVER_ERROR, f"submit answered without request_id: {str(data)[:300]}",
                            outcome_unknown=True)
    return Submission(upstream_id=request_id, status=WorkStatus.RUNNING, raw=data)


def usage_of(state: dict) -> Usage | None:
    inference_time = (state.get("metrics") or {}).get("inference_time")
    if isinstance(inference_time, (int, float)) and not isinstance(inference_time, bool):
        return Usage(units=float(inference_time))
    return None


def first_output(result: dict) -> tuple[str | None, str | None]:
    """(URL, content type) of the first output file: `images[0]`, `image` or `video`. A data URI (an
    input's `sync_mode`) is no output: nothing can be fetched from it."""
    for name in ("images", "image", "video"):
        value = result.get(name)
        file = next((item for item in value if isinstance(item, dict)), None) if isinstance(value, list) else value
        url = file.get("url") if isinstance(file, dict) else None
        if isinstance(url, str) and url.startswith(("https://", "http://")):
            content_type = file.get("content_type") or mimetypes.guess_type(urlsplit(url).path)[0]
            return url, content_type
    return None, None


def completed(state: dict, result: dict, usage: Usage | None) -> PollResult:
    """A request that completed without an error: its first output, unless the safety checker flagged it."""
    raw = {**state, "result": result}
    url, content_type = first_output(result)
    flags = result.get("has_nsfw_concepts")
    if isinstance(flags, list) and flags and flags[0] is True:
        # The image was made, and is billed, but flagged: a refusal.
        return PollResult(status=WorkStatus.FAILED, error="the image was flagged by fal's safety checker (has_nsfw_concepts)",
                          error_class=ErrorClass.REFUSED, usage=usage, raw=raw)
    if not url:
        return PollResult(status=WorkStatus.FAILED, error=f"completed without an output URL: {str(result)[:300]}",
                          usage=usage, raw=raw)
    return PollResult(status=WorkStatus.SUCCEEDED, output_url=url, content_type=content_type, usage=usage, raw=raw)


def failed(state: dict, response, usage: Usage | None) -> PollResult:
    """A request that completed with an error, in the model's own words where its result holds them.

    `raw["result_status"]` keeps the HTTP status of the model's error: fal never charges a 5xx one, which
    the executor cannot yet tell from a paid failure."""
    body, result_status = {}, None
    if response is not None and response.status_code >= 400:
        body, result_status = http.error_body(response), response.status_code
    message, refused = error_words(body)
    error_type = state.get("error_type") or body.get("error_type")
    if error_type is None and response is not None:
        error_type = response.headers.get("x-fal-error-type")
    message = message or _text(state.get("error")) or error_type or "the request failed upstream"
    raw = {**state, "result": body, "result_status": result_status}
    if error_type == _CANCELLED_TYPE:
        return PollResult(status=WorkStatus.CANCELLED, error=message, usage=usage, raw=raw)
    if refused or _REFUSAL_WORDS.search(message):
        error_class = ErrorClass.REFUSED
    elif result_status is not None and model_error(result_status):
        error_class = ErrorClass.INVALID_INPUT  # the model refused this input: sending it again fails again
    else:
        error_class = None  # the executor's default (a server error)
    return PollResult(status=WorkStatus.FAILED, error=message, error_class=error_class, usage=usage, raw=raw)


def model_error(status: int) -> bool:
    """Whether an error answer of the result endpoint is the model's (the read itself has no input to
    refuse): a 4xx that is not about our key, an unknown or expired request, a timeout or a throttle. A 5xx
    may be the gateway's as well as the model's: only the status's `error` tells."""
    return 400 <= status < 500 and status not in (401, 403, 404, 408, 429)


def error_words(body: dict) -> tuple[str | None, bool]:
    """(fal's words, content refusal) of an error body: a request error (`{"detail": "...", "error_type"}`)
    or a model error (`{"detail": [{"loc", "msg", "type"}]}`, one entry a problem)."""
    detail = body.get("detail")
    if isinstance(detail, str) and detail.strip():
        return detail.strip(), body.get("error_type") == _REFUSAL_TYPE
    if isinstance(detail, list):
        entries = [entry for entry in detail if isinstance(entry, dict)]
        words = [said for said in map(_entry_words, entries) if said]
        return "; ".join(words) or None, any(entry.get("type") == _REFUSAL_TYPE for entry in entries)
    return None, False


def _entry_words(entry: dict) -> str | None:
    msg = entry.get("msg")
    if not isinstance(msg, str) or not msg:
        return None
    loc = entry.get("loc")
    field = ".".join(str(part) for part in loc if part != "body") if isinstance(loc, list) else ""
    return f"{field}: {msg}" if field else msg


def _text(value) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def error_from(response) -> ProviderError:
    """An error answer as a ProviderError of its class, with fal's own words: a content_policy_violation
    is refused, 422 input validation is invalid_input, a locked account (balance exhausted) is unavailable,
    and a proxy's page keeps its text."""
    message, refused = error_words(http.error_body(response))
    message = message or http.fallback_message(response)
    status = response.status_code
    kind, unknown = classify_http_error(status, refused=refused or bool(_REFUSAL_WORDS.search(message)))
    if status == 403 and _LOCKED.search(message):
        kind = ErrorClass.UNAVAILABLE
    return ProviderError(kind, message, status=status, outcome_unknown=unknown,
                         retry_after=parse_retry_after(response.headers.get("retry-after")))


def _no_references() -> ProviderError:
    return ProviderError(ErrorClass.INVALID_INPUT,
                         "fal: reference media are not supported; pass a public URL in the model's own "
                         "parameter (image_url...) instead")
