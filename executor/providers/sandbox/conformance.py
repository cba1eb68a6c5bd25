"""The sandbox's conformance profiles, one per model (executor.providers.conformance;
tests/executor/test_conformance.py runs them against the sandbox's real process, its ledger checked). An
answer here is a sandbox fault (docs/sandbox.md "Faults")."""

from decimal import Decimal

from executor.providers.base import ErrorClass
from executor.providers.conformance import CancelCase, LookupCase, PaidFailure, PriceCase, Profile, RateLimit, Refusal
from executor.providers.sandbox.adapter import SandboxProvider


def _profile(model: str, **cases) -> Profile:
    text = model == "llm"
    return Profile(
        id=f"sandbox/{model}",
        adapter=SandboxProvider,
        model=model,
        kind="text" if text else "media",
        backend="sandbox",
        route=("POST", "/v1/messages" if text else "/v1/generations"),
        accepted=None,
        accepted_id=None,
        refusals=(
            Refusal("400", {"action": "status_400"}, ErrorClass.INVALID_INPUT, "the request is not valid"),
            Refusal("422", {"action": "status_422"}, ErrorClass.INVALID_INPUT, "duration_secs must be 8"),
            Refusal("400-refused", {"action": "refuse"}, ErrorClass.REFUSED, "refused by the content policy"),
        ),
        rate_limit=RateLimit({"action": "status_429", "seconds": 7}, 7.0),
        server_errors={500: {"action": "status_500"}, 503: {"action": "status_503"}},
        lost={"action": "accept_then_drop"},
        params={} if text else {"render_s": 1},
        max_tokens=8,
        **cases,
    )


def _render_cases(model: str, price: str) -> dict:
    return dict(
        paid_failures=(PaidFailure("fail_render", {"action": "fail_render", "message": "the render farm caught fire"},
                                   params={"render_s": 0}, error="the render farm caught fire"),),
        callback="sandbox",
        # The sandbox's catalog: a render or an image is one unit at its price, which its ledger charges.
        prices=(PriceCase(model, Decimal(price)),),
    )


PROFILES = (
    _profile(
        "video-keyed",
        cancel=CancelCase(("POST", "/v1/generations/{id}/cancel"), params={"render_s": 30}),
        # $0.40 per render (sandbox/catalog.py).
        **_render_cases("video-keyed", "0.400000"),
    ),
    _profile(
        "image-lookup",
        lookup=LookupCase(("GET", "/v1/generations")),
        # $0.04 per image.
        **_render_cases("image-lookup", "0.040000"),
    ),
    _profile("image-blind", **_render_cases("image-blind", "0.040000")),
    _profile(
        "llm",
        no_paid_failure="the sandbox's LLM never refuses inside a 200 (its one paid failure, the `empty` fault, "
                        "is an answer the adapter returns and the chapter step fails)",
        # input: ceil((len("You write market reports.") 25 + len("Write chapter 1") 15) / 4) = 10 tokens;
        # output: cut at max_tokens 8 -> 8 tokens. $3 and $15 per million (sandbox/catalog.py):
        # 10 * 3 + 8 * 15 = 150 -> $0.000150.
        prices=(PriceCase("llm", Decimal("0.000150")),),
    ),
)
