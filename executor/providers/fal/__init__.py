"""fal's queue: FLUX.1 [dev] and Kling 2.5 Turbo Pro by name (any other fal app through the models file), a
media provider that calls back with its own signature (executor.providers.fal.webhooks)."""

from executor.providers.base import ModelSpec, Param
from executor.providers.fal import callbacks, replay
from executor.providers.fal.adapter import CAPABILITIES, FalProvider
from executor.providers.spec import ProviderSpec

# fal's models as its API reference declares them (executor.providers.fal.adapter): one output per job, so
# num_images is held to 1; sync_mode (the output as a data URI fal does not keep) is not taken.
_FLUX_PARAMS = (
    Param("image_size", "string", choices=("square_hd", "square", "portrait_4_3", "portrait_16_9", "landscape_4_3",
                                           "landscape_16_9")),
    Param("num_inference_steps", "integer", minimum=1, maximum=50),
    Param("guidance_scale", "number", minimum=1, maximum=20),
    Param("seed", "integer", minimum=0),
    Param("num_images", "integer", minimum=1, maximum=1),
    Param("output_format", "string", choices=("jpeg", "png")),
    Param("acceleration", "string", choices=("none", "regular", "high")),
)
_KLING_PARAMS = (
    Param("duration", "string", choices=("5", "10")),
    Param("aspect_ratio", "string", choices=("16:9", "9:16", "1:1")),
    Param("negative_prompt", "string"),
    Param("cfg_scale", "number", minimum=0, maximum=1),
)
_KLING = "fal-ai/kling-video/v2.5-turbo/pro/text-to-video"


def models() -> dict[str, ModelSpec]:
    return {"fal/fal-ai/flux/dev": ModelSpec("fal", "fal-ai/flux/dev", "image", "image/jpeg", "jpg", CAPABILITIES,
                                             _FLUX_PARAMS),
            f"fal/{_KLING}": ModelSpec("fal", _KLING, "video", "video/mp4", "mp4", CAPABILITIES, _KLING_PARAMS)}


SPEC = ProviderSpec(
    name="fal", package="fal", adapter=FalProvider, models=models,
    callback_verifier=callbacks.verify_callback, callbacks_on=callbacks.callbacks_on,
    replay_routes=replay.routes, replay_media_prefixes=(replay.MEDIA_PREFIX,),
    smoke="media", smoke_params={"image_size": "square", "num_images": 1, "num_inference_steps": 4},
)
