"""A real OTLP/HTTP traces receiver for the tests, as a process of its own: what payonce's exporter sends it
arrives over HTTP exactly as a collector would take it, and every span it takes is written to a file as one
JSON line, so a test reads the spans that were really sent.

    python -m tests.support.otlp_receiver --port PORT --out SPANS.jsonl

It takes `POST /v1/traces` in both OTLP encodings, protobuf (`application/x-protobuf`, gzip- or
deflate-compressed as OTEL_EXPORTER_OTLP_COMPRESSION makes the exporter send it) and JSON
(`application/json`, ids in hex as OTLP/JSON writes them), and answers 200 with an empty
ExportTraceServiceResponse in the request's encoding. A body over 16 MiB, sent or once inflated, is refused
with 413, an undecodable one with 400, another content type or encoding with 415; every POST to /v1/...
counts as a request, refused or not, so a test can tell that nothing was sent at all. `GET /healthz` says it
is up (and its PID); `GET /stats` counts requests, the refused among them, spans, and the requests taken by
Content-Encoding (identity, gzip, deflate); `POST /control/reset` empties the file and the counts.

A span's line: trace_id and span_id in hex, parent_span_id in hex or "", name, kind (SERVER, CLIENT,
INTERNAL, PRODUCER, CONSUMER, UNSPECIFIED), start_ns, end_ns, attributes (a dict of Python values: an
array is a list, a kvlist a dict, bytes their hex), events [{name, time_ns, attributes}], links [{trace_id,
span_id, attributes}], status {code: UNSET|OK|ERROR, message}, resource (the resource's attributes:
service.name, ...) and scope (the instrumentation scope's name).

A test drives it through `OtlpReceiver` (below), or the `otlp` fixture (tests/conftest.py), which is the
session's receiver emptied for the test. A process under test exports to it when its environment says so:

    worker = ProcfileProcess("worker", env={"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint, ...}).start()
    spans = otlp.wait_for(lambda spans: otlp.by_name("payonce.provider_call", spans))

Its top-level imports are the standard library, requests, the OTLP protobuf messages (opentelemetry-proto,
googleapis-common-protos for the error answers) and tests/support/procs.py, none of Django: the receiver
process starts in a moment.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

import requests
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)
from opentelemetry.proto.trace.v1 import trace_pb2

from tests.support.procs import REPO_ROOT, free_port

MAX_BODY_BYTES = 16 * 1024 * 1024
DISCARD_BYTES = 256 * 1024 * 1024  # of a refused body, read and dropped so that its sender reads the 413
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
# zlib's wbits: 16 + MAX_WBITS reads a gzip member, MAX_WBITS a zlib stream (what "deflate" means over HTTP).
INFLATE_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


# --- the receiver process ---------------------------------------------------------------------------------

class Refused(Exception):
    """A request the receiver answers with a 4xx: its status and what was wrong with it."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class SpanFile:
    """The spans file and the counters, changed under one lock: a request's lines are written in one piece
    and flushed before it is answered, exporters sending at once never interleave theirs, and a reset never
    falls between a request's lines and its count."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._file = open(path, "ab")
        self._zero()

    def _zero(self) -> None:
        self.requests = self.refused = self.spans = 0
        self.encodings: dict[str, int] = defaultdict(int)  # of the requests taken: identity, gzip, deflate

    def count_request(self) -> None:
        with self._lock:
            self.requests += 1

    def count_refused(self) -> None:
        with self._lock:
            self.refused += 1

    def append(self, records: list[dict], encoding: str) -> None:
        lines = b"".join(json.dumps(record, separators=(",", ":")).encode() + b"\n" for record in records)
        with self._lock:
            self._file.write(lines)
            self._file.flush()  # the test process reads the file while this one runs
            self.spans += len(records)
            self.encodings[encoding] += 1

    def stats(self) -> dict:
        with self._lock:
            return {"requests": self.requests, "refused": self.refused, "spans": self.spans,
                    "encodings": dict(self.encodings)}

    def reset(self) -> None:
        with self._lock:
            self._file.truncate(0)  # opened for appending: the next line is written at the new end, 0
            self._zero()

    def close(self) -> None:
        self._file.close()


def any_value(value) -> object:
    """An OTLP AnyValue as the Python value it carries (None when it carries none)."""
    which = value.WhichOneof("value")
    if which == "array_value":
        return [any_value(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return attributes(value.kvlist_value.values)
    if which == "bytes_value":
        return value.bytes_value.hex()  # a JSON line holds no bytes
    if which in ("string_value", "bool_value", "int_value", "double_value"):
        return getattr(value, which)
    return None  # unset, or a profile's string-table index (never in traces)


def attributes(key_values) -> dict:
    return {item.key: any_value(item.value) for item in key_values}


def span_records(request: ExportTraceServiceRequest) -> list[dict]:
    """Every span of an export request as the line the spans file keeps for it, in the request's order."""
    records = []
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                records.append({
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(),
                    "name": span.name,
                    "kind": trace_pb2.Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
                    "start_ns": span.start_time_unix_nano,
                    "end_ns": span.end_time_unix_nano,
                    "attributes": attributes(span.attributes),
                    "events": [{"name": event.name, "time_ns": event.time_unix_nano,
                                "attributes": attributes(event.attributes)} for event in span.events],
                    "links": [{"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex(),
                               "attributes": attributes(link.attributes)} for link in span.links],
                    "status": {"code": trace_pb2.Status.StatusCode.Name(span.status.code).removeprefix("STATUS_CODE_"),
                               "message": span.status.message},
                    "resource": resource,
                    "scope": scope_spans.scope.name,
                })
    return records


def inflate(body: bytes, encoding: str, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body as it was before the exporter compressed it (`encoding` is lower case, "identity" for none),
    refused past `limit` bytes once inflated (a small gzip body can inflate to gigabytes)."""
    if encoding == "identity":
        return body
    if encoding not in INFLATE_WBITS:
        raise Refused(415, f"unsupported Content-Encoding {encoding!r}")
    inflater = zlib.decompressobj(INFLATE_WBITS[encoding])
    try:
        inflated = inflater.decompress(body, limit + 1)
    except zlib.error as error:
        raise Refused(400, f"the body is not {encoding}: {error}") from None
    if len(inflated) > limit:
        raise Refused(413, f"the body inflates to more than {limit} bytes")
    if not inflater.eof:
        raise Refused(400, f"the {encoding} body is cut short")
    return inflated


def hex_ids_to_base64(request: dict) -> dict:
    """OTLP/JSON writes trace and span ids in hex, where protobuf's JSON mapping of `bytes` reads base64:
    the ids of an OTLP/JSON request, rewritten in place so that json_format reads them."""

    def rewrite(holder: dict, *keys: str) -> None:
        for key in keys:
            for spelling in (key, "".join(part if n == 0 else part.capitalize()
                                          for n, part in enumerate(key.split("_")))):
                if isinstance(holder.get(spelling), str):
                    holder[spelling] = base64.b64encode(bytes.fromhex(holder[spelling])).decode()

    for resource_spans in _items(request, "resource_spans", "resourceSpans"):
        for scope_spans in _items(resource_spans, "scope_spans", "scopeSpans"):
            for span in _items(scope_spans, "spans"):
                rewrite(span, "trace_id", "span_id", "parent_span_id")
                for link in _items(span, "links"):
                    rewrite(link, "trace_id", "span_id")
    return request


def _items(holder, *spellings: str) -> list:
    """The list under whichever spelling the sender used (OTLP/JSON receivers take lowerCamelCase and
    snake_case keys alike); nothing when the holder is not an object or has no such list."""
    if not isinstance(holder, dict):
        return []
    for spelling in spellings:
        if isinstance(holder.get(spelling), list):
            return holder[spelling]
    return []


def decode(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    try:
        if content_type == PROTOBUF:
            request.ParseFromString(body)
        else:
            json_format.ParseDict(hex_ids_to_base64(json.loads(body)), request, ignore_unknown_fields=True)
    except (DecodeError, json_format.ParseError, ValueError, TypeError) as error:
        raise Refused(400, f"not an ExportTraceServiceRequest in {content_type}: {error}") from None
    return request


def encoded(message, content_type: str) -> bytes:
    if content_type == JSON:
        return json_format.MessageToJson(message, indent=None).encode()
    return message.SerializeToString()


def handler_for(spans: SpanFile, limit: int):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # the exporter keeps its connection for the next batch

        def log_message(self, *args):  # the test reads the file, not a line per request
            pass

        def do_GET(self):
            if self.path == "/healthz":
                self.answer(200, JSON, json.dumps({"ok": True, "pid": os.getpid()}).encode())
            elif self.path == "/stats":
                self.answer(200, JSON, json.dumps(spans.stats()).encode())
            else:
                self.answer(404, "text/plain", b"not found\n")

        def do_POST(self):
            if self.path == "/control/reset":
                spans.reset()
                self.answer(200, JSON, b"{}")
                return
            if not self.path.startswith("/v1/"):
                self.answer(404, "text/plain", b"not found\n")
                return
            spans.count_request()  # before anything is refused: a refused export was still sent
            content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
            try:
                body = self.read_body()
                if body is None:
                    return
                if self.path != "/v1/traces":  # metrics or logs sent to a traces-only receiver
                    raise Refused(404, f"this receiver takes traces only, not {self.path}")
                if content_type not in (PROTOBUF, JSON):
                    raise Refused(415, f"unsupported Content-Type {content_type!r}")
                request = decode(inflate(body, encoding, limit), content_type)
            except Refused as refused:
                spans.count_refused()
                # OTLP/HTTP answers a refusal with a google.rpc.Status in the request's encoding (3: INVALID_ARGUMENT).
                status = status_pb2.Status(code=3, message=refused.message)
                self.answer(refused.status, JSON if content_type == JSON else PROTOBUF, encoded(status, content_type))
                return
            spans.append(span_records(request), encoding)
            self.answer(200, content_type, encoded(ExportTraceServiceResponse(), content_type))

        def read_body(self) -> bytes | None:
            """The body, or None when the sender went away before sending all of it (no request taken). A body
            without a length is refused (no exporter sends one chunked), and one past the limit is read and
            dropped a chunk at a time, never held, before the 413 (as nginx lingers on a close): a connection
            closed on unread bytes is reset, and a client that reads only once it has sent everything may
            then see the reset and not the 413."""
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                self.close_connection = True  # the body, if any, is still on the connection
                raise Refused(411, "a Content-Length is required")
            if int(length) > limit:
                self.close_connection = True
                self.discard(int(length))
                raise Refused(413, f"the body is {length} bytes, more than {limit}")
            body = self.rfile.read(int(length))
            if len(body) < int(length):
                self.close_connection = True
                return None
            return body

        def discard(self, length: int) -> None:
            """Read and drop up to `length` bytes of body (no more than DISCARD_BYTES, in 10 s at most)."""
            self.connection.settimeout(10)
            left = min(length, DISCARD_BYTES)
            try:
                while left > 0:
                    chunk = self.rfile.read(min(left, 1024 * 1024))
                    if not chunk:
                        return
                    left -= len(chunk)
            except OSError:  # a timeout, or the sender gave up
                return

        def answer(self, status: int, content_type: str, body: bytes) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the exporter gave up first (its timeout)

    return Handler


def serve(port: int, out: Path, host: str = "127.0.0.1", limit: int = MAX_BODY_BYTES) -> None:
    """Serve until SIGTERM or SIGINT; the spans file is complete whenever the process ends (every request's
    lines are flushed before it is answered)."""
    spans = SpanFile(out)
    server = ThreadingHTTPServer((host, port), handler_for(spans, limit))
    server.daemon_threads = True
    server.request_queue_size = 128

    def stop(signum, frame):
        raise SystemExit(0)  # out of serve_forever, in the main thread, through the finally below

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever(poll_interval=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        spans.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.otlp_receiver", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True, help="the spans file, one JSON line per span (appended)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES)
    args = parser.parse_args(argv)
    serve(args.port, args.out, args.host, args.max_body_bytes)


# --- the tests' handle on it ------------------------------------------------------------------------------

class OtlpReceiver:
    """The receiver process on its own loopback port, writing to its own spans file (or `out`).

        with OtlpReceiver() as receiver:
            env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}  # the exporter adds /v1/traces
            ...
            spans = receiver.wait_for(lambda spans: len(spans) >= 2)
            assert receiver.requests() == 1
    """

    def __init__(self, port: int | None = None, out: str | Path | None = None):
        self.port = port
        self._workdir = Path(tempfile.mkdtemp(prefix="payonce-otlp-"))
        self.out = Path(out) if out else self._workdir / "spans.jsonl"
        self.log_path = self._workdir / "otlp_receiver.log"
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        """OTEL_EXPORTER_OTLP_ENDPOINT's value: the base URL, to which the exporter adds /v1/traces."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def traces_url(self) -> str:
        """What an OTLPSpanExporter(endpoint=...) built in code is given: the signal's own URL."""
        return f"{self.endpoint}/v1/traces"

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, timeout: float = 15.0, tries: int = 3) -> "OtlpReceiver":
        # A free port is bound and released before the receiver binds it: if something took it in between,
        # the receiver exits at once (or another one answers in its place), and it is started on another.
        for attempt in range(tries):
            port = self.port if self.port and attempt == 0 else free_port()
            try:
                self._start_on(port, timeout)
                return self
            except _NotStarted:
                self.stop()
                if attempt == tries - 1:
                    raise
        return self

    def _start_on(self, port: int, timeout: float) -> None:
        self.port = port
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.otlp_receiver", "--port", str(port), "--out", str(self.out)],
                cwd=REPO_ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise _NotStarted(f"the OTLP receiver exited with {self.proc.returncode}:\n{self.output()[-4000:]}")
            try:
                health = requests.get(f"{self.endpoint}/healthz", timeout=1).json()
            except (requests.RequestException, ValueError):
                time.sleep(0.05)
                continue
            if health.get("pid") != self.proc.pid:
                raise _NotStarted(f"another server (pid {health.get('pid')}) answers on port {port}")
            return
        self.stop()
        raise RuntimeError(f"the OTLP receiver did not answer /healthz within {timeout}s:\n{self.output()[-4000:]}")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM by PID (the receiver closes its file and exits), SIGKILL if it has not gone after `timeout`."""
        if not self.alive:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=timeout)

    def cleanup(self) -> None:
        shutil.rmtree(self._workdir, ignore_errors=True)

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> "OtlpReceiver":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self.cleanup()

    # -- what it received --------------------------------------------------------------------------

    def spans(self) -> list[dict]:
        """Every span received since the start or the last reset, in the order they arrived."""
        try:
            text = self.out.read_bytes().decode()
        except FileNotFoundError:
            return []
        # Complete lines only: the receiver may be writing the next request's lines this very moment.
        return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines() if line]

    def stats(self) -> dict:
        """{"requests", "refused", "spans", "encodings"}: export requests received (refused ones too), those
        refused, spans taken, and the requests taken by Content-Encoding ({"identity": n, "gzip": m})."""
        response = requests.get(f"{self.endpoint}/stats", timeout=5)
        response.raise_for_status()
        return response.json()

    def requests(self) -> int:
        return self.stats()["requests"]

    def reset(self) -> None:
        """Forget every span and request so far (the spans file is emptied)."""
        requests.post(f"{self.endpoint}/control/reset", timeout=5).raise_for_status()

    def wait_for(self, predicate: Callable[[list[dict]], object], timeout: float = 15.0,
                 message: str = "the spans' condition") -> list[dict]:
        """Poll the spans until `predicate(spans)` is true, and return them; an exporter sends a batch when
        its processor's delay is up (OTEL_BSP_SCHEDULE_DELAY, 5 s by default) or when it is flushed."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans()
            if predicate(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({span["name"] for span in spans})
                raise AssertionError(f"{message} not met within {timeout}s: {len(spans)} spans ({names}), "
                                     f"{self.requests()} requests")
            time.sleep(0.05)

    def traces(self, spans: list[dict] | None = None) -> dict[str, list[dict]]:
        """The spans (all received, or those given) by trace id, each trace's in the order they started."""
        grouped = defaultdict(list)
        for span in self.spans() if spans is None else spans:
            grouped[span["trace_id"]].append(span)
        return {trace_id: sorted(members, key=lambda span: span["start_ns"]) for trace_id, members in grouped.items()}

    def by_name(self, name: str, spans: list[dict] | None = None) -> list[dict]:
        return [span for span in (self.spans() if spans is None else spans) if span["name"] == name]


class _NotStarted(RuntimeError):
    """The receiver exited at once (its port was taken), or another server answers on its port."""


if __name__ == "__main__":
    main()
