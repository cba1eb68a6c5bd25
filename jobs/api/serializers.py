"""The job request (validated strictly: wrong types are errors, never coerced) and the job as answered."""

import json
import math
import sys
from datetime import datetime, timezone as dt_timezone

from drf_spectacular.utils import extend_schema_field, inline_serializer
from rest_framework import serializers

from config import tracing
from executor.policy import DEFAULT_ATTEMPTS_PER_MODEL, DEFAULT_FALLBACK_ON, FALLBACK_REASONS, default_policy
from executor.registry import PAYONCE_INPUT_KEYS, code_spec, model_spec, provider_usable
from executor.selectors import attempts_for, public_attempts
from executor.store import KEY_MAX_CHARS, key_problem
from jobs import selectors
from jobs.models import PRIORITY_DEFAULT, PRIORITY_MAX, PRIORITY_MIN, JobStatus, job_kinds
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
    # Seconds after the create by which the job's first paid call must go out, else it ends DEADLINE_EXCEEDED
    # unpaid (executor.record); a paid job is never cut short by it. Absent: none.
    deadline_s = serializers.FloatField(required=False, min_value=1, max_value=30 * 86400)
    # The same as a moment (ISO 8601 with its offset), kept as UTC text: the earlier of the two holds.
    deadline_at = serializers.DateTimeField(required=False, default_timezone=dt_timezone.utc)

    def validate_deadline_at(self, value):  # a time without its offset is UTC
        return value.astimezone(dt_timezone.utc).isoformat().replace("+00:00", "Z")

    def validate_fallback_on(self, value):
        return sorted(set(value), key=FALLBACK_REASONS.index)

    def validate(self, attrs):
        if attrs.get("paid_retries", 0) > attrs["attempts_per_model"]:
            raise serializers.ValidationError({"paid_retries": ["At most attempts_per_model."]})
        return attrs

    def to_internal_value(self, data):
        for name in ("window_s", "deadline_s"):
            value = data.get(name) if isinstance(data, dict) else None
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise serializers.ValidationError({name: ["A number of seconds is required."]})
        return super().to_internal_value(data)


class KindField(serializers.ChoiceField):
    """A job's kind: one of jobs.kinds.KINDS. Its choices are read when a serializer binds the field, not when
    this module is imported: jobs.kinds imports jobs.services, which imports this module (job_as_dict)."""

    def __init__(self, **kwargs):
        super().__init__(choices=(), **kwargs)

    def bind(self, field_name, parent):
        super().bind(field_name, parent)
        self.choices = job_kinds()


class JobCreateSerializer(StrictSerializer):
    # The contract of a create. jobs.api.fastcreate takes the plain media bodies without this machinery and
    # must accept nothing this refuses: a rule added here is added there (or makes it fall back), and
    # tests/jobs/test_fast_create.py holds the two equal over generated bodies.
    kind = KindField()
    models = serializers.ListField(child=StrictCharField(max_length=100), min_length=1, max_length=MAX_MODELS)
    input = serializers.DictField(validators=[bounded_json], help_text=(
        f"media: {' and '.join(PAYONCE_INPUT_KEYS)}, and only the parameters that every model of the chain "
        "which declares its parameters takes (any other key is 422, named in fields.input); the sandbox's "
        f"media models take {', '.join(p.name for p in code_spec('sandbox/video-keyed').params)}; a "
        "Replicate model's are passed through unchecked. report: subject, chapters, email, and optionally "
        "template ({name, version or label}: one of your report templates, pinned at submit; chapters then optional)."))
    policy = PolicySerializer(required=False)
    output_key = StrictCharField(required=False, max_length=KEY_MAX_CHARS)
    webhook_url = serializers.URLField(required=False, max_length=2048)
    metadata = serializers.DictField(required=False, validators=[bounded_json])
    # Absent rather than defaulted (the row's default is PRIORITY_DEFAULT), so a body without it hashes as
    # it did before the field existed (jobs.services.HASH_NULL_WHEN_ABSENT says why that matters).
    priority = StrictIntegerField(required=False, min_value=PRIORITY_MIN, max_value=PRIORITY_MAX, help_text=(
        f"{PRIORITY_MIN} to {PRIORITY_MAX}, default {PRIORITY_DEFAULT}: a higher priority starts sooner; within a "
        "priority, ready jobs are started in turn across clients (weighted round robin)."))

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
        from jobs.kinds import KINDS  # at call time: kinds import services, which import this (jobs.kinds)

        kind = KINDS[attrs["kind"]]
        wrong_kind = [name for name in attrs["models"] if model_spec(name).kind not in kind.model_kinds]
        if wrong_kind:
            errors["models"] = [f"Not a {attrs['kind']} model: {', '.join(wrong_kind)}."]
        # What is validated is what is stored: each kind's cleaned input goes into the row. The body's
        # hash (the Idempotency-Key's) stays over the input as sent (jobs.services.job_create says why).
        errors.update(kind.accept_input(attrs, client=self.client))
        deadline_at = (attrs.get("policy") or {}).get("deadline_at")
        if deadline_at is not None and datetime.fromisoformat(deadline_at) <= datetime.now(dt_timezone.utc):
            errors["policy"] = {"deadline_at": ["This moment has passed: the job could only end DEADLINE_EXCEEDED."]}
        if errors:
            raise serializers.ValidationError(errors)
        attrs.setdefault("policy", default_policy())
        attrs.setdefault("metadata", {})
        return attrs

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
        "priority": job.priority,
        "output": job.output,
        "error": job.error,
        "attempts": attempts,
        "cost": cost,
        "created_at": _iso(job.created_at),
        "started_at": _iso(job.started_at),
        "completed_at": _iso(job.completed_at),
        "trace_id": tracing.trace_id_of(job.trace_context),
    }
    from jobs.kinds import KINDS  # at call time: kinds import services, which import this (jobs.kinds)

    shown.update(KINDS[job.kind].answer(job, attempts))
    return shown


class JobSerializer(serializers.Serializer):
    """A job as the API and webhooks show it (docs/api.md, "A job"): the schema of job_as_dict."""

    id = serializers.UUIDField()
    kind = KindField()  # choices: the document's enums (JobKind, JobStatus)
    status = serializers.ChoiceField(choices=JobStatus.choices)
    run = serializers.IntegerField()
    idempotency_key = serializers.CharField()
    models = serializers.ListField(child=serializers.CharField(), source="model_chain")
    input = serializers.JSONField()
    policy = serializers.JSONField()
    output_key = serializers.CharField()
    webhook_url = serializers.CharField(allow_null=True)
    metadata = serializers.JSONField()
    priority = serializers.IntegerField(help_text="Higher starts sooner (1 to 5); within a level, clients take turns.")
    output = serializers.JSONField(allow_null=True)
    error = serializers.JSONField(allow_null=True)
    attempts = serializers.SerializerMethodField()
    cost = serializers.SerializerMethodField()
    chapters = serializers.SerializerMethodField(help_text="Reports only: the chapters in order.")
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    completed_at = serializers.DateTimeField(allow_null=True)
    trace_id = serializers.CharField(allow_null=True, help_text=(
        "The trace of the job's current run (32 hex digits, W3C) when traces are exported and the run was "
        "sampled, else null."))

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


class JobDetailSerializer(JobSerializer):
    """GET /v1/jobs/{id}: the job, and why it waits if it has not sent its call yet (jobs.selectors.job_waiting).
    Only here: the list and the webhooks' events do not ask it of every job."""

    waiting = serializers.SerializerMethodField(help_text=(
        "null, or why the job waits on payonce: client_limit (queued: your jobs in progress are at your "
        "limit), turn (queued: started in its turn across clients, by priority), provider_limit (started: "
        "its call waits unsent while a provider's calls in flight are at their limit)."))

    def to_representation(self, instance):
        return {**job_as_dict(instance), "waiting": selectors.job_waiting(instance)}

    @extend_schema_field(inline_serializer("JobWaiting", {
        "reason": serializers.ChoiceField(choices=["client_limit", "turn", "provider_limit"]),
        "message": serializers.CharField(),
        "limit": serializers.JSONField(required=False, help_text="client_limit: the number; provider_limit: "
                                       "its name (a provider, or provider/model)"),
        "running": serializers.IntegerField(required=False),
        "in_flight": serializers.IntegerField(required=False),
    }, allow_null=True))
    def get_waiting(self, job):  # the schema only: to_representation renders
        raise NotImplementedError
