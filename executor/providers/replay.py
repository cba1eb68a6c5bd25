"""Recorded answers for the real providers, with no network (docs/design.md, "Real money is opt-in"). With
REAL_PROVIDERS off a job may still name any real provider's models; their adapters then reach this module
instead of the provider.

`ReplayAdapter` is a requests transport adapter that answers from the recorded wire formats each provider's
folder keeps (executor/providers/<package>/fixtures/, see executor/providers/FIXTURES.md): the same status
codes, headers and JSON bodies the providers send, with the request's own model, a deterministic id and
deterministic text or bytes filled in. This module is the engine; the routes are each provider's own
(executor/providers/<package>/replay.py, its spec's `replay_routes`), tried in the order of
executor.providers.PROVIDERS, and the media hosts their answers point at (`replay_media_prefixes`) answer a
small PNG (or bytes named like the path). Nothing here keeps state or reads the clock, so the same request
always yields the same answer, in any process.

`mount_replay(session, base_url)` mounts the adapter on a session. The real adapters do not need it:
`executor.providers.real.send` routes their calls through `replay_session_key`, a per-thread session of
its own where the adapter is mounted for every http(s) URL, so a recorded call can never fall through to
the network and the real session for the same base URL is never altered.
"""

import hashlib
import http.client
import json
import math
import mimetypes
import struct
import zlib
from functools import lru_cache
from io import BytesIO
from pathlib import Path
from urllib.parse import urlsplit

import requests
from requests.adapters import BaseAdapter
from requests.structures import CaseInsensitiveDict

from executor import providers
from executor.providers import http as provider_http

PROVIDERS_DIR = Path(__file__).parent
_SESSION_PREFIX = "payonce-replay:"


def fixtures_dir(package: str) -> Path:
    """Where a provider's recorded answers are: its own folder's `fixtures/`."""
    return PROVIDERS_DIR / package / "fixtures"


def fixture(name: str) -> dict:
    """One recorded response, `{"status", "headers", "body"}`, as a fresh copy (callers may change it).
    `name` is `<package>/<file stem>`: "anthropic/message" is anthropic/fixtures/message.json."""
    return json.loads(_fixture_text(name))


@lru_cache(maxsize=None)
def _fixture_text(name: str) -> str:
    package, _, stem = name.partition("/")
    return (fixtures_dir(package) / f"{stem}.json").read_text(encoding="utf-8")


def mount_replay(session: requests.Session, base_url: str) -> "ReplayAdapter":
    """Answer every request `session` sends under `base_url` (and to the providers' media hosts) from the
    recorded fixtures."""
    adapter = ReplayAdapter(base_url)
    session.mount(base_url.rstrip("/") + "/", adapter)
    for prefix in _media_prefixes():
        session.mount(prefix, adapter)
    return adapter


def _specs():
    """The providers' specs, read at call time: the real adapters import this module (through
    executor.providers.real) while executor.providers builds them (so `providers` is the package, not yet
    its PROVIDERS)."""
    return providers.PROVIDERS


def _media_prefixes() -> tuple[str, ...]:
    return tuple(prefix for spec in _specs() for prefix in spec.replay_media_prefixes)


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
        if url.startswith(_media_prefixes()):
            return self._media(method, parts.path)
        origin = f"{parts.scheme}://{parts.netloc}"
        base = self.base_url if self.base_url.startswith(origin) else origin
        path = parts.path
        base_path = urlsplit(base).path.rstrip("/")
        if base_path and path.startswith(base_path + "/"):
            path = path[len(base_path):]
        api = origin  # URLs in answers (Replicate's, fal's) point back at where the call went
        # Each provider's routes answer only its own requests; the order of PROVIDERS settles the rest (fal's
        # submit takes any `/fal-ai/...` path, so it comes after the providers with fixed paths).
        for spec in _specs():
            if spec.replay_routes is not None and (answer := spec.replay_routes(method, url, api, path, request)):
                return answer
        message = f"payonce replay: no recorded answer for {method} {parts.path}"
        # Readable by every adapter's error parser.
        return _json(404, {"content-type": "application/json"},
                     {"type": "error", "error": {"type": "not_found_error", "message": message},
                      "title": "Not found", "detail": message, "status": 404})

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
