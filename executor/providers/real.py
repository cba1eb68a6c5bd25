"""Whether the real provider adapters spend real money (docs/design.md, "Real money is opt-in"), and the one door
through which they reach the network or, with REAL_PROVIDERS off, its recording.

Spending is opt-in: with REAL_PROVIDERS off, every real provider (a spec of executor.providers.PROVIDERS with
`real`: `anthropic`, `openai`, `replicate`, `fal`, `openai-images`) answers from recorded fixtures (executor.providers.replay) and never open a socket. With it on, each needs its key, and a
deployment switched on with nothing usable refuses to start (`check_real_providers`).
Settings are read at call time, never at import time, so tests (and a reloaded config) can change them.
"""

import requests
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from executor import providers
from executor.providers import http
from executor.providers.base import ErrorClass, ProviderError
from executor.providers.replay import replay_session_key



def _real_specs():
    """The real providers' specs, read at call time: the adapters import this module while
    executor.providers builds them (so `providers` is the package, not yet its PROVIDERS)."""
    return tuple(spec for spec in providers.PROVIDERS if spec.real)


def real_provider_names() -> tuple[str, ...]:
    return tuple(spec.name for spec in _real_specs())


def key_settings() -> dict[str, str]:
    """Each real provider's key setting, by provider name."""
    return {spec.name: spec.key_setting for spec in _real_specs()}


DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"
# An LLM answers nothing until its whole text is written (no streaming here): a long chapter takes a minute
# or two, far past PROVIDER_READ_TIMEOUT_S. Cutting it short would be an unknown outcome that is paid for
# and then resubmitted, so text calls wait up to 120 s (docs/design.md, "Reports and orders").


def real_providers_on() -> bool:
    return bool(settings.REAL_PROVIDERS)


def replaying(replay: bool | None = None) -> bool:
    """Does a real adapter answer from recorded fixtures? Its own `replay` flag when set (tests), otherwise
    whenever REAL_PROVIDERS is off."""
    return replay if replay is not None else not real_providers_on()


def configured_providers() -> set[str]:
    """The real providers whose key (or token) is set."""
    return {name for name, setting in key_settings().items() if getattr(settings, setting, "")}


def openai_is_local(base_url: str | None = None) -> bool:
    """An OpenAI-compatible server other than OpenAI's own (vLLM, llama.cpp, Ollama...) may run keyless."""
    base_url = (base_url or settings.OPENAI_BASE_URL).rstrip("/")
    return base_url != DEFAULT_OPENAI_BASE_URL


def provider_is_usable(name: str) -> bool:
    """May a job name this provider's models now?

    REAL_PROVIDERS off: yes, the adapter answers from fixtures. On: only with its key, except a provider
    whose spec is `keyless_when_local` (OpenAI's) pointed at a non-default OPENAI_BASE_URL (a local server,
    which may run keyless). Providers that are not real (the sandbox) are not governed by REAL_PROVIDERS and
    are always usable.
    """
    spec = next((spec for spec in _real_specs() if spec.name == name), None)
    if spec is None or not real_providers_on():
        return True
    if name in configured_providers():
        return True
    return spec.keyless_when_local and openai_is_local()


def check_real_providers() -> set[str]:
    """Refuse to start when REAL_PROVIDERS is on and no real provider can be used; returns the usable ones
    (empty when REAL_PROVIDERS is off: every real provider then answers from fixtures).

    A keyless local OpenAI-compatible server (OPENAI_BASE_URL changed from the default) counts as usable:
    it spends nothing, and its operator chose it explicitly.
    """
    if not real_providers_on():
        return set()
    usable = {name for name in real_provider_names() if provider_is_usable(name)}
    if not usable:
        variables = ", ".join(dict.fromkeys(key_settings().values()))  # each once, in PROVIDERS' order
        raise ImproperlyConfigured(
            f"REAL_PROVIDERS is on but no provider key is set: set at least one of {variables} (or point "
            "OPENAI_BASE_URL at a local server), or switch REAL_PROVIDERS off to answer from recorded fixtures."
        )
    return usable


def llm_timeout(read_timeout_s: float | None = None) -> tuple[float, float]:
    """(connect, read) timeouts of a text call: the adapter's own read timeout when it was given one,
    otherwise 120 s or PROVIDER_READ_TIMEOUT_S, whichever is longer."""
    read = read_timeout_s if read_timeout_s is not None else max(settings.PROVIDER_READ_TIMEOUT_S,
                                                                settings.LLM_READ_TIMEOUT_S)
    return settings.PROVIDER_CONNECT_TIMEOUT_S, read


def missing_key(name: str) -> ProviderError:
    """Raised before any network call by an adapter switched to real mode without its key."""
    return ProviderError(ErrorClass.AUTH, f"{key_settings()[name]} is not set (REAL_PROVIDERS is on)")


def send(method: str, url: str, *, base_url: str, replay: bool | None = None, **kwargs) -> requests.Response:
    """http.send for a real adapter. Replaying (REAL_PROVIDERS off, unless the adapter was told otherwise)
    goes through a per-thread session of its own on which executor.providers.replay is mounted for every
    URL, so a recorded answer can never fall through to the network, and the real session for the same
    base URL is never touched."""
    if replaying(replay):
        return http.send(method, url, base_url=replay_session_key(base_url), **kwargs)
    return http.send(method, url, base_url=base_url, **kwargs)


class RealAdapter:
    """What the real adapters share: their base URL and key come from settings, read at call time,
    unless given to the constructor (tests), and `replay` (None: follow REAL_PROVIDERS at call time;
    True/False: force recorded answers or the network)."""

    base_url_setting: str
    key_setting: str

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *, replay: bool | None = None,
                 read_timeout_s: float | None = None):
        self._base_url = base_url.rstrip("/") if base_url else None
        self._api_key = api_key
        self.replay = replay
        self.read_timeout_s = read_timeout_s

    @property
    def base_url(self) -> str:
        return self._base_url or getattr(settings, self.base_url_setting).rstrip("/")

    @property
    def api_key(self) -> str:
        return self._api_key if self._api_key is not None else getattr(settings, self.key_setting)
