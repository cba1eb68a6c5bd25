"""What the sync and the async client share beyond the transport: request bodies, paths, how a page
leads to the next, where a redirect goes, and how an event stream reconnects."""

from __future__ import annotations

import dataclasses
import time
from datetime import date
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import parse_qsl, quote, urlsplit

import httpx

from ._http import TimeoutTypes, api_error, connection_error, origin
from ._retry import RETRYABLE_STATUSES, Mode, may_pass, pause_after_error, pause_after_status
from .errors import APIConnectionError, APIError, TooManyStreams

JOBS = "/v1/jobs"
REPORT_TEMPLATES = "/v1/report-templates"
STREAM_READ_TIMEOUT_S = 45.0  # payonce sends a keep-alive at least every 15 s on a quiet stream
WAIT_STREAM_FAILURES = 3  # failed connections in a row after which `wait` polls instead
MAX_REDIRECTS = 5
ANY = {"Accept": "*/*"}  # an output is whatever its job made; a report's `303` then answers Markdown
STREAM_ROLLOVER_S = 1.0  # a stream that lived this long and closed is payonce's SSE_MAX_S, not a failure

TEMPLATE_LOST_ANSWER = (
    "The answer to POST /v1/report-templates was lost ({cause}): payonce may or may not have written the "
    "version. It was not sent again, because a second try would write a second version. List the templates "
    "(report_templates.list: `versions`) before writing it again."
)

RETRY_LOST_ANSWER = (
    "The answer to POST /v1/jobs/{job_id}/retry was lost ({cause}): payonce may or may not have taken the "
    "retry. It was not sent again, because a retry pays again. Read the job (jobs.get: its `run` and "
    "`status`) before deciding again."
)


def job_path(job_id: Any, *rest: str) -> str:
    return "/".join([JOBS, quote(str(job_id), safe="")] + list(rest))


def order_path(order_id: Any) -> str:
    return f"/v1/orders/{quote(str(order_id), safe='')}"


def create_body(kind: str, models: Sequence[str], input: Mapping[str, Any], policy: Optional[Mapping[str, Any]],
                output_key: Optional[str], webhook_url: Optional[str],
                metadata: Optional[Mapping[str, Any]], priority: Optional[int] = None) -> Dict[str, Any]:
    """The job as ``POST /v1/jobs`` takes it: optional fields left out rather than sent as null, so the
    body is the one the caller would have written by hand. This matters: payonce hashes the body under
    the ``Idempotency-Key``, and a create without ``priority`` must send the body it sent before
    ``priority`` existed."""
    body: Dict[str, Any] = {"kind": kind, "models": list(models), "input": dict(input)}
    for name, value in (("policy", policy), ("output_key", output_key), ("webhook_url", webhook_url),
                        ("metadata", metadata), ("priority", priority)):
        if value is not None:
            body[name] = dict(value) if isinstance(value, Mapping) else value
    return body


def order_body(payment_id: str, run_id: str, product: str, input: Mapping[str, Any], email: str) -> Dict[str, Any]:
    return {"payment_id": payment_id, "run_id": run_id, "product": product, "input": dict(input), "email": email}


def template_path(name: str, *rest: str) -> str:
    return "/".join([REPORT_TEMPLATES, quote(str(name), safe="")] + list(rest))


def template_version_path(name: str, number: int) -> str:
    return template_path(name, "versions", quote(str(number), safe=""))


def plain(value: Any) -> Any:
    """A part of a template as JSON takes it: a mapping as given, or one of the typed results
    (:class:`~payonce_client.ReportTemplateChapter`, ``...Layout``, ``...Mail``, read back from a version)
    as its fields, without ``raw`` and without the fields it does not have (None), since payonce refuses a
    null where a value is optional."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)
                if f.name != "raw" and getattr(value, f.name) is not None}
    return dict(value)


def template_body(name: str, system: str, chapters: Sequence[Any], synthesis: Optional[str],
                  max_output_tokens: Optional[int], layout: Any, mail: Any, page_title: Optional[str],
                  live: bool) -> Dict[str, Any]:
    """A template's next version as ``POST /v1/report-templates`` takes it. payonce refuses a field it does
    not know and takes an absent one as its default: the optional fields left as None are left out."""
    body: Dict[str, Any] = {"name": name, "system": system, "chapters": [plain(chapter) for chapter in chapters]}
    for field, value in (("synthesis", synthesis), ("max_output_tokens", max_output_tokens),
                         ("layout", layout), ("mail", mail), ("page_title", page_title)):
        if value is not None:
            body[field] = plain(value) if field in ("layout", "mail") else value
    body["live"] = bool(live)
    return body


def template_lost(error: APIConnectionError) -> APIConnectionError:
    cause = error.__cause__ or error
    return APIConnectionError(TEMPLATE_LOST_ANSWER.format(cause=f"{type(cause).__name__}: {cause}"),
                              maybe_sent=True, attempts=error.attempts)


def month_param(month: Union[str, date, None]) -> Optional[str]:
    return f"{month:%Y-%m}" if isinstance(month, date) else month


def next_page(page: Mapping[str, Any]) -> Optional[List[Tuple[str, str]]]:
    """The query of the page after this one, or None at the last page.

    payonce writes ``next`` as a full URL with its own idea of its host, which behind a proxy or a load
    balancer is not the address this client reaches it at. Only the query is taken (cursor, limit,
    status) and sent to ``/v1/jobs`` under the client's own ``base_url``: the path payonce writes may also
    lack (or already hold) a prefix the proxy adds, and the list's path never changes.
    """
    url = page.get("next")
    if not url:
        return None
    return parse_qsl(urlsplit(url).query, keep_blank_values=True)


def redirect_target(base_url: str, response: httpx.Response) -> Tuple[str, bool]:
    """Where a redirect of ``/output`` goes, and whether the API key goes with it.

    A ``303`` (a report: its ``/report``) is payonce's own path and is sent under ``base_url`` with the
    key. A ``302`` to another host is the output store's presigned URL: it carries its own authorisation
    in its query, and the API key must never be sent to a host that is not payonce.
    """
    location = response.headers.get("location", "")
    parts = urlsplit(location)
    if not parts.scheme:  # a path on payonce itself
        return (parts.path + (f"?{parts.query}" if parts.query else "")), True
    return location, origin(location) == origin(base_url)


def stream_headers(last_event_id: Optional[str]) -> Dict[str, str]:
    headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    return headers


def stream_timeout(base: httpx.Timeout, deadline: Optional[float]) -> TimeoutTypes:
    """An event stream may be quiet for up to 15 s between keep-alives, whatever the client's timeout for
    ordinary requests; within ``wait``, a read never outlasts the caller's deadline."""
    read = max(base.read or 0.0, STREAM_READ_TIMEOUT_S)
    if deadline is not None:
        read = min(read, max(0.05, deadline - time.monotonic()))
    return httpx.Timeout(base.connect, read=read, write=base.write, pool=base.pool)


def past(deadline: Optional[float]) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def until(deadline: Optional[float], pause: float) -> float:
    """A pause, shortened so that it does not run past the deadline."""
    return pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic()))


class StreamUnusable(Exception):
    """Within ``wait``: the event stream cannot be had (too many streams, or connections failing), so
    ``wait`` polls instead."""


class StreamReconnect:
    """How an event stream comes back after it ended without ``event: end``.

    A stream that lived a while and closed cleanly is payonce's ``SSE_MAX_S`` at work: it is reopened at
    once, with ``Last-Event-ID``, and counts as no failure. Anything else (a refused or broken connection,
    a 5xx, a stream closed at once with nothing in it) is a failure: reopened after the usual back-off, up
    to ``max_retries`` in a row, then raised. ``429 TOO_MANY_STREAMS`` waits its ``Retry-After``. For
    ``wait`` (``for_wait``), too many streams or a few failures in a row raise :class:`StreamUnusable`
    instead, since polling will do.
    """

    def __init__(self, max_retries: int, path: str, for_wait: bool):
        self.max_retries = max_retries
        self.path = path
        self.for_wait = for_wait
        self.failures = 0

    def after_error_answer(self, response: httpx.Response) -> float:
        error = api_error(response, self.failures + 1)
        if self.for_wait and isinstance(error, TooManyStreams):
            raise StreamUnusable() from error
        pause = pause_after_status(Mode.REPEATABLE, self.failures, self.max_retries, error.status or 0,
                                   error.headers.get("retry-after"))
        if pause is None:
            if self.for_wait and error.status in RETRYABLE_STATUSES:
                raise StreamUnusable() from error
            raise error
        return self._failed(pause, error)

    def after_transport_error(self, exc: BaseException) -> float:
        pause = pause_after_error(Mode.REPEATABLE, self.failures, self.max_retries, exc)
        if pause is None:
            if self.for_wait and may_pass(exc):
                raise StreamUnusable() from exc
            raise connection_error("GET", self.path, exc, self.failures + 1, True) from exc
        return self._failed(pause, exc)

    def after_stream(self, lived_s: float, frames: int, exc: Optional[BaseException]) -> float:
        worked = frames > 0 or lived_s >= STREAM_ROLLOVER_S
        if worked:
            self.failures = 0
            if exc is None:
                return 0.0
        return self.after_transport_error(exc or httpx.RemoteProtocolError("the stream closed before `end`"))

    def _failed(self, pause: float, cause: BaseException) -> float:
        self.failures += 1
        if self.for_wait and self.failures >= WAIT_STREAM_FAILURES:
            raise StreamUnusable() from cause
        return pause


def retry_lost(job_id: Any, error: APIConnectionError) -> APIConnectionError:
    cause = error.__cause__ or error
    return APIConnectionError(RETRY_LOST_ANSWER.format(job_id=job_id, cause=f"{type(cause).__name__}: {cause}"),
                              maybe_sent=True, attempts=error.attempts)


def cancelled_by_earlier_try(error: APIError) -> bool:
    """A cancel that was sent more than once and is told the job has ended, cancelled: the earlier try,
    whose answer was lost, is what cancelled it."""
    return error.attempts > 1 and error.details.get("status") == "cancelled"
