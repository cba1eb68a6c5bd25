"""Adapter for Replicate's HTTP API (predictions), a MediaProvider.

Replicate has no idempotency key and no metadata on a prediction, so the upstream key is never sent.
What it has is a listing of the account's predictions, newest first: `lookup` reconciles an attempt whose
submit outcome is unknown by finding the prediction whose model (and version) and exact `input` are what
this attempt would have sent, created no earlier than a minute before the attempt was submitted.

Model names are `owner/name` (official and deployment-less models: `POST /v1/models/{owner}/{name}/predictions`)
or `owner/name:version` (`POST /v1/predictions` with `version`). The prediction input is
`{**params, "prompt": prompt}`: the job's parameters, then payonce's own fields over them, and the body's
other fields (`version`, `webhook`) are payonce's alone. Reference media uploaded through `upload_input`
(Replicate's file store, `POST /v1/files`) are passed as `input["input_images"]`, a list of URLs: the name
that multi-image editing models on Replicate use. A model that wants another field name (`image`,
`input_image`...) takes it through `params` instead, which the caller controls.
"""

import json
import mimetypes
import re
from datetime import datetime
from urllib.parse import urlsplit


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

# Replicate documents 429 (and the other 4xx) as refusals; a 5xx may come after the prediction was
# created, so it stays an unknown outcome (resolved by lookup).
CAPABILITIES = Capabilities(idempotency_key=False, lookup=True, asynchronous=True, cancel=True, window_s=1800.0,
                            unpaid_statuses=frozenset({429}), callbacks=True)

_STATUSES = {"starting": WorkStatus.RUNNING, "processing": WorkStatus.RUNNING, "succeeded": WorkStatus.SUCCEEDED,
             "failed": WorkStatus.FAILED, "canceled": WorkStatus.CANCELLED, "aborted": WorkStatus.FAILED}
# A failed prediction (or a rejected input) that is a content refusal: FLUX's "NSFW content detected",
# safety checkers, moderation filters.
_REFUSAL_WORDS = re.compile(r"nsfw|safety|content (policy|filter|moderation)|flagged as sensitive", re.IGNORECASE)
# How much earlier than our own submit clock a matching prediction may have been created (clock skew).
LOOKUP_SLACK_S = 60.0
# A bound on listing pages: past it absence is unproven, never assumed.
LOOKUP_MAX_PAGES = 50


class ReplicateProvider(real.RealAdapter):
    name = "replicate"
    capabilities = CAPABILITIES
    # The fields payonce sets in a prediction (the model is in the URL; the rest in the body or its `input`): a
    # job parameter may not be named like one (executor.registry.input_problems).
    own_fields = ("model", "prompt", "input_images", "input", "version", "webhook", "webhook_events_filter")

    base_url_setting = "REPLICATE_BASE_URL"  # without /v1
    key_setting = "REPLICATE_API_TOKEN"

    def __init__(self, base_url: str | None = None, api_token: str | None = None, *, replay: bool | None = None):
        super().__init__(base_url, api_token, replay=replay)

    # -- HTTP ------------------------------------------------------------------------------------------

    def _call(self, method: str, url: str, *, authorize: bool = True, **kwargs):
        replaying = real.replaying(self.replay)
        headers = dict(kwargs.pop("headers", None) or {})
        if authorize:
            token = self.api_key
            if not token and not replaying:
                raise real.missing_key(self.name)
            if token:
                headers["Authorization"] = f"Bearer {token}"
        response = real.send(method, url, base_url=self.base_url, replay=replaying, headers=headers, **kwargs)
        if response.status_code >= 400:
            raise error_from(response)
        return response

    def _api(self, path: str) -> str:
        return f"{self.base_url}/v1{path}"

    # -- the port --------------------------------------------------------------------------------------

    def upload_input(self, model: str, payload: bytes, content_type: str) -> str:
        filename = "input" + (mimetypes.guess_extension(content_type or "") or ".bin")
        response = self._call("POST", self._api("/files"), data={"filename": filename, "type": content_type},
                              files={"content": (filename, payload, content_type)})
        data = http.json_answer(response)
        url = (data.get("urls") or {}).get("get")
        if not url:
            raise ProviderError(ErrorClass.SERVER_ERROR, f"file upload answered without urls.get: {str(data)[:300]}",
                                status=response.status_code)
        return url

    def submit(self, model: str, *, upstream_key: str, prompt: str, params: dict, metadata: dict,
               inputs: list[str]) -> Submission:
        # Replicate keeps neither an idempotency key nor metadata: neither upstream_key nor metadata is sent.
        owner_name, version = split_model(model)
        body = {"input": prediction_input(prompt, params, inputs)}
        webhook = callbacks.callback_url(self.name)
        if webhook:
            # A doorbell when the prediction ends (docs/design.md, "Callbacks are a doorbell"); polling stays the
            # fallback.
            body.update(webhook=webhook, webhook_events_filter=["completed"])
        if version:
            body["version"] = version
            url = self._api("/predictions")
        else:
            url = self._api(f"/models/{owner_name}/predictions")
        return submission(http.json_answer(self._call("POST", url, json=body)))

    def poll(self, model: str, upstream_id: str) -> PollResult:
        data = http.json_answer(self._call("GET", self._api(f"/predictions/{upstream_id}")))
        status = _STATUSES.get(data.get("status"), WorkStatus.RUNNING)
        output_url = first_output(data.get("output"))
        error = data.get("error")
        error = str(error) if error else None
        if status == WorkStatus.FAILED and not error:
            error = f"prediction {data.get('status')}"
        return PollResult(
            status=status,
            output_url=output_url,
            content_type=mimetypes.guess_type(urlsplit(output_url).path)[0] if output_url else None,
            error=error,
            error_class=ErrorClass.REFUSED if status == WorkStatus.FAILED and error and _REFUSAL_WORDS.search(error) else None,
            usage=usage_of(data),
            raw=data,
        )

    def lookup(self, model: str, *, upstream_key: str, metadata: dict, prompt: str, params: dict,
               submitted_at: float, inputs: list[str] | None = None) -> Submission | None:
        """List-based reconciliation: the newest prediction of this model (and version, when named) whose
        input equals what `submit` sends, created at or after `submitted_at - 60 s`. Pages are followed
        newest first and the search stops at the first older prediction: None then means proven absent.

        `inputs` are the uploaded file URLs the submit carried (the port's lookup does not pass them; a
        caller that submitted with inputs must pass them here, or the input cannot match).
        Predictions made on the website (`source: web`) are never ours.
        """
        owner_name, version = split_model(model)
        wanted = _json_roundtrip(prediction_input(prompt, params, inputs or []))
        cutoff = submitted_at - LOOKUP_SLACK_S
        url = self._api("/predictions")
        for _ in range(LOOKUP_MAX_PAGES):
            page = http.json_answer(self._call("GET", url))
            for prediction in page.get("results") or []:
                created = parse_time(prediction.get("created_at"))
                if created is not None and created < cutoff:
                    return None  # newest first: everything after this one is older still
                if (
                    prediction.get("model") == owner_name
                    and (version is None or prediction.get("version") == version)
                    and prediction.get("source", "api") != "web"
                    and prediction.get("input") == wanted
                    and created is not None
                ):
                    return submission(prediction)
            next_url = page.get("next")
            if not next_url:
                return None
            url = self._same_origin(next_url)
        # Absence is not proven: the caller must not resubmit on this answer.
        raise ProviderError(ErrorClass.SERVER_ERROR,
                            f"lookup listed {LOOKUP_MAX_PAGES} pages without reaching the submit time",
                            outcome_unknown=True)

    def cancel(self, model: str, upstream_id: str) -> None:
        self._call("POST", self._api(f"/predictions/{upstream_id}/cancel"))

    def fetch(self, url: str) -> bytes:
        # Output files on replicate.delivery are public; files under the API itself need the token. The
        # token is never sent anywhere else.
        return self._call("GET", url, authorize=url.startswith(self.base_url + "/")).content

    def _same_origin(self, url: str) -> str:
        """A `next` link rebased onto our base URL, so the token only ever goes where it is configured to."""
        if url.startswith(self.base_url + "/"):
            return url
        parts = urlsplit(url)
        return f"{self.base_url}{parts.path}" + (f"?{parts.query}" if parts.query else "")


def split_model(model: str) -> tuple[str, str | None]:
    """`owner/name` or `owner/name:version` -> (owner/name, version or None)."""
    owner_name, _, version = model.partition(":")
    owner, _, name = owner_name.partition("/")
    if not owner or not name or "/" in name:
        raise ProviderError(ErrorClass.INVALID_INPUT, f"Replicate model must be owner/name[:version], not {model!r}")
    return owner_name, version or None


def prediction_input(prompt: str, params: dict, inputs: list[str]) -> dict:
    """The prediction's `input`: the job's parameters, then payonce's own fields over them."""
    body = {**(params or {}), "prompt": prompt}
    if inputs:
        body["input_images"] = list(inputs)
    return body


def first_output(output) -> str | None:
    """Output is a URL or a list of URLs (some models answer an object of URLs): the first one."""
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return next((item for item in output if isinstance(item, str)), None)
    if isinstance(output, dict):
        return next((item for item in output.values() if isinstance(item, str)), None)
    return None


def usage_of(data: dict) -> Usage | None:
    predict_time = (data.get("metrics") or {}).get("predict_time")
    return Usage(units=float(predict_time)) if predict_time is not None else None


def submission(data: dict) -> Submission:
    if not data.get("id"):
        raise ProviderError(ErrorClass.SERVER_ERROR, f"prediction without id: {str(data)[:300]}")
    error = data.get("error")
    return Submission(
        upstream_id=data["id"],
        status=_STATUSES.get(data.get("status"), WorkStatus.RUNNING),
        output_url=first_output(data.get("output")),
        error=str(error) if error else None,
        usage=usage_of(data),
        raw=data,
    )


def parse_time(value) -> float | None:
    """Replicate's ISO 8601 timestamps (`2025-06-12T09:41:07.512Z`) as epoch seconds."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _json_roundtrip(value):
    """What the input looks like once Replicate has stored it as JSON (tuples become lists)."""
    return json.loads(json.dumps(value))


def error_from(response) -> ProviderError:
    """Problem details (`{"title", "detail", "status"}`) as a ProviderError of its class, with Replicate's
    own words: 422 input validation is invalid_input, a safety rejection is refused."""
    data = http.error_body(response)
    detail, title = data.get("detail"), data.get("title")
    if isinstance(detail, str) and detail.strip():
        message = detail.strip()
    elif isinstance(title, str) and title:
        message = title
    else:
        message = http.fallback_message(response)
    status = response.status_code
    kind, unknown = classify_http_error(status, refused=bool(_REFUSAL_WORDS.search(message)))
    if status == 402:
        # Insufficient credit: no retry of this model helps until someone pays; another provider may.
        kind = ErrorClass.UNAVAILABLE
    return ProviderError(kind, message, status=status, outcome_unknown=unknown,
                         retry_after=parse_retry_after(response.headers.get("retry-after")))
