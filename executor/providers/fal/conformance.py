"""fal's conformance profile (executor.providers.conformance; tests/executor/test_conformance.py runs it)."""

from decimal import Decimal

from executor.providers.base import ErrorClass
from executor.providers.conformance import DROP, CancelCase, PaidFailure, PriceCase, Profile, RateLimit, Refusal
from executor.providers.fal.adapter import FalProvider

REQUEST_ID = "764cabcf-b745-4b3e-ae38-1200304cf45b"  # fal/submit_accepted
REQUESTS = f"/fal-ai/flux/requests/{REQUEST_ID}"  # status, result and cancel: the app id, no /dev
FLUX_DEV = "fal-ai/flux/dev"


PROFILES = (
    Profile(
        id="fal",
        fixtures="fal/error_",
        adapter=FalProvider,
        model=FLUX_DEV,
        kind="media",
        backend="replay",
        route=("POST", f"/{FLUX_DEV}"),
        accepted="fal/submit_accepted",
        accepted_id=REQUEST_ID,
        refusals=(
            Refusal("422", "fal/error_422_validation", ErrorClass.INVALID_INPUT, "prompt: Field required"),
            Refusal("422-content-policy", "fal/result_error_422_content_policy", ErrorClass.REFUSED,
                    "flagged by a content checker"),
        ),
        rate_limit=RateLimit("fal/error_429_rate_limited", 12.0),
        server_errors={500: "fal/error_500_internal", 502: "fal/error_502_ingress", 503: "fal/error_503_unavailable",
                       504: "fal/error_504_timeout"},
        lost=DROP,
        paid_failures=(
            PaidFailure("nsfw-flagged", "fal/submit_accepted",
                        then=(("GET", f"{REQUESTS}/status", "fal/status_completed"),
                              ("GET", REQUESTS, "fal/result_flux_dev_nsfw")),
                        error="the image was flagged by fal's safety checker (has_nsfw_concepts)",
                        error_class=ErrorClass.REFUSED),
            PaidFailure("422-content-policy", "fal/submit_accepted",
                        then=(("GET", f"{REQUESTS}/status", "fal/status_completed_unprocessable"),
                              ("GET", REQUESTS, "fal/result_error_422_content_policy")),
                        error="prompt: The content was flagged by a content checker.",
                        error_class=ErrorClass.REFUSED),
        ),
        cancel=CancelCase(("PUT", f"{REQUESTS}/cancel"), answers=("fal/cancel_requested",),
                          upstream_id=REQUEST_ID),
        callback="fal",
        # FLUX.1 [dev] on fal: $0.025 per megapixel, an image rounded up to the next megapixel
        # (fal.ai/models/fal-ai/flux/dev). result_flux_dev is 1024 x 768 = 786,432 px = 0.79 MP -> 1 MP:
        # $0.025. Its inference_time (2.1843 s) is not what it is billed by.
        prices=(PriceCase("one image, landscape_4_3", Decimal("0.025000"), submit="fal/submit_accepted",
                          then=(("GET", f"{REQUESTS}/status", "fal/status_completed"),
                                ("GET", REQUESTS, "fal/result_flux_dev"))),),
        params={"image_size": "landscape_4_3", "num_images": 1},
    ),
)
