"""The models payonce knows: `provider/model` names, what they make, and their capabilities.

A job's `models` are validated against this catalog, so a typo is a 422 at submit, not a failed job:
the sandbox's four models by name, Anthropic's `claude-*` models, any model of an OpenAI-compatible
server, and Replicate's `owner/name[:version]` models.

A media model also declares the parameters it takes (`ModelSpec.params`), so that a job's `input` is
checked against them at submit (`input_problems`): without it, a typo such as `rendr_s` was sent to the
provider, which ignored it and rendered (and charged) a default render.
"""

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from django.conf import settings

from executor.providers import anthropic, openai_compat, real, replicate
from executor.providers.base import CHEAP_LLM, Capabilities
from sandbox import catalog as sandbox_catalog

# A media job's input keys that are payonce's own, never a provider parameter: every other key is sent to
# each model of the chain as a parameter (executor.render, through provider_params).
PAYONCE_INPUT_KEYS = ("prompt", "references")


@dataclass(frozen=True)
class Param:
    """A provider parameter a model takes in a media job's input: its JSON type and bounds (inclusive).

    `type` is "number" (an int or a finite float, never a bool), "integer" (never a bool) or "string".
    """

    name: str
    type: str
    minimum: float | None = None
    maximum: float | None = None
    nullable: bool = False

    def problem(self, value) -> str | None:
        """Why `value` is not a value of this parameter, or None."""
        if value is None:
            return None if self.nullable else "May not be null."
        if self.type == "string":
            return None if isinstance(value, str) else "A string is required."
        wanted = "An integer" if self.type == "integer" else "A number"
        if isinstance(value, bool) or not isinstance(value, int if self.type == "integer" else (int, float)):
            return f"{wanted}{' or null' if self.nullable else ''} is required."
        if not math.isfinite(value):
            return "A finite number is required."
        if self.minimum is not None and value < self.minimum:
            return f"Ensure this value is greater than or equal to {self.minimum:g}."
        if self.maximum is not None and value > self.maximum:
            return f"Ensure this value is less than or equal to {self.maximum:g}."
        return None


# The sandbox's media models take what its server reads of `params` (sandbox/server.py `_render_params`,
# sandbox/state.py, sandbox/catalog.py), with the sandbox's own bounds; render_s keeps payonce's tighter
# bound of an hour (the sandbox takes a day), the one the API has always had: a longer render would
# outlast the default wait (WAIT_DEADLINE_S) and be paid for and given up.
_SANDBOX_MEDIA_PARAMS = (
    Param("render_s", "number", minimum=0, maximum=3600),  # how long the render takes (default 1 s)
    Param("expected_s", "number", minimum=0, nullable=True),  # the duration it announces (null: none)
    Param("fail_render", "string"),  # the render fails with this message (paid: a failure script)
    Param("size_bytes", "integer", minimum=0, maximum=sandbox_catalog.MAX_SIZE_BYTES),  # the output's size
)


@dataclass(frozen=True)
class ModelSpec:
    provider: str
    model: str
    kind: str  # "video", "image" or "text"
    content_type: str
    extension: str
    capabilities: Capabilities
    # The `input` parameters the model takes, or None: passed through unchecked (a model whose adapter cannot
    # know them, an arbitrary Replicate model; text models, whose input is a report's, checked elsewhere).
    # Declared, an undeclared key is refused at submit: otherwise a typo is paid for as a default render.
    params: tuple[Param, ...] | None = None

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
                    dict(idempotency_key=True, lookup=False, asynchronous=True, cancel=True), _SANDBOX_MEDIA_PARAMS),
    "image-lookup": ("image", "image/png", "png",
                     dict(idempotency_key=False, lookup=True, asynchronous=True, cancel=False), _SANDBOX_MEDIA_PARAMS),
    "image-blind": ("image", "image/png", "png",
                    dict(idempotency_key=False, lookup=False, asynchronous=True, cancel=False), _SANDBOX_MEDIA_PARAMS),
    "llm": ("text", "text/markdown", "md", None, None),
}


def _sandbox_capabilities(declared: dict | None) -> Capabilities:
    if declared is None:
        return CHEAP_LLM
    return Capabilities(**declared, unpaid_statuses=_SANDBOX_UNPAID, key_ttl_s=settings.SANDBOX_KEY_TTL_S)
# Every content type a job's output can have (GET /v1/jobs/{id}/output).
OUTPUT_CONTENT_TYPES = ("video/mp4", "image/png", "application/octet-stream")
# Whole names (\A...\Z: `$` would also match before a final newline).
_REPLICATE_MODEL = re.compile(r"\A[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*(:[0-9a-f]{16,64})?\Z")
_OPENAI_MODEL = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._:/-]{0,99}\Z")


@lru_cache(maxsize=1024)
def model_spec(name: str) -> ModelSpec | None:
    provider, _, model = name.partition("/")
    if provider == "sandbox" and model in _SANDBOX:
        kind, content_type, extension, declared, params = _SANDBOX[model]
        return ModelSpec(provider, model, kind, content_type, extension, _sandbox_capabilities(declared), params)
    if provider == "anthropic" and re.fullmatch(r"claude-[a-z0-9.-]{1,80}", model):
        return ModelSpec(provider, model, "text", "text/markdown", "md", anthropic.CAPABILITIES)
    if provider == "openai" and _OPENAI_MODEL.match(model):
        return ModelSpec(provider, model, "text", "text/markdown", "md", openai_compat.CAPABILITIES)
    if provider == "replicate" and _REPLICATE_MODEL.match(model):
        # What a Replicate model makes is the model's business; the bytes are kept as they come. Its
        # parameters too: any model of any owner, so its input is passed through unchecked (params None).
        return ModelSpec(provider, model, "image", "application/octet-stream", "bin", replicate.CAPABILITIES,
                         params=None)
    return None


def provider_params(job_input: Mapping) -> dict:
    """The provider parameters of a media job's input: every key but payonce's own."""
    return {name: value for name, value in job_input.items() if name not in PAYONCE_INPUT_KEYS}


def input_problems(models: Iterable[str], job_input: Mapping) -> dict[str, list[str]]:
    """Why each provider parameter of a media job's input is refused, by key ({} when none is).

    Every model of the chain gets the same parameters, so a key must suit each model that declares its
    parameters: an undeclared key, a value of the wrong type or out of bounds is refused (for the first
    model it fails, named). A model that declares none (None: an arbitrary Replicate model) takes anything.
    Unknown model names are skipped: the chain's own validation refuses them.
    """
    problems: dict[str, list[str]] = {}
    specs = [spec for spec in map(model_spec, models) if spec is not None and spec.params is not None]
    for key, value in provider_params(job_input).items():
        for spec in specs:
            declared = {param.name: param for param in spec.params}
            if key not in declared:
                problem = f"Not a parameter of {spec.name}, which takes: {', '.join(declared) or 'none'}."
            else:
                problem = declared[key].problem(value)
            if problem is not None:
                problems[key] = [problem]
                break
    return problems


def provider_usable(provider: str) -> bool:
    """False when real providers are on and this one has no key (a job naming it is refused)."""
    return provider == "sandbox" or real.provider_is_usable(provider)
