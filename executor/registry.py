"""The models payonce knows: `provider/model` names, what they make, and their capabilities.

A job's `models` are validated against this catalog, so a typo is a 422 at submit, not a failed job.
"""

from dataclasses import dataclass

from executor.providers.base import Capabilities


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


_CATALOG = [
    ModelSpec("sandbox", "video-keyed", "video", "video/mp4", "mp4",
              Capabilities(idempotency_key=True, lookup=False, asynchronous=True, cancel=True)),
    ModelSpec("sandbox", "image-lookup", "image", "image/png", "png",
              Capabilities(idempotency_key=False, lookup=True, asynchronous=True, cancel=False)),
    ModelSpec("sandbox", "image-blind", "image", "image/png", "png",
              Capabilities(idempotency_key=False, lookup=False, asynchronous=True, cancel=False)),
    ModelSpec("sandbox", "llm", "text", "text/markdown", "md",
              Capabilities(idempotency_key=False, lookup=False, asynchronous=False, cancel=False)),
]

MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in _CATALOG}


def model_spec(name: str) -> ModelSpec | None:
    return MODELS.get(name)
