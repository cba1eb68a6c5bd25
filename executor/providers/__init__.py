"""Provider adapters behind one port (executor.providers.base): the sandbox, Anthropic Messages, any
OpenAI-compatible chat completions server, Replicate predictions, fal's queue and OpenAI's image
generation. The real ones answer from recorded
fixtures unless REAL_PROVIDERS is on (executor.providers.real)."""

from functools import lru_cache

from executor.providers.anthropic import AnthropicProvider
from executor.providers.fal import FalProvider
from executor.providers.openai_compat import OpenAICompatibleProvider
from executor.providers.openai_images import OpenAIImagesProvider
from executor.providers.replicate import ReplicateProvider
from executor.providers.sandbox import SandboxProvider

ADAPTERS = {"sandbox": SandboxProvider, "anthropic": AnthropicProvider, "openai": OpenAICompatibleProvider,
            "replicate": ReplicateProvider, "fal": FalProvider, "openai-images": OpenAIImagesProvider}


@lru_cache(maxsize=None)
def provider_for(name: str):
    if name not in ADAPTERS:
        raise LookupError(f"no adapter for provider {name!r}")
    return ADAPTERS[name]()
