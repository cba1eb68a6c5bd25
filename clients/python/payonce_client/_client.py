"""The synchronous client, :class:`Payonce`. The async client (``_async_client``) is the same, line for
line, with ``await``."""

from __future__ import annotations

import os
import time
import uuid
from datetime import date
from typing import Any, Generator, Iterator, List, Literal, Mapping, Optional, Sequence, Union, overload

import httpx

from . import _common as common
from ._http import SyncTransport, TimeoutTypes
from ._models import (
    STOP_STATUSES,
    Event,
    Job,
    Order,
    Report,
    ReportTemplateChapter,
    ReportTemplateLayout,
    ReportTemplateLive,
    ReportTemplateMail,
    ReportTemplateSummary,
    ReportTemplateVersion,
    ReportTemplateVersionCreated,
    Spend,
    WhoAmI,
)
from ._retry import Mode
from ._sse import SSEDecoder
from .errors import APIConnectionError, APIError, JobTerminal, WaitTimeout

DEFAULT_BASE_URL = "http://127.0.0.1:8000"


class OutputStream:
    """A job's output as it arrives, for outputs too large to hold in memory::

        with po.jobs.output(job.id, stream=True) as output:
            for chunk in output:
                file.write(chunk)

    Iterating it reads the body once; a connection that breaks part-way raises
    :class:`APIConnectionError` (read the output again from the start: it is stored, and reading it costs
    nothing).
    """

    def __init__(self, response: httpx.Response):
        self.response = response

    @property
    def content_type(self) -> Optional[str]:
        value: Optional[str] = self.response.headers.get("content-type")
        return value

    @property
    def content_length(self) -> Optional[int]:
        length = self.response.headers.get("content-length")
        return int(length) if length and length.isdigit() else None

    def iter_bytes(self, chunk_size: Optional[int] = None) -> Iterator[bytes]:
        try:
            yield from self.response.iter_bytes(chunk_size)
        except httpx.TransportError as exc:
            raise APIConnectionError(f"The output stream broke: {type(exc).__name__}: {exc}") from exc
        finally:
            self.close()

    def __iter__(self) -> Iterator[bytes]:
        return self.iter_bytes()

    def close(self) -> None:
        self.response.close()

    def __enter__(self) -> OutputStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Jobs:
    """``po.jobs``: create, read, follow, cancel and retry jobs."""

    def __init__(self, http: SyncTransport):
        self._http = http

    def create(self, *, kind: str, models: Sequence[str], input: Mapping[str, Any],
               policy: Optional[Mapping[str, Any]] = None, output_key: Optional[str] = None,
               webhook_url: Optional[str] = None, metadata: Optional[Mapping[str, Any]] = None,
               idempotency_key: Optional[str] = None, priority: Optional[int] = None) -> Job:
        """Create a job, and never pay for it twice.

        The call sends one ``Idempotency-Key`` on every try: yours, or one made for this call. So when an
        answer is lost (the connection breaks after payonce made the job, a timeout, a ``503`` while its
        database restarts), the call sends the same request again and payonce answers ``202`` with the job
        it already made: the job comes back once, with ``replayed=True``, and nothing is made or paid
        twice.

        Give your own ``idempotency_key`` (an order number, a row id) when the *caller* may itself be
        retried, for example a task queue running this code again after a crash: the key made here lives
        only as long as this call. The same key with a different body raises
        :class:`~payonce_client.errors.IdempotencyConflict`.

        ``priority`` (1 to 5; payonce's default, 3, when left None and then not sent): a higher priority
        starts sooner; within a priority, ready jobs of different clients take turns.
        """
        body = common.create_body(kind, models, input, policy, output_key, webhook_url, metadata, priority)
        key = idempotency_key if idempotency_key is not None else str(uuid.uuid4())
        response = self._http.send("POST", common.JOBS, json_body=body, headers={"Idempotency-Key": key})
        return Job.from_dict(response.json(), replayed=response.status_code == 202)

    def get(self, job_id: str) -> Job:
        return Job.from_dict(self._http.send("GET", common.job_path(job_id)).json())

    def list(self, *, status: Optional[str] = None, limit: Optional[int] = None) -> Iterator[Job]:
        """Every job of yours, newest first (optionally of one ``status``), page after page; ``limit`` is the
        size of a page, not of the whole. Pages are fetched as the iteration reaches them."""
        params: Any = {"status": status, "limit": limit}
        while True:
            page = self._http.send("GET", common.JOBS, params=params).json()
            for item in page.get("results") or []:
                yield Job.from_dict(item)
            params = common.next_page(page)
            if params is None:
                return

    def cancel(self, job_id: str) -> Job:
        """Cancel a job (final; payonce stops the render upstream where the provider can).

        Sent again when its answer is lost, like a GET: cancelling twice is cancelling once. If the first
        try did cancel the job and only its answer was lost, the next try is told the job has ended
        (``JOB_TERMINAL``, cancelled); that is this call's own success, and the job is returned. A job
        that had ended otherwise raises :class:`~payonce_client.errors.JobTerminal`.
        """
        try:
            response = self._http.send("POST", common.job_path(job_id, "cancel"))
        except JobTerminal as error:
            if common.cancelled_by_earlier_try(error):
                return self.get(job_id)
            raise
        return Job.from_dict(response.json())

    def retry(self, job_id: str) -> Job:
        """A person's decision to pay again for a ``failed`` or ``waiting`` job: the job in its next ``run``.

        Unlike every other call, this one is sent **once**. It is tried again only when no connection could
        be made at all (payonce cannot have seen it). If the connection broke after the request went out,
        the answer is lost and nobody knows whether payonce took the retry; sending it again could pay a
        third time (if the job failed again in between), so this raises
        :class:`~payonce_client.errors.APIConnectionError` instead: read the job (``get``: its ``run`` and
        ``status``) and decide again.
        """
        try:
            response = self._http.send("POST", common.job_path(job_id, "retry"), mode=Mode.ONCE)
        except APIConnectionError as error:
            if error.maybe_sent:
                raise common.retry_lost(job_id, error) from error
            raise
        return Job.from_dict(response.json())

    @overload
    def output(self, job_id: str, *, stream: Literal[False] = ...) -> bytes: ...

    @overload
    def output(self, job_id: str, *, stream: Literal[True]) -> OutputStream: ...

    def output(self, job_id: str, *, stream: bool = False) -> Union[bytes, OutputStream]:
        """A succeeded job's output: its bytes, or with ``stream=True`` an :class:`OutputStream` of chunks.

        payonce answers a media job from S3 with a ``302`` to a presigned URL (followed without the API
        key, which never goes to another host), and a report job with a ``303`` to its report (its
        Markdown). A job with no output yet raises :class:`~payonce_client.errors.JobNotSucceeded`.
        """
        response = self._open_output(job_id, stream=stream)
        return OutputStream(response) if stream else response.content

    def _open_output(self, job_id: str, *, stream: bool) -> httpx.Response:
        response = self._http.send("GET", common.job_path(job_id, "output"), headers=common.ANY, stream=stream)
        for _ in range(common.MAX_REDIRECTS):
            if not response.is_redirect:
                return response
            response.close()
            url, authenticated = common.redirect_target(self._http.base_url, response)
            response = self._http.send("GET", url, headers=common.ANY, authenticated=authenticated,
                                       stream=stream)
        if not response.is_redirect:
            return response
        response.close()
        raise APIError("Too many redirects reading the output.", status=response.status_code,
                       headers=response.headers)

    @overload
    def report(self, job_id: str, format: Literal["markdown"] = ...) -> str: ...

    @overload
    def report(self, job_id: str, format: Literal["json"]) -> Report: ...

    def report(self, job_id: str, format: str = "markdown") -> Union[str, Report]:
        """A sealed report: its Markdown (as the model wrote it, not sanitised: sanitise before rendering
        it as HTML), or with ``format="json"`` a :class:`Report` of its chapters. Before the seal it
        raises :class:`~payonce_client.errors.ReportNotSealed`."""
        if format not in ("markdown", "json"):
            raise ValueError('format is "markdown" or "json"')
        accept = "application/json" if format == "json" else "text/markdown"
        response = self._http.send("GET", common.job_path(job_id, "report"), headers={"Accept": accept})
        return Report.from_dict(response.json()) if format == "json" else response.text

    def events(self, job_id: str, last_event_id: Optional[str] = None) -> Iterator[Event]:
        """The job's progress as it happens: a frame whenever its snapshot changes (the first one is the
        current state), and last an ``end`` event once it has ended.

        The stream survives what streams suffer: when payonce closes it (it does, every ``SSE_MAX_S``) or
        the connection drops, it is reopened with ``Last-Event-ID``, so no frame is lost and none comes
        twice. ``last_event_id`` resumes from a frame an earlier iteration saw. A job that waits for a
        person has not ended: its stream stays open until it does.
        """
        return self._frames(job_id, last_event_id, deadline=None, for_wait=False)

    def wait(self, job_id: str, timeout: float = 600.0, poll_interval: float = 1.0) -> Job:
        """Wait until the job has ended (``succeeded``, ``failed``, ``cancelled``) or waits for a person
        (``waiting``: nothing more happens until someone retries or cancels it), and return it as ``get``
        reads it then.

        It follows the event stream, and polls every ``poll_interval`` seconds instead when the stream
        cannot be had (``429 TOO_MANY_STREAMS``, connections failing). A failed job is returned, not
        raised: read ``job.status`` and ``job.error``. After ``timeout`` seconds it raises
        :class:`~payonce_client.errors.WaitTimeout` with the last state seen; the job goes on.
        """
        deadline = time.monotonic() + timeout
        frames = self._frames(job_id, None, deadline=deadline, for_wait=True)
        try:
            for event in frames:
                if event.event == "end" or event.status in STOP_STATUSES:
                    break
        except common.StreamUnusable:
            pass
        finally:
            frames.close()
        job = self.get(job_id)
        while job.status not in STOP_STATUSES:
            if common.past(deadline):
                raise WaitTimeout(f"Job {job_id} is still {job.status} after {timeout} s.", job=job)
            time.sleep(common.until(deadline, poll_interval))
            job = self.get(job_id)
        return job

    def _frames(self, job_id: str, last_event_id: Optional[str], *, deadline: Optional[float],
                for_wait: bool) -> Generator[Event, None, None]:
        path = common.job_path(job_id, "events")
        reconnect = common.StreamReconnect(self._http.max_retries, path, for_wait)
        last_id = last_event_id
        while not common.past(deadline):
            started, frames, broken = time.monotonic(), 0, None
            try:
                response = self._http.send_once("GET", path, headers=common.stream_headers(last_id),
                                                timeout=common.stream_timeout(self._http.timeout, deadline),
                                                stream=True)
            except httpx.TransportError as exc:
                if common.past(deadline):
                    return
                time.sleep(common.until(deadline, reconnect.after_transport_error(exc)))
                continue
            if response.status_code >= 400:
                time.sleep(common.until(deadline, reconnect.after_error_answer(response)))
                continue
            decoder = SSEDecoder(last_id)
            try:
                for line in response.iter_lines():
                    event = decoder.feed(line)
                    if event is None:
                        continue
                    frames += 1
                    last_id = decoder.last_event_id
                    yield event
                    if event.event == "end":
                        return
            except httpx.TransportError as exc:
                broken = exc
            finally:
                response.close()
                last_id = decoder.last_event_id
            if common.past(deadline):
                return
            time.sleep(common.until(deadline, reconnect.after_stream(time.monotonic() - started, frames, broken)))


class Orders:
    """``po.orders``: paid orders, each one report."""

    def __init__(self, http: SyncTransport):
        self._http = http

    def create(self, *, payment_id: str, run_id: str, product: str, input: Mapping[str, Any], email: str) -> Order:
        """Turn a payment into one report. ``payment_id`` is the order's idempotency key on payonce's side,
        so this is sent again when an answer is lost: the same payment is the same order (``200``,
        ``replayed=True``), never a second report. A second payment for the same run and product is an
        order with ``status="duplicate"`` and no new job.

        ``input`` is the report's: ``subject``, and ``chapters`` and ``template`` (``{"name", "version"?,
        "label"?}``) as a report job's; without ``template``, your template named as the ``product`` is
        used when you have one (its ``live`` version), else the built-in one (then ``chapters`` is
        required)."""
        body = common.order_body(payment_id, run_id, product, input, email)
        response = self._http.send("POST", "/v1/orders", json_body=body)
        return Order.from_dict(response.json(), replayed=response.status_code == 200)

    def get(self, order_id: str) -> Order:
        return Order.from_dict(self._http.send("GET", common.order_path(order_id)).json())


class ReportTemplates:
    """``po.report_templates``: your report templates, each a name and its immutable versions (docs/api.md,
    "Report templates"). A report job names one in its input (``"template": {"name": ..., "version": 2}``,
    or the ``live`` version by default), and an order's ``product`` of the same name is written from it."""

    def __init__(self, http: SyncTransport):
        self._http = http

    def create(self, *, name: str, system: str,
               chapters: Sequence[Union[Mapping[str, Any], ReportTemplateChapter]], synthesis: Optional[str] = None,
               max_output_tokens: Optional[int] = None,
               layout: Union[Mapping[str, Any], ReportTemplateLayout, None] = None,
               mail: Union[Mapping[str, Any], ReportTemplateMail, None] = None,
               page_title: Optional[str] = None, live: bool = True) -> ReportTemplateVersionCreated:
        """Write the template's next version (the first makes the template). ``chapters`` are
        ``{"key", "title", "instruction"}``; ``layout`` is ``{"title", "chapter_heading", "closing"?,
        "figures"?}``, ``mail`` ``{"subject", "body"}`` (the typed parts of a version read back with
        :meth:`version` are taken too). An optional field left None is left out: payonce's default.
        ``live=False`` leaves ``live`` where it was (a template's first version is live whatever it says).

        Every text is checked as a template where it is written: one that reaches past its variables
        (``{{ ''.__class__ }}``, a call, a loop) raises :class:`~payonce_client.errors.InvalidRequest`
        whose ``fields`` name it, and nothing is stored.

        Sent once, like ``jobs.retry``: a second try of a lost answer would write a second version. It is
        tried again only when no connection could be made; a lost answer raises
        :class:`~payonce_client.errors.APIConnectionError` (``maybe_sent=True``): :meth:`list` says how many
        versions there are before you write it again.
        """
        body = common.template_body(name, system, chapters, synthesis, max_output_tokens, layout, mail,
                                    page_title, live)
        try:
            response = self._http.send("POST", common.REPORT_TEMPLATES, json_body=body, mode=Mode.ONCE)
        except APIConnectionError as error:
            if error.maybe_sent:
                raise common.template_lost(error) from error
            raise
        return ReportTemplateVersionCreated.from_dict(response.json())

    def list(self) -> List[ReportTemplateSummary]:
        """Your templates by name: where ``live`` points and how many versions each has."""
        return [ReportTemplateSummary.from_dict(item)
                for item in self._http.send("GET", common.REPORT_TEMPLATES).json()]

    def version(self, name: str, number: int) -> ReportTemplateVersion:
        """One version, as it was written. Another client's template is :class:`~payonce_client.errors.NotFound`,
        as is a version that is not there."""
        answer = self._http.send("GET", common.template_version_path(name, number))
        return ReportTemplateVersion.from_dict(answer.json())

    def set_live(self, name: str, version: int) -> ReportTemplateLive:
        """Point the template's ``live`` label at ``version``: from now on the orders for its name, and the
        jobs that name it without a version, are written from it (a job already accepted keeps the version
        it was pinned to). Sent again when an answer is lost: pointing it twice is pointing it once."""
        response = self._http.send("POST", common.template_path(name, "live"), json_body={"version": version})
        return ReportTemplateLive.from_dict(response.json())


class Payonce:
    """A client of one payonce service::

        with Payonce(base_url="http://127.0.0.1:8000", api_key="...") as po:
            job = po.jobs.create(kind="media", models=["sandbox/video-keyed"], input={"prompt": "a lighthouse"})
            job = po.jobs.wait(job.id)

    ``base_url`` and ``api_key`` default to ``PAYONCE_BASE_URL`` and ``PAYONCE_API_KEY``. ``timeout`` is
    per request (an event stream's reads may take longer: payonce keeps it alive every 15 s).
    ``max_retries`` is how many times a request is sent again after the first try, on the rules of
    :meth:`Jobs.create` and :meth:`Jobs.retry`. ``http_client`` is an ``httpx.Client`` of your own
    (proxies, certificates, event hooks); requests go to ``base_url`` whatever its own base is.
    """

    def __init__(self, *, base_url: Optional[str] = None, api_key: Optional[str] = None,
                 timeout: TimeoutTypes = 30.0, max_retries: int = 5, http_client: Optional[httpx.Client] = None):
        self._http = SyncTransport(base_url or os.environ.get("PAYONCE_BASE_URL") or DEFAULT_BASE_URL,
                                   api_key or os.environ.get("PAYONCE_API_KEY") or "", timeout, max_retries,
                                   http_client)
        self.jobs = Jobs(self._http)
        self.orders = Orders(self._http)
        self.report_templates = ReportTemplates(self._http)

    @property
    def base_url(self) -> str:
        return self._http.base_url

    def __repr__(self) -> str:  # what a log line or a debugger shows: the base URL, never the API key
        return f"Payonce(base_url={self.base_url!r})"

    def spend(self, month: Union[str, date, None] = None) -> Spend:
        """One UTC month (``"YYYY-MM"`` or a date; default the current one) of your money against your cap."""
        return Spend.from_dict(self._http.send("GET", "/v1/spend", params={"month": common.month_param(month)}).json())

    def whoami(self) -> WhoAmI:
        return WhoAmI.from_dict(self._http.send("GET", "/v1/whoami").json())

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Payonce:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

