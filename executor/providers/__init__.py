"""Provider adapters behind one port (executor.providers.base)."""

from functools import lru_cache


@lru_cache(maxsize=None)
def provider_for(name: str):
    if name == "sandbox":
        from executor.providers.sandbox import SandboxProvider

        return SandboxProvider()
    raise LookupError(f"no adapter for provider {name!r}")
