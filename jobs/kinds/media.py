"""The media kind: one render of a prompt (and reference media) by the first model of a chain that
succeeds, stored as an object in the client's store (docs/design.md, "How a job runs: durable steps").

Its recipe: check the output key, mark running, submit | wait | store output, finish. Three stages, so
three messages: steps that only touch the database or read run inline in one task, each still its own
`Step` row; a message is needed only where the job waits on the provider. (The budget's worst case is
reserved with each attempt's intent: executor.record.intend.)
"""

import base64
import binascii
import re
from decimal import Decimal

from django.db.models import Count
from rest_framework import serializers

from billing import rates
from billing import services as billing
from executor import cancel, record, render
from executor import services as executor
from executor.models import ModelKind
from executor.policy import DEFAULT_ATTEMPTS_PER_MODEL
from executor.registry import input_problems
from executor.store import KEY_MAX_CHARS, key_problem
from jobs import services
from jobs.api.serializers import StrictCharField, StrictSerializer
from jobs.engine.workflow import Effect, Kind, Recipe, Stage, StepSpec
from jobs.kinds.common import mark_running
from jobs.models import JobStatus
from jobs.selectors import succeeded_output_keys


def check_output(ctx) -> dict:
    output = executor.output_check(ctx.job)
    return {"exists": output is not None, "output": output}


def submit(ctx) -> dict:
    if ctx.result("check_output")["exists"]:
        return {"skipped": True}  # this job's output is already stored: nothing to pay for
    # The job was loaded knowing whether it has any attempt (jobs.selectors.job_with_steps).
    accepted = render.submit(ctx.job, done=ctx.done_mark, none_yet=not getattr(ctx.job, "has_attempts", True))
    ctx.handoff["submit"] = accepted  # the wait, run next in this execution, starts from it
    return record.accepted(accepted)


def wait(ctx) -> dict:
    if ctx.result("submit").get("skipped"):
        return {"skipped": True}
    return render.wait(ctx.job, attempt=ctx.handoff.get("submit"), rung=ctx.rung, done=ctx.done_mark)


def wait_ready(ctx, mark) -> dict | None:
    if ctx.result("submit").get("skipped"):
        return {"skipped": True}
    return render.finish_answered(ctx.job, ctx.handoff.get("submit"), mark)


def store_output(ctx) -> dict:
    existing = ctx.result("check_output")
    if existing["exists"]:
        return {"output": existing["output"]}
    return {"output": executor.media_store(ctx.job, ctx.result("wait"))}


def finish(ctx) -> dict:
    output = ctx.result("store_output")["output"]
    # The store step's done mark commits with this step (jobs.engine.runner defers a read's mark to the next
    # transaction): the attempt lets go of its inline bytes in that same commit.
    executor.media_stored(ctx.job, ctx.result("wait") or {}, output)
    won = services.job_finish(job_id=ctx.job.id, status=JobStatus.SUCCEEDED, output=output)
    return {"won": won}


def cancel_upstream(ctx) -> float | None:
    return cancel.cancel_current(ctx.job)


RECIPE = Recipe(
    stages=(
        Stage("prepare", (
            # The read first: then marking the job running, the read's done mark and the submit's
            # lease are one transaction (jobs.engine.runner).
            StepSpec("check_output", check_output, Effect.READ),
            StepSpec("mark_running", mark_running, Effect.DB),
            StepSpec("submit", submit, Effect.EXTERNAL),
        )),
        Stage("wait", (StepSpec("wait", wait, Effect.WAIT, ready=wait_ready),)),
        # Writing the output is create-only and idempotent for this job, so it needs no lease.
        Stage("finish", (
            StepSpec("store_output", store_output, Effect.READ),
            StepSpec("finish", finish, Effect.DB),
        )),
    ),
    on_cancel=cancel_upstream,
)


# --- the input -----------------------------------------------------------------------------------------------


class ReferenceSerializer(StrictSerializer):
    """Reference media, uploaded to the provider's input store before each submit: inline bytes (base64)
    or an object already in payonce's output store (an earlier job's output)."""

    data = StrictCharField(required=False, max_length=200_000)
    # Only the output of one of the caller's own succeeded jobs (foreign_references checks it).
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



def accept_input(attrs: dict, *, client) -> dict:
    """The create serializer's check of a media job's `input` (jobs.engine.workflow.Kind.accept_input)."""
    media_input = MediaInputSerializer(data=attrs["input"], context={"models": attrs["models"]})
    if not media_input.is_valid():
        return {"input": media_input.errors}
    refused = foreign_references(media_input.validated_data.get("references") or [], client)
    if refused:
        return {"input": {"references": refused}}
    attrs["input_as_sent"], attrs["input"] = attrs["input"], media_input.validated_data
    return {}


def foreign_references(references: list[dict], client) -> list[dict]:
    """A reference may name only an output of one of the caller's own succeeded jobs: any other key
    (another client's output, a job still running, a key nothing was written to) is refused here,
    before a row or a charge, with the same words whether or not the key exists elsewhere."""
    keys = [ref["output_key"] for ref in references if "output_key" in ref]
    if not keys:
        return []
    owned = succeeded_output_keys(client_id=client.id, keys=keys) if client is not None else set()
    if all(key in owned for key in keys):
        return []
    return [
        {"output_key": ["Not the output of one of your succeeded jobs."]}
        if "output_key" in ref and ref["output_key"] not in owned else {}
        for ref in references
    ]


# --- an operator's retry ------------------------------------------------------------------------------------


def worst_cases(jobs) -> Decimal:
    """What new runs of these media jobs may reserve: grouped by chain and policy, each model of the chain
    tried attempts_per_model times at its worst case (jobs.engine.workflow.Kind.worst_cases)."""
    total = Decimal("0.000000")
    groups = jobs.order_by().values("model_chain", "policy__attempts_per_model").annotate(jobs=Count("id"))
    for group in groups:
        total += _worst_case(group["model_chain"], group["policy__attempts_per_model"]) * group["jobs"]
    return total


def _worst_case(chain: list[str], attempts_per_model) -> Decimal:
    """What a media run's retry may reserve: each model's worst case (no less than its drift floor, as the
    reservation itself takes it) for each try."""
    tries = attempts_per_model if attempts_per_model is not None else DEFAULT_ATTEMPTS_PER_MODEL
    return sum((max(rates.worst_case(model), billing.reservation_floor(model)) * tries for model in chain),
               Decimal("0.000000"))


KIND = Kind(
    name="media",
    model_kinds=frozenset({ModelKind.VIDEO, ModelKind.IMAGE}),
    recipe=RECIPE,
    accept_input=accept_input,
    worst_cases=worst_cases,
)
