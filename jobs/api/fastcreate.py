"""A fast path for POST /v1/jobs: the validated data of a plain, valid media body without DRF's serializer
machinery, or None whenever it is not sure (then JobCreateSerializer decides, as it always did).

JobCreateSerializer is the contract (and what the OpenAPI document is generated from); building one costs a
deep copy of every declared field (URLField's validators compiled again each time) and a nested serializer
for the input, most of a create's validation CPU. This checks the same rules in plain code for the bodies
most creates send, and answers only "valid, and here is exactly what the serializer would have validated"
or "not sure". Every refusal, every error body and every field-error detail still comes from the
serializer, because anything this does not accept outright falls back to it: an unknown or absent field,
a type it does not take, a value out of bounds, a report job, references, a webhook_url (refused after
DNS) or a deadline_at (a moment's parsing), anything the catalog or a bound refuses.

tests/jobs/test_fast_create.py runs both over many generated bodies, valid and invalid, and holds that
whatever this accepts the serializer accepts with equal validated data (types, key order and all)."""

import json

from rest_framework.exceptions import ValidationError

from executor.policy import DEFAULT_ATTEMPTS_PER_MODEL, DEFAULT_FALLBACK_ON, FALLBACK_REASONS, default_policy
from executor.registry import input_problems, model_spec, provider_usable
from executor.store import KEY_MAX_CHARS, key_problem
from jobs.api.serializers import MAX_MODELS, METADATA_MAX_BYTES, bounded_json
from jobs.models import PRIORITY_MAX, PRIORITY_MIN

# The top-level fields it takes (the serializer's, less webhook_url), and the policy's (less deadline_at).
_FIELDS = frozenset({"kind", "models", "input", "policy", "output_key", "metadata", "priority"})
_POLICY_FIELDS = frozenset({"attempts_per_model", "fallback_on", "window_s", "paid_retries", "deadline_s"})
_PROMPT_MAX = 20000  # jobs.kinds.media.MediaInputSerializer.prompt
_MODEL_MAX = 100  # JobCreateSerializer.models' child


class _NotSure(Exception):
    pass


def _char(value, max_length: int) -> str:
    """StrictCharField(max_length): a string, trimmed, not blank, no longer than max_length after trimming,
    without NUL or surrogate characters (the validators DRF's CharField adds)."""
    if type(value) is not str:
        raise _NotSure
    cleaned = value.strip()
    if not cleaned or len(cleaned) > max_length or "\x00" in cleaned:
        raise _NotSure
    try:
        cleaned.encode("utf-8")  # a lone surrogate does not encode
    except UnicodeEncodeError:
        raise _NotSure from None
    return cleaned


def _int(value, low: int, high: int) -> int:
    """StrictIntegerField(min_value=low, max_value=high)."""
    if type(value) is not int or not low <= value <= high:
        raise _NotSure
    return value


def _seconds(value, low: float, high: float) -> float:
    """PolicySerializer's number of seconds: FloatField(min_value=low, max_value=high) of an int or float."""
    if type(value) is not int and type(value) is not float:
        raise _NotSure
    try:
        number = float(value)
    except OverflowError:
        raise _NotSure from None
    if not low <= number <= high:  # NaN fails this too
        raise _NotSure
    return number


def _bounded(value) -> dict:
    """DictField(validators=[bounded_json]) of the client's own JSON: a shallow copy with str keys."""
    if type(value) is not dict:
        raise _NotSure
    try:
        bounded_json(value)
    except ValidationError:
        raise _NotSure from None
    return dict(value)


def _policy(value) -> dict:
    if type(value) is not dict or not value.keys() <= _POLICY_FIELDS:
        raise _NotSure
    policy = {"attempts_per_model": _int(value["attempts_per_model"], 1, 10)
              if "attempts_per_model" in value else DEFAULT_ATTEMPTS_PER_MODEL}
    if "fallback_on" in value:
        reasons = value["fallback_on"]
        if type(reasons) is not list or len(reasons) > len(FALLBACK_REASONS):
            raise _NotSure
        for reason in reasons:
            if type(reason) is not str or reason not in FALLBACK_REASONS:
                raise _NotSure
    else:
        reasons = DEFAULT_FALLBACK_ON
    policy["fallback_on"] = sorted(set(reasons), key=FALLBACK_REASONS.index)
    if "window_s" in value:
        policy["window_s"] = _seconds(value["window_s"], 1, 86400)
    if "paid_retries" in value:
        policy["paid_retries"] = _int(value["paid_retries"], 0, 10)
        if policy["paid_retries"] > policy["attempts_per_model"]:
            raise _NotSure
    if "deadline_s" in value:
        policy["deadline_s"] = _seconds(value["deadline_s"], 1, 30 * 86400)
    return policy


def _media_models(value) -> list[str]:
    if type(value) is not list or not 1 <= len(value) <= MAX_MODELS:
        raise _NotSure
    models = [_char(name, _MODEL_MAX) for name in value]
    if len(set(models)) != len(models):
        raise _NotSure
    from jobs.kinds import KINDS  # at call time, as the serializer (jobs.kinds imports jobs.services)

    model_kinds = KINDS["media"].model_kinds
    for name in models:
        spec = model_spec(name)
        if spec is None or not provider_usable(spec.provider) or spec.kind not in model_kinds:
            raise _NotSure
    return models


def _media_input(sent: dict, models: list[str]) -> dict:
    """jobs.kinds.media.MediaInputSerializer of an input without references: the prompt trimmed, every other
    key a provider parameter that input_problems takes, kept as sent."""
    if "references" in sent or "prompt" not in sent:
        raise _NotSure
    prompt = _char(sent["prompt"], _PROMPT_MAX)
    if input_problems(models, sent):
        raise _NotSure
    return {**sent, "prompt": prompt}


def create_data(body) -> dict | None:
    """JobCreateSerializer(data=body).validated_data for a valid media body it is sure of, else None. The
    keys in the serializer's order: its fields as declared, then what its validate() adds. The catalog's
    checks of the input come last, as in the serializer (its validate() runs once every field is valid), and
    whatever goes wrong on the way is the serializer's to meet again: the fast path never answers itself."""
    if (type(body) is not dict or not body.keys() <= _FIELDS or body.get("kind") != "media"
            or "models" not in body or "input" not in body):
        return None
    try:
        models = _media_models(body["models"])
        sent = _bounded(body["input"])
        data = {"kind": "media", "models": models, "input": sent}
        if "policy" in body:
            data["policy"] = _policy(body["policy"])
        if "output_key" in body:
            data["output_key"] = _char(body["output_key"], KEY_MAX_CHARS)
            if key_problem(data["output_key"]):
                return None
        if "metadata" in body:
            metadata = _bounded(body["metadata"])
            if len(json.dumps(metadata, ensure_ascii=False, separators=(",", ":")).encode("utf-8")) > METADATA_MAX_BYTES:
                return None
            data["metadata"] = metadata
        if "priority" in body:
            data["priority"] = _int(body["priority"], PRIORITY_MIN, PRIORITY_MAX)
        data["input"] = _media_input(sent, models)
    except Exception:  # noqa: BLE001 (_NotSure, or anything the serializer will raise, or answer, itself)
        return None
    data["input_as_sent"] = sent
    data.setdefault("policy", default_policy())
    data.setdefault("metadata", {})
    return data
