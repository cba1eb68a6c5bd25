"""Provider adapters behind one port (executor.providers.base): the sandbox, Anthropic Messages, any
OpenAI-compatible chat completions server, Replicate predictions, fal's queue and OpenAI's image
generation. Each is one folder and one declaration, its `ProviderSpec` (executor.providers.spec), listed
in PROVIDERS below: every list of providers in the code is derived from it. The real ones answer from
recorded fixtures unless REAL_PROVIDERS is on (executor.providers.real)."""

from functools import lru_cache

# Listed by hand, imported explicitly: a provider is known because it is named here, never found by a
# scan of the folder or registered by an app's ready().
from executor.providers.anthropic import SPEC as ANTHROPIC
from executor.providers.fal import SPEC as FAL
from executor.providers.openai import SPEC as OPENAI
from executor.providers.openai_images import SPEC as OPENAI_IMAGES
from executor.providers.replicate import SPEC as REPLICATE
from executor.providers.sandbox import SPEC as SANDBOX
from executor.providers.spec import ProviderSpec

PROVIDERS: tuple[ProviderSpec, ...] = (SANDBOX, ANTHROPIC, OPENAI, REPLICATE, FAL, OPENAI_IMAGES)

_BY_NAME = {spec.name: spec for spec in PROVIDERS}
ADAPTERS = {spec.name: spec.adapter for spec in PROVIDERS}


def spec_of(name: str) -> ProviderSpec | None:
    return _BY_NAME.get(name)


@lru_cache(maxsize=None)
def provider_for(name: str):
    if name not in ADAPTERS:
        raise LookupError(f"no adapter for provider {name!r}")
    return ADAPTERS[name]()
