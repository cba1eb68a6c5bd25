"""OpenAI image generation's conformance profile (executor.providers.conformance; tests/executor/
test_conformance.py runs it)."""

from decimal import Decimal

from executor.providers.base import ErrorClass
from executor.providers.conformance import DROP, PriceCase, Profile, RateLimit, Refusal
from executor.providers.openai_images.adapter import OpenAIImagesProvider

REQUEST_ID = "req_5c1e9a7f3b2d4e6a8c0f1b3d5e7a9c2b"  # openai_images/images_generation's x-request-id


PROFILES = (
    Profile(
        id="openai-images",
        fixtures="openai_images/images_error_",
        adapter=OpenAIImagesProvider,
        model="gpt-image-1",
        kind="media",
        backend="replay",
        route=("POST", "/v1/images/generations"),
        accepted="openai_images/images_generation",
        accepted_id=REQUEST_ID,
        refusals=(
            Refusal("400-invalid-size", "openai_images/images_error_400_invalid_size", ErrorClass.INVALID_INPUT,
                    "Invalid value: '1792x1024'"),
            Refusal("400-content-policy", "openai_images/images_error_400_content_policy", ErrorClass.REFUSED,
                    "rejected as a result of our safety system"),
            Refusal("400-moderation-blocked", "openai_images/images_error_400_moderation_blocked", ErrorClass.REFUSED,
                    "rejected by the safety system"),
        ),
        rate_limit=RateLimit("openai_images/images_error_429_rate_limit", 12.0),
        server_errors={500: "openai_images/images_error_500_server", 503: "openai_images/images_error_503_overloaded"},
        lost=DROP,
        prices=(
            # gpt-image-1 bills tokens (openai.com/api/pricing, 2026-12-03): text input $5, image output $40 per
            # million. images_generation (medium, 1024x1024) reports 17 text input and 1,056 image output
            # tokens: 17 * 5 + 1,056 * 40 = 85 + 42,240 = 42,325 -> $0.042325 (the per-image table's $0.042
            # is those 1,056 tokens rounded, the prompt not counted).
            PriceCase("gpt-image-1 medium 1024x1024", Decimal("0.042325"), submit="openai_images/images_generation",
                      params={"size": "1024x1024", "quality": "medium"}),
            # dall-e-3 bills per image, by quality and size: standard 1024x1024 is $0.04 (no tokens).
            PriceCase("dall-e-3 standard 1024x1024", Decimal("0.040000"), submit="openai_images/images_generation_url",
                      model="dall-e-3", params={"size": "1024x1024", "quality": "standard"}),
        ),
        params={"size": "1024x1024", "quality": "medium"},
    ),
)
