"""The asynchronous client, :class:`AsyncPayonce`: :class:`~payonce_client.Payonce` with ``await``, and
``async for`` where the sync client iterates. The rules (what is sent again, and when) are the same, and
are documented once, on the sync client's methods."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from datetime import date
from typing import (
    Any,
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    List,
    Literal,
    Mapping,
    Optional,
    Sequence,
    Union,
    overload,
)

import httpx

from . import _common as common
from ._client import DEFAULT_BASE_URL
from ._http import AsyncTransport, TimeoutTypes
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


class AsyncOutputStream:
    """A job's output as it arrives::

        async with po.jobs.output(job.id, stream=True) as output:
            async for chunk in output:
                file.write(chunk)

    The request is made on entering the block (or on the first chunk).
    """

    def __init__(self, jobs: AsyncJobs, job_id: str):
        self._jobs = jobs
        self._job_id = job_id
        self.response: Optional[httpx.Response] = None

    async def open(self) -> AsyncOutputStream:
        if self.response is None:
            self.response = await self._jobs._open_output(self._job_id, stream=True)
        return self

    @property
    def content_type(self) -> Optional[str]:
        return self.response.headers.get("content-type") if self.response is not None else None

    async def iter_bytes(self, chunk_size: Optional[int] = None) -> AsyncIterator[bytes]:
        await self.open()
        assert self.response is not None
        try:
            async for chunk in self.response.aiter_bytes(chunk_size):
                yield chunk
        except httpx.TransportError as exc:
            raise APIConnectionError(f"The output stream broke: {type(exc).__name__}: {exc}") from exc
        finally:
            await self.aclose()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self.iter_bytes()

    async def aclose(self) -> None:
        if self.response is not None:
            await self.response.aclose()

    async def __aenter__(self) -> AsyncOutputStream:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncJobs:
    """``po.jobs`` of :class:`AsyncPayonce` (see :class:`payonce_client.Jobs` for what each call does)."""

    def __init__(self, http: AsyncTransport):
        self._http = http

    async def create(self, *, kind: str, models: Sequence[str], input: Mapping[str, Any],
                     policy: Optional[Mapping[str, Any]] = None, output_key: Optional[str] = None,
                     webhook_url: Optional[str] = None, metadata: Optional[Mapping[str, Any]] = None,
                     idempotency_key: Optional[str] = None, priority: Optional[int] = None) -> Job:
        """Create a job under one ``Idempotency-Key`` for every try of this call; ``priority`` 1 to 5, left
        out when None (payonce's default, 3). See ``Jobs.create``."""
        body = common.create_body(kind, models, input, policy, output_key, webhook_url, metadata, priority)
        key = idempotency_key if idempotency_key is not None else str(uuid.uuid4())
        response = await self._http.send("POST", common.JOBS, json_body=body, headers={"Idempotency-Key": key})
        return Job.from_dict(response.json(), replayed=response.status_code == 202)

    async def get(self, job_id: str) -> Job:
        return Job.from_dict((await self._http.send("GET", common.job_path(job_id))).json())

    async def list(self, *, status: Optional[str] = None, limit: Optional[int] = None) -> AsyncIterator[Job]:
        """Every job of yours, newest first, page after page: ``async for job in po.jobs.list(): ...``"""
        params: Any = {"status": status, "limit": limit}
        while True:
            page = (await self._http.send("GET", common.JOBS, params=params)).json()
            for item in page.get("results") or []:
                yield Job.from_dict(item)
            params = common.next_page(page)
            if params is None:
                return

    async def cancel(self, job_id: str) -> Job:
        """Cancel a job; a cancel whose first answer was lost returns the job it cancelled (see ``Jobs.cancel``)."""
        try:
            response = await self._http.send("POST", common.job_path(job_id, "cancel"))
        except JobTerminal as error:
            if common.cancelled_by_earlier_try(error):
                return await self.get(job_id)
            raise
        return Job.from_dict(response.json())

    async def retry(self, job_id: str) -> Job:
        """A person's decision to pay again: sent once, and again only if no connection was made; a lost
        answer raises :class:`~payonce_client.errors.APIConnectionError` (read the job, then decide)."""
        try:
            response = await self._http.send("POST", common.job_path(job_id, "retry"), mode=Mode.ONCE)
        except APIConnectionError as error:
            if error.maybe_sent:
                raise common.retry_lost(job_id, error) from error
            raise
        return Job.from_dict(response.json())

    @overload
    def output(self, job_id: str, *, stream: Literal[False] = ...) -> Awaitable[bytes]: ...

    @overload
    def output(self, job_id: str, *, stream: Literal[True]) -> AsyncOutputStream: ...

    def output(self, job_id: str, *, stream: bool = False) -> Union[Awaitable[bytes], AsyncOutputStream]:
        """``await po.jobs.output(id)`` for the bytes; ``async with po.jobs.output(id, stream=True)`` for
        chunks. Redirects as in ``Jobs.output`` (the API key never goes to another host)."""
        if stream:
            return AsyncOutputStream(self, job_id)
        return self._output_bytes(job_id)

    async def _output_bytes(self, job_id: str) -> bytes:
        return (await self._open_output(job_id, stream=False)).content

    async def _open_output(self, job_id: str, *, stream: bool) -> httpx.Response:
        response = await self._http.send("GET", common.job_path(job_id, "output"), headers=common.ANY, stream=stream)
        for _ in range(common.MAX_REDIRECTS):
            if not response.is_redirect:
                return response
            await response.aclose()
            url, authenticated = common.redirect_target(self._http.base_url, response)
            response = await self._http.send("GET", url, headers=common.ANY, authenticated=authenticated,
                                       stream=stream)
        if not response.is_redirect:
            return response
        await response.aclose()
        raise APIError("Too many redirects reading the output.", status=response.status_code,
                       headers=response.headers)

    @overload
    async def report(self, job_id: str, format: Literal["markdown"] = ...) -> str: ...

    @overload
    async def report(self, job_id: str, format: Literal["json"]) -> Report: ...

    async def report(self, job_id: str, format: str = "markdown") -> Union[str, Report]:
        """A sealed report: Markdown (not sanitised), or with ``format="json"`` a :class:`Report`."""
        if format not in ("markdown", "json"):
            raise ValueError('format is "markdown" or "json"')
        accept = "application/json" if format == "json" else "text/markdown"
        response = await self._http.send("GET", common.job_path(job_id, "report"), headers={"Accept": accept})
        return Report.from_dict(response.json()) if format == "json" else response.text

    def events(self, job_id: str, last_event_id: Optional[str] = None) -> AsyncIterator[Event]:
        """``async for event in po.jobs.events(id)``: the job's progress, reconnecting with
        ``Last-Event-ID`` until ``end`` (see ``Jobs.events``). Leaving the loop early, close it
        (``contextlib.aclosing``) so that the connection is given back at once."""
        return self._frames(job_id, last_event_id, deadline=None, for_wait=False)

    async def wait(self, job_id: str, timeout: float = 600.0, poll_interval: float = 1.0) -> Job:
        """The job once it has ended or waits for a person; polls when the stream cannot be had; raises
        :class:`~payonce_client.errors.WaitTimeout` after ``timeout`` (see ``Jobs.wait``)."""
        deadline = time.monotonic() + timeout
        frames = self._frames(job_id, None, deadline=deadline, for_wait=True)
        try:
            async for event in frames:
                if event.event == "end" or event.status in STOP_STATUSES:
                    break
        except common.StreamUnusable:
            pass
        finally:
            await frames.aclose()
        job = await self.get(job_id)
        while job.status not in STOP_STATUSES:
            if common.past(deadline):
                raise WaitTimeout(f"Job {job_id} is still {job.status} after {timeout} s.", job=job)
            await asyncio.sleep(common.until(deadline, poll_interval))
            job = await self.get(job_id)
        return job

    async def _frames(self, job_id: str, last_event_id: Optional[str], *, deadline: Optional[float],
                      for_wait: bool) -> AsyncGenerator[Event, None]:
        path = common.job_path(job_id, "events")
        reconnect = common.StreamReconnect(self._http.max_retries, path, for_wait)
        last_id = last_event_id
        while not common.past(deadline):
            started, frames, broken = time.monotonic(), 0, None
            try:
                response = await self._http.send_once("GET", path, headers=common.stream_headers(last_id),
                                                      timeout=common.stream_timeout(self._http.timeout, deadline),
                                                      stream=True)
            except httpx.TransportError as exc:
                if common.past(deadline):
                    return
                await asyncio.sleep(common.until(deadline, reconnect.after_transport_error(exc)))
                continue
            if response.status_code >= 400:
                await asyncio.sleep(common.until(deadline, reconnect.after_error_answer(response)))
                continue
            decoder = SSEDecoder(last_id)
            try:
                async for line in response.aiter_lines():
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
                await response.aclose()
                last_id = decoder.last_event_id
            if common.past(deadline):
                return
            pause = reconnect.after_stream(time.monotonic() - started, frames, broken)
            await asyncio.sleep(common.until(deadline, pause))


class AsyncOrders:
    """``po.orders`` of :class:`AsyncPayonce` (see :class:`payonce_client.Orders`)."""

    def __init__(self, http: AsyncTransport):
        self._http = http

    async def create(self, *, payment_id: str, run_id: str, product: str, input: Mapping[str, Any],
                     email: str) -> Order:
        """One payment, one report; the same payment again is the same order (``replayed=True``)."""
        body = common.order_body(payment_id, run_id, product, input, email)
        response = await self._http.send("POST", "/v1/orders", json_body=body)
        return Order.from_dict(response.json(), replayed=response.status_code == 200)

    async def get(self, order_id: str) -> Order:
        return Order.from_dict((await self._http.send("GET", common.order_path(order_id))).json())


class AsyncReportTemplates:
    """``po.report_templates`` of :class:`AsyncPayonce` (see :class:`payonce_client.ReportTemplates`)."""

    def __init__(self, http: AsyncTransport):
        self._http = http

    async def create(self, *, name: str, system: str,
                     chapters: Sequence[Union[Mapping[str, Any], ReportTemplateChapter]],
                     synthesis: Optional[str] = None, max_output_tokens: Optional[int] = None,
                     layout: Union[Mapping[str, Any], ReportTemplateLayout, None] = None,
                     mail: Union[Mapping[str, Any], ReportTemplateMail, None] = None,
                     page_title: Optional[str] = None, live: bool = True) -> ReportTemplateVersionCreated:
        """The template's next version; optional fields left None are left out. Sent once: a lost answer
        raises :class:`~payonce_client.errors.APIConnectionError` (see ``ReportTemplates.create``)."""
        body = common.template_body(name, system, chapters, synthesis, max_output_tokens, layout, mail,
                                    page_title, live)
        try:
            response = await self._http.send("POST", common.REPORT_TEMPLATES, json_body=body, mode=Mode.ONCE)
        except APIConnectionError as error:
            if error.maybe_sent:
                raise common.template_lost(error) from error
            raise
        return ReportTemplateVersionCreated.from_dict(response.json())

    async def list(self) -> List[ReportTemplateSummary]:
        return [ReportTemplateSummary.from_dict(item)
                for item in (await self._http.send("GET", common.REPORT_TEMPLATES)).json()]

    async def version(self, name: str, number: int) -> ReportTemplateVersion:
        answer = await self._http.send("GET", common.template_version_path(name, number))
        return ReportTemplateVersion.from_dict(answer.json())

    async def set_live(self, name: str, version: int) -> ReportTemplateLive:
        answer = await self._http.send("POST", common.template_path(name, "live"), json_body={"version": version})
        return ReportTemplateLive.from_dict(answer.json())


class AsyncPayonce:
    """The asynchronous client::

        async with AsyncPayonce(base_url="http://127.0.0.1:8000", api_key="...") as po:
            job = await po.jobs.create(kind="media", models=["sandbox/video-keyed"], input={"prompt": "..."})
            job = await po.jobs.wait(job.id)

    The arguments are :class:`~payonce_client.Payonce`'s, with an ``httpx.AsyncClient`` as ``http_client``.
    """

    def __init__(self, *, base_url: Optional[str] = None, api_key: Optional[str] = None,
                 timeout: TimeoutTypes = 30.0, max_retries: int = 5,
                 http_client: Optional[httpx.AsyncClient] = None):
        self._http = AsyncTransport(base_url or os.environ.get("PAYONCE_BASE_URL") or DEFAULT_BASE_URL,
                                    api_key or os.environ.get("PAYONCE_API_KEY") or "", timeout, max_retries,
                                    http_client)
        self.jobs = AsyncJobs(self._http)
        self.orders = AsyncOrders(self._http)
        self.report_templates = AsyncReportTemplates(self._http)

    @property
    def base_url(self) -> str:
        return self._http.base_url

    def __repr__(self) -> str:  # what a log line or a debugger shows: the base URL, never the API key
        return f"AsyncPayonce(base_url={self.base_url!r})"

    async def spend(self, month: Union[str, date, None] = None) -> Spend:
        answer = await self._http.send("GET", "/v1/spend", params={"month": common.month_param(month)})
        return Spend.from_dict(answer.json())

    async def whoami(self) -> WhoAmI:
        return WhoAmI.from_dict((await self._http.send("GET", "/v1/whoami")).json())

    async def close(self) -> None:
        await self._http.close()

    async def __aenter__(self) -> AsyncPayonce:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
