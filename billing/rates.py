"""The rate card (docs/design.md, "The rate card"): what a model costs, and the most one call on it can cost.

Defaults live here, in code; rows of `ModelPrice` (the admin) override them model by model. Token prices
are dollars per million tokens for input, output, cache write and cache read; media is priced per render,
per image or per second. A model the card does not know (a typo, a new model) gets the penalty tier for
its worst case, so a mistake makes a reservation bigger, never smaller, and its cost is recorded as
unpriced: payonce never claims to know a price it does not.

Usage is priced exactly once: `executor.providers` normalises it so that `input_tokens` never includes
cached tokens (Anthropic reports cache writes and reads apart; OpenAI's prompt_tokens includes
cached_tokens, which the adapter splits out) and `output_tokens` includes reasoning tokens (OpenAI counts
them in completion_tokens, at the output price).
"""

import re
import time
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from billing.models import ModelPrice, PriceUnit

MICRO = Decimal("0.000001")
MILLION = Decimal(1_000_000)
D = Decimal

# The penalty tier: an unknown or mistyped model's worst case.
PENALTY_INPUT_PER_MTOK = D("15")
PENALTY_OUTPUT_PER_MTOK = D("75")
PENALTY_MEDIA_PER_UNIT = D("1.00")  # above every media price the card knows
# A call's input tokens are at most its UTF-8 bytes plus a little per message (roles, separators).
TOKENS_PER_MESSAGE_OVERHEAD = 16
OVERRIDES_CACHE_S = 10.0


@dataclass(frozen=True)
class Rate:
    model: str
    input: Decimal | None = None
    output: Decimal | None = None
    cache_write: Decimal | None = None
    cache_read: Decimal | None = None
    per_unit: Decimal | None = None
    unit: str = ""  # render | image | second
    free: bool = False
    known: bool = True  # False: the card does not know the model (the penalty tier, unpriced)

    @property
    def priced_by_tokens(self) -> bool:
        return self.input is not None and self.output is not None


def _tokens(input_, output, cache_write=None, cache_read=None) -> dict:
    input_, output = D(input_), D(output)
    return {"input": input_, "output": output,
            "cache_write": D(cache_write) if cache_write is not None else input_ * D("1.25"),
            "cache_read": D(cache_read) if cache_read is not None else input_ * D("0.1")}


# Defaults, checked against the providers' published prices (2026-11). The sandbox's must match the
# sandbox's own catalog to the cent: tests compare them with its ledger.
DEFAULTS: dict[str, dict] = {
    # the sandbox (sandbox/catalog.py)
    "sandbox/video-keyed": {"per_unit": D("0.40"), "unit": "render"},
    "sandbox/image-lookup": {"per_unit": D("0.04"), "unit": "image"},
    "sandbox/image-blind": {"per_unit": D("0.04"), "unit": "image"},
    "sandbox/llm": {"input": D("3"), "output": D("15"), "cache_write": D("3.75"), "cache_read": D("0.30")},
    # Anthropic (cache write: 5-minute TTL, 1.25 x input; cache read: 0.1 x input)
    "anthropic/claude-opus-5": _tokens("5", "25", "6.25", "0.50"),
    "anthropic/claude-opus-4-8": _tokens("5", "25", "6.25", "0.50"),
    "anthropic/claude-opus-4-7": _tokens("5", "25", "6.25", "0.50"),
    "anthropic/claude-opus-4-6": _tokens("5", "25", "6.25", "0.50"),
    "anthropic/claude-opus-4-5": _tokens("5", "25", "6.25", "0.50"),
    "anthropic/claude-opus-4-1": _tokens("15", "75", "18.75", "1.50"),
    "anthropic/claude-opus-4": _tokens("15", "75", "18.75", "1.50"),
    "anthropic/claude-sonnet-5": _tokens("2", "10", "2.50", "0.20"),
    "anthropic/claude-sonnet-4-6": _tokens("3", "15", "3.75", "0.30"),
    "anthropic/claude-sonnet-4-5": _tokens("3", "15", "3.75", "0.30"),
    "anthropic/claude-sonnet-4": _tokens("3", "15", "3.75", "0.30"),
    "anthropic/claude-haiku-4-5": _tokens("1", "5", "1.25", "0.10"),
    "anthropic/claude-3-5-haiku": _tokens("0.80", "4", "1", "0.08"),
    # OpenAI (cache_read: cached input tokens; nothing is charged for writing the cache)
    "openai/gpt-5.4": _tokens("2.50", "15", "0", "0.25"),
    "openai/gpt-5.4-mini": _tokens("0.75", "4.50", "0", "0.075"),
    "openai/gpt-5.2": _tokens("1.75", "14", "0", "0.175"),
    "openai/gpt-5.1": _tokens("1.25", "10", "0", "0.125"),
    "openai/gpt-5": _tokens("1.25", "10", "0", "0.125"),
    "openai/gpt-5-mini": _tokens("0.25", "2", "0", "0.025"),
    "openai/gpt-5-nano": _tokens("0.05", "0.40", "0", "0.005"),
    "openai/gpt-4.1": _tokens("2", "8", "0", "0.50"),
    "openai/gpt-4.1-mini": _tokens("0.40", "1.60", "0", "0.10"),
    "openai/gpt-4.1-nano": _tokens("0.10", "0.40", "0", "0.025"),
    "openai/gpt-4o": _tokens("2.50", "10", "0", "1.25"),
    "openai/gpt-4o-mini": _tokens("0.15", "0.60", "0", "0.075"),
    "openai/o3": _tokens("2", "8", "0", "0.50"),
    "openai/o4-mini": _tokens("1.10", "4.40", "0", "0.275"),
}

# A dated or aliased snapshot is priced as its model: claude-sonnet-4-5-20250929, gpt-4.1-mini-2025-04-14.
_SNAPSHOT = re.compile(r"^(?P<base>.+?)(-\d{8}|-\d{4}-\d{2}-\d{2}|-latest)$")

_overrides: dict = {"at": float("-inf"), "rows": {}}


def _override_rows() -> dict:
    """The admin's overrides, read at most every OVERRIDES_CACHE_S per process (the rate card is read on
    every reservation; an edit takes effect within seconds)."""
    now = time.monotonic()
    if now - _overrides["at"] > OVERRIDES_CACHE_S:
        _overrides["rows"] = {row.model: row for row in ModelPrice.objects.all()}
        _overrides["at"] = now
    return _overrides["rows"]


def forget_overrides() -> None:
    """Read the overrides again on next use (after an edit; tests)."""
    _overrides["at"] = float("-inf")


def _from_row(row) -> Rate:
    return Rate(row.model, input=row.input_per_mtok_usd, output=row.output_per_mtok_usd,
                cache_write=row.cache_write_per_mtok_usd, cache_read=row.cache_read_per_mtok_usd,
                per_unit=row.per_unit_usd, unit=row.unit, free=row.free)


def rate_for(model_name: str) -> Rate:
    """The rate of `provider/model`: an override, else the default, else (a dated snapshot) its base
    model's; a model the card does not know is `known=False`."""
    rows = _override_rows()
    names = [model_name]
    snapshot = _SNAPSHOT.match(model_name)
    if snapshot:
        names.append(snapshot.group("base"))
    for name in names:
        if name in rows:
            return _from_row(rows[name])
        if name in DEFAULTS:
            return Rate(name, **DEFAULTS[name])
    return Rate(model_name, known=False)


def _quantize(amount: Decimal) -> Decimal:
    return amount.quantize(MICRO, rounding=ROUND_HALF_UP)


def token_cost(rate: Rate, usage: dict) -> Decimal:
    """Each kind of token at its price, once (usage as executor.providers.base.Usage.as_dict gives it)."""
    cache_write = rate.cache_write if rate.cache_write is not None else rate.input
    cache_read = rate.cache_read if rate.cache_read is not None else rate.input
    amount = (
        D(usage.get("input_tokens", 0)) * rate.input
        + D(usage.get("output_tokens", 0)) * rate.output
        + D(usage.get("cache_write_tokens", 0)) * cache_write
        + D(usage.get("cache_read_tokens", 0)) * cache_read
    ) / MILLION
    return _quantize(amount)


def cost_of(model_name: str, usage: dict | None, *, units: float | None = None) -> Decimal | None:
    """The derived cost of a call from what it used, or None when nobody can price it (unpriced, never
    zero): a model the card does not know, a token model that reported no usage, a media model with no
    unit price. Usage > 0 costs 0 only on a model marked free."""
    rate = rate_for(model_name)
    if rate.free:
        return D("0.000000")
    if not rate.known:
        return None
    if rate.priced_by_tokens:
        if not usage or not any(usage.get(k) for k in ("input_tokens", "output_tokens", "cache_write_tokens",
                                                        "cache_read_tokens")):
            return None
        return token_cost(rate, usage)
    if rate.per_unit is not None:
        if rate.unit == PriceUnit.SECOND:
            seconds = units if units is not None else (usage or {}).get("units")
            return _quantize(D(str(seconds)) * rate.per_unit) if seconds is not None else None
        return _quantize(rate.per_unit)  # one render, one image
    return None


def input_tokens_bound(system: str | None, messages: list[dict]) -> int:
    """At most how many input tokens a call can be billed for: every token covers at least one byte."""
    texts = [system or ""] + [m.get("content") if isinstance(m.get("content"), str) else str(m.get("content"))
                              for m in messages]
    return sum(len(t.encode("utf-8")) for t in texts) + TOKENS_PER_MESSAGE_OVERHEAD * (len(messages) + 1)


def worst_case(model_name: str, *, max_tokens: int = 0, input_tokens: int = 0, units: float = 1.0) -> Decimal:
    """The most one call can cost, reserved before it is sent: for a token model every input token at
    the dearest input price (written to the cache, say) plus max_tokens at the output price; for media
    the unit price (per second: times `units`). Unknown: the penalty tier. Free: 0."""
    rate = rate_for(model_name)
    if rate.free:
        return D("0.000000")
    if not rate.known:
        if max_tokens or input_tokens:
            return _quantize((D(input_tokens) * PENALTY_INPUT_PER_MTOK + D(max_tokens) * PENALTY_OUTPUT_PER_MTOK)
                             / MILLION)
        return _quantize(PENALTY_MEDIA_PER_UNIT * D(str(units)))
    if rate.priced_by_tokens:
        dearest_input = max(p for p in (rate.input, rate.cache_write, rate.cache_read) if p is not None)
        return _quantize((D(input_tokens) * dearest_input + D(max_tokens) * rate.output) / MILLION)
    if rate.per_unit is not None:
        return _quantize(rate.per_unit * (D(str(units)) if rate.unit == PriceUnit.SECOND else 1))
    return _quantize(PENALTY_MEDIA_PER_UNIT * D(str(units)))
