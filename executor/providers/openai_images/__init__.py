"""OpenAI's image generation: gpt-image-1, gpt-image-1-mini and dall-e-3 by name, a media provider that
answers the finished bytes at once. Named `openai-images`: `openai/<model>` stays a chat model."""

from executor.providers.base import ModelSpec, Param
from executor.providers.openai_images import replay
from executor.providers.openai_images.adapter import CAPABILITIES, PARAMS, OpenAIImagesProvider
from executor.providers.spec import ProviderSpec, SecretShape


def _params(model: str) -> tuple[Param, ...]:
    return tuple(Param(each.name, each.type, minimum=each.minimum, maximum=each.maximum, choices=each.choices)
                 for each in PARAMS[model])


def models() -> dict[str, ModelSpec]:
    return {f"openai-images/{model}": ModelSpec("openai-images", model, "image", "image/png", "png", CAPABILITIES,
                                                _params(model))
            for model in PARAMS}


SPEC = ProviderSpec(
    name="openai-images", package="openai_images", adapter=OpenAIImagesProvider, keyless_when_local=True,
    models=models, replay_routes=replay.routes,
    smoke="media", smoke_params={"quality": "low", "size": "1024x1024"},
    secret_shapes=(SecretShape("sk-", r"\bsk-[A-Za-z0-9_-]{16,}"),),
)
