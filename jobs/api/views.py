"""The job API (docs/api.md, "Every endpoint"). Views parse and validate, call one service, and render."""

import secrets

from django.http import FileResponse, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import months
from billing import selectors as billing_selectors
from executor import callbacks
from executor.registry import OUTPUT_CONTENT_TYPES
from executor.services import store_error_is_permanent
from executor.store import client_store
from jobs import selectors, services
from jobs.api import fastcreate, limits
from jobs.api.errors import (
    InvalidRequest,
    JobNotRetryable,
    JobNotSucceeded,
    JobTerminal,
    NotAReport,
    ReportNotSealed,
    StoreUnavailable,
    answers_database_outage,
    error_body,
    method_not_allowed,
)
from jobs.api.pagination import MAX_LIMIT, MAX_METADATA_FILTERS, job_page, list_filters
from jobs.api.parsers import IDEMPOTENCY_KEY_PATTERN, idempotency_key_from, read_json_body
from jobs.api.schema import ERROR_SCHEMA
from jobs.api.serializers import JobCreateSerializer, JobDetailSerializer, JobSerializer, job_as_dict
from jobs.kinds import KINDS
from jobs.kinds.report import reports
from jobs.markdown import to_html
from jobs.models import Job, JobStatus, Report

_JOB_PAGE = inline_serializer("JobPage", {
    "next": serializers.URLField(allow_null=True, help_text="The next (older) page, or null."),
    "previous": serializers.URLField(allow_null=True, help_text="The previous (newer) page, or null."),
    "results": JobSerializer(many=True),
})


class JobListCreateView(APIView):
    @extend_schema(
        operation_id="jobs_create",
        request=JobCreateSerializer,
        parameters=[OpenApiParameter(
            "Idempotency-Key", {"type": "string", "minLength": 1, "maxLength": 255, "pattern": IDEMPOTENCY_KEY_PATTERN},
            OpenApiParameter.HEADER, required=True,
            description="1 to 255 visible ASCII characters, sent once. The same key and body is the same job.",
        )],
        # The examples of docs/api.md, "Create a job: POST /v1/jobs": what a client sends (and what the API fuzzing
        # starts from to reach a real job).
        examples=[
            OpenApiExample("media", request_only=True, value={
                "kind": "media", "models": ["sandbox/video-keyed", "sandbox/image-lookup"],
                "input": {"prompt": "a lighthouse at dusk", "render_s": 2},
                "policy": {"attempts_per_model": 3, "fallback_on": ["exhausted", "unavailable", "refused"]},
                "metadata": {"campaign": "spring"},
            }),
            OpenApiExample("report", request_only=True, value={
                "kind": "report", "models": ["sandbox/llm"],
                "input": {"subject": {"name": "Ada Example", "born": "1990-04-12T06:30", "place": "Lyon"},
                          "chapters": ["sun", "moon"], "email": "ada@example.com"},
            }),
        ],
        responses={
            201: JobSerializer,
            202: OpenApiResponse(JobSerializer, description="A replay of the same key and body: the same job."),
            400: ERROR_SCHEMA, 401: ERROR_SCHEMA,
            409: OpenApiResponse(ERROR_SCHEMA, description="IDEMPOTENCY_CONFLICT, or OUTPUT_KEY_CONFLICT"),
            413: ERROR_SCHEMA, 415: ERROR_SCHEMA, 422: ERROR_SCHEMA,
            429: OpenApiResponse(ERROR_SCHEMA, description="RATE_LIMITED: over your creates per second; send it "
                                 "again after Retry-After under the same Idempotency-Key"),
        },
    )
    def post(self, request):
        key = idempotency_key_from(request)
        limits.take_create(request.user)  # before the body is read: a refused create costs next to nothing
        body = read_json_body(request)
        # A plain valid media body is validated without the serializer's machinery (jobs.api.fastcreate);
        # anything it is not sure of, every refusal included, is the serializer's to decide and answer.
        data = fastcreate.create_data(body)
        if data is None:
            serializer = JobCreateSerializer(data=body, client=request.user)
            if not serializer.is_valid() and selectors.idempotency_key_used(client_id=request.user.id, key=key):
                # Refused against the catalog as it is now, but the key has its job: a replay is judged by the
                # body's hash alone (JobCreateSerializer.replay), never by a catalog changed since.
                serializer = JobCreateSerializer(data=body, client=request.user, replay=True)
            serializer.is_valid(raise_exception=True)
            data = serializer.validated_data
        job, created = services.job_create(client=request.user, idempotency_key=key, data=data)
        # job_as_dict is what JobSerializer(job).data returns (its to_representation), without the serializer.
        return Response(job_as_dict(job), status=201 if created else 202)

    @extend_schema(
        operation_id="jobs_list",
        parameters=[
            OpenApiParameter("status", str, enum=JobStatus.values),
            OpenApiParameter("cursor", str, description="From `next` or `previous` of an earlier page."),
            OpenApiParameter("limit", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 50},
                             description="Jobs per page; a page also stops before it grows past about 1 MiB."),
            OpenApiParameter("created_after", OpenApiTypes.DATETIME,
                             description="Only jobs created at or after this time (ISO 8601, with its offset)."),
            OpenApiParameter("created_before", OpenApiTypes.DATETIME,
                             description="Only jobs created before this time (ISO 8601, with its offset)."),
            OpenApiParameter("metadata.{key}", str, description=(
                f"Only jobs whose metadata has `key` with this string value, e.g. `metadata.campaign=spring`; up "
                f"to {MAX_METADATA_FILTERS} such filters, all of which must match.")),
        ],
        responses={200: _JOB_PAGE, 401: ERROR_SCHEMA, 422: ERROR_SCHEMA},
    )
    def get(self, request):
        status = request.query_params.get("status")
        if status and status not in JobStatus.values:
            raise InvalidRequest("Unknown status.", fields={"status": [f"One of {', '.join(JobStatus.values)}."]})
        return Response(job_page(request, client_id=request.user.id, status=status or None,
                                 filters=list_filters(request.query_params)))


class JobDetailView(APIView):
    @extend_schema(operation_id="jobs_retrieve", responses={200: JobDetailSerializer, 401: ERROR_SCHEMA, 404: ERROR_SCHEMA})
    def get(self, request, job_id):
        return Response(JobDetailSerializer(_own_job(request, job_id)).data)


def _own_job(request, job_id) -> Job:
    """The client's job with its attempts, in one statement; another client's job is 404."""
    job = selectors.own_job(client_id=request.user.id, job_id=job_id)
    if job is None:
        raise NotFound("Not found.")
    return job


class JobCancelView(APIView):
    @extend_schema(operation_id="jobs_cancel", request=None,
                   responses={200: JobSerializer, 401: ERROR_SCHEMA, 404: ERROR_SCHEMA, 409: ERROR_SCHEMA})
    def post(self, request, job_id):
        job = _own_job(request, job_id)
        if not services.job_cancel(job=job):
            job = _own_job(request, job_id)
            raise JobTerminal(f"The job has already ended ({job.status}).", status=job.status)
        return Response(JobSerializer(_own_job(request, job_id)).data)


class JobRetryView(APIView):
    @extend_schema(operation_id="jobs_retry", request=None,
                   responses={202: JobSerializer, 401: ERROR_SCHEMA, 404: ERROR_SCHEMA, 409: ERROR_SCHEMA})
    def post(self, request, job_id):
        job = _own_job(request, job_id)
        retried = services.job_retry(job=job)
        if retried is None:
            job = _own_job(request, job_id)
            raise JobNotRetryable(
                f"Only failed or waiting jobs can be retried; this one is {job.status}.", status=job.status
            )
        return Response(JobSerializer(_own_job(request, job_id)).data, status=202)


class JobOutputView(APIView):
    @extend_schema(
        operation_id="jobs_output",
        responses={
            **{(200, content_type): OpenApiTypes.BINARY for content_type in OUTPUT_CONTENT_TYPES},
            302: OpenApiResponse(description="S3 store: a presigned URL of the object, valid for an hour."),
            303: OpenApiResponse(description="A report: its text is at GET /v1/jobs/{job_id}/report."),
            409: OpenApiResponse(ERROR_SCHEMA, description="JOB_NOT_SUCCEEDED: the job has no output (yet)."),
            401: ERROR_SCHEMA, 404: ERROR_SCHEMA, 503: ERROR_SCHEMA,
        },
    )
    def get(self, request, job_id):
        job = selectors.own_job_output(client_id=request.user.id, job_id=job_id)
        if job is None:  # another client's job, or none
            raise NotFound("Not found.")
        if KINDS[job.kind].text is not None:
            # A kind whose output is a text (a report's sealed chapters), not an object in the store (its
            # `output` names a link and a delivery, no store key): See Other, the endpoint that answers it.
            return Response(status=303, headers={"Location": reverse("job-report", args=[job.id])})
        if job.status != JobStatus.SUCCEEDED or not (job.output or {}).get("key"):
            raise JobNotSucceeded(f"This job has no output: it is {job.status}.", status=job.status)
        store = client_store(request.user.id)  # the client's own keys only, whatever the row says
        url = store.presigned_url(job.output["key"])
        if url:
            return Response(status=302, headers={"Location": url})
        try:
            handle = store.open(job.output["key"])
        except Exception as exc:  # noqa: BLE001
            if store_error_is_permanent(exc):  # gone from the store (or written before keys were per client)
                raise NotFound("Not found.") from None
            raise StoreUnavailable("The output store cannot be reached; try again shortly.") from None
        return FileResponse(handle, content_type=job.output.get("content_type"))


class WhoAmIView(APIView):
    """The authenticated client: a cheap way to check a key (and the benchmark's ceiling)."""

    @extend_schema(
        operation_id="whoami",
        responses={200: inline_serializer("WhoAmI", {"client_id": serializers.UUIDField(), "name": serializers.CharField()}),
                   401: ERROR_SCHEMA},
    )
    def get(self, request):
        return Response({"client_id": str(request.user.id), "name": request.user.name})


class _AnswerInJson(BaseContentNegotiation):
    """The report view reads Accept itself (Markdown unless JSON is asked for) and answers its errors in
    JSON: DRF's negotiation against the JSON renderer alone would refuse `Accept: text/markdown` (406)."""

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None


class JobReportView(APIView):
    """A sealed report's chapters in order: Markdown, or JSON with `Accept: application/json`."""

    content_negotiation_class = _AnswerInJson

    @extend_schema(
        operation_id="jobs_report",
        parameters=[OpenApiParameter("Accept", str, OpenApiParameter.HEADER,
                                     description="application/json for JSON; anything else is Markdown.")],
        responses={
            (200, "text/markdown"): OpenApiTypes.STR,
            (200, "application/json"): inline_serializer("Report", {
                "job_id": serializers.UUIDField(), "sealed_at": serializers.DateTimeField(),
                "figures": serializers.JSONField(),
                "chapters": inline_serializer("ReportText", {"key": serializers.CharField(),
                                                             "text": serializers.CharField()}, many=True),
            }),
            401: ERROR_SCHEMA, 404: OpenApiResponse(ERROR_SCHEMA, description="NOT_FOUND, or NOT_A_REPORT (a media job)"),
            409: OpenApiResponse(ERROR_SCHEMA, description="REPORT_NOT_SEALED"),
        },
    )
    def get(self, request, job_id):
        job = _own_job(request, job_id)
        if KINDS[job.kind].text is None:  # its output is an object in the store (GET /v1/jobs/{id}/output)
            raise NotAReport(f"This job is a {job.kind} job: it has an output, not a report.", kind=job.kind)
        report = Report.objects.filter(job_id=job.id).first()
        if report is None or report.sealed_at is None:
            raise ReportNotSealed("The report is not sealed yet.", status=job.status)
        if "application/json" in request.META.get("HTTP_ACCEPT", ""):
            return Response({
                "job_id": str(job.id), "sealed_at": report.sealed_at.isoformat().replace("+00:00", "Z"),
                "figures": report.figures,
                "chapters": [{"key": c.key, "text": c.text} for c in reports.chapters_in_order(report)],
            })
        return HttpResponse(reports.as_markdown(report), content_type="text/markdown; charset=utf-8")


# The report page runs no script, loads nothing and is framed by nobody: its one inline <style> carries a
# nonce made for the response, and nothing else may apply. Chapter text is escaped when rendered
# (jobs.markdown); this is the second wall, should any markup ever get through.
REPORT_PAGE_CSP = ("default-src 'none'; style-src 'nonce-{nonce}'; img-src 'none'; frame-ancestors 'none'; "
                   "base-uri 'none'; form-action 'none'")


def _report_page_response(request, template: str, context: dict, status: int):
    nonce = secrets.token_urlsafe(18)
    response = render(request, template, {**context, "csp_nonce": nonce}, status=status)
    response["Content-Security-Policy"] = REPORT_PAGE_CSP.format(nonce=nonce)
    response["X-Content-Type-Options"] = "nosniff"
    response["Referrer-Policy"] = "no-referrer"  # the URL is the bearer token: never sent onwards
    return response


@answers_database_outage  # a 503 with Retry-After while the database is away, not a 500
def report_page(request, token: str):
    """GET /r/{token}: the page behind the emailed link. Signed and expiring; a bad or expired token is
    404. Server-rendered, self-contained (no CDN, no external font), readable on a phone, under a strict
    Content-Security-Policy (REPORT_PAGE_CSP)."""
    report = reports.report_from_token(token)
    if report is None:
        return _report_page_response(request, "jobs/report_not_found.html", {}, status=404)
    if report.sealed_at is None:  # a duplicate payment's link, mailed before the first report sealed
        return _report_page_response(request, "jobs/report_pending.html", {}, status=202)
    shown = reports.layout(report)  # the template's, rendered when the report was loaded
    chapters = [{"key": c.key, "title": shown["headings"].get(c.key, c.key), "html": to_html(c.text or "")}
                for c in reports.chapters_in_order(report)]
    return _report_page_response(request, "jobs/report.html", {
        "report": report, "chapters": chapters, "layout": shown,
        "closing": to_html(shown["closing"]) if shown.get("closing") else ""}, status=200)


# --- spend (money is billing's; this is its API) ------------------------------------------------------------

def _money():
    """A money field: a new one for each use (a DRF field belongs to the one serializer it is bound to; one
    shared instance left the document with a single field named after its last use)."""
    return serializers.CharField(help_text="USD as a decimal string with 6 places")


_SPEND = inline_serializer("Spend", {
    "month": serializers.CharField(), "resets_at": serializers.DateTimeField(),
    "cap_usd": _money(), "spent_usd": _money(), "reserved_usd": _money(), "headroom_usd": _money(),
    "unpriced_attempts": serializers.IntegerField(),
    "by_model": inline_serializer("SpendByModel", {
        "model": serializers.CharField(), "spent_usd": _money(), "attempts": serializers.IntegerField(),
        "unpriced_attempts": serializers.IntegerField(),
    }, many=True),
})


class SpendView(APIView):
    """GET /v1/spend (docs/api.md, "Spend: GET /v1/spend"): a client's month, as the budget guard keeps it."""

    @extend_schema(
        operation_id="spend",
        parameters=[OpenApiParameter("month", {"type": "string", "pattern": months.MONTH_PATTERN},
                                     description="YYYY-MM (UTC); default: the current month")],
        responses={200: _SPEND, 401: ERROR_SCHEMA, 422: ERROR_SCHEMA},
    )
    def get(self, request):
        raw = request.query_params.get("month")
        try:
            month = months.parse_month(raw) if raw else months.month_of(timezone.now())
        except ValueError:
            raise InvalidRequest("Invalid month.", fields={"month": [months.MONTH_WORDS]}) from None
        return Response(billing_selectors.month_spend(request.user, month))


# --- provider callbacks --------------------------------------------------------------------------------------


@csrf_exempt
@answers_database_outage  # a 503 the provider sends again, as a DRF view's
def provider_callback(request, provider: str):
    """POST /v1/callbacks/{provider} (executor.callbacks): thin, unauthenticated by API key (the provider
    signs instead), and never an HTML page. The body is bounded by config.limits before it reaches here."""
    if request.method != "POST":
        return method_not_allowed("POST", "Callbacks are POSTed.")
    answer = callbacks.ring(provider, request.body, request.headers, wake=services.job_wake)
    if answer.status >= 400:
        return JsonResponse(error_body(answer.code, answer.message), status=answer.status)
    return JsonResponse({"status": answer.code}, status=answer.status)
