"""Provider adapters behind one port (executor.providers.base): the sandbox, Anthropic Messages, any
OpenAI-compatible chat completions server, and Replicate predictions. The real ones answer from recorded
fixtures unless REAL_PROVIDERS is on (executor.providers.real)."""

from functools import lru_cache


@lru_cache(maxsize=None)
def provider_for(name: str):
    if name == "sandbox":
        from executor.providers.sandbox import SandboxProvider

        return SandboxProvider()
    if name == "anthropic":
        from executor.providers.anthropic import AnthropicProvider

        return AnthropicProvider()
    if name == "openai":
        from executor.providers.openai_compat import OpenAICompatibleProvider

        return OpenAICompatibleProvider()
    if name == "replicate":
        from executor.providers.replicate import ReplicateProvider

        return ReplicateProvider()
    raise LookupError(f"no adapter for provider {name!r}")
