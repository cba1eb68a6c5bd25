"""The sandbox provider's HTTP server: a paid provider that charges on acceptance and takes a failure script.

Run alone with `python -m sandbox.server` (or under the supervisor, `python -m sandbox`). Settings:
SANDBOX_HOST (127.0.0.1), SANDBOX_PORT (8100), SANDBOX_STATE_DIR (./var/sandbox), SANDBOX_LOG=1 for a
per-request log on stderr. Standard library only: this process must never import Django.

Every call to /v1/generations*, /v1/messages and /v1/inputs* is written to the call log, with the fault
it took and the status answered (null when the answer was never sent), before the answer goes out.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import signal
import socket
import sys
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

from . import catalog
from .callbacks import Caller
from .state import CancelRefused, IdempotencyConflict, Reset, State, generation_status, iso

MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_RENDER_S = 24 * 3600

FAULT_ACTIONS = frozenset(
    {
        "status_400",
        "status_429",
        "status_500",
        "status_503",
        "status_422",
        "status_401",
        "refuse",
        "delay",
        "accept_then_drop",
        "crash_after_accept",
        "fail_render",
        "empty",
        "drop_callback",
    }
)
FAULT_ONS = frozenset({"submit", "poll", "cancel", "upload", "lookup", "media"})
FAULT_KEYS = frozenset({"model", "action", "times", "seconds", "message", "on"})
CRASH_EXIT_CODE = 17


class ApiError(Exception):
    def __init__(self, status: int, type_: str, message: str, headers=None, **extra):
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.headers = headers or {}
        self.extra = extra

    def response(self) -> "Response":
        body = {"error": {"type": self.type, "message": self.message, **self.extra}}
        return Response(self.status, body, headers=self.headers)


class Response:
    def __init__(self, status: int, body=None, *, raw: bytes | None = None, content_type=None, headers=None):
        self.status = status
        if raw is None:
            self.data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
            self.content_type = "application/json"
        else:
            self.data = raw
            self.content_type = content_type or "application/octet-stream"
        self.headers = headers or {}


class SandboxServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address, state: State):
        super().__init__(address, Handler)
        self.state = state
        self.callbacks = Caller(self._callback_view)

    def _callback_view(self, generation_id: str, base_url: str) -> dict | None:
        gen = self.state.get_generation(generation_id)
        return generation_view(self.state, gen, base_url) if gen is not None else None


def generation_view(state: State, gen: dict, base_url: str) -> dict:
    """A generation as GET /v1/generations/{id} answers it (and as a callback carries it)."""
    status, completed_at = generation_status(gen, time.time())
    model = catalog.MODELS[gen["model"]]
    output = None
    error = None
    if status == "succeeded":
        size, sha = state.media_digest(gen)
        output = {
            "url": f"{base_url}/v1/generations/{gen['id']}/media",
            "content_type": model.content_type,
            "bytes": size,
            "sha256": sha,
        }
    elif status == "failed":
        error = {"type": "render_failed", "message": gen["fail_message"]}
    return {
        "id": gen["id"],
        "model": gen["model"],
        "status": status,
        "request_id": gen["request_id"],
        "metadata": gen["metadata"],
        "created_at": iso(gen["created_at"]),
        "completed_at": iso(completed_at) if completed_at is not None else None,
        # How long the render is expected to take from created_at: a poller's first look
        # (docs/design.md, "Waiting costs little"). `params.expected_s` makes the sandbox say another figure
        # (null: none), for tests of a render that finishes early, late, or without a word.
        "expected_s": gen["params"].get("expected_s", gen["render_s"]),
        "cost_usd": gen["cost_usd"],
        "output": output,
        "error": error,
    }


# -- validation helpers --------------------------------------------------------------------------


def _invalid(message: str) -> ApiError:
    return ApiError(422, "invalid_request", message)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _optional_object(body: dict, key: str):
    value = body.get(key)
    if value is not None and not isinstance(value, dict):
        raise _invalid(f"{key} must be an object")
    return value


def _optional_string(body: dict, key: str, *, non_empty: bool = True):
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or (non_empty and not value):
        raise _invalid(f"{key} must be a non-empty string")
    return value


def _render_params(params: dict) -> dict:
    if "render_s" in params:
        render_s = params["render_s"]
        if not _is_number(render_s) or render_s < 0 or render_s > MAX_RENDER_S:
            raise _invalid(f"params.render_s must be a number between 0 and {MAX_RENDER_S}")
    if "size_bytes" in params:
        size = params["size_bytes"]
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= catalog.MAX_SIZE_BYTES:
            raise _invalid(f"params.size_bytes must be an integer between 0 and {catalog.MAX_SIZE_BYTES}")
    if "fail_render" in params and not isinstance(params["fail_render"], str):
        raise _invalid("params.fail_render must be a string")
    if "expected_s" in params and params["expected_s"] is not None and (
            not _is_number(params["expected_s"]) or params["expected_s"] < 0):
        raise _invalid("params.expected_s must be a number >= 0 or null")
    return params


def _fault_error(fault: dict) -> ApiError | None:
    """The error an injected fault answers with instead of handling the call, or None."""
    action = fault["action"]
    seconds = fault.get("seconds")
    message = fault.get("message")
    if action == "status_429":
        wait = seconds if seconds is not None else 1
        return ApiError(
            429,
            "rate_limited",
            message or "rate limited, retry later",
            headers={"Retry-After": str(math.ceil(wait))},
            retry_after_s=wait,
        )
    if action == "status_500":
        return ApiError(500, "server_error", message or "internal server error")
    if action == "status_503":
        headers = {"Retry-After": str(math.ceil(seconds))} if seconds is not None else {}
        extra = {"retry_after_s": seconds} if seconds is not None else {}
        return ApiError(503, "unavailable", message or "service unavailable", headers=headers, **extra)
    if action == "status_422":
        return _invalid(message or "duration_secs must be 8 when reference images are given")
    if action == "status_400":
        return ApiError(400, "invalid_request_error", message or "the request is not valid")
    if action == "status_401":
        return ApiError(401, "authentication_error", message or "invalid API key")
    if action == "refuse":
        return ApiError(400, "content_refused", message or "The request was refused by the content policy.")
    return None


def _validate_faults(body) -> list[dict]:
    if not isinstance(body, dict) or not isinstance(body.get("faults"), list):
        raise _invalid('body must be {"faults": [...]}')
    faults = []
    for index, raw in enumerate(body["faults"]):
        where = f"faults[{index}]"
        if not isinstance(raw, dict):
            raise _invalid(f"{where} must be an object")
        unknown = set(raw) - FAULT_KEYS
        if unknown:
            raise _invalid(f"{where} has unknown keys: {', '.join(sorted(unknown))}")
        model = raw.get("model")
        if model != "*" and model not in catalog.MODELS:
            raise _invalid(f"{where}.model must be '*' or one of {', '.join(catalog.MODELS)}")
        action = raw.get("action")
        if action not in FAULT_ACTIONS:
            raise _invalid(f"{where}.action must be one of {', '.join(sorted(FAULT_ACTIONS))}")
        times = raw.get("times", 1)
        if not isinstance(times, int) or isinstance(times, bool) or times < 1:
            raise _invalid(f"{where}.times must be an integer >= 1")
        seconds = raw.get("seconds")
        if seconds is not None and (not _is_number(seconds) or seconds < 0):
            raise _invalid(f"{where}.seconds must be a number >= 0")
        message = raw.get("message")
        if message is not None and not isinstance(message, str):
            raise _invalid(f"{where}.message must be a string")
        on = raw.get("on", "submit")
        if on not in FAULT_ONS:
            raise _invalid(f"{where}.on must be one of {', '.join(sorted(FAULT_ONS))}")
        if action in ("fail_render", "drop_callback") and (on != "submit" or model == "llm"):
            raise _invalid(f"{where}: {action} applies to generation submits only")
        if action == "empty" and (on != "submit" or model not in ("llm", "*")):
            raise _invalid(f"{where}: empty applies to LLM calls only")
        faults.append(
            {"model": model, "action": action, "times": times, "seconds": seconds, "message": message, "on": on}
        )
    return faults


# -- the handler ---------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sandbox/1"
    timeout = 300  # an idle keep-alive connection gives its thread back after this
    server: SandboxServer

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format, *args):  # noqa: A002 (BaseHTTPRequestHandler's signature)
        if os.environ.get("SANDBOX_LOG") == "1":
            super().log_message(format, *args)

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_PATCH(self):
        self._dispatch("PATCH")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def do_HEAD(self):
        self._dispatch("HEAD")

    # -- plumbing ----------------------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self.server.state

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks, total = [], 0
            while True:
                try:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                except ValueError:
                    raise ApiError(400, "invalid_request", "bad chunk size") from None
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                total += size
                if total > MAX_BODY_BYTES:
                    raise ApiError(413, "payload_too_large", f"body over {MAX_BODY_BYTES} bytes")
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = self.headers.get("Content-Length")
        if not length:
            return b""
        try:
            length = int(length)
        except ValueError:
            raise ApiError(400, "invalid_request", "bad Content-Length") from None
        if length < 0 or length > MAX_BODY_BYTES:
            raise ApiError(413, "payload_too_large", f"body over {MAX_BODY_BYTES} bytes")
        return self.rfile.read(length)

    def _json_body(self) -> dict:
        def reject_constant(name):
            raise ValueError(f"{name} is not JSON")

        try:
            body = json.loads(self.body, parse_constant=reject_constant)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, "invalid_json", f"body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise _invalid("body must be a JSON object")
        return body

    def _dispatch(self, method: str) -> None:
        self.call = None  # what the call log records; set by provider endpoints
        self.call_seq = None
        self.after = None  # "drop" | "crash": what an injected fault does instead of answering
        self.result_id = None  # the generation or message a submit answered with, for the call log
        self.state.enter()  # a reset from now on leaves this call nothing to write (State.enter)
        split = urlsplit(self.path)
        self.route_path = split.path
        self.query = parse_qsl(split.query, keep_blank_values=True)
        try:
            try:
                self.body = self._read_body()
            except ApiError:
                self.close_connection = True  # the unread body would be taken for the next request
                raise
            handler, args = self._route(method, split.path)
            response = handler(*args)
        except ApiError as exc:
            response = exc.response()
        except Reset:  # held (a `delay` fault) across a reset: it charged and recorded nothing
            self.call = None
            self.after = None
            response = ApiError(503, "unavailable", "the sandbox was reset while this call was in it").response()
        except Exception:  # a bug in the sandbox: say so, don't hang the client
            traceback.print_exc()
            response = ApiError(500, "internal_error", "sandbox bug; see its stderr").response()

        if self.call is not None:
            # Record the answer before sending it, so a client that reads /control/calls right
            # after its response sees the status. A dropped or crashed call keeps status null.
            status = response.status if self.after is None else None
            try:
                if self.call_seq is None:
                    self.state.log_call(**self.call, status=status)
                elif status is not None or self.result_id is not None:
                    self.state.set_call_status(self.call_seq, status, self.result_id)
            except Reset:  # reset since it was answered: the answer stands, the new call log does not hold it
                pass

        if self.after == "crash":
            with self.state.lock:  # no other thread is half-way through a journal append
                print(f"sandbox: crash_after_accept on {method} {split.path}: exit {CRASH_EXIT_CODE}",
                      file=sys.stderr, flush=True)
                os._exit(CRASH_EXIT_CODE)
        if self.after == "drop":
            self._drop_connection()
            return
        self._send(response)

    def _send(self, response: Response) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.data)))
        for name, value in response.headers.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        # Headers and body in one write: two small writes meet Nagle and delayed ACKs on keep-alive
        # connections and cost ~40 ms a request.
        self._headers_buffer.append(b"\r\n")
        if self.command != "HEAD":
            self._headers_buffer.append(response.data)
        self.flush_headers()

    def _drop_connection(self) -> None:
        """Send nothing and cut the connection: the client sees a connection error."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.connection.close()

    def _route(self, method: str, path: str):
        for pattern, methods in ROUTES:
            match = pattern.fullmatch(path)
            if match is None:
                continue
            name = methods.get(method)
            if name is None:
                raise ApiError(
                    405,
                    "method_not_allowed",
                    f"{method} not allowed on {path}",
                    headers={"Allow": ", ".join(sorted(methods))},
                )
            return getattr(self, name), match.groups()
        raise ApiError(404, "not_found", f"no route for {path}")

    def _track(self, kind: str, *, model=None, request_id=None, metadata=None, generation_id=None) -> None:
        """Mark this request as a provider call for the call log (logged even if it fails validation)."""
        self.call = {
            "method": self.command,
            "path": self.route_path,
            "kind": kind,
            "model": model,
            "request_id": request_id,
            "metadata": metadata,
            "generation_id": generation_id,
        }

    def _begin(self, on: str | None, *, skip_actions=frozenset()) -> dict | None:
        """Log the call, take a matching fault and apply what happens before handling it.

        Error faults raise; `delay` sleeps (outside the lock); `accept_then_drop` and
        `crash_after_accept` are remembered and carried out after the call has been handled.
        """
        self.call_seq, fault = self.state.log_call(**self.call, fault_on=on, skip_actions=skip_actions)
        if fault is None:
            return None
        error = _fault_error(fault)
        if error is not None:
            raise error
        if fault["action"] == "delay":
            time.sleep(fault["seconds"] if fault["seconds"] is not None else 1)
        elif fault["action"] == "accept_then_drop":
            self.after = "drop"
        elif fault["action"] == "crash_after_accept":
            self.after = "crash"
        return fault

    def _base_url(self) -> str:
        host = self.headers.get("Host")
        if not host:
            host, port = self.server.server_address[:2]
            host = f"{host}:{port}"
        return f"http://{host}"

    def _generation_view(self, gen: dict) -> dict:
        return generation_view(self.state, gen, self._base_url())

    def _find_generation(self, gen_id: str) -> dict:
        gen = self.state.get_generation(gen_id)
        if gen is None:
            raise ApiError(404, "not_found", f"no generation {gen_id}")
        return gen

    # -- endpoints ---------------------------------------------------------------------------------

    def healthz(self):
        return Response(200, {"ok": True, "pid": os.getpid()})

    def list_models(self):
        return Response(200, {"data": [m.as_json() for m in catalog.MODELS.values()]})

    def submit_generation(self):
        self._track("submit")
        body = self._json_body()
        self._track(
            "submit",
            model=body.get("model") if isinstance(body.get("model"), str) else None,
            request_id=body.get("request_id"),
            metadata=body.get("metadata"),
        )
        model_id = body.get("model")
        if not isinstance(model_id, str):
            raise _invalid("model must be a string")
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise _invalid("prompt must be a non-empty string")
        params = _optional_object(body, "params") or {}
        metadata = _optional_object(body, "metadata")
        request_id = _optional_string(body, "request_id")
        callback_url = _optional_string(body, "callback_url")
        if callback_url is not None and not callback_url.startswith(("http://", "https://")):
            raise _invalid("callback_url must be an http(s) URL")
        model = catalog.MODELS.get(model_id)
        if model is None:
            raise ApiError(404, "model_not_found", f"no model {model_id!r}")
        if not model.is_async:
            raise _invalid(f"model {model_id} is answered by POST /v1/messages")
        _render_params(params)

        fault = self._begin("submit", skip_actions=frozenset({"empty"}))
        fail_message = params.get("fail_render")
        if fault is not None and fault["action"] == "fail_render":
            fail_message = fault["message"] or "render failed upstream"
        try:
            gen, created = self.state.submit_generation(
                model=model,
                prompt=prompt,
                params=params,
                request_id=request_id,
                metadata=metadata,
                fail_message=fail_message,
                callback_url=callback_url,
            )
        except IdempotencyConflict as exc:
            raise ApiError(
                409,
                "idempotency_conflict",
                f"request_id {request_id!r} was first used with a different prompt or params",
                generation_id=exc.generation_id,
            ) from None
        self.result_id = gen["id"]
        view = self._generation_view(gen)
        dropped = fault is not None and fault["action"] == "drop_callback"
        # A replay's callback is the first submit's; a render that ended before its submit was answered
        # is told in that answer, not called back.
        if created and callback_url and not dropped and view["status"] == "running":
            self.server.callbacks.schedule(gen["id"], callback_url, self._base_url(),
                                           gen["created_at"] + gen["render_s"])
        headers = {} if created else {"Idempotent-Replayed": "true"}
        return Response(202, view, headers=headers)

    def lookup_generations(self):
        filters = []
        model_id = None
        for key, value in self.query:
            if key.startswith("metadata.") and len(key) > len("metadata."):
                filters.append((key[len("metadata."):], value))
            elif key == "model":
                model_id = value
            else:
                self._track("lookup", model=model_id)
                raise _invalid(f"unknown query parameter {key!r}; use metadata.KEY=VALUE or model")
        self._track("lookup", model=model_id, metadata=dict(filters) or None)
        if not filters:
            raise _invalid("lookup needs at least one metadata.KEY=VALUE filter")
        if model_id is not None:
            model = catalog.MODELS.get(model_id)
            if model is None:
                raise ApiError(404, "model_not_found", f"no model {model_id!r}")
            if not model.lookup:
                raise ApiError(400, "not_supported", f"model {model_id} cannot be looked up by metadata")
        self._begin("lookup")
        found = self.state.lookup(filters, model_id)
        return Response(200, {"data": [self._generation_view(g) for g in found]})

    def get_generation(self, gen_id: str):
        self._track("poll", generation_id=gen_id)
        gen = self._find_generation(gen_id)
        self._track("poll", model=gen["model"], generation_id=gen_id)
        self._begin("poll")
        return Response(200, self._generation_view(self._find_generation(gen_id)))

    def cancel_generation(self, gen_id: str):
        self._track("cancel", generation_id=gen_id)
        gen = self._find_generation(gen_id)
        self._track("cancel", model=gen["model"], generation_id=gen_id)
        self._begin("cancel")
        if not catalog.MODELS[gen["model"]].cancel:
            raise ApiError(400, "not_supported", f"model {gen['model']} does not support cancel")
        try:
            gen = self.state.cancel_generation(gen_id)
        except CancelRefused as exc:
            raise ApiError(409, "conflict", f"generation {gen_id} already {exc.status}") from None
        if gen.get("callback_url"):
            self.server.callbacks.schedule(gen_id, gen["callback_url"], self._base_url(), time.time())
        return Response(200, self._generation_view(gen))

    def generation_media(self, gen_id: str):
        self._track("media", generation_id=gen_id)
        gen = self._find_generation(gen_id)
        self._track("media", model=gen["model"], generation_id=gen_id)
        self._begin("media")
        status, _ = generation_status(gen, time.time())
        if status != "succeeded":
            raise ApiError(409, "not_ready", f"generation {gen_id} is {status}", generation_status=status)
        data = self.state.media(gen)
        _, sha = self.state.media_digest(gen)
        return Response(
            200,
            raw=data,
            content_type=catalog.MODELS[gen["model"]].content_type,
            headers={"ETag": f'"{sha}"'},
        )

    def create_message(self):
        self._track("submit")
        body = self._json_body()
        self._track(
            "submit",
            model=body.get("model") if isinstance(body.get("model"), str) else None,
            request_id=body.get("request_id"),
            metadata=body.get("metadata"),
        )
        model_id = body.get("model")
        if not isinstance(model_id, str):
            raise _invalid("model must be a string")
        system = body.get("system")
        if system is not None and not isinstance(system, str):
            raise _invalid("system must be a string")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _invalid("messages must be a non-empty list")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
                raise _invalid(f"messages[{index}] must be an object with role 'user' or 'assistant'")
            content = message.get("content")
            blocks_ok = isinstance(content, list) and all(
                isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
                for b in content
            )
            if not isinstance(content, str) and not blocks_ok:
                raise _invalid(f"messages[{index}].content must be a string or a list of text blocks")
            for block in content if isinstance(content, list) else ():
                marker = block.get("cache_control")
                if marker is not None and (not isinstance(marker, dict) or marker.get("type") != "ephemeral"):
                    raise _invalid(f'messages[{index}]: cache_control must be {{"type": "ephemeral"}}')
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise _invalid("max_tokens must be an integer >= 1")
        metadata = _optional_object(body, "metadata")
        request_id = _optional_string(body, "request_id")
        model = catalog.MODELS.get(model_id)
        if model is None:
            raise ApiError(404, "model_not_found", f"no model {model_id!r}")
        if model.is_async:
            raise _invalid(f"model {model_id} is rendered by POST /v1/generations")

        # The prompt as it arrived, in the call log: the system prompt and each message's text (its blocks
        # joined), so a test reads what a provider was sent.
        self.call["prompt"] = {"system": system, "messages": [
            m["content"] if isinstance(m["content"], str) else "".join(b["text"] for b in m["content"]) for m in messages]}
        # fail_render has no meaning for a synchronous call: such faults wait for a generation.
        fault = self._begin("submit", skip_actions=frozenset({"fail_render", "drop_callback"}))
        reply = catalog.llm_reply(system, messages, max_tokens)
        if fault is not None and fault["action"] == "empty":
            reply = {**reply, "text": "", "output_tokens": 0}  # answered (and charged for its input), empty
        written, read = self._prompt_cache(model, system, messages, reply["input_tokens"])
        input_tokens = reply["input_tokens"] - written - read
        amount = catalog.llm_cost(model, input_tokens, reply["output_tokens"], written, read)
        msg_id, charge = self.state.charge_message(
            model=model, amount=amount, request_id=request_id, metadata=metadata
        )
        self.result_id = msg_id
        return Response(
            200,
            {
                "id": msg_id,
                "type": "message",
                "role": "assistant",
                "model": model.id,
                "content": [{"type": "text", "text": reply["text"]}],
                "stop_reason": reply["stop_reason"],
                "stop_sequence": None,
                # Token usage only, like Anthropic's Messages API: the caller derives the cost from its
                # rate card; the ledger charges the catalog's price.
                # Cached prefix tokens apart, as Anthropic reports them: input_tokens is the rest.
                "usage": {"input_tokens": input_tokens, "output_tokens": reply["output_tokens"],
                          "cache_creation_input_tokens": written, "cache_read_input_tokens": read},
            },
        )

    def _prompt_cache(self, model, system, messages, input_tokens: int) -> tuple[int, int]:
        """(tokens written to the cache, tokens read from it) for a prompt with a `cache_control`
        breakpoint: its prefix is looked up by hash, per model; a hit within the cache's lifetime is a
        read, anything else a write. A prefix under CACHE_MIN_TOKENS, or no breakpoint: (0, 0)."""
        prefix = catalog.cache_prefix(system, messages)
        if prefix is None:
            return 0, 0
        chars, canonical = prefix
        tokens = min(catalog.prefix_tokens(chars), input_tokens)
        if tokens < catalog.CACHE_MIN_TOKENS:
            return 0, 0
        key = hashlib.sha256(f"{model.id}\n{canonical}".encode()).hexdigest()
        return (0, tokens) if self.state.cache_use(key) else (tokens, 0)

    def upload_input(self):
        self._track("upload")
        self._begin("upload")
        content_type = self.headers.get("Content-Type") or "application/octet-stream"
        return Response(201, self.state.add_input(self.body, content_type))

    def get_input(self, inp_id: str):
        self._track("input")
        record = self.state.get_input(inp_id)
        if record is None:
            raise ApiError(404, "not_found", f"no input {inp_id}")
        return Response(200, record)

    def input_content(self, inp_id: str):
        self._track("input")
        record = self.state.get_input(inp_id)
        if record is None:
            raise ApiError(404, "not_found", f"no input {inp_id}")
        return Response(200, raw=self.state.input_bytes(inp_id), content_type=record["content_type"])

    def ledger(self):
        return Response(200, self.state.ledger())

    def control_calls(self):
        return Response(200, {"calls": self.state.call_log()})

    def control_faults_list(self):
        return Response(200, {"faults": self.state.pending_faults()})

    def control_faults_add(self):
        """POST /control/faults {"faults": [...], "first": false}: append the faults to the pending ones,
        or with "first": true put them before every pending one (a test's fault for the very next call)."""
        body = self._json_body()
        faults = _validate_faults(body)
        first = body.get("first", False)
        if not isinstance(first, bool):
            raise _invalid("first must be true or false")
        return Response(200, {"faults": self.state.add_faults(faults, first=first)})

    def control_callbacks(self):
        return Response(200, {"callbacks": self.server.callbacks.log()})

    def control_cache(self):
        """POST /control/cache {"ttl_s": 2}: how long a prompt cache entry lives from now on (a test's short
        lifetime; a reset restores SANDBOX_CACHE_TTL_S)."""
        ttl = self._json_body().get("ttl_s")
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl <= 86400:
            raise _invalid("ttl_s must be a number of seconds, above 0 and at most a day")
        return Response(200, {"ttl_s": self.state.set_cache_ttl(float(ttl))})

    def control_reset(self):
        self.state.reset()
        self.server.callbacks.reset()
        return Response(200, {"ok": True})


ROUTES = [
    (re.compile(p), methods)
    for p, methods in (
        (r"/healthz", {"GET": "healthz"}),
        (r"/v1/models", {"GET": "list_models"}),
        (r"/v1/generations", {"GET": "lookup_generations", "POST": "submit_generation"}),
        (r"/v1/generations/([^/]+)", {"GET": "get_generation"}),
        (r"/v1/generations/([^/]+)/media", {"GET": "generation_media"}),
        (r"/v1/generations/([^/]+)/cancel", {"POST": "cancel_generation"}),
        (r"/v1/messages", {"POST": "create_message"}),
        (r"/v1/inputs", {"POST": "upload_input"}),
        (r"/v1/inputs/([^/]+)", {"GET": "get_input"}),
        (r"/v1/inputs/([^/]+)/content", {"GET": "input_content"}),
        (r"/ledger", {"GET": "ledger"}),
        (r"/control/calls", {"GET": "control_calls"}),
        (r"/control/faults", {"GET": "control_faults_list", "POST": "control_faults_add"}),
        (r"/control/callbacks", {"GET": "control_callbacks"}),
        (r"/control/reset", {"POST": "control_reset"}),
        (r"/control/cache", {"POST": "control_cache"}),
    )
]


class _Stop(Exception):
    pass


def _stop(signum, frame):
    raise _Stop()


def main() -> int:
    host = os.environ.get("SANDBOX_HOST", "127.0.0.1")
    port = int(os.environ.get("SANDBOX_PORT", "8100"))
    state_dir = os.environ.get("SANDBOX_STATE_DIR", "./var/sandbox")
    state = State(state_dir)
    try:
        server = SandboxServer((host, port), state)
    except OSError as exc:
        print(f"sandbox.server: cannot listen on {host}:{port}: {exc}", file=sys.stderr, flush=True)
        return 2
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        server.serve_forever()
    except _Stop:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
