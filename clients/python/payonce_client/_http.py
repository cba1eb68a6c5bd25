"""The transport: one place where a request is sent, tried again by the policy of ``_retry``, and turned
into an answer or an error. One class for the sync client and one for the async client, written side by
side so that they stay the same.

What "the same request again" means is settled here, not by httpx: a try is built afresh each time from
the same method, URL, headers and bytes, so a retried ``POST /v1/jobs`` carries the very
``Idempotency-Key`` and body of the first try, which is what makes payonce answer it with the job it
already made instead of making a second one.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import urlsplit

import httpx

from ._retry import Mode, never_connected, pause_after_error, pause_after_status
from ._version import __version__
from .errors import APIConnectionError, APIError, error_for_code

TimeoutTypes = Union[float, httpx.Timeout]
Params = Union[Mapping[str, Any], Sequence[Tuple[str, str]], None]


def encode_json(body: Any) -> bytes:
    """The request body as payonce reads it: strict JSON in UTF-8. NaN and infinities are refused here,
    as payonce would refuse them (422), before anything is sent."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def api_error(response: httpx.Response, attempts: int) -> APIError:
    """The error an answer of 400 or more stands for (its body must have been read)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    error = error if isinstance(error, dict) else {}
    code = error.get("code") if isinstance(error.get("code"), str) else None
    message = error.get("message") if isinstance(error.get("message"), str) else None
    if message is None:
        message = f"{response.status_code} {response.reason_phrase or 'error'}"
        if body is None and response.content:
            message += f": {response.text[:200]}"
    cls = error_for_code(code)
    return cls(message, status=response.status_code, code=code, body=body, headers=response.headers,
               attempts=attempts)


def connection_error(method: str, url: str, exc: BaseException, attempts: int, reached: bool) -> APIConnectionError:
    tries = "try" if attempts == 1 else "tries"
    return APIConnectionError(f"No answer from payonce to {method} {url} after {attempts} {tries}: "
                              f"{type(exc).__name__}: {exc}", maybe_sent=reached, attempts=attempts)


def clean_params(params: Params) -> Any:
    """The query without its unset parameters (a page's ``next`` query is taken as it is)."""
    if isinstance(params, Mapping):
        return {k: v for k, v in params.items() if v is not None} or None
    return list(params) if params else None


def origin(url: Union[str, httpx.URL]) -> Tuple[str, str, Optional[int]]:
    parts = urlsplit(str(url))
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


class _Base:
    def __init__(self, base_url: str, api_key: str, timeout: TimeoutTypes, max_retries: int):
        if not api_key:
            raise ValueError("api_key is required (or set PAYONCE_API_KEY)")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self.max_retries = max(0, int(max_retries))

    def __repr__(self) -> str:  # the base URL, never the key
        return f"{type(self).__name__}(base_url={self.base_url!r})"

    def same_origin(self, url: Union[str, httpx.URL]) -> bool:
        return origin(url) == origin(self.base_url)

    def _build(self, client: Union[httpx.Client, httpx.AsyncClient], method: str, url: str, *, params: Params,
               content: Optional[bytes], headers: Optional[Mapping[str, str]], authenticated: bool,
               timeout: Optional[TimeoutTypes]) -> httpx.Request:
        sent = {"User-Agent": f"payonce-client-python/{__version__}", "Accept": "application/json"}
        if content is not None:
            sent["Content-Type"] = "application/json"
        if authenticated:
            # Per request, never on the httpx client: a redirect to another host (an S3 URL) is fetched
            # with the same client and must not carry the key.
            sent["Authorization"] = f"Bearer {self.api_key}"
        sent.update(headers or {})
        if url.startswith("/"):  # a path of payonce's, under base_url (which may carry a prefix of its own)
            url = self.base_url + url
        return client.build_request(method, url, params=clean_params(params), content=content, headers=sent,
                                    timeout=timeout if timeout is not None else self.timeout)


class SyncTransport(_Base):
    def __init__(self, base_url: str, api_key: str, timeout: TimeoutTypes, max_retries: int,
                 http_client: Optional[httpx.Client] = None):
        super().__init__(base_url, api_key, timeout, max_retries)
        self._own_client = http_client is None
        self.client = http_client or httpx.Client(timeout=self.timeout)

    def close(self) -> None:
        if self._own_client:
            self.client.close()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def send_once(self, method: str, url: str, *, params: Params = None, content: Optional[bytes] = None,
                  headers: Optional[Mapping[str, str]] = None, authenticated: bool = True,
                  timeout: Optional[TimeoutTypes] = None, stream: bool = False) -> httpx.Response:
        """One try: the answer (an error answer with its body read), or httpx's transport error."""
        request = self._build(self.client, method, url, params=params, content=content, headers=headers,
                              authenticated=authenticated, timeout=timeout)
        response = self.client.send(request, stream=stream)
        if stream and response.status_code >= 400:
            try:
                response.read()
            finally:
                response.close()
        return response

    def send(self, method: str, url: str, *, params: Params = None, json_body: Any = None,
             headers: Optional[Mapping[str, str]] = None, mode: Mode = Mode.REPEATABLE,
             authenticated: bool = True, timeout: Optional[TimeoutTypes] = None,
             stream: bool = False) -> httpx.Response:
        """Send until payonce answers something that is not worth trying again, within the policy of
        ``mode``; return an answer under 400 (redirects included), raise the error answer otherwise, or
        :class:`APIConnectionError` when no answer came on any try."""
        content = encode_json(json_body) if json_body is not None else None
        attempts, reached = 0, False
        while True:
            attempts += 1
            try:
                response = self.send_once(method, url, params=params, content=content, headers=headers,
                                          authenticated=authenticated, timeout=timeout, stream=stream)
            except httpx.TransportError as exc:
                reached = reached or not never_connected(exc)
                pause = pause_after_error(mode, attempts - 1, self.max_retries, exc)
                if pause is None:
                    raise connection_error(method, url, exc, attempts, reached) from exc
                self.sleep(pause)
                continue
            if response.status_code < 400:
                return response
            pause = pause_after_status(mode, attempts - 1, self.max_retries, response.status_code,
                                       response.headers.get("retry-after"))
            if pause is None:
                raise api_error(response, attempts)
            self.sleep(pause)


class AsyncTransport(_Base):
    def __init__(self, base_url: str, api_key: str, timeout: TimeoutTypes, max_retries: int,
                 http_client: Optional[httpx.AsyncClient] = None):
        super().__init__(base_url, api_key, timeout, max_retries)
        self._own_client = http_client is None
        self.client = http_client or httpx.AsyncClient(timeout=self.timeout)

    async def close(self) -> None:
        if self._own_client:
            await self.client.aclose()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def send_once(self, method: str, url: str, *, params: Params = None, content: Optional[bytes] = None,
                        headers: Optional[Mapping[str, str]] = None, authenticated: bool = True,
                        timeout: Optional[TimeoutTypes] = None, stream: bool = False) -> httpx.Response:
        """One try: the answer (an error answer with its body read), or httpx's transport error."""
        request = self._build(self.client, method, url, params=params, content=content, headers=headers,
                              authenticated=authenticated, timeout=timeout)
        response = await self.client.send(request, stream=stream)
        if stream and response.status_code >= 400:
            try:
                await response.aread()
            finally:
                await response.aclose()
        return response

    async def send(self, method: str, url: str, *, params: Params = None, json_body: Any = None,
                   headers: Optional[Mapping[str, str]] = None, mode: Mode = Mode.REPEATABLE,
                   authenticated: bool = True, timeout: Optional[TimeoutTypes] = None,
                   stream: bool = False) -> httpx.Response:
        """As :meth:`SyncTransport.send`."""
        content = encode_json(json_body) if json_body is not None else None
        attempts, reached = 0, False
        while True:
            attempts += 1
            try:
                response = await self.send_once(method, url, params=params, content=content, headers=headers,
                                                authenticated=authenticated, timeout=timeout, stream=stream)
            except httpx.TransportError as exc:
                reached = reached or not never_connected(exc)
                pause = pause_after_error(mode, attempts - 1, self.max_retries, exc)
                if pause is None:
                    raise connection_error(method, url, exc, attempts, reached) from exc
                await self.sleep(pause)
                continue
            if response.status_code < 400:
                return response
            pause = pause_after_status(mode, attempts - 1, self.max_retries, response.status_code,
                                       response.headers.get("retry-after"))
            if pause is None:
                raise api_error(response, attempts)
            await self.sleep(pause)
