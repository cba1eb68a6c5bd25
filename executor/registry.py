"""The models payonce knows: `provider/model` names, what they make, and their capabilities.

A job's `models` are validated against this catalog, so a typo is a 422 at submit, not a failed job:
the sandbox's four models by name, Anthropic's `claude-*` models, any model of an OpenAI-compatible
server, and Replicate's `owner/name[:version]` models.
"""

import re
from dataclasses import dataclass
from functools import lru_cache

from executor.providers.base import CHEAP_LLM, Capabilities


@dataclass(frozen=True)
class ModelSpec:
    provider: str
    model: str
    kind: str  # "video", "image" or "text"
    content_type: str
    extension: str
    capabilities: Capabilities

    @property
    def name(self) -> str:
        return f"{self.provider}/{self.model}"

    @property
    def job_kind(self) -> str:
        """The job kind this model can serve: media renders or report chapters."""
        return "report" if self.kind == "text" else "media"


# The sandbox answers every status_* fault before accepting anything (it never charges for one), and it
# remembers a request_id for ever unless SANDBOX_KEY_TTL_S tells it (and payonce) otherwise.
_SANDBOX_UNPAID = frozenset({429, 500, 503})
_SANDBOX = {
    "video-keyed": ("video", "video/mp4", "mp4",
                    dict(idempotency_key=True, lookup=False, asynchronous=True, cancel=True)),
    "image-lookup": ("image", "image/png", "png",
                     dict(idempotency_key=False, lookup=True, asynchronous=True, cancel=False)),
    "image-blind": ("image", "image/png", "png",
                    dict(idempotency_key=False, lookup=False, asynchronous=True, cancel=False)),
    "llm": ("text", "text/markdown", "md", None),
}


def _sandbox_capabilities(declared: dict | None) -> Capabilities:
    from django.conf import settings

    if declared is None:
        return CHEAP_LLM
    return Capabilities(**declared, unpaid_statuses=_SANDBOX_UNPAID, key_ttl_s=settings.SANDBOX_KEY_TTL_S)
# Every content type a job's output can have (GET /v1/jobs/{id}/output).
OUTPUT_CONTENT_TYPES = ("video/mp4", "image/png", "application/octet-stream")
_REPLICATE_MODEL = re.compile(r"^[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*(:[0-9a-f]{16,64})?$")
_OPENAI_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,99}$")


@lru_cache(maxsize=1024)
def model_spec(name: str) -> ModelSpec | None:
    provider, _, model = name.partition("/")
    if provider == "sandbox" and model in _SANDBOX:
        kind, content_type, extension, declared = _SANDBOX[model]
        return ModelSpec(provider, model, kind, content_type, extension, _sandbox_capabilities(declared))
    if provider == "anthropic" and re.fullmatch(r"claude-[a-z0-9.-]{1,80}", model):
        from executor.providers.anthropic import CAPABILITIES

        return ModelSpec(provider, model, "text", "text/markdown", "md", CAPABILITIES)
    if provider == "openai" and _OPENAI_MODEL.match(model):
        from executor.providers.openai_compat import CAPABILITIES

        return ModelSpec(provider, model, "text", "text/markdown", "md", CAPABILITIES)
    if provider == "replicate" and _REPLICATE_MODEL.match(model):
        from executor.providers.replicate import CAPABILITIES

        # What a Replicate model makes is the model's business; the bytes are kept as they come.
        return ModelSpec(provider, model, "image", "application/octet-stream", "bin", CAPABILITIES)
    return None


def provider_usable(provider: str) -> bool:
    """False when real providers are on and this one has no key (a job naming it is refused)."""
    from executor.providers.real import provider_is_usable

    return provider == "sandbox" or provider_is_usable(provider)
