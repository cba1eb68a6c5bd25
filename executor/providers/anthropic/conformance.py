"""Anthropic's conformance profile (executor.providers.conformance; tests/executor/test_conformance.py runs it)."""

from decimal import Decimal

from executor.providers.anthropic.adapter import AnthropicProvider
from executor.providers.base import ErrorClass, Usage
from executor.providers.conformance import DROP, PaidFailure, PriceCase, Profile, RateLimit, Refusal

MESSAGE_ID = "msg_01Hk9zQyR3bVnE8sPjGx4fT2"  # anthropic/message


PROFILES = (
    Profile(
        id="anthropic",
        fixtures="anthropic/error_",
        adapter=AnthropicProvider,
        model="claude-sonnet-4-5",
        kind="text",
        backend="replay",
        route=("POST", "/v1/messages"),
        accepted="anthropic/message",
        accepted_id=MESSAGE_ID,
        refusals=(Refusal("400", "anthropic/error_400_invalid_request", ErrorClass.INVALID_INPUT,
                          "max_tokens: 200000 > 64000"),),
        rate_limit=RateLimit("anthropic/error_429_rate_limit", 17.0),
        server_errors={500: "anthropic/error_500_api", 529: "anthropic/error_529_overloaded"},
        lost=DROP,
        paid_failures=(PaidFailure("200-refusal", "anthropic/message_refusal",
                                   error="the model refused to answer (stop_reason: refusal)",
                                   usage=Usage(input_tokens=38, output_tokens=5)),),
        # anthropic/message answers claude-sonnet-4-5-20250929 (priced as claude-sonnet-4-5: $3 input, $15
        # output, $3.75 cache write, $0.30 cache read per million; anthropic.com/pricing, 2026-11):
        # 21 * 3 + 412 * 15 + 1,870 * 3.75 + 3,054 * 0.30 = 63 + 6,180 + 7,012.5 + 916.2 = 14,171.7
        # -> $0.0141717, kept to the micro-dollar (half up) as the card keeps it: $0.014172.
        prices=(PriceCase("message", Decimal("0.014172"), submit="anthropic/message"),),
    ),
)
