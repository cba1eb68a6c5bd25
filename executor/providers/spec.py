"""What a provider is, in one declaration: `ProviderSpec` (docs/providers.md, "Adding a provider").

Each provider is one folder, executor/providers/<package>/: its adapter (`adapter.py`), its recorded
answers (`fixtures/`), its replay routes (`replay.py`), its conformance profile (`conformance.py`, data the
suite reads) and, in its `__init__.py`, one `SPEC = ProviderSpec(...)`. executor.providers.PROVIDERS lists
the specs, and every list of provider names is derived from it: the adapters (`provider_for`), the real
providers and their keys (executor.providers.real), the models the code knows (executor.registry), the
callback secrets (executor.callbacks), the replay routes (executor.providers.replay), the providers
`smoke_provider` can call, and the secrets redacted from every log line (config.logs).

Two things stay where they are, by the one-way stack (tests/project/test_architecture.py):

- prices: a model's price is money, the rate card's (billing.rates.DEFAULTS, keyed by `provider/model`),
  and billing stands below the executor, so it cannot read a spec; a price given with a model in the
  models file or the admin reaches the card through the registry's port (executor.apps);
- log redaction: config stands below everything, so config.logs cannot read the specs either; executor's
  AppConfig.ready() registers each spec's secrets with it (`config.logs.register_secrets`), the one way a
  lower layer learns what a higher one declares without importing it.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from executor.providers.base import ModelSpec


@dataclass(frozen=True)
class SecretShape:
    """A provider key's recognisable shape, redacted wherever it appears in a log line (even when it is not
    this deployment's key). `needle`: a lower-case text every match holds (a cheap test first)."""

    needle: str
    pattern: str


@dataclass(frozen=True)
class ProviderSpec:
    # The `provider` of `provider/model`; the adapter's own `name`.
    name: str
    # The folder under executor/providers/ (a Python name: `openai-images` lives in openai_images/).
    package: str
    # The adapter's class; provider_for(name) makes one per process. Its settings are on it
    # (`key_setting`, `base_url_setting`: real.RealAdapter reads them at call time), read here through
    # the properties below, so each is said once.
    adapter: type
    # Real money: governed by REAL_PROVIDERS (recorded answers while it is off, a key needed while on).
    # The sandbox is not.
    real: bool = True
    # A server other than the provider's own (OPENAI_BASE_URL changed) may run keyless (vLLM, Ollama...).
    keyless_when_local: bool = False
    # The models the code declares by name (built at call time: some read settings) and, for a provider
    # that serves any model of a shape (`anthropic/claude-*`), the spec of a name that has it.
    models: Callable[[], Mapping[str, ModelSpec]] = dict
    pattern: Callable[[str], ModelSpec | None] | None = None
    # Callbacks (executor.callbacks): the setting holding its Standard Webhooks secret, or a function
    # giving the secret now (the sandbox's development default), or a verifier of its own scheme
    # (`callback_verifier(body, headers) -> (message id, generation id)`, raising callbacks.Refused) with
    # `callbacks_on()` saying whether it can verify now (fal's published keys).
    callback_secret_setting: str | None = None
    callback_secret: Callable[[], str] | None = None
    callback_verifier: Callable | None = None
    callbacks_on: Callable[[], bool] | None = None
    # Its recorded answers with REAL_PROVIDERS off (executor.providers.replay): `routes(adapter, request,
    # method, url, api, path)` answers `(status, headers, body bytes)` or None when the request is not its.
    replay_routes: Callable | None = None
    # The media hosts its answers point at (replayed as small files).
    replay_media_prefixes: tuple[str, ...] = ()
    # What `manage.py smoke_provider` makes of it: "text" (one LLM call) or "media" (its cheapest render,
    # with `smoke_params`); None: not offered.
    smoke: str | None = None
    smoke_params: Mapping = field(default_factory=dict)
    # Secrets to redact from every log line (config.logs): its key's shape, wherever it appears. Its key
    # and callback secret settings are redacted by value whatever their names.
    secret_shapes: tuple[SecretShape, ...] = ()
    # The most calls the provider takes in flight at once (its documented concurrency, for every client of
    # one account), None: no limit of its own. PROVIDER_MAX_IN_FLIGHT overrides it (executor.in_flight).
    max_in_flight: int | None = None

    @property
    def key_setting(self) -> str | None:
        return getattr(self.adapter, "key_setting", None) if self.real else None

    @property
    def base_url_setting(self) -> str | None:
        return getattr(self.adapter, "base_url_setting", None)

    @property
    def secret_settings(self) -> tuple[str, ...]:
        """The settings whose values are secrets: its key, its callback secret."""
        return tuple(name for name in (self.key_setting, self.callback_secret_setting) if name)
