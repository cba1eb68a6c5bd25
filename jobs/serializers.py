"""The job request (validated strictly: wrong types are errors, never coerced) and the job as answered."""

import base64
import binascii
import json
import math
import re
import sys
from decimal import Decimal

from django.conf import settings
from drf_spectacular.utils import extend_schema_field, inline_serializer
from rest_framework import serializers

from executor.policy import DEFAULT_ATTEMPTS_PER_MODEL, DEFAULT_FALLBACK_ON, FALLBACK_REASONS, default_policy
from executor.registry import PAYONCE_INPUT_KEYS, code_spec, input_problems, model_spec, provider_usable
from executor.selectors import attempts_for, public_attempts
from executor.store import KEY_MAX_CHARS, key_problem
from jobs.models import JobKind, JobStatus, ReportChapter
from jobs.selectors import succeeded_output_keys
from webhooks import services as webhooks

MAX_MODELS = 5
MAX_JSON_DEPTH = 32
# A job's metadata is echoed in every answer, list page and event: it is for ids and tags, not payloads.
METADATA_MAX_BYTES = 16 * 1024


class StrictCharField(serializers.CharField):
    """A string, never a number or a bool turned into one."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictRegexField(serializers.RegexField):
    """A string matching the pattern, never a number turned into one (DRF's RegexField takes 0 for "0")."""

    default_error_messages = {"not_a_string": StrictCharField.default_error_messages["invalid"]}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("not_a_string")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictSerializer(serializers.Serializer):
    """Unknown fields are errors: a typo such as "polcy" must not be silently ignored."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


def bounded_json(value) -> None:
    """The validator of every field that holds the client's own JSON as it sent it: a job's `input` and
    `metadata`, an order's `input`. One check whichever way the value comes in, so a bound that holds for
    a job holds for an order too:

    - at most MAX_JSON_DEPTH levels of objects and arrays (422 naming the field);
    - every number a finite double (422 naming where it is, `input.render_s`, `metadata.ids.0`). The body's
      parser refuses 1e400 already; an integer of 310 digits is as large, valid to Python but infinity or an
      error to a JavaScript client, a webhook receiver or a provider, and an OverflowError to any code that
      takes it for a float (the 500 a declared parameter was).

    Walked with a stack of its own that stops at the first level too deep, so a body nested as deep as
    the parser allows costs no recursion here."""
    pending = [(value, ())]
    while pending:
        item, path = pending.pop()
        if isinstance(item, (dict, list)):
            if len(path) >= MAX_JSON_DEPTH:
                raise serializers.ValidationError(f"Nested deeper than {MAX_JSON_DEPTH} levels.")
            children = item.items() if isinstance(item, dict) else enumerate(item)
            pending.extend((child, (*path, str(key))) for key, child in children)
        elif isinstance(item, (int, float)) and not isinstance(item, bool) and not _fits_a_double(item):
            error = ["A finite number that fits a double (at most about 1.8e308 in size) is required."]
            for key in reversed(path):  # the error at its place: {"render_s": [...]} names input.render_s
                error = {key: error}
            raise serializers.ValidationError(error)


def _fits_a_double(number: int | float) -> bool:
    # Compared, not converted: float() of a 310-digit int raises OverflowError.
    return math.isfinite(number) if isinstance(number, float) else abs(number) <= sys.float_info.max


class PolicySerializer(StrictSerializer):
    attempts_per_model = StrictIntegerField(min_value=1, max_value=10, default=DEFAULT_ATTEMPTS_PER_MODEL)
    fallback_on = serializers.ListField(
        child=serializers.ChoiceField(choices=FALLBACK_REASONS),
        max_length=len(FALLBACK_REASONS),
        default=lambda: list(DEFAULT_FALLBACK_ON),
    )

    # A per-attempt window (seconds) tighter than the provider's own: past it, no retry of that model.
    window_s = serializers.FloatField(required=False, min_value=1, max_value=86400)
    # How often a run may pay again on its own after a paid attempt failed (absent: 0, so a failed render
    # that was charged ends the job PAID_ATTEMPT_FAILED and only a person's retry pays again). Absent
    # rather than defaulted, so the stored body, and with it an Idempotency-Key's hash, is what it was.
    paid_retries = StrictIntegerField(required=False, min_value=0, max_value=10)

    def validate_fallback_on(self, value):
        return sorted(set(value), key=FALLBACK_REASONS.index)

    def validate(self, attrs):
        if attrs.get("paid_retries", 0) > attrs["attempts_per_model"]:
            raise serializers.ValidationError({"paid_retries": ["At most attempts_per_model."]})
        return attrs

    def to_internal_value(self, data):
        window = data.get("window_s") if isinstance(data, dict) else None
        if window is not None and (isinstance(window, bool) or not isinstance(window, (int, float))):
            raise serializers.ValidationError({"window_s": ["A number of seconds is required."]})
        return super().to_internal_value(data)


class ReferenceSerializer(StrictSerializer):
    """Reference media, uploaded to the provider's input store before each submit: inline bytes (base64)
    or an object already in payonce's output store (an earlier job's output)."""

    data = StrictCharField(required=False, max_length=200_000)
    # Only the output of one of the caller's own succeeded jobs (JobCreateSerializer.validate checks it).
    output_key = StrictCharField(required=False, max_length=KEY_MAX_CHARS)
    content_type = StrictCharField(required=False, max_length=100)

    def validate_output_key(self, value):
        problem = key_problem(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value

    def validate(self, attrs):
        if ("data" in attrs) == ("output_key" in attrs):
            raise serializers.ValidationError("Give exactly one of data (base64) or output_key.")
        if "data" in attrs:
            try:
                base64.b64decode(attrs["data"], validate=True)
            except (binascii.Error, ValueError):
                raise serializers.ValidationError({"data": ["Not valid base64."]}) from None
            if not re.fullmatch(r"(image|video)/[a-z0-9.+-]+", attrs.get("content_type", "")):
                raise serializers.ValidationError({"content_type": ["image/* or video/* is required with data."]})
        return attrs


class MediaInputSerializer(serializers.Serializer):
    """A media job's input: a prompt, reference media, and the provider parameters the chain's models
    declare (executor.registry.input_problems; a model that declares none takes any key). The chain comes
    in the context: `models`."""

    prompt = StrictCharField(max_length=20000)
    references = ReferenceSerializer(many=True, required=False, max_length=8)

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["Expected an object."]})
        errors = input_problems(self.context["models"], data)
        try:
            cleaned = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            errors = {**exc.detail, **errors}
        if errors:
            raise serializers.ValidationError(errors)
        # The extra keys are the provider's parameters, kept as sent (input_problems checked them); the
        # fields declared here are stored as they were checked (the prompt trimmed, the references
        # cleaned), never the raw value beside a checked copy.
        declared = {"prompt": cleaned["prompt"]}
        if "references" in cleaned:
            declared["references"] = [dict(ref) for ref in cleaned["references"]]
        return {**data, **declared}


# The whole key (\A...\Z: `$` would also match before a final newline), ASCII only.
_CHAPTER_KEY = re.compile(r"\A[a-z0-9][a-z0-9-]{0,63}\Z", re.ASCII)


class ReportInputSerializer(StrictSerializer):
    """A report's input: the subject it is written about (personal: purged after the retention period),
    its chapters (slugs, in order, each once) and where the link goes. Its validated_data is what is
    stored: a chapter key is taken exactly as sent (not trimmed: " sun" or "sun\n" is not a slug and
    is refused, rather than checked trimmed and stored raw), the email trimmed as DRF's EmailField does."""

    subject = serializers.DictField()
    chapters = serializers.ListField(child=StrictCharField(max_length=64, trim_whitespace=False), min_length=1)
    email = serializers.EmailField(max_length=254)

    def validate_subject(self, value):
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
        if not value:
            raise serializers.ValidationError("The subject is empty.")
        if size > METADATA_MAX_BYTES:
            raise serializers.ValidationError(f"At most {METADATA_MAX_BYTES} bytes of JSON ({size} given).")
        return value

    def validate_chapters(self, value):
        if len(value) > settings.REPORT_MAX_CHAPTERS:
            raise serializers.ValidationError(f"At most {settings.REPORT_MAX_CHAPTERS} chapters.")
        bad = [repr(key) for key in value if not _CHAPTER_KEY.match(key)]
        if bad:
            raise serializers.ValidationError(f"Chapter keys are slugs (a-z, 0-9, '-'): {', '.join(bad[:5])}.")
        if len(set(value)) != len(value):
            raise serializers.ValidationError("Each chapter key once.")
        return value


class JobCreateSerializer(StrictSerializer):
    kind = serializers.ChoiceField(choices=JobKind.choices)
    models = serializers.ListField(child=StrictCharField(max_length=100), min_length=1, max_length=MAX_MODELS)
    input = serializers.DictField(validators=[bounded_json], help_text=(
        f"media: {' and '.join(PAYONCE_INPUT_KEYS)}, and only the parameters that every model of the chain "
        "which declares its parameters takes (any other key is 422, named in fields.input); the sandbox's "
        f"media models take {', '.join(p.name for p in code_spec('sandbox/video-keyed').params)}; a "
        "Replicate model's are passed through unchecked. report: subject, chapters, email."))
    policy = PolicySerializer(required=False)
    output_key = StrictCharField(required=False, max_length=KEY_MAX_CHARS)
    webhook_url = serializers.URLField(required=False, max_length=2048)
    metadata = serializers.DictField(required=False, validators=[bounded_json])

    def __init__(self, *args, client=None, replay: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.client = client  # whose outputs a reference may name
        # A replay of a key that already has its job: the catalog is not asked (a model disabled, a
        # parameter no longer declared since the job was accepted): only the body's shape is checked, and
        # its hash decides (the same job, 202, or 409). A careful client's retry of a POST whose answer was
        # lost is never told 422 for a job that exists and may be paid for.
        self.replay = replay

    def validate_models(self, value):
        if self.replay:
            return value
        unknown = [name for name in value if model_spec(name) is None]
        if unknown:
            raise serializers.ValidationError(f"Unknown model(s): {', '.join(unknown)}.")
        unusable = [name for name in value if not provider_usable(model_spec(name).provider)]
        if unusable:
            raise serializers.ValidationError(
                f"Real providers are on and these have no API key configured: {', '.join(unusable)}."
            )
        if len(set(value)) != len(value):
            raise serializers.ValidationError("A model may appear only once in the chain.")
        return value

    def validate_output_key(self, value):
        problem = key_problem(value)  # the one rule every store can hold (executor.store)
        if problem:
            raise serializers.ValidationError(problem)
        return value

    def validate_webhook_url(self, value):
        if not value.lower().startswith(("http://", "https://")):
            raise serializers.ValidationError("Only http and https URLs.")
        # Private, loopback and link-local targets are refused after DNS (checked again at send); the
        # words never say what the host resolves to.
        refusal = webhooks.webhook_url_refusal(value)
        if refusal:
            raise serializers.ValidationError(f"This webhook URL may not be used: {refusal}")
        return value

    def validate_metadata(self, value):
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
        if size > METADATA_MAX_BYTES:
            raise serializers.ValidationError(f"At most {METADATA_MAX_BYTES} bytes of JSON ({size} given).")
        return value

    def validate(self, attrs):
        if self.replay:
            attrs.setdefault("policy", default_policy())
            attrs.setdefault("metadata", {})
            return attrs
        errors = {}
        wrong_kind = [name for name in attrs["models"] if model_spec(name).job_kind != attrs["kind"]]
        if wrong_kind:
            errors["models"] = [f"Not a {attrs['kind']} model: {', '.join(wrong_kind)}."]
        # What is validated is what is stored: each kind's cleaned input goes into the row. The body's
        # hash (the Idempotency-Key's) stays over the input as sent (jobs.services.job_create says why).
        if attrs["kind"] == JobKind.MEDIA:
            media_input = MediaInputSerializer(data=attrs["input"], context={"models": attrs["models"]})
            if not media_input.is_valid():
                errors["input"] = media_input.errors
            else:
                refused = self._foreign_references(media_input.validated_data.get("references") or [])
                if refused:
                    errors["input"] = {"references": refused}
                else:
                    attrs["input_as_sent"], attrs["input"] = attrs["input"], media_input.validated_data
        if attrs["kind"] == JobKind.REPORT:
            report_input = ReportInputSerializer(data=attrs["input"])
            if not report_input.is_valid():
                errors["input"] = report_input.errors
            elif "output_key" in attrs:
                errors["output_key"] = ["A report has no output key: it is read at /v1/jobs/{id}/report."]
            else:
                attrs["input_as_sent"], attrs["input"] = attrs["input"], dict(report_input.validated_data)
        if errors:
            raise serializers.ValidationError(errors)
        attrs.setdefault("policy", default_policy())
        attrs.setdefault("metadata", {})
        return attrs

    def _foreign_references(self, references: list[dict]) -> list[dict]:
        """A reference may name only an output of one of the caller's own succeeded jobs: any other key
        (another client's output, a job still running, a key nothing was written to) is refused here,
        before a row or a charge, with the same words whether or not the key exists elsewhere."""
        keys = [ref["output_key"] for ref in references if "output_key" in ref]
        if not keys:
            return []
        owned = succeeded_output_keys(client_id=self.client.id, keys=keys) if self.client is not None else set()
        if all(key in owned for key in keys):
            return []
        return [
            {"output_key": ["Not the output of one of your succeeded jobs."]}
            if "output_key" in ref and ref["output_key"] not in owned else {}
            for ref in references
        ]


class AttemptSerializer(serializers.Serializer):
    number = serializers.IntegerField()
    step = serializers.CharField(help_text="The step of the run that made it: submit, synthesis, chapter-{key}")
    provider = serializers.CharField()
    model = serializers.CharField()
    upstream_key = serializers.CharField()
    state = serializers.CharField()
    error_class = serializers.CharField(allow_null=True)
    error = serializers.CharField(allow_null=True)
    duration_ms = serializers.IntegerField(allow_null=True)
    cost_usd = serializers.DecimalField(max_digits=12, decimal_places=6, allow_null=True)
    cost_source = serializers.CharField(allow_null=True)
    usage = serializers.JSONField(allow_null=True)
    paid = serializers.ChoiceField(
        choices=["yes", "no", "unknown"],
        help_text="yes: the provider accepted it (and charged); no: refused before accepting, or never sent; "
                  "unknown: a send's outcome nobody knows (a person decides)")


def _iso(value) -> str | None:
    """The format DRF gives datetimes (ISO 8601, UTC as Z), without DRF's per-field machinery."""
    return value.isoformat().replace("+00:00", "Z") if value is not None else None


def job_as_dict(job) -> dict:
    """A job as the API and webhooks show it. A plain function, because it runs in every API answer and
    every event; JobSerializer (below) declares the same fields for the OpenAPI schema. The attempts
    come with the job (`attempt_rows`, read in the same statement) or are read here."""
    rows = getattr(job, "attempt_rows", None)
    if rows is None:
        rows = attempts_for([job.id]).get(job.id, [])
    attempts, cost = public_attempts(rows)
    shown = {
        "id": str(job.id),
        "kind": job.kind,
        "status": job.status,
        "run": job.run,
        "idempotency_key": job.idempotency_key,
        "models": job.model_chain,
        "input": job.input,
        "policy": job.policy,
        "output_key": job.output_key,
        "webhook_url": job.webhook_url or None,
        "metadata": job.metadata,
        "output": job.output,
        "error": job.error,
        "attempts": attempts,
        "cost": cost,
        "created_at": _iso(job.created_at),
        "started_at": _iso(job.started_at),
        "completed_at": _iso(job.completed_at),
    }
    if job.kind == JobKind.REPORT:
        shown["chapters"] = report_chapters(job, attempts)
    return shown


def report_chapters(job, attempts: list[dict]) -> list[dict]:
    """A report's chapters in order, each with its attempts (every run's) and their cost (docs/api.md, "A job")."""
    by_step: dict[str, list[dict]] = {}
    for attempt in attempts:
        by_step.setdefault(attempt.get("step") or "", []).append(attempt)
    keys = job.input.get("chapters") or []
    status = dict(ReportChapter.objects.filter(report_id=job.id).values_list("key", "status"))
    chapters = []
    for key in keys:
        rows = by_step.get(f"chapter-{key}", [])
        cost = sum((Decimal(a["cost_usd"]) for a in rows if a["cost_usd"] is not None), Decimal(0))
        chapters.append({"key": key, "status": status.get(key, "pending"), "attempts": rows,
                         "cost_usd": str(cost.quantize(Decimal("0.000001")))})
    return chapters


class JobSerializer(serializers.Serializer):
    """A job as the API and webhooks show it (docs/api.md, "A job"): the schema of job_as_dict."""

    id = serializers.UUIDField()
    kind = serializers.ChoiceField(choices=JobKind.choices)  # choices: the document's enums (JobKind, JobStatus)
    status = serializers.ChoiceField(choices=JobStatus.choices)
    run = serializers.IntegerField()
    idempotency_key = serializers.CharField()
    models = serializers.ListField(child=serializers.CharField(), source="model_chain")
    input = serializers.JSONField()
    policy = serializers.JSONField()
    output_key = serializers.CharField()
    webhook_url = serializers.CharField(allow_null=True)
    metadata = serializers.JSONField()
    output = serializers.JSONField(allow_null=True)
    error = serializers.JSONField(allow_null=True)
    attempts = serializers.SerializerMethodField()
    cost = serializers.SerializerMethodField()
    chapters = serializers.SerializerMethodField(help_text="Reports only: the chapters in order.")
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    completed_at = serializers.DateTimeField(allow_null=True)

    def to_representation(self, instance):
        return job_as_dict(instance)

    @extend_schema_field(AttemptSerializer(many=True))
    def get_attempts(self, job):  # the schema only: job_as_dict renders
        raise NotImplementedError

    @extend_schema_field(inline_serializer("Cost", {
        "total_usd": serializers.DecimalField(max_digits=12, decimal_places=6),
        "unpriced_attempts": serializers.IntegerField(),
    }))
    def get_cost(self, job):  # the schema only: job_as_dict renders
        raise NotImplementedError

    @extend_schema_field(inline_serializer("ReportChapter", {
        "key": serializers.CharField(), "status": serializers.CharField(),
        "attempts": AttemptSerializer(many=True), "cost_usd": serializers.DecimalField(max_digits=12, decimal_places=6),
    }, many=True))
    def get_chapters(self, job):  # the schema only: job_as_dict renders
        raise NotImplementedError
