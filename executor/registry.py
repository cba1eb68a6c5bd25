"""The models payonce knows: `provider/model` names, what they make, their capabilities and parameters.

Three layers, each over the one before, model by model and field by field (docs/providers.md):

1. the code's: the sandbox's models, fal's and OpenAI's image models by name, and by pattern Anthropic's
   `claude-*` models, any model of an OpenAI-compatible server and Replicate's `owner/name[:version]`;
2. the models file (MODELS_FILE, JSON: `{"models": [{"name", "provider", "kind", "content_type",
   "capabilities", "params", "price", "enabled"}]}`), read again when it changes;
3. the admin's Models page (executor.models.ModelConfig), read again within MODELS_CACHE_S.

A model's price is the rate card's (billing.rates), with the same two layers over its defaults. A job's
`models` are validated against the catalog, so a typo is a 422 at submit, not a failed job; a model
whose provider has no key (REAL_PROVIDERS on) is refused at submit too (`provider_usable`).

A media model also declares the parameters it takes (`ModelSpec.params`), so that a job's `input` is
checked against them at submit (`input_problems`): without it, a typo such as `rendr_s` was sent to the
provider, which ignored it and rendered (and charged) a default render.
"""

import dataclasses
import json
import logging
import math
import mimetypes
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from django.conf import settings

from billing import rates
from config.logs import log_event
from config.metrics import count
from executor.models import ModelConfig, ModelKind
from executor.providers import ADAPTERS, PROVIDERS, real, spec_of
# A model's spec and its parameters are the port's: a provider's folder declares its models with them.
from executor.providers.base import (
    CAPABILITY_FIELDS,
    CHEAP_LLM,
    Capabilities,
    ModelSpec,
    Param,
)

logger = logging.getLogger(__name__)

# A media job's input keys that are payonce's own, never a provider parameter: every other key is sent to
# each model of the chain as a parameter (executor.render, through provider_params).
PAYONCE_INPUT_KEYS = ("prompt", "references")


# Every content type a job's output can have (GET /v1/jobs/{id}/output).
OUTPUT_CONTENT_TYPES = ("video/mp4", "image/png", "image/jpeg", "image/webp", "application/octet-stream")
# Whole names (\A...\Z: `$` would also match before a final newline).
_NAME = re.compile(r"\A[a-z0-9-]{1,40}/[A-Za-z0-9][A-Za-z0-9._:/-]{0,150}\Z")


def _code_models() -> dict[str, ModelSpec]:
    """The models the code names (patterns aside): each provider's spec declares its own (built at call
    time: the sandbox's key lifetime is a setting)."""
    models = {}
    for provider in PROVIDERS:
        models.update(provider.models())
    return models


def code_model_names() -> list[str]:
    """Every model the code names: its own catalog and the rate card's priced models (a pattern such as
    anthropic/claude-* takes any name; these are the ones the code knows a price of). The admin's Models
    page lists them with the models file's and the admin's own."""
    return sorted(set(_code_models()) | {name for name in rates.DEFAULTS if code_spec(name) is not None})


def code_spec(name: str) -> ModelSpec | None:
    """The model as the code alone says it (no file, no admin: no database; safe at import time)."""
    return _code_models().get(name) or _pattern_spec(name)


def _pattern_spec(name: str) -> ModelSpec | None:
    """A name of the shape a provider serves any model of (its spec's `pattern`: `anthropic/claude-*`)."""
    provider, _, _model = name.partition("/")
    spec = spec_of(provider)
    return spec.pattern(name) if spec is not None and spec.pattern is not None else None


# --- the file's and the admin's layers: one validator ------------------------------------------------------
#
# What an operator writes is input. A model entry (the models file's, an admin row's with its price) is
# checked by one validator, `check_entry`, wherever it comes from, and refused where it is written: the
# admin's form names the field, a models file with a wrong entry refuses to start, and one changed at run
# time replaces the one in memory only once all of it is valid (`models_file`). The code's own catalog
# passes the same validator (tests/executor/test_catalog.py).

_PARAM_FIELDS = {"name", "type", "minimum", "maximum", "nullable", "choices"}
# What an entry may state: a field outside these (a typo such as `enable`) is refused, never ignored.
ENTRY_FIELDS = ("name", "enabled", "provider", "kind", "content_type", "capabilities", "params", "price", "note")
# A window is a wait, and every wait ends: a provider's stated window on one attempt is at most a week.
# A key's lifetime is at most a year (null: for ever, as the sandbox's).
MAX_WINDOW_S = 7 * 24 * 3600
MAX_KEY_TTL_S = 366 * 24 * 3600
# An output's file extension by content type, where mimetypes' first guess is not the usual one.
_EXTENSIONS = {"image/jpeg": "jpg", "text/markdown": "md", "application/octet-stream": "bin"}


def check_entry(name: str, entry: Mapping, below: ModelSpec | None) -> ModelSpec | None:
    """The one validator of an operator's model: `entry` (a models file entry, or an admin row with its
    price as a models file states one) over `below` (what the layers under it say, or None). Returns the
    spec it makes, None when it disables the model. ValueError names the field and what is wrong."""
    spec = spec_from(name, entry, below)
    price = entry.get("price")
    if price is not None:
        try:
            rate = rates.rate_from(name, price)
        except ValueError as exc:
            raise ValueError(f"price: {exc}") from None
        kind = spec.kind if spec is not None else (below.kind if below is not None else "")
        _price_suits(kind, rate)
    return spec


def _price_suits(kind: str, rate: rates.Rate) -> None:
    """A text model's call is reserved from token prices, a render's from a unit price: a price of the
    other form would reserve nothing that bounds the call (a text model priced per unit reserved one
    unit for a call of 8,000 output tokens)."""
    if rate.free or not kind:
        return
    if kind == ModelKind.TEXT and not rate.priced_by_tokens:
        raise ValueError("price: a text model is priced by tokens (input and output per million), or free")
    if kind != ModelKind.TEXT and rate.per_unit is None:
        raise ValueError("price: a media model is priced per unit (per_unit and unit, or variants), or free")


def spec_from(name: str, entry: Mapping, below: ModelSpec | None) -> ModelSpec | None:
    """The model `name` as `entry` states it over `below` (its price aside: check_entry); None when the
    entry disables it. ValueError names the first thing wrong."""
    if not _NAME.match(name):
        raise ValueError(f"{name!r} is not provider/model")
    if not isinstance(entry, Mapping):
        raise ValueError("a model is an object")
    unknown = set(entry) - set(ENTRY_FIELDS)
    if unknown:
        raise ValueError(f"unknown fields: {', '.join(sorted(unknown))} (known: {', '.join(ENTRY_FIELDS)})")
    _refuse_non_finite(entry)
    enabled = entry.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ValueError(f"enabled: true or false (a JSON boolean), not {enabled!r}")
    if not enabled:
        return None
    provider = entry.get("provider") or (below.provider if below else "")
    if provider != name.partition("/")[0]:
        raise ValueError(f"the model's name starts with its provider ({provider or 'none given'}/...)")
    if provider not in ADAPTERS:
        raise ValueError(f"no adapter for provider {provider!r} (there are: {', '.join(sorted(ADAPTERS))})")
    kind = entry.get("kind") or (below.kind if below else "")
    if kind not in ModelKind.values:
        raise ValueError(f"kind must be one of {', '.join(ModelKind.values)}")
    _kind_suits(provider, kind, below)
    content_type = entry.get("content_type") or (below.content_type if below and below.kind == kind else "")
    content_type = content_type or ("text/markdown" if kind == ModelKind.TEXT else "application/octet-stream")
    if not isinstance(content_type, str) or (kind != ModelKind.TEXT and content_type not in OUTPUT_CONTENT_TYPES):
        raise ValueError(f"content_type must be one of {', '.join(OUTPUT_CONTENT_TYPES)}")
    base = below.capabilities if below else getattr(ADAPTERS[provider], "capabilities", CHEAP_LLM)
    capabilities = _capabilities(base, entry.get("capabilities") or {})
    params = _params(entry["params"], name) if entry.get("params") is not None else (below.params if below else None)
    extension = _EXTENSIONS.get(content_type) or (mimetypes.guess_extension(content_type) or ".bin").lstrip(".")
    return ModelSpec(provider, name.partition("/")[2], kind, content_type, extension, capabilities, params)


def _call(kind: str) -> str:
    """The adapter call that makes a model kind's output."""
    return "complete" if kind == ModelKind.TEXT else "submit"


def _kind_suits(provider: str, kind: str, below: ModelSpec | None) -> None:
    """A model keeps the call the layers below give it (a video model declared `text` would be sent a
    report's chapters, and a job naming it would be priced as neither), and its adapter must make that
    kind: a text model is a `complete` call, a video or image model a `submit`. (Which job kind a model
    kind serves is jobs' word, jobs.engine.workflow.Kind.model_kinds: the executor sits below jobs.)"""
    call = _call(kind)
    if below is not None and call != _call(below.kind):
        raise ValueError(f"kind: {below.name} makes {below.kind}, not {kind} (a `{_call(below.kind)}` model stays one)")
    if not callable(getattr(ADAPTERS[provider], call, None)):
        raise ValueError(f"kind: provider {provider} makes no {kind} (its adapter has no {call})")


def _refuse_non_finite(value, path: str = "") -> None:
    """NaN and Infinity are not JSON, yet Python's json reads them: PostgreSQL then refuses the row (a 500
    in the admin), and a NaN bound compares false with everything (it refuses nothing)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{path or 'a value'}: {value!r} is not a number JSON can hold")
    children = value.items() if isinstance(value, Mapping) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        _refuse_non_finite(child, f"{path}.{key}" if path else str(key))


def _number(value) -> bool:
    """A JSON number: an int or a finite float, never a bool (True is an int to Python)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _capabilities(base: Capabilities, stated: Mapping) -> Capabilities:
    if not isinstance(stated, Mapping):
        raise ValueError("capabilities is an object")
    unknown = set(stated) - set(CAPABILITY_FIELDS)
    if unknown:
        raise ValueError(f"unknown capabilities: {', '.join(sorted(unknown))} (known: {', '.join(CAPABILITY_FIELDS)})")
    changes = {}
    for key, value in stated.items():
        if key == "unpaid_statuses":
            if not isinstance(value, list) or not all(
                    isinstance(s, int) and not isinstance(s, bool) and 400 <= s <= 599 for s in value):
                raise ValueError("unpaid_statuses is a list of HTTP statuses (400-599)")
            value = frozenset(value)
        elif key in ("key_ttl_s", "window_s"):
            most = MAX_WINDOW_S if key == "window_s" else MAX_KEY_TTL_S
            if value is not None and (not _number(value) or not 0 < value <= most):
                raise ValueError(f"{key} is a number of seconds above 0 and at most {most}, or null")
        elif not isinstance(value, bool):
            raise ValueError(f"{key} is true or false")
        changes[key] = value
    return dataclasses.replace(base, **changes)


def _param(each) -> Param:
    """One declared parameter, checked: a bound that is not a number (`"minimum": "abc"` was a 500 at
    every submit naming the parameter) or is not finite refuses nothing, or everything."""
    if not isinstance(each, Mapping) or not isinstance(each.get("name"), str) or set(each) - _PARAM_FIELDS:
        raise ValueError(f"a parameter is {{{', '.join(sorted(_PARAM_FIELDS))}}} with a name: {each!r}")
    name, kind = each["name"], each.get("type")
    if not 0 < len(name) <= 100:
        raise ValueError(f"a parameter's name is 1 to 100 characters: {name!r}")
    if kind not in ("number", "integer", "string"):
        raise ValueError(f"{name}: type is number, integer or string")
    for bound in ("minimum", "maximum"):
        if each.get(bound) is not None and (kind == "string" or not _number(each[bound])):
            raise ValueError(f"{name}: {bound} is a number (of a number or integer parameter), not {each[bound]!r}")
    if each.get("minimum") is not None and each.get("maximum") is not None and each["minimum"] > each["maximum"]:
        raise ValueError(f"{name}: minimum is above maximum")
    if not isinstance(each.get("nullable", False), bool):
        raise ValueError(f"{name}: nullable is true or false")
    choices = each.get("choices")
    if choices is not None:
        fits = (lambda v: isinstance(v, str)) if kind == "string" else (
            (lambda v: isinstance(v, int) and not isinstance(v, bool)) if kind == "integer" else _number)
        if not isinstance(choices, list) or not choices or not all(fits(choice) for choice in choices):
            raise ValueError(f"{name}: choices is a list of {kind} values")
    return Param(name, kind, minimum=each.get("minimum"), maximum=each.get("maximum"),
                 nullable=each.get("nullable", False), choices=tuple(choices) if choices else None)


def _params(stated, name: str) -> tuple[Param, ...] | None:
    """The parameters an entry for the model `name` declares (None: "any"). ValueError names the first thing
    wrong, a parameter named like a field payonce sets among them."""
    if stated == "any":
        return None
    if not isinstance(stated, list):
        raise ValueError('params is a list of parameters, or "any"')
    params = [_param(each) for each in stated]
    names = [param.name for param in params]
    twice = sorted({each for each in names if names.count(each) > 1})
    if twice:
        raise ValueError(f"params: a parameter is declared twice ({', '.join(twice)})")
    if {p.name for p in params} & set(PAYONCE_INPUT_KEYS):
        raise ValueError(f"{', '.join(PAYONCE_INPUT_KEYS)} are payonce's own keys, not parameters")
    provider = name.partition("/")[0]
    owned = [p.name for p in params if p.name in own_fields(provider)]
    if owned:
        raise ValueError(f"{name}: {', '.join(owned)} {'is a field' if len(owned) == 1 else 'are fields'} payonce "
                         f"sets in every {provider} request, never a parameter")
    return tuple(params)


def own_fields(provider: str) -> tuple[str, ...]:
    """The request fields payonce sets for `provider` (its adapter's `own_fields`: the model, the prompt, keys,
    metadata, callback URLs...). A job parameter named like one is refused, whatever the model declares: sent,
    it could replace what payonce records and bills (a `model` parameter once bought gpt-image-1 at the mini
    model's price)."""
    return ADAPTERS[provider].own_fields


def row_entry(row: ModelConfig) -> dict:
    """An admin row as a layer's entry: blank fields say nothing."""
    entry = {"enabled": row.enabled}
    for field in ("provider", "kind", "content_type", "capabilities", "params"):
        value = getattr(row, field)
        if value not in ("", None):
            entry[field] = value
    return entry


# --- the models file: read, checked whole, and kept while a changed one is wrong ---------------------------


@dataclass(frozen=True)
class ModelsFile:
    """A models file as read and found valid: its entries by name, and their prices (billing.rates reads
    them through `rates.file_prices_from`, the port executor.apps hands it)."""

    path: str
    stamp: tuple | None
    entries: Mapping[str, dict]
    prices: Mapping[str, rates.Rate]


class ModelsFileInvalid(ValueError):
    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def _no_constant(constant: str):
    raise ValueError(f"{constant} is not JSON")


def read_models_file(path: str) -> ModelsFile:
    """Read the models file and check all of it (every entry with check_entry over the code's model, no
    name twice). ModelsFileInvalid names every problem, each with its model."""
    try:
        stat = os.stat(path)
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle, parse_constant=_no_constant)
    except (OSError, ValueError) as exc:  # ValueError: not JSON (UnicodeDecodeError and JSONDecodeError too)
        raise ModelsFileInvalid([f"MODELS_FILE {path!r}: {exc}"]) from None
    stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
    listed = data.get("models") if isinstance(data, dict) and set(data) <= {"models"} else None
    if not isinstance(listed, list) or not all(isinstance(e, dict) and isinstance(e.get("name"), str) for e in listed):
        raise ModelsFileInvalid([f'MODELS_FILE {path!r}: the models file is {{"models": [{{"name": "provider/model", '
                                 '...}]}}'])
    problems, entries, prices = [], {}, {}
    for entry in listed:
        name = entry["name"]
        if name in entries:
            problems.append(f"MODELS_FILE, model {name}: named twice")
            continue
        entries[name] = entry
        try:
            check_entry(name, entry, code_spec(name))
        except ValueError as exc:
            problems.append(f"MODELS_FILE, model {name}: {exc}")
            continue
        if entry.get("price") is not None:
            prices[name] = rates.rate_from(name, entry["price"])
    if problems:
        raise ModelsFileInvalid(problems)
    return ModelsFile(path, stamp, entries, prices)


_NO_FILE = ModelsFile("", None, {}, {})
# This process's models file: the last one read and found valid, and what was last seen on disk (a stamp,
# or why it could not be read) so that a wrong file is read, refused and said so once, not at every look.
_file: dict = {"good": _NO_FILE, "seen": None}


def models_file() -> ModelsFile:
    """The models file in force: the one on disk once it is valid. A file changed (or removed) at run time
    that is wrong leaves the last good one in force, and says so once: an error log line naming every
    problem, and payonce_models_file_total{outcome="rejected"} (docs/operating.md alerts on it). A wrong
    file at start refuses to start instead (check_models_file)."""
    path = settings.MODELS_FILE
    if not path:
        return _NO_FILE
    seen = _on_disk(path)
    good = _file["good"] if _file["good"].path == path else _NO_FILE
    if seen == _file["seen"]:
        return good
    _file["seen"] = seen
    try:
        loaded = read_models_file(path)
    except ModelsFileInvalid as exc:
        count("models_file", outcome="rejected")
        logger.error("models_file.rejected: %s; the models file in force stays %s", "; ".join(exc.problems),
                     "the one read before" if good.stamp else "none", extra={"path": path, "problems": exc.problems})
        return good
    if good.stamp is not None:  # not the first read of this process: a change, said once
        count("models_file", outcome="loaded")
        log_event(logger, "models_file.loaded", path=path, models=len(loaded.entries))
    _file["good"] = loaded
    return loaded


def _on_disk(path: str) -> tuple:
    """What the file on disk is now: its stamp (a change of content, size or inode, as a rename into place
    makes), or why it cannot be read."""
    try:
        stat = os.stat(path)
    except OSError as exc:
        return (path, f"{type(exc).__name__}: {exc}")
    return (path, stat.st_mtime_ns, stat.st_size, stat.st_ino)


def file_entries() -> Mapping[str, dict]:
    """The models file's entries by name, as in force ({} without MODELS_FILE)."""
    return models_file().entries


def file_prices() -> Mapping[str, rates.Rate]:
    """The models file's prices by name, as in force: what billing.rates reads through its port."""
    return models_file().prices


def check_models_file() -> list[str]:
    """What is wrong with the models file, each entry's own problem named (the start-up check). A valid
    one is then the one in force."""
    path = settings.MODELS_FILE
    if not path:
        return []
    seen = _on_disk(path)
    try:
        loaded = read_models_file(path)
    except ModelsFileInvalid as exc:
        return exc.problems
    _file.update(good=loaded, seen=seen)  # in force; its first use reads nothing again, and says nothing
    return []


# What the layers say, per process: ({name: [entry, ...]} bottom first, read at (monotonic)), and every
# spec built from them (cleared with them).
_layers: dict = {"at": float("-inf"), "entries": {}, "specs": {}}


def _layer_entries() -> dict[str, list[dict]]:
    now = time.monotonic()
    if now - _layers["at"] <= settings.MODELS_CACHE_S:
        return _layers["entries"]
    entries: dict[str, list[dict]] = {}
    for name, entry in file_entries().items():
        entries.setdefault(name, []).append(entry)
    for row in ModelConfig.objects.all():
        entries.setdefault(row.name, []).append(row_entry(row))
    _layers.update(at=now, entries=entries, specs={})
    return entries


def forget_models() -> None:
    """Read the file and the admin's rows again on next use (after an edit: this process at once, the
    others within MODELS_CACHE_S)."""
    _layers["at"] = float("-inf")
    _file["seen"] = None
    rates.forget_overrides()  # its price too: one catalog, one lifetime


# A name no layer knows reads the layers again at once, at most this often: a model added in the admin
# is known to every process at its first job, not MODELS_CACHE_S later (a change to a known one waits).
MISS_RELOAD_S = rates.MISS_RELOAD_S  # one value with the rate card's: a model and its price are found together


def model_spec(name: str) -> ModelSpec | None:
    """The model `name` as the three layers say it, or None (unknown, or disabled)."""
    spec = _spec(name)
    if spec is None and time.monotonic() - _layers["at"] >= MISS_RELOAD_S:
        forget_models()
        spec = _spec(name)
    return spec


def _spec(name: str) -> ModelSpec | None:
    entries = _layer_entries()
    specs = _layers["specs"]
    if name in specs:
        return specs[name]
    spec = code_spec(name)
    for entry in entries.get(name, ()):
        try:
            spec = spec_from(name, entry, spec)
        except ValueError as exc:  # refused where it was written; one that slipped by is skipped, loudly
            logger.error("model %s: %s; the entry is skipped", name, exc)
        if spec is None:
            break
    if len(specs) < 4096:  # names are client input: the memo stays bounded
        specs[name] = spec
    return spec


def model_names(*, kind: str) -> list[str]:
    """Every enabled model of `kind` (ModelKind) the three layers name, by name: what a form offers to
    choose from (the admin's report preview lists the text models). A pattern's models (anthropic/claude-*)
    are the ones the code, the file or the admin names."""
    names = set(code_model_names()) | set(_layer_entries())
    # _spec, not model_spec: every name here is one a layer states, so a disabled one (None) is no miss to
    # read the layers again for.
    return sorted(name for name in names if (spec := _spec(name)) is not None and spec.kind == kind)


def provider_params(job_input: Mapping) -> dict:
    """The provider parameters of a media job's input: every key but payonce's own."""
    return {name: value for name, value in job_input.items() if name not in PAYONCE_INPUT_KEYS}


def input_problems(models: Iterable[str], job_input: Mapping) -> dict[str, list[str]]:
    """Why each provider parameter of a media job's input is refused, by key ({} when none is).

    Every model of the chain gets the same parameters, so a key must suit each model: a key named like a
    field payonce sets for the model's provider (`own_fields`) is refused for every model, even one that
    takes "any" key; then, for a model that declares its parameters, an undeclared key, a value of the wrong
    type or out of bounds is refused (for the first model it fails, named). A model that declares none
    (None: an arbitrary Replicate model) takes any other key. Unknown model names are skipped: the chain's
    own validation refuses them.
    """
    problems: dict[str, list[str]] = {}
    specs = [spec for spec in map(model_spec, models) if spec is not None]
    for key, value in provider_params(job_input).items():
        for spec in specs:
            problem = _own_field_problem(spec, key) or _declared_problem(spec, key, value)
            if problem is not None:
                problems[key] = [problem]
                break
    return problems


def _own_field_problem(spec: ModelSpec, key: str) -> str | None:
    # Only the code may declare a parameter named like an own field (a models file or an admin row that
    # does is refused: _params), and it does so only to take the one value payonce sends (OpenAI's `n`, 1).
    if key in own_fields(spec.provider) and key not in {param.name for param in spec.params or ()}:
        return f"Not a parameter: payonce sets {key} in every request to {spec.name}."
    return None


def _declared_problem(spec: ModelSpec, key: str, value) -> str | None:
    if spec.params is None:
        return None
    declared = {param.name: param for param in spec.params}
    if key not in declared:
        return f"Not a parameter of {spec.name}, which takes: {', '.join(declared) or 'none'}."
    return declared[key].problem(value)


def provider_usable(provider: str) -> bool:
    """False when real providers are on and this one has no key (a job naming it is refused)."""
    return real.provider_is_usable(provider)  # a provider not governed by REAL_PROVIDERS (the sandbox) always is
