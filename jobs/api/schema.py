"""The OpenAPI document: the Bearer API-key authentication (drf-spectacular extension), the hooks that
complete what drf-spectacular sees, and the views that serve the document and its page."""

import copy

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import inline_serializer
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from jobs.api.errors import ERROR_CODES

# The body of every error answer, as the operations' responses name it (jobs.api.views, orders.views).
ERROR_SCHEMA = inline_serializer(
    "Error",
    {"error": inline_serializer("ErrorBody", {"code": serializers.CharField(), "message": serializers.CharField()})},
)


class BearerAPIKeyScheme(OpenApiAuthenticationExtension):
    target_class = "jobs.api.auth.BearerAPIKeyAuthentication"
    name = "BearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer <api_key>"}


def report_fields_are_optional(result, generator, request, public):
    """drf-spectacular postprocessing hook: a job's `chapters` is there for reports only (in the list's jobs
    and in GET /v1/jobs/{id}'s alike)."""
    for name in ("Job", "JobDetail"):
        job = result.get("components", {}).get("schemas", {}).get(name)
        if job and "chapters" in job.get("required", []):
            job["required"].remove("chapters")
    return result


# The event stream is an async Django view (DRF views cannot stream without a thread each), so
# drf-spectacular does not see it: it is described here, with its headers, so that clients and the API
# fuzzing know it as they know the others.
_RETRY_AFTER = {"Retry-After": {"required": True, "schema": {"type": "integer", "minimum": 0},
                                "description": "Seconds to wait before sending the same request again."}}
_ERROR_REF = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
_STATUS = {"type": "string", "enum": ["queued", "running", "waiting", "succeeded", "failed", "cancelled"]}
# What a frame's data holds: the snapshot (jobs.selectors.job_snapshot), or, for `event: end`, the status.
_SNAPSHOT = {"type": "object", "additionalProperties": False,
             "required": ["status", "run", "steps", "cost"],
             "properties": {
                 "status": _STATUS, "run": {"type": "integer", "minimum": 1},
                 "steps": {"type": "array", "items": {"type": "object", "required": ["name", "status"],
                                                       "properties": {"name": {"type": "string"},
                                                                      "status": {"type": "string"}}}},
                 "chapters": {"type": "object", "required": ["done", "total"],
                              "properties": {"done": {"type": "integer", "minimum": 0},
                                             "total": {"type": "integer", "minimum": 1}}},
                 "cost": {"type": "object", "required": ["total_usd", "unpriced_attempts"],
                          "properties": {"total_usd": {"type": "string", "pattern": "^[0-9]+\\.[0-9]{6}$"},
                                         "unpriced_attempts": {"type": "integer", "minimum": 0}}},
             }}
_END = {"type": "object", "additionalProperties": False, "required": ["status"],
        "properties": {"status": {"type": "string", "enum": ["succeeded", "failed", "cancelled"]}}}
# One event of the stream (OpenAPI before 3.2: a text/event-stream schema describes each event).
_EVENT = {
    "type": "object", "required": ["data"],
    "properties": {
        "event": {"type": "string", "enum": ["message", "end"],
                  "description": "`end` after the frame that shows a terminal status; the stream then closes."},
        "id": {"type": "string", "pattern": "^[0-9]{1,19}$", "description": "The frame's id (frames only)."},
        # JSON in a string: OpenAPI 3.0 cannot say so (contentSchema is 3.1), hence the extension.
        "data": {"type": "string", "description": "JSON: the snapshot, or for `end` the status.",
                 "x-json-schema": {"oneOf": [_SNAPSHOT, _END]}},
    },
}
EVENTS_OPERATION = {
    "operationId": "jobs_events",
    "description": (
        "Server-sent events of the job's progress: `id: <n>` and `data: <snapshot>` whenever the snapshot "
        "changes, the first frame being the current snapshot; after the frame that shows a terminal status, "
        "`event: end` and the stream closes; otherwise it closes after SSE_MAX_S. At most SSE_MAX_PER_CLIENT "
        "open streams per client."),
    "parameters": [
        {"in": "path", "name": "job_id", "required": True, "schema": {"type": "string", "format": "uuid"}},
        {"in": "header", "name": "Last-Event-ID", "required": False, "schema": {"type": "string"},
         "description": "The id of the last frame the client has: nothing up to it is sent again. A value that "
                        "is not 1 to 19 ASCII digits is ignored (the stream starts from the current snapshot)."},
        {"in": "header", "name": "Accept", "required": False, "schema": {"type": "string"},
         "description": "text/event-stream (the stream is sent whatever this says)."},
    ],
    "tags": ["jobs"],
    "security": [{"BearerAuth": []}],
    "responses": {
        "200": {"description": "The stream; the schema is each event's.",
                "content": {"text/event-stream": {"schema": _EVENT}}},
        "401": {"description": "", "content": _ERROR_REF},
        "404": {"description": "", "content": _ERROR_REF},
        "429": {"description": "TOO_MANY_STREAMS: the client (or this web process) has as many streams open as "
                               "it may.", "content": _ERROR_REF,
                "headers": _RETRY_AFTER},
    },
}


_CALLBACK_ANSWER = {"application/json": {"schema": {
    "type": "object", "required": ["status"],
    "properties": {"status": {"type": "string", "enum": ["rung", "ended", "duplicate"]}}}}}
CALLBACK_OPERATION = {
    "operationId": "provider_callback",
    "description": (
        "For providers, not clients: a completion callback signed with Standard Webhooks (the provider's "
        "callback secret). It only wakes the step waiting on that generation, which then asks the provider; "
        "each webhook-id is acted on once; a bad signature or an old timestamp is refused and changes nothing."),
    "parameters": [
        {"in": "path", "name": "provider", "required": True,
         "schema": {"type": "string", "pattern": "^[-a-zA-Z0-9_]+$"},
         "description": "The provider whose callback this is (`sandbox`, `replicate`)."},
        *({"in": "header", "name": name, "required": False, "schema": {"type": "string"}}
          for name in ("webhook-id", "webhook-timestamp", "webhook-signature")),
    ],
    "requestBody": {"required": True, "content": {"application/json": {"schema": {"type": "object"}}}},
    "tags": ["callbacks"],
    "security": [],
    "responses": {
        "200": {"description": "ended (nothing waits on that generation any more) or duplicate (that "
                               "webhook-id was taken already)", "content": _CALLBACK_ANSWER},
        "202": {"description": "rung: the waiting step was woken", "content": _CALLBACK_ANSWER},
        "400": {"description": "CALLBACK_UNVERIFIED: the signature or timestamp does not verify",
                "content": _ERROR_REF},
        "404": {"description": "CALLBACK_NOT_CONFIGURED (no callbacks taken from that provider) or "
                               "CALLBACK_UNKNOWN_GENERATION", "content": _ERROR_REF},
        "409": {"description": "CALLBACK_EARLY: the job is not waiting on that generation yet; send it again",
                "content": _ERROR_REF},
        "413": {"description": "PAYLOAD_TOO_LARGE", "content": _ERROR_REF},
        "422": {"description": "INVALID_REQUEST: the callback names no generation", "content": _ERROR_REF},
        "503": {"description": "CALLBACK_UNVERIFIED: fal's key page cannot be had now (the provider sends it "
                               "again), or DATABASE_UNAVAILABLE: PostgreSQL is restarting or unreachable (with "
                               "Retry-After)", "content": _ERROR_REF},
    },
}


def event_stream_path(result, generator, request, public):
    """drf-spectacular postprocessing hook: the two routes that are plain Django views, so drf-spectacular
    does not see them: GET /v1/jobs/{job_id}/events (jobs.api.events) and POST /v1/callbacks/{provider}
    (jobs.api.views.provider_callback)."""
    paths = result.setdefault("paths", {})
    paths["/v1/jobs/{job_id}/events"] = {"get": EVENTS_OPERATION}
    paths["/v1/callbacks/{provider}"] = {"post": CALLBACK_OPERATION}
    return result


_LOCATION = {"Location": {"required": True, "schema": {"type": "string"}, "description": "Where the answer is."}}
DATABASE_UNAVAILABLE = {
    "description": "DATABASE_UNAVAILABLE: PostgreSQL is restarting or unreachable. Send the same request "
                   "again after Retry-After: a create under the same Idempotency-Key gives the "
                   "same job, whatever was committed.",
    "content": _ERROR_REF, "headers": _RETRY_AFTER}


# The fields some codes add beside `code` and `message` (jobs.api.errors.ApiError's extras).
_ERROR_EXTRAS = {
    "fields": {"type": "object", "description": "INVALID_REQUEST: what is wrong, by field (`input.render_s`)."},
    "job_id": {"type": "string", "nullable": True,
               "description": "IDEMPOTENCY_CONFLICT, OUTPUT_KEY_CONFLICT: the job that holds the key."},
    "order_id": {"type": "string", "description": "IDEMPOTENCY_CONFLICT of an order: the order of that payment."},
    "output_key": {"type": "string", "description": "OUTPUT_KEY_CONFLICT: the key asked for."},
    "status": {"$ref": "#/components/schemas/JobStatus",
               "description": "JOB_TERMINAL, JOB_NOT_RETRYABLE, JOB_NOT_SUCCEEDED: the job's status."},
    "kind": {"$ref": "#/components/schemas/JobKind", "description": "NOT_A_REPORT: the job's kind."},
    "scope": {"type": "string", "enum": ["client", "process"],
              "description": "TOO_MANY_STREAMS: whose limit was reached."},
    "limit": {"type": "integer", "description": "TOO_MANY_STREAMS: that limit."},
    "limit_bytes": {"type": "integer", "description": "PAYLOAD_TOO_LARGE: the largest body taken."},
}


def api_errors(result, generator, request, public):
    """drf-spectacular postprocessing hook: what every operation of the API may answer besides its own.

    - `ErrorBody.code` is the enum of every code (jobs.api.errors.ERROR_CODES), so a client library's types
      name each one;
    - every operation that reads the database may answer `503 DATABASE_UNAVAILABLE` with `Retry-After`
      (jobs.api.errors.api_exception_handler), which a client is to wait out and send again; the output's
      own 503 (STORE_UNAVAILABLE) is made to say both, and the callbacks' (CALLBACK_UNVERIFIED) does;
    - a redirect names its `Location`."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas["ErrorCode"] = {"type": "string", "enum": list(ERROR_CODES),
                            "description": "docs/api.md, \"Every error code\"."}
    body = schemas["ErrorBody"]
    body["properties"]["code"] = {"$ref": "#/components/schemas/ErrorCode"}
    body["properties"].update(_ERROR_EXTRAS)
    body["additionalProperties"] = True  # a later release may add a field; a client ignores what it does not know
    for path, operations in result.get("paths", {}).items():
        if not path.startswith("/v1/") or path in ("/v1/schema", "/v1/docs"):
            continue
        for operation in operations.values():
            responses = operation["responses"]
            if "503" in responses and "DATABASE_UNAVAILABLE" in responses["503"]["description"]:
                # An operation's own 503 that says both already (the callbacks' CALLBACK_UNVERIFIED).
                responses["503"]["headers"] = {"Retry-After": {**_RETRY_AFTER["Retry-After"], "required": False}}
            elif "503" in responses:
                responses["503"]["description"] = ("STORE_UNAVAILABLE (the output store cannot be reached) or "
                                                   + DATABASE_UNAVAILABLE["description"])
                responses["503"]["headers"] = {"Retry-After": {**_RETRY_AFTER["Retry-After"], "required": False}}
            else:
                responses["503"] = copy.deepcopy(DATABASE_UNAVAILABLE)  # a YAML dump would alias one dict
            for code in ("301", "302", "303", "307", "308"):
                if code in responses:
                    responses[code].setdefault("headers", copy.deepcopy(_LOCATION))
    return result


class JsonErrors:
    """An error answer of these views (a wrong method, say) is JSON like every other API error, not the
    view's own format (the document's YAML, the docs page's HTML)."""

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        if isinstance(response, Response) and response.status_code >= 400:
            response.accepted_renderer = JSONRenderer()
            response.accepted_media_type = JSONRenderer.media_type
        return response


class SchemaView(JsonErrors, SpectacularAPIView):
    pass


class DocsView(JsonErrors, SpectacularSwaggerView):
    pass
