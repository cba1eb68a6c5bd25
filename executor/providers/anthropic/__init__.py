"""Anthropic Messages: any `anthropic/claude-*` model, a text provider (reports' chapters)."""

import re

from executor.providers.anthropic import replay
from executor.providers.anthropic.adapter import CAPABILITIES, AnthropicProvider
from executor.providers.base import ModelSpec
from executor.providers.spec import ProviderSpec, SecretShape

_MODEL = re.compile(r"claude-[a-z0-9.-]{1,80}")


def pattern(name: str) -> ModelSpec | None:
    model = name.partition("/")[2]
    return ModelSpec("anthropic", model, "text", "text/markdown", "md", CAPABILITIES) if _MODEL.fullmatch(model) else None


SPEC = ProviderSpec(
    name="anthropic", package="anthropic", adapter=AnthropicProvider, pattern=pattern,
    replay_routes=replay.routes, smoke="text",
    # sk-ant-...: the `sk-` shape OpenAI's keys share (the same pattern, declared by both: redacted once).
    secret_shapes=(SecretShape("sk-", r"\bsk-[A-Za-z0-9_-]{16,}"),),
)
