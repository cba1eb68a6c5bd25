"""Any OpenAI-compatible chat completions server (OpenAI's own, or a local vLLM, llama.cpp, Ollama...): every
`openai/<model>`, a text provider. The adapter is executor.providers.openai_compat, which OpenAI's images
(executor.providers.openai_images) share."""

import re

from executor.providers.base import ModelSpec
from executor.providers.openai import replay
from executor.providers.openai_compat import CAPABILITIES, OpenAICompatibleProvider
from executor.providers.spec import ProviderSpec, SecretShape

_MODEL = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._:/-]{0,99}\Z")  # whole names (`$` would match before a newline)


def pattern(name: str) -> ModelSpec | None:
    model = name.partition("/")[2]
    return ModelSpec("openai", model, "text", "text/markdown", "md", CAPABILITIES) if _MODEL.match(model) else None


SPEC = ProviderSpec(
    name="openai", package="openai", adapter=OpenAICompatibleProvider, keyless_when_local=True, pattern=pattern,
    replay_routes=replay.routes, smoke="text",
    secret_shapes=(SecretShape("sk-", r"\bsk-[A-Za-z0-9_-]{16,}"),),
)
