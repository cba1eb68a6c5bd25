"""Adapter for the sandbox provider (API.md, "The sandbox provider"), over HTTP with requests."""

import os
import threading
from urllib.request import getproxies

import requests
from django.conf import settings

from executor.providers.base import ErrorClass, PollResult, ProviderError, Submission

_local = threading.local()


def _session() -> requests.Session:
    # One keep-alive session per worker thread: requests.Session is not documented as thread-safe.
    session = getattr(_local, "session", None)
    if session is None:
        session = _local.session = requests.Session()
        # Read proxy and CA settings from the environment once, not on every call (requests scans the
        # whole environment per request when trust_env is on: a measurable share of a fast job's CPU).
        session.proxies.update(getproxies())
        session.verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
        session.trust_env = False
    return session


def classify_http_error(status: int, error_type: str | None) -> tuple[str, bool]:
    """(error class, outcome unknown) for an HTTP error answer."""
    if status >= 500:
        return ErrorClass.SERVER_ERROR, True
    if status == 429:
        return ErrorClass.RATE_LIMITED, False
    if status in (401, 403):
        return ErrorClass.AUTH, False
    if status == 404:
        return ErrorClass.UNAVAILABLE, False
    if error_type == "content_refused":
        return ErrorClass.REFUSED, False
    return ErrorClass.INVALID_INPUT, False


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header given in seconds; an HTTP date or garbage is ignored."""
    try:
        seconds = float(value) if value else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < 86400 else None


class SandboxProvider:
    name = "sandbox"

    def __init__(self, base_url: str | None = None):
        self.base_url = (base_url or settings.SANDBOX_URL).rstrip("/")
        self.timeout = (settings.PROVIDER_CONNECT_TIMEOUT_S, settings.PROVIDER_READ_TIMEOUT_S)

    def _call(self, method: str, path: str, **kwargs) -> requests.Response:
        url = path if path.startswith("http") else f"{self.base_url}{path}"
        try:
            response = _session().request(method, url, timeout=self.timeout, **kwargs)
        except requests.Timeout as exc:
            raise ProviderError(ErrorClass.TIMEOUT, f"no answer from the sandbox: {exc}", outcome_unknown=True)
        except requests.RequestException as exc:
            raise ProviderError(ErrorClass.NETWORK, f"sandbox unreachable: {exc}", outcome_unknown=True)
        if response.status_code >= 400:
            try:
                error = response.json().get("error") or {}
            except ValueError:
                error = {}
            kind, unknown = classify_http_error(response.status_code, error.get("type"))
            raise ProviderError(
                kind,
                error.get("message") or response.text[:500] or response.reason,
                status=response.status_code,
                retry_after=parse_retry_after(response.headers.get("Retry-After")),
                outcome_unknown=unknown,
            )
        return response

    def submit(self, model: str, *, upstream_key: str, prompt: str, params: dict, metadata: dict) -> Submission:
        body = {"model": model, "request_id": upstream_key, "prompt": prompt, "params": params, "metadata": metadata}
        data = self._call("POST", "/v1/generations", json=body).json()
        return Submission(upstream_id=data["id"], status=data.get("status", "running"), cost_usd=data.get("cost_usd"),
                          output_url=(data.get("output") or {}).get("url"), raw=data)

    def poll(self, model: str, upstream_id: str) -> PollResult:
        data = self._call("GET", f"/v1/generations/{upstream_id}").json()
        output = data.get("output") or {}
        error = data.get("error") or {}
        return PollResult(
            status=data["status"],
            output_url=output.get("url"),
            content_type=output.get("content_type"),
            error=error.get("message"),
            cost_usd=data.get("cost_usd"),
            raw=data,
        )

    def cancel(self, model: str, upstream_id: str) -> None:
        self._call("POST", f"/v1/generations/{upstream_id}/cancel")

    def fetch(self, url: str) -> bytes:
        return self._call("GET", url).content
