"""The rate card (docs/design.md, "The rate card"): what a model costs, and the most one call on it can cost.

Defaults live here, in code; the models file (MODELS_FILE: a model's `price`) overrides them, and rows of
`ModelPrice` (the admin's Models page) override both, model by model. Token prices are dollars per
million tokens for input, output, cache write and cache read; media is priced per render, per image or
per second, or per unit by the job's parameters (`variants`: an image's size and quality). A model the card does not know (a typo, a new model) gets the penalty tier for
its worst case, so a mistake makes a reservation bigger, never smaller, and its cost is recorded as
unpriced: payonce never claims to know a price it does not.

Usage is priced exactly once: `executor.providers` normalises it so that `input_tokens` never includes
cached tokens (Anthropic reports cache writes and reads apart; OpenAI's prompt_tokens includes
cached_tokens, which the adapter splits out) and `output_tokens` includes reasoning tokens (OpenAI counts
them in completion_tokens, at the output price).
"""

import logging
import re
import time
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django.conf import settings

from billing.models import ModelPrice, PriceUnit

logger = logging.getLogger(__name__)

MICRO = Decimal("0.000001")
# The most an amount of money can be: what numeric(12,6), every column of money, holds.
MAX_AMOUNT = Decimal("999999.999999")
# A price by parameters is a table an operator types: bounded, as every input is.
MAX_VARIANTS = 1000
MILLION = Decimal(1_000_000)
D = Decimal

# The penalty tier: an unknown or mistyped model's worst case.
PENALTY_INPUT_PER_MTOK = D("15")
PENALTY_OUTPUT_PER_MTOK = D("75")
PENALTY_MEDIA_PER_UNIT = D("1.00")  # above every media price the card knows
# A call's input tokens are at most its UTF-8 bytes plus a little per message (roles, separators).
TOKENS_PER_MESSAGE_OVERHEAD = 16
# How often a model unknown to the card reads the overrides again (executor.registry's catalog uses it too).
MISS_RELOAD_S = 1.0


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
    # A unit price by the job's parameters: {"by": (names), "prices": {(values): Decimal}, "defaults":
    # {name: value}}; `per_unit` is then the dearest of them (what a caller that knows no parameters pays).
    variants: dict | None = None

    @property
    def priced_by_tokens(self) -> bool:
        """A text model's rate; a media model with token prices (an image's output tokens) has a unit price
        too, which its reservation is made from."""
        return self.input is not None and self.output is not None and self.per_unit is None


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
    # Replicate, per output image (replicate.com model pages, read 2026-12-03); any other Replicate model is
    # unknown to the card (the penalty tier, unpriced) until priced in the models file or the admin.
    "replicate/black-forest-labs/flux-schnell": {"per_unit": D("0.003"), "unit": "image"},
    "replicate/black-forest-labs/flux-dev": {"per_unit": D("0.025"), "unit": "image"},
    "replicate/black-forest-labs/flux-1.1-pro": {"per_unit": D("0.04"), "unit": "image"},
    # OpenAI image generation, per image by quality and size (openai.com pricing, read 2026-12-03).
    # gpt-image-1 bills tokens: the image's output tokens at $40 per million (a fixed count per quality
    # and size: 272 / 1,056 / 4,160 for a low / medium / high square, 408 / 1,584 / 6,240 portrait, 400 /
    # 1,568 / 6,208 landscape; the per-image table, $0.011 to $0.25, is those rounded) and the prompt's
    # text at $5. The variants are the exact token prices, so the reservation is never below the bill,
    # and the derived cost is the usage's tokens where the answer reports them. `auto`: the dearest.
    "openai-images/gpt-image-1": {"per_unit": D("0.2496"), "unit": "image", "input": D("5"), "output": D("40"),
                                  "variants": {
        "by": ("quality", "size"), "defaults": {"quality": "auto", "size": "auto"},
        "prices": {("low", "1024x1024"): D("0.01088"), ("low", "1024x1536"): D("0.01632"),
                   ("low", "1536x1024"): D("0.016"), ("medium", "1024x1024"): D("0.04224"),
                   ("medium", "1024x1536"): D("0.06336"), ("medium", "1536x1024"): D("0.06272"),
                   ("high", "1024x1024"): D("0.1664"), ("high", "1024x1536"): D("0.2496"),
                   ("high", "1536x1024"): D("0.24832")}}},
    # gpt-image-1-mini: the published per-image table (its text tokens at $2 per million on top).
    "openai-images/gpt-image-1-mini": {"per_unit": D("0.052"), "unit": "image", "input": D("2"), "variants": {
        "by": ("quality", "size"), "defaults": {"quality": "auto", "size": "auto"},
        "prices": {("low", "1024x1024"): D("0.005"), ("low", "1024x1536"): D("0.006"), ("low", "1536x1024"): D("0.006"),
                   ("medium", "1024x1024"): D("0.011"), ("medium", "1024x1536"): D("0.015"),
                   ("medium", "1536x1024"): D("0.015"), ("high", "1024x1024"): D("0.036"),
                   ("high", "1024x1536"): D("0.052"), ("high", "1536x1024"): D("0.052")}}},
    "openai-images/dall-e-3": {"per_unit": D("0.12"), "unit": "image", "variants": {
        "by": ("quality", "size"), "defaults": {"quality": "auto", "size": "1024x1024"},
        "prices": {("standard", "1024x1024"): D("0.04"), ("standard", "1024x1792"): D("0.08"),
                   ("standard", "1792x1024"): D("0.08"), ("hd", "1024x1024"): D("0.08"),
                   ("hd", "1024x1792"): D("0.12"), ("hd", "1792x1024"): D("0.12")}}},

    # fal (fal.ai pricing pages, read 2026-12-03). FLUX.1 [dev] is $0.025 per megapixel, rounded up; whether
    # fal's megapixel is 10^6 pixels or 2^20 is not said, so square_hd (1024 x 1024) is priced as 2
    # megapixels: a reservation may be larger than the charge, never smaller. One image per job.
    "fal/fal-ai/flux/dev": {"per_unit": D("0.05"), "unit": "image", "variants": {
        "by": ("image_size",), "defaults": {"image_size": "landscape_4_3"},
        "prices": {("square_hd",): D("0.05"), ("square",): D("0.025"), ("portrait_4_3",): D("0.025"),
                   ("portrait_16_9",): D("0.025"), ("landscape_4_3",): D("0.025"),
                   ("landscape_16_9",): D("0.025")}}},
    # Kling 2.5 Turbo Pro, text to video: $0.35 for 5 s and $0.07 each second more ("10" s: $0.70).
    "fal/fal-ai/kling-video/v2.5-turbo/pro/text-to-video": {"per_unit": D("0.70"), "unit": "render", "variants": {
        "by": ("duration",), "defaults": {"duration": "5"}, "prices": {("5",): D("0.35"), ("10",): D("0.70")}}},
}

# A dated or aliased snapshot is priced as its model: claude-sonnet-4-5-20250929, gpt-4.1-mini-2025-04-14.
_SNAPSHOT = re.compile(r"^(?P<base>.+?)(-\d{8}|-\d{4}-\d{2}-\d{2}|-latest)$")

_overrides: dict = {"at": float("-inf"), "rows": {}}


def _no_file_prices() -> dict:
    return {}


# The models file's prices, as the models file in force states them. The file is one document (a model's
# spec and its price), read and checked whole by executor.registry, which hands this port down at start
# (executor.apps): a wrong file changed at run time leaves the last good one's prices in force with its
# specs, never half of it.
file_prices_from = _no_file_prices


def _override_rows() -> dict:
    """The overrides, the models file's prices under the admin's rows, read at most every MODELS_CACHE_S per
    process (the rate card is read on every reservation; an edit takes effect within seconds). One lifetime
    with the catalog's (executor.registry): a model and its price, one document in the models file and one
    form in the admin, change together, never a new model at an old price for a while."""
    now = time.monotonic()
    if now - _overrides["at"] > settings.MODELS_CACHE_S:
        _overrides["rows"] = {**file_prices_from(), **{row.model: _from_row(row) for row in ModelPrice.objects.all()}}
        _overrides["at"] = now
    return _overrides["rows"]


def forget_overrides() -> None:
    """Read the overrides again on next use (after an edit; tests)."""
    _overrides["at"] = float("-inf")


def _from_row(row) -> Rate:
    """An admin row's rate. A row its form would refuse (written before a rule existed, or by hand) makes
    the model unknown to the card, never cheaper: the penalty tier, unpriced, and a log line."""
    try:
        variants = parse_variants(row.variants)
    except ValueError as exc:
        logger.error("the rate card's override of %s is refused (%s): its model is priced at the penalty tier",
                     row.model, exc)
        return Rate(row.model, known=False)
    return Rate(row.model, input=row.input_per_mtok_usd, output=row.output_per_mtok_usd,
                cache_write=row.cache_write_per_mtok_usd, cache_read=row.cache_read_per_mtok_usd,
                per_unit=row.per_unit_usd, unit=row.unit, free=row.free, variants=variants)


_PRICE_FIELDS = {"input": "input", "output": "output", "cache_write": "cache_write", "cache_read": "cache_read",
                 "per_unit": "per_unit"}


def rate_from(model_name: str, price: dict) -> Rate:
    """A Rate from a price as the models file states it: `{"input", "output", "cache_write", "cache_read"}`
    dollars per million tokens, or `{"per_unit", "unit"}` with optional `variants`, or `{"free": true}`;
    amounts as decimal strings or numbers. ValueError names what is wrong."""
    if not isinstance(price, dict):
        raise ValueError("a price is an object")
    unknown = set(price) - {*_PRICE_FIELDS, "unit", "free", "variants"}
    if unknown:
        raise ValueError(f"unknown price fields: {', '.join(sorted(unknown))}")
    amounts = {name: _amount(price[key], key) for key, name in _PRICE_FIELDS.items() if price.get(key) is not None}
    unit = price.get("unit", "")
    if unit and unit not in PriceUnit.values:
        raise ValueError(f"unit must be one of {', '.join(PriceUnit.values)}")
    # `free` is a JSON boolean: the string "false" is true to Python, and made a $0.40 render free (its
    # reservation 0, so no cap held).
    free = price.get("free", False)
    if not isinstance(free, bool):
        raise ValueError(f"free: true or false (a JSON boolean), not {free!r}")
    variants = parse_variants(price.get("variants"))
    if variants and "per_unit" not in amounts:
        amounts["per_unit"] = max(variants["prices"].values())
    if ("input" in amounts) != ("output" in amounts) and "per_unit" not in amounts:
        raise ValueError("a token price states both input and output")
    return Rate(model_name, unit=unit, free=free, variants=variants, **amounts)


def parse_variants(variants) -> dict | None:
    """`{"by": [names], "prices": {"v1,v2": amount}, "defaults": {name: value}}` (the JSON form; keys are
    the values of `by`, in order, joined by commas) or the code's form (tuple keys), as the code's form."""
    if not variants:
        return None
    if not isinstance(variants, dict) or set(variants) - {"by", "prices", "defaults"}:
        raise ValueError("variants are {\"by\", \"prices\", \"defaults\"}")
    if not isinstance(variants.get("by"), (list, tuple)) or not variants["by"] or not all(
            isinstance(name, str) and name for name in variants["by"]):
        raise ValueError("variants need `by`, the parameters a price depends on")
    by = tuple(variants["by"])
    if not isinstance(variants.get("prices") or {}, dict) or not isinstance(variants.get("defaults") or {}, dict):
        raise ValueError("variants' prices and defaults are objects")
    if len(variants.get("prices") or {}) > MAX_VARIANTS:
        raise ValueError(f"variants: at most {MAX_VARIANTS} prices")
    prices = {}
    for key, amount in (variants.get("prices") or {}).items():
        values = tuple(key) if isinstance(key, tuple) else tuple(str(key).split(","))
        if len(values) != len(by):
            raise ValueError(f"the price key {key!r} does not name a value for each of {', '.join(by)}")
        prices[values] = _amount(amount, f"variants[{key!r}]")
    if not prices:
        raise ValueError("variants need prices")
    defaults = variants.get("defaults") or {}
    return {"by": by, "prices": prices, "defaults": {str(k): str(v) for k, v in defaults.items()}}


def variant_price(rate: Rate, params: dict | None) -> Decimal | None:
    """The unit price of a job with `params`: each parameter of `by` as given, else its default; one
    still unknown (not given, no default; OpenAI's `auto`; no params at all) is the dearest price it could
    be. None: the values are not in the table (nobody can price it)."""
    if not rate.variants:
        return rate.per_unit
    wanted = []
    for name in rate.variants["by"]:
        value = (params or {}).get(name, rate.variants["defaults"].get(name))
        wanted.append(None if params is None or value in (None, "auto") else str(value))
    found = [amount for values, amount in rate.variants["prices"].items()
             if all(want is None or want == have for want, have in zip(wanted, values))]
    return max(found) if found else None


def _amount(value, name: str) -> Decimal:
    """An amount as money holds it: what numeric(12,6) can (a price of 1e30 left every job naming its model
    running, its reservation an InvalidOperation), finite, not negative, no finer than a millionth."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float, Decimal)):
        raise ValueError(f"{name}: {value!r} is not an amount")
    try:
        amount = D(str(value).strip())
    except InvalidOperation:
        raise ValueError(f"{name}: {value!r} is not an amount") from None
    if not amount.is_finite() or amount < 0:
        raise ValueError(f"{name}: an amount is finite and not negative")
    if amount > MAX_AMOUNT:
        raise ValueError(f"{name}: {value!r} is more than an amount can be ({MAX_AMOUNT})")
    if amount != amount.quantize(MICRO, rounding=ROUND_HALF_UP):
        raise ValueError(f"{name}: {value!r} has more than 6 decimal places")
    return amount


def rate_for(model_name: str) -> Rate:
    """The rate of `provider/model`: an override (the admin's, else the models file's), else the default,
    else (a dated snapshot) its base model's; a model the card does not know is `known=False`."""
    names = [model_name]
    snapshot = _SNAPSHOT.match(model_name)
    if snapshot:
        names.append(snapshot.group("base"))
    for fresh in (False, True):
        rows = _override_rows()
        for name in names:
            if name in rows:
                return rows[name]
            if name in DEFAULTS:
                return Rate(name, **DEFAULTS[name])
        # A model the card does not know reads the overrides again, at most every MISS_RELOAD_S: one
        # priced in the admin a moment ago is priced at its first job, not the penalty tier.
        if fresh or time.monotonic() - _overrides["at"] < MISS_RELOAD_S:
            break
        forget_overrides()
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


def cost_of(model_name: str, usage: dict | None, *, units: float | None = None,
            params: dict | None = None) -> Decimal | None:
    """The derived cost of a call from what it used, or None when nobody can price it (unpriced, never
    zero): a model the card does not know, a token model that reported no usage, a media model with no
    unit price (or, priced by its parameters, none for these `params`). Usage > 0 costs 0 only on a model
    marked free. A media model with an `input` price adds the prompt's text tokens the usage reports."""
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
    if rate.output is not None and rate.input is not None and (usage or {}).get("output_tokens"):
        return token_cost(rate, usage)  # what the provider bills: the tokens its answer reports
    unit_price = variant_price(rate, params)
    if unit_price is not None:
        text = D((usage or {}).get("input_tokens", 0)) * rate.input / MILLION if rate.input is not None else 0
        if rate.unit == PriceUnit.SECOND:
            seconds = units if units is not None else (usage or {}).get("units")
            return _quantize(D(str(seconds)) * unit_price + text) if seconds is not None else None
        return _quantize(unit_price + text)  # one render, one image
    return None


def input_tokens_bound(system: str | None, messages: list[dict]) -> int:
    """At most how many input tokens a call can be billed for: every token covers at least one byte. A
    content of text blocks counts each block's text, and the overhead of a message per block."""
    texts, parts = [system or ""], 1
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and all(isinstance(block, dict) and "text" in block for block in content):
            texts += [str(block["text"]) for block in content]
            parts += max(1, len(content))
        else:
            texts.append(content if isinstance(content, str) else str(content))
            parts += 1
    return sum(len(t.encode("utf-8")) for t in texts) + TOKENS_PER_MESSAGE_OVERHEAD * parts


def worst_case(model_name: str, *, max_tokens: int = 0, input_tokens: int = 0, units: float = 1.0,
               params: dict | None = None) -> Decimal:
    """The most one call can cost, reserved before it is sent: for a token model every input token at
    the dearest input price (written to the cache, say) plus max_tokens at the output price; for media
    the unit price for `params` (unknown ones: the dearest; per second: times `units`), plus
    `input_tokens` at its `input` price where the prompt is billed too. Unknown: the penalty tier. Free: 0."""
    rate = rate_for(model_name)
    if rate.free:
        return D("0.000000")
    if not rate.known:
        if max_tokens:  # a text call (a render's prompt tokens do not make it one)
            return _quantize((D(input_tokens) * PENALTY_INPUT_PER_MTOK + D(max_tokens) * PENALTY_OUTPUT_PER_MTOK)
                             / MILLION)
        return _quantize(PENALTY_MEDIA_PER_UNIT * D(str(units)))
    if rate.priced_by_tokens:
        dearest_input = max(p for p in (rate.input, rate.cache_write, rate.cache_read) if p is not None)
        return _quantize((D(input_tokens) * dearest_input + D(max_tokens) * rate.output) / MILLION)
    unit_price = variant_price(rate, params)
    if unit_price is not None:
        text = D(input_tokens) * rate.input / MILLION if rate.input is not None else 0
        return _quantize(unit_price * (D(str(units)) if rate.unit == PriceUnit.SECOND else 1) + text)
    return _quantize(PENALTY_MEDIA_PER_UNIT * D(str(units)))
