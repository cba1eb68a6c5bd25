"""Replicate predictions: any `replicate/<owner>/<name>[:<version>]`, a media provider that calls back."""

import re

from executor.providers.base import ModelSpec
from executor.providers.replicate import replay
from executor.providers.replicate.adapter import CAPABILITIES, ReplicateProvider
from executor.providers.spec import ProviderSpec, SecretShape

_MODEL = re.compile(r"\A[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*(:[0-9a-f]{16,64})?\Z")  # whole names


def pattern(name: str) -> ModelSpec | None:
    # What a Replicate model makes is the model's business; the bytes are kept as they come. Its
    # parameters too: any model of any owner, so its input is passed through unchecked (params None).
    model = name.partition("/")[2]
    if not _MODEL.match(model):
        return None
    return ModelSpec("replicate", model, "image", "application/octet-stream", "bin", CAPABILITIES, params=None)


SPEC = ProviderSpec(
    name="replicate", package="replicate", adapter=ReplicateProvider, pattern=pattern,
    callback_secret_setting="REPLICATE_WEBHOOK_SECRET",
    replay_routes=replay.routes, replay_media_prefixes=(replay.MEDIA_PREFIX,),
    smoke="media", smoke_params={},
    secret_shapes=(SecretShape("r8_", r"\br8_[A-Za-z0-9]{16,}"),),
)
