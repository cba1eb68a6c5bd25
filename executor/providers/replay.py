"""Recorded answers for the real providers, with no network (docs/design.md, "Real money is opt-in"). With
REAL_PROVIDERS off a job may still name `anthropic/...`, `openai/...`, `replicate/...`, `fal/...` and
`openai-images/...` models; their adapters then reach this module instead of the provider.

`ReplayAdapter` is a requests transport adapter that answers from the recorded wire formats in
`fixtures/` (see fixtures/README.md): the same status codes, headers and JSON bodies the providers send,
with the request's own model, a deterministic id and deterministic text or bytes filled in. Nothing here
keeps state or reads the clock, so the same request always yields the same answer, in any process:

- Anthropic `POST /v1/messages` and OpenAI-compatible `POST .../chat/completions` answer a text derived
  from the last user message, with token counts of about four characters a token, cut at max_tokens;
- OpenAI's `POST .../images/generations` answers a tiny PNG derived from the prompt, as base64;
- fal's queue takes a `fal-ai/...` submit with a request id derived from model and input; any status
  of it answers COMPLETED, and its result is an image (a video for an app named for video) under a replay
  media host that answers the same small PNG (or bytes named .mp4);
- Replicate predictions are created `starting` (id derived from model, version and input) and any poll
  of them answers `succeeded` (so `starting -> succeeded` after one poll), with one output URL under
  `https://replicate.delivery/replay/` that answers a small PNG. A poll cannot echo the request's input
  (there is no state), so it carries the recorded prediction's model and input. The prediction list is
  empty: reconciliation finds nothing and the resubmit gets the same deterministic id back;
- `POST /v1/files` answers a file object whose id and checksums are those of the uploaded content.

`mount_replay(session, base_url)` mounts the adapter on a session. The real adapters do not need it:
`executor.providers.real.send` routes their calls through `replay_session_key`, a per-thread session of
its own where the adapter is mounted for every http(s) URL, so a recorded call can never fall through to
the network and the real session for the same base URL is never altered.
"""

import base64
import hashlib
import http.client
import json
import math
import mimetypes
import re
import struct
import zlib
from email.parser import BytesParser
from email.policy import HTTP
from functools import lru_cache
from io import BytesIO
from pathlib import Path
from urllib.parse import urlsplit

import requests
from requests.adapters import BaseAdapter
from requests.structures import CaseInsensitiveDict

from executor.providers import http as provider_http

FIXTURES_DIR = Path(__file__).with_name("fixtures")
MEDIA_PREFIX = "https://replicate.delivery/"
REPLAY_MEDIA_PREFIX = MEDIA_PREFIX + "replay/"
FAL_MEDIA_PREFIX = "https://v3.fal.media/"
FAL_REPLAY_MEDIA_PREFIX = FAL_MEDIA_PREFIX + "files/replay/"
_SESSION_PREFIX = "payonce-replay:"


def fixture(name: str) -> dict:
    """One recorded response, `{"status", "headers", "body"}`, as a fresh copy (callers may change it)."""
    return json.loads(_fixture_text(name))


@lru_cache(maxsize=None)
def _fixture_text(name: str) -> str:
    return (FIXTURES_DIR / f"{name}.json").read_text(encoding="utf-8")


def mount_replay(session: requests.Session, base_url: str) -> "ReplayAdapter":
    """Answer every request `session` sends under `base_url` (and to Replicate's media host) from the
    recorded fixtures."""
    adapter = ReplayAdapter(base_url)
    session.mount(base_url.rstrip("/") + "/", adapter)
    session.mount(MEDIA_PREFIX, adapter)
    return adapter


def replay_session_key(base_url: str) -> str:
    """The key of this thread's replay session for `base_url` in executor.providers.http, with the replay
    adapter mounted for every URL (so nothing sent through it can reach the network)."""
    key = _SESSION_PREFIX + base_url
    session = provider_http.session(key)
    if not isinstance(session.adapters.get("https://"), ReplayAdapter):
        adapter = mount_replay(session, base_url)
        session.mount("https://", adapter)
        session.mount("http://", adapter)
    return key


def _digest(value) -> bytes:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()).digest()


def _replicate_id(value) -> str:
    """26 lower-case base32 characters, the shape of Replicate's ids."""
    return base64.b32encode(_digest(value)).decode().lower()[:26]


def _text_of(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _png(width: int = 1, height: int = 1) -> bytes:
    """A valid, tiny PNG (grey pixels): what a replayed image render delivers."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b""))


REPLAY_PNG = _png()


def llm_reply(system: str, messages: list[dict], max_tokens: int) -> dict:
    """Deterministic text for a replayed LLM call, and its token counts (about four characters a token)."""
    texts = [_text_of(message.get("content")) for message in messages if isinstance(message, dict)]
    last_user = next((_text_of(m.get("content")) for m in reversed(messages)
                      if isinstance(m, dict) and m.get("role") == "user"), "")
    recorded = _text_of(fixture("anthropic/message")["body"]["content"])
    text = f"Recorded answer (payonce replay, no provider was called) to: {last_user[:80]}\n\n{recorded}"
    truncated = math.ceil(len(text) / 4) > max_tokens
    if truncated:
        text = text[: max(max_tokens, 0) * 4]
    return {
        "text": text,
        "truncated": truncated,
        "input_tokens": max(1, math.ceil((len(system or "") + sum(len(t) for t in texts)) / 4)),
        "output_tokens": min(math.ceil(len(text) / 4), max(max_tokens, 0)),
    }


class ReplayAdapter(BaseAdapter):
    """A requests transport that answers Anthropic, OpenAI-compatible and Replicate calls from fixtures."""

    def __init__(self, base_url: str = ""):
        super().__init__()
        self.base_url = base_url.rstrip("/")

    def close(self):
        pass

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):
        status, headers, content = self._answer(request)
        response = requests.Response()
        response.status_code = status
        response.reason = http.client.responses.get(status, "")
        response.headers = CaseInsensitiveDict(headers)
        response._content = content
        response.raw = BytesIO(content)
        response.encoding = "utf-8"
        response.url = request.url
        response.request = request
        response.connection = self
        return response

    # -- routing ---------------------------------------------------------------------------------------

    def _answer(self, request) -> tuple[int, dict, bytes]:
        method = request.method.upper()
        url = request.url
        parts = urlsplit(url)
        if url.startswith(MEDIA_PREFIX):
            return self._media(method, parts.path)
        origin = f"{parts.scheme}://{parts.netloc}"
        base = self.base_url if self.base_url.startswith(origin) else origin
        path = parts.path
        base_path = urlsplit(base).path.rstrip("/")
        if base_path and path.startswith(base_path + "/"):
            path = path[len(base_path):]
        api = origin  # Replicate URLs in answers point back at where the call went

        if method == "POST" and path == "/v1/messages":
            return self._anthropic(_json_body(request))
        if method == "POST" and path.endswith("/chat/completions"):
            return self._openai(_json_body(request))
        if method == "POST" and path.endswith("/images/generations"):
            return self._openai_image(_json_body(request))
        if method == "POST" and (match := re.fullmatch(r"/v1/models/([^/]+)/([^/]+)/predictions", path)):
            return self._prediction_create(api, f"{match[1]}/{match[2]}", None, _json_body(request))
        if method == "POST" and path == "/v1/predictions":
            body = _json_body(request)
            return self._prediction_create(api, None, body.get("version"), body)
        if method == "GET" and path == "/v1/predictions":
            return _json(200, {"content-type": "application/json"}, {"next": None, "previous": None, "results": []})
        if method == "GET" and (match := re.fullmatch(r"/v1/predictions/([^/]+)", path)):
            return self._prediction(api, match[1], "replicate/prediction_succeeded")
        if method == "POST" and (match := re.fullmatch(r"/v1/predictions/([^/]+)/cancel", path)):
            return self._prediction(api, match[1], "replicate/prediction_canceled")
        if method == "POST" and path == "/v1/files":
            return self._file(api, request)
        if (answer := self._fal(method, url, api, path, request)) is not None:
            return answer
        message = f"payonce replay: no recorded answer for {method} {parts.path}"
        # Readable by all three adapters' error parsers.
        return _json(404, {"content-type": "application/json"},
                     {"type": "error", "error": {"type": "not_found_error", "message": message},
                      "title": "Not found", "detail": message, "status": 404})

    # -- Anthropic -------------------------------------------------------------------------------------

    def _anthropic(self, body: dict):
        missing = next((f for f in ("model", "max_tokens", "messages") if not body.get(f)), None)
        if missing:
            recorded = fixture("anthropic/error_400_invalid_request")
            recorded["body"]["error"]["message"] = f"{missing}: Field required"
            return _recorded(recorded)
        reply = llm_reply(_text_of(body.get("system")), body["messages"], int(body["max_tokens"]))
        recorded = fixture("anthropic/message")
        answer = recorded["body"]
        answer["id"] = "msg_replay" + _digest(body).hex()[:22]
        answer["model"] = body["model"]
        answer["content"] = [{"type": "text", "text": reply["text"]}]
        answer["stop_reason"] = "max_tokens" if reply["truncated"] else "end_turn"
        answer["usage"] = {
            "input_tokens": reply["input_tokens"], "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
            "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
            "output_tokens": reply["output_tokens"], "service_tier": "standard",
        }
        recorded["headers"]["request-id"] = "req_replay" + _digest(body).hex()[22:44]
        return _recorded(recorded)

    # -- OpenAI-compatible -----------------------------------------------------------------------------

    def _openai(self, body: dict):
        if not body.get("model") or not body.get("messages"):
            recorded = fixture("openai/error_400_invalid_request")
            recorded["body"]["error"].update(
                message="you must provide a model parameter" if not body.get("model") else "'messages' is required",
                param="model" if not body.get("model") else "messages", code=None)
            return _recorded(recorded)
        messages = body["messages"]
        system = "".join(_text_of(m.get("content")) for m in messages if m.get("role") == "system")
        reply = llm_reply(system, [m for m in messages if m.get("role") != "system"],
                          int(body.get("max_tokens") or body.get("max_completion_tokens") or 4096))
        recorded = fixture("openai/chat_completion")
        answer = recorded["body"]
        answer["id"] = "chatcmpl-replay" + _digest(body).hex()[:20]
        answer["model"] = body["model"]
        choice = answer["choices"][0]
        choice["message"]["content"] = reply["text"]
        choice["finish_reason"] = "length" if reply["truncated"] else "stop"
        answer["usage"].update(prompt_tokens=reply["input_tokens"], completion_tokens=reply["output_tokens"],
                               total_tokens=reply["input_tokens"] + reply["output_tokens"])
        answer["usage"]["prompt_tokens_details"]["cached_tokens"] = 0
        recorded["headers"]["x-request-id"] = "req_replay" + _digest(body).hex()[20:52]
        return _recorded(recorded)

    def _openai_image(self, body: dict):
        """OpenAI's image generation: a 4x4 grey PNG whose pixels are the prompt's digest, as base64 for
        every model (where OpenAI would answer dall-e-3 with a URL too), so the same prompt always makes the
        same bytes and no media host is needed. Always a PNG, whatever output_format asked."""
        if not body.get("model") or not body.get("prompt"):
            missing = "model" if not body.get("model") else "prompt"
            recorded = fixture("openai/error_400_invalid_request")
            recorded["body"]["error"].update(message=f"Missing required parameter: '{missing}'.", param=missing,
                                             code="missing_required_parameter")
            return _recorded(recorded)

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

        pixels = hashlib.sha256(str(body["prompt"]).encode()).digest()
        rows = b"".join(b"\x00" + pixels[4 * row:4 * row + 4] for row in range(4))
        png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 4, 8, 0, 0, 0, 0))
               + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b""))
        recorded = fixture("openai/images_generation")
        answer = recorded["body"]
        answer["data"] = [{"b64_json": base64.b64encode(png).decode()}]
        if str(body["model"]).startswith("dall-e"):  # no tokens, no echo of the GPT image models' settings
            for name in ("background", "output_format", "quality", "size", "usage"):
                answer.pop(name, None)
        else:
            answer.update({name: body[name] for name in ("quality", "size") if body.get(name) not in (None, "auto")})
            text_tokens = max(1, math.ceil(len(str(body["prompt"])) / 4))
            usage = answer["usage"]
            usage.update(input_tokens=text_tokens, total_tokens=text_tokens + usage["output_tokens"])
            usage["input_tokens_details"]["text_tokens"] = text_tokens
        recorded["headers"]["x-request-id"] = "req_replay" + _digest(body).hex()[:32]
        return _recorded(recorded)

    # -- Replicate -------------------------------------------------------------------------------------

    def _prediction_create(self, api: str, model: str | None, version: str | None, body: dict):
        prediction_input = body.get("input")
        if not isinstance(prediction_input, dict):
            recorded = fixture("replicate/error_422_invalid_input")
            detail = "- input: Invalid type. Expected: object, given: " + type(prediction_input).__name__
            recorded["body"].update(detail=detail + "\n", invalid_fields=[
                {"type": "invalid_type", "field": "input", "description": detail[len("- input: "):]}])
            return _recorded(recorded)
        recorded = fixture("replicate/prediction_starting")
        prediction = recorded["body"]
        prediction_id = _replicate_id({"model": model, "version": version, "input": prediction_input})
        prediction.update(id=prediction_id, input=prediction_input, urls=_urls(api, prediction_id))
        if model:
            prediction["model"] = model
        if version:
            prediction["version"] = version
        recorded["headers"]["location"] = f"{api}/v1/predictions/{prediction_id}"
        return _recorded(recorded)

    def _prediction(self, api: str, prediction_id: str, name: str):
        recorded = fixture(name)
        prediction = recorded["body"]
        prediction.update(id=prediction_id, urls=_urls(api, prediction_id))
        if prediction.get("output"):
            prediction["output"] = [f"{REPLAY_MEDIA_PREFIX}{prediction_id}/out-0.png"]
        return _recorded(recorded)

    def _file(self, api: str, request):
        content_type = request.headers.get("Content-Type", "")
        message = BytesParser(policy=HTTP).parsebytes(
            b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + (request.body or b""))
        content, filename, file_type = b"", "file", "application/octet-stream"
        for part in message.iter_parts() if message.is_multipart() else []:
            if part.get_param("name", header="content-disposition") == "content":
                content = part.get_payload(decode=True) or b""
                filename = part.get_filename() or filename
                file_type = part.get_content_type() or file_type
        recorded = fixture("replicate/file_upload")
        file = recorded["body"]
        file_id = _replicate_id({"file": hashlib.sha256(content).hexdigest()})
        md5 = hashlib.md5(content).hexdigest()
        file.update(id=file_id, name=filename, content_type=file_type, size=len(content), etag=f'"{md5}"',
                    checksums={"sha256": hashlib.sha256(content).hexdigest(), "md5": md5},
                    urls={"get": f"{api}/v1/files/{file_id}"})
        return _recorded(recorded)

    # -- fal -------------------------------------------------------------------------------------------

    def _fal(self, method: str, url: str, api: str, path: str, request):
        """fal's queue API, its webhook keys (`/.well-known/jwks.json`) and its media host; None for a
        request that is none of these. A submit (`POST /{owner}/{app}[/path]`, taken on fal's own hosts, or
        for a `fal-ai/` model on any: elsewhere such a path may be another provider's) is queued with a
        request id derived from the model and the input; any status of a request answers COMPLETED and its
        result one image (one video for an app named `...video...`) under FAL_REPLAY_MEDIA_PREFIX, so
        `IN_QUEUE -> COMPLETED` after one poll. A cancel is accepted."""
        if url.startswith(FAL_MEDIA_PREFIX):
            return self._media(method, urlsplit(url).path)
        if method == "GET" and path == "/.well-known/jwks.json":
            return _recorded(fixture("fal/jwks"))
        if match := re.fullmatch(r"/([^/]+/[^/]+(?:/[^/]+)?)/requests/([^/]+)(/status|/cancel)?", path):
            app, request_id, tail = match.groups()
            urls = {"response_url": f"{api}/{app}/requests/{request_id}",
                    "status_url": f"{api}/{app}/requests/{request_id}/status",
                    "cancel_url": f"{api}/{app}/requests/{request_id}/cancel"}
            if method == "GET" and tail == "/status":
                recorded = fixture("fal/status_completed")
                recorded["body"].update(request_id=request_id, **urls)
                return _recorded(recorded)
            if method == "GET" and tail is None:
                video = "video" in app
                recorded = fixture("fal/result_kling_video" if video else "fal/result_flux_dev")
                recorded["headers"]["x-fal-request-id"] = request_id
                if video:
                    recorded["body"]["video"]["url"] = f"{FAL_REPLAY_MEDIA_PREFIX}{request_id}/output.mp4"
                else:
                    recorded["body"]["images"] = [{"url": f"{FAL_REPLAY_MEDIA_PREFIX}{request_id}/out-0.png",
                                                   "width": 1, "height": 1, "content_type": "image/png"}]
                return _recorded(recorded)
            if method == "PUT" and tail == "/cancel":
                return _recorded(fixture("fal/cancel_requested"))
            return None
        fal_host = (urlsplit(url).hostname or "").endswith((".fal.run", ".falrun.com"))
        if method != "POST" or not (fal_host or path.startswith("/fal-ai/")) or not re.fullmatch(r"(/[^/]+){2,}", path):
            return None
        try:
            body = json.loads(request.body or b"null")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            recorded = fixture("fal/error_422_validation")
            recorded["body"]["detail"] = [{"loc": ["body"], "msg": "Input should be a valid dictionary",
                                           "type": "dict_type", "input": body}]
            return _recorded(recorded)
        model = path[1:]
        digest = _digest({"model": model, "input": body}).hex()
        request_id = f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
        segments = model.split("/")
        app = "/".join(segments[: 3 if segments[0] in ("workflows", "comfy") else 2])  # as fal names an app
        recorded = fixture("fal/submit_accepted")
        recorded["body"].update(request_id=request_id, response_url=f"{api}/{app}/requests/{request_id}",
                                status_url=f"{api}/{app}/requests/{request_id}/status",
                                cancel_url=f"{api}/{app}/requests/{request_id}/cancel")
        recorded["headers"]["x-fal-request-id"] = request_id
        return _recorded(recorded)

    # -- media -----------------------------------------------------------------------------------------

    def _media(self, method: str, path: str):
        if method not in ("GET", "HEAD"):
            return 405, {"content-type": "text/plain"}, b"method not allowed\n"
        if path.endswith(".png"):
            content, content_type = REPLAY_PNG, "image/png"
        else:
            content = f"payonce replay media {path}\n".encode()
            content_type = mimetypes.guess_type(path)[0] or "application/octet-stream"
        return 200, {"content-type": content_type, "content-length": str(len(content))}, content


def _urls(api: str, prediction_id: str) -> dict:
    return {"cancel": f"{api}/v1/predictions/{prediction_id}/cancel", "get": f"{api}/v1/predictions/{prediction_id}",
            "stream": f"https://stream.replicate.com/v1/files/replay-{prediction_id}",
            "web": f"https://replicate.com/p/{prediction_id}"}


def _json_body(request) -> dict:
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _json(status: int, headers: dict, body) -> tuple[int, dict, bytes]:
    return status, headers, json.dumps(body).encode()


def _recorded(recorded: dict) -> tuple[int, dict, bytes]:
    return _json(recorded["status"], recorded["headers"], recorded["body"])
