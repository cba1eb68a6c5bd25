"""The OpenAI-compatible chat adapter's conformance profile (executor.providers.conformance; tests/executor/
test_conformance.py runs it)."""

from decimal import Decimal

from executor.providers.base import ErrorClass, Usage
from executor.providers.conformance import DROP, PaidFailure, PriceCase, Profile, RateLimit, Refusal
from executor.providers.openai_compat import OpenAICompatibleProvider

COMPLETION_ID = "chatcmpl-BqR2xKcV8nZ3pLw0aJ5mYtE7uH1sD"  # openai/chat_completion


PROFILES = (
    Profile(
        id="openai",
        fixtures="openai/error_",
        adapter=OpenAICompatibleProvider,
        model="gpt-4.1-mini",
        kind="text",
        backend="replay",
        route=("POST", "/v1/chat/completions"),
        accepted="openai/chat_completion",
        accepted_id=COMPLETION_ID,
        refusals=(
            Refusal("400", "openai/error_400_invalid_request", ErrorClass.INVALID_INPUT, "max_tokens is too large"),
            Refusal("400-content-policy", "openai/error_400_content_policy", ErrorClass.REFUSED,
                    "rejected as a result of our safety system"),
        ),
        rate_limit=RateLimit("openai/error_429_rate_limit", 2.0),
        server_errors={500: "openai/error_500_server"},
        lost=DROP,
        paid_failures=(PaidFailure("200-content-filter", "openai/chat_completion_content_filter",
                                   error="finish_reason: content_filter", usage=Usage(input_tokens=57)),),
        # openai/chat_completion answers gpt-4.1-mini-2025-04-14 (priced as gpt-4.1-mini: $0.40 input, $1.60
        # output, $0.10 cached input per million; openai.com/api/pricing, 2026-11). prompt_tokens 2,306
        # include 1,920 cached: 386 * 0.40 + 301 * 1.60 + 1,920 * 0.10 = 154.4 + 481.6 + 192 = 828 -> $0.000828.
        prices=(PriceCase("chat completion", Decimal("0.000828"), submit="openai/chat_completion"),),
    ),
)
