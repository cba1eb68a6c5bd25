"""Replicate's conformance profile (executor.providers.conformance; tests/executor/test_conformance.py runs it)."""

from datetime import datetime
from decimal import Decimal

from executor.providers.base import ErrorClass
from executor.providers.conformance import (
    DROP,
    CancelCase,
    LookupCase,
    PaidFailure,
    PriceCase,
    Profile,
    RateLimit,
    Refusal,
)
from executor.providers.replay import fixture
from executor.providers.replicate.adapter import ReplicateProvider

PREDICTION_ID = "qxm7r9k2anrj00cmd5kb3ce1tc"  # replicate/prediction_*
FLUX_SCHNELL = "black-forest-labs/flux-schnell"
# Replicate's listing (newest first) holds our prediction, created 2025-06-12T09:41:07.512Z, on page 2.
VERSION = "5599ed30703defd1d160a25a63321b4dec97101d98b4674bcc56e41f62f35637"
SUBMITTED_AT = datetime.fromisoformat("2025-06-12T09:41:07.300Z").timestamp()


def page_2_without_ours() -> dict:
    """The listing's page 2 without our prediction: its next one (09:38:40) is older than the submit."""
    page = fixture("replicate/predictions_page_2")
    page["body"]["results"] = [p for p in page["body"]["results"] if p["id"] != PREDICTION_ID]
    if not page["body"]["next"]:  # a page 3 exists: only reaching an older prediction may end the search
        raise ValueError("the recorded page 2 of Replicate's listing names no next page")
    return page


PROFILES = (
    Profile(
        id="replicate",
        fixtures="replicate/error_",
        adapter=ReplicateProvider,
        model=FLUX_SCHNELL,
        kind="media",
        backend="replay",
        route=("POST", f"/v1/models/{FLUX_SCHNELL}/predictions"),
        accepted="replicate/prediction_starting",
        accepted_id=PREDICTION_ID,
        refusals=(Refusal("422", "replicate/error_422_invalid_input", ErrorClass.INVALID_INPUT,
                          "aspect_ratio must be one of"),),
        rate_limit=RateLimit("replicate/error_429_throttled", 6.0),
        server_errors={500: "replicate/error_500_internal"},
        lost=DROP,
        paid_failures=(PaidFailure(
            "nsfw", "replicate/prediction_starting",
            then=(("GET", f"/v1/predictions/{PREDICTION_ID}", "replicate/prediction_failed_nsfw"),),
            error="NSFW content detected. Try running it again, or try a different prompt.",
            error_class=ErrorClass.REFUSED),),
        # The listing (predictions_page_1, _2) holds our prediction on page 2; without it, page 2 reaches a
        # prediction older than the submit: absence proven.
        lookup=LookupCase(
            ("GET", "/v1/predictions"),
            found=(("GET", "/v1/predictions", "replicate/predictions_page_1", "replicate/predictions_page_2"),),
            absent=(("GET", "/v1/predictions", "replicate/predictions_page_1", page_2_without_ours()),),
            found_id=PREDICTION_ID,
            submitted_at=SUBMITTED_AT,
        ),
        cancel=CancelCase(("POST", "/v1/predictions/{id}/cancel"), answers=("replicate/prediction_canceled",),
                          upstream_id=PREDICTION_ID),
        wire_model=(f"{FLUX_SCHNELL}:{VERSION}", ("POST", "/v1/predictions")),
        callback="replicate",
        # flux-schnell is priced per output image: $3 per thousand (replicate.com/black-forest-labs/
        # flux-schnell); prediction_succeeded made one (metrics.image_count 1): $0.003. Its predict_time
        # (0.712843 s) is not what it is billed by.
        prices=(PriceCase("one image", Decimal("0.003000"), submit="replicate/prediction_starting",
                          then=(("GET", f"/v1/predictions/{PREDICTION_ID}", "replicate/prediction_succeeded"),)),),
        params={"aspect_ratio": "16:9", "output_format": "png"},
    ),
)
