"""HTTP plumbing shared by every adapter: one keep-alive requests.Session per thread and base URL, the
connect and read timeouts of settings, and transport failures turned into ProviderError."""

import base64
import os
import threading
from urllib.request import getproxies

import requests
import urllib3
from django.conf import settings

from executor.providers.base import ErrorClass, ProviderError

_local = threading.local()


def session(base_url: str) -> requests.Session:
    """requests.Session is not documented as thread-safe: one per worker thread (and base URL)."""
    sessions = getattr(_local, "sessions", None)
    if sessions is None:
        sessions = _local.sessions = {}
    found = sessions.get(base_url)
    if found is None:
        found = sessions[base_url] = requests.Session()
        # Proxy and CA settings are read from the environment once, not on every call (requests scans
        # the whole environment per request when trust_env is on: a measurable share of a fast job).
        found.proxies.update(getproxies())
        found.verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
        found.trust_env = False
    return found


def send(method: str, url: str, *, base_url: str, timeout: tuple[float, float] | None = None,
         **kwargs) -> requests.Response:
    """One HTTP call. A transport failure is a ProviderError whose outcome is unknown (the request may
    have arrived); HTTP error statuses are returned for the adapter to read."""
    timeout = timeout or (settings.PROVIDER_CONNECT_TIMEOUT_S, settings.PROVIDER_READ_TIMEOUT_S)
    try:
        return session(base_url).request(method, url, timeout=timeout, **kwargs)
    except (requests.ConnectTimeout, requests.ConnectionError) as exc:
        if _never_connected(exc):
            # Refused, unreachable, or no connection in time: no byte of the request left, so nothing
            # can have been accepted. The storm's dead sandbox made dozens of blind renders `uncertain`
            # (waiting for a person) when it was only down.
            raise ProviderError(ErrorClass.NETWORK, f"could not connect: {exc}", never_sent=True) from exc
        if isinstance(exc, requests.Timeout):
            raise ProviderError(ErrorClass.TIMEOUT, f"no answer in time: {exc}", outcome_unknown=True) from exc
        raise ProviderError(ErrorClass.NETWORK, f"connection failed: {exc}", outcome_unknown=True) from exc
    except requests.Timeout as exc:
        raise ProviderError(ErrorClass.TIMEOUT, f"no answer in time: {exc}", outcome_unknown=True) from exc
    except requests.RequestException as exc:
        raise ProviderError(ErrorClass.NETWORK, f"connection failed: {exc}", outcome_unknown=True) from exc


def _never_connected(exc: requests.RequestException) -> bool:
    """The connection was never made (urllib3's NewConnectionError, a connect timeout among them), as
    against one that broke after the request went out (RemoteDisconnected, a reset, a read timeout)."""
    if isinstance(exc, requests.ConnectTimeout):
        return True
    reason = getattr(exc.args[0], "reason", None) if exc.args else None
    return isinstance(reason, urllib3.exceptions.NewConnectionError)


def json_answer(response: requests.Response) -> dict:
    """The JSON object of a 2xx answer. An unreadable one (a proxy's HTML page, a cut body) is a server
    error whose outcome is unknown: the provider may well have done, and billed, the work."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ProviderError(
            ErrorClass.SERVER_ERROR,
            f"unreadable answer (HTTP {response.status_code}): {response.text[:300]!r}",
            status=response.status_code,
            outcome_unknown=True,
        )
    return data


def error_body(response: requests.Response) -> dict:
    """The JSON object of an error answer, or {} when it is not one."""
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def fallback_message(response: requests.Response) -> str:
    return response.text[:500].strip() or response.reason or f"HTTP {response.status_code}"


def data_url(payload: bytes, content_type: str | None) -> str:
    """Bytes a provider answered in its body, as a `data:` URL (RFC 2397) an attempt's output_url can hold."""
    return f"data:{content_type or 'application/octet-stream'};base64,{base64.b64encode(payload).decode()}"


def is_data_url(url: str | None) -> bool:
    return url is not None and url.startswith("data:")


def data_url_payload(url: str) -> tuple[bytes, str] | None:
    """(bytes, content type) of a `data:` URL made by data_url; None for any other URL."""
    if not is_data_url(url):
        return None
    head, _, encoded = url[5:].partition(",")
    content_type, _, encoding = head.partition(";")
    if encoding != "base64":
        raise ValueError("only base64 data URLs are made here")
    return base64.b64decode(encoded, validate=True), content_type or "application/octet-stream"
