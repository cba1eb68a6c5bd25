"""The sandbox's model catalog and everything derived from a request alone: prices, media bytes, LLM text.

Nothing here keeps state or reads the clock, so a repeated request always yields the same bytes, text
and price; that is what lets tests compare a render or a charge across retries and restarts.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

MICRO = Decimal("0.000001")
MILLION = Decimal(1_000_000)

DEFAULT_RENDER_S = 1.0
DEFAULT_SIZE_BYTES = 4096
MAX_SIZE_BYTES = 50 * 1024 * 1024

# About 200 tokens of reply (4 characters per token) before max_tokens truncates it.
LLM_REPLY_CHARS = 800


@dataclass(frozen=True)
class Model:
    id: str
    kind: str  # "video" | "image" | "text"
    content_type: str | None
    is_async: bool
    idempotency_key: bool  # honours request_id: a repeat returns the first generation, uncharged
    lookup: bool  # findable by GET /v1/generations?metadata.K=V
    cancel: bool
    price_usd: Decimal | None = None  # per render
    input_per_mtok_usd: Decimal | None = None
    output_per_mtok_usd: Decimal | None = None
    # Prompt caching, Anthropic's shape: a prefix written to the cache, and one read from it.
    cache_write_per_mtok_usd: Decimal | None = None
    cache_read_per_mtok_usd: Decimal | None = None

    def as_json(self) -> dict:
        return {
            "id": self.id,
            "kind": self.kind,
            "content_type": self.content_type,
            "async": self.is_async,
            "idempotency_key": self.idempotency_key,
            "lookup": self.lookup,
            "cancel": self.cancel,
            "price_usd": money(self.price_usd) if self.price_usd is not None else None,
            "input_per_mtok_usd": (
                money(self.input_per_mtok_usd) if self.input_per_mtok_usd is not None else None
            ),
            "output_per_mtok_usd": (
                money(self.output_per_mtok_usd) if self.output_per_mtok_usd is not None else None
            ),
            "cache_write_per_mtok_usd": (
                money(self.cache_write_per_mtok_usd) if self.cache_write_per_mtok_usd is not None else None
            ),
            "cache_read_per_mtok_usd": (
                money(self.cache_read_per_mtok_usd) if self.cache_read_per_mtok_usd is not None else None
            ),
        }


MODELS: dict[str, Model] = {
    m.id: m
    for m in (
        Model("video-keyed", "video", "video/mp4", True, True, False, True, price_usd=Decimal("0.40")),
        Model("image-lookup", "image", "image/png", True, False, True, False, price_usd=Decimal("0.04")),
        Model("image-blind", "image", "image/png", True, False, False, False, price_usd=Decimal("0.04")),
        Model(
            "llm",
            "text",
            None,
            False,
            False,
            False,
            False,
            input_per_mtok_usd=Decimal("3"),
            output_per_mtok_usd=Decimal("15"),
            cache_write_per_mtok_usd=Decimal("3.75"),  # 1.25 x input
            cache_read_per_mtok_usd=Decimal("0.30"),  # 0.1 x input
        ),
    )
}


def money(value: Decimal) -> str:
    """Render money as a decimal string with exactly 6 places ("0.400000")."""
    return str(Decimal(value).quantize(MICRO, rounding=ROUND_HALF_UP))


def canonical_json(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# -- media -------------------------------------------------------------------------------------------


def media_bytes(model: Model, prompt: str, params: dict) -> bytes:
    """Deterministic stand-in media for (model, prompt, params).

    A header line naming the model, then a SHA-256 counter stream seeded by the request, cut to
    params.size_bytes (default 4096) in total.
    """
    size = int(params.get("size_bytes", DEFAULT_SIZE_BYTES))
    seed = hashlib.sha256(
        canonical_json({"model": model.id, "prompt": prompt, "params": params}).encode()
    ).digest()
    header = f"SANDBOX-MEDIA {model.id} {model.content_type} {seed.hex()[:16]}\n".encode()
    if size <= len(header):
        return header[:size]
    need = size - len(header)
    blocks = [
        hashlib.sha256(seed + counter.to_bytes(8, "big")).digest()
        for counter in range(-(-need // 32))
    ]
    return header + b"".join(blocks)[:need]


# -- llm ---------------------------------------------------------------------------------------------

_WORDS = (
    "the lighthouse keeper records each retry once and pays for a single answer while the ledger "
    "shows every charge as it arrived so a careful reader can trace spend back to its attempt "
    "and see that nothing was bought twice under the same key"
).split()


def message_text(content) -> str:
    """The text of one message's content: a string, or a list of {"type": "text", "text"} blocks."""
    if isinstance(content, str):
        return content
    return "".join(block["text"] for block in content)


def llm_reply(system: str | None, messages: list[dict], max_tokens: int) -> dict:
    """Deterministic reply for an LLM call: text, stop_reason and token usage.

    input tokens = ceil(characters of system + all message contents / 4);
    output tokens = ceil(len(text) / 4), the text being cut to max_tokens * 4 characters.
    """
    texts = [message_text(m["content"]) for m in messages]
    input_chars = len(system or "") + sum(len(t) for t in texts)
    last_user = next(
        (message_text(m["content"]) for m in reversed(messages) if m["role"] == "user"), ""
    )
    head = f"Sandbox answer to: {last_user[:80]}"

    seed = hashlib.sha256(canonical_json({"system": system, "messages": texts}).encode()).digest()
    words: list[str] = []
    length = len(head)
    counter = 0
    while length < LLM_REPLY_CHARS:
        block = hashlib.sha256(seed + counter.to_bytes(8, "big")).digest()
        counter += 1
        for byte in block:
            word = _WORDS[byte % len(_WORDS)]
            words.append(word)
            length += len(word) + 1
            if length >= LLM_REPLY_CHARS:
                break
    text = (head + "\n\n" + " ".join(words))[: LLM_REPLY_CHARS - 1].rstrip() + "."

    stop_reason = "end_turn"
    if math.ceil(len(text) / 4) > max_tokens:
        text = text[: max_tokens * 4]
        stop_reason = "max_tokens"
    input_tokens = math.ceil(input_chars / 4)
    output_tokens = min(math.ceil(len(text) / 4), max_tokens)
    return {
        "text": text,
        "stop_reason": stop_reason,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
    }


def llm_cost(model: Model, input_tokens: int, output_tokens: int, cache_write_tokens: int = 0,
             cache_read_tokens: int = 0) -> Decimal:
    """Each kind of token at its price per million, summed, quantized once to 6 places (ROUND_HALF_UP)."""
    amount = (
        Decimal(input_tokens) * model.input_per_mtok_usd
        + Decimal(output_tokens) * model.output_per_mtok_usd
        + Decimal(cache_write_tokens) * (model.cache_write_per_mtok_usd or model.input_per_mtok_usd)
        + Decimal(cache_read_tokens) * (model.cache_read_per_mtok_usd or model.input_per_mtok_usd)
    ) / MILLION
    return amount.quantize(MICRO, rounding=ROUND_HALF_UP)


# -- prompt caching ------------------------------------------------------------------------------------

# A prefix shorter than this is never cached (Anthropic's minimum for most models).
CACHE_MIN_TOKENS = 1024


def cache_prefix(system: str | None, messages: list[dict]) -> tuple[int, str] | None:
    """The prompt up to its last `cache_control` breakpoint: (its characters, a canonical form of it to
    hash), or None when no block is marked. As Anthropic reads it: the system prompt, then every message
    in order, each content block in order, up to and including the marked block."""
    parts: list = [system or ""]
    marked = None
    for message in messages:
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for block in blocks:
            parts.append([message["role"], block["text"]])
            if block.get("cache_control") is not None:
                marked = len(parts)
    if marked is None:
        return None
    prefix = parts[:marked]
    chars = len(prefix[0]) + sum(len(text) for _, text in prefix[1:])
    return chars, canonical_json(prefix)


def prefix_tokens(chars: int) -> int:
    """A prefix's tokens, counted as the whole prompt's are (a token is four characters, rounded up)."""
    return math.ceil(chars / 4)
