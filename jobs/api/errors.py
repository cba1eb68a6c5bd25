"""Every API error is `{"error": {"code": "...", "message": "...", ...}}` with a stable code (docs/api.md,
"Every error code")."""

import functools
import logging

from asgiref.sync import iscoroutinefunction
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response

logger = logging.getLogger(__name__)


class ApiError(exceptions.APIException):
    """An error answer with a stable code. Subclasses name the status and the code."""

    status_code = status.HTTP_400_BAD_REQUEST
    code = "BAD_REQUEST"

    def __init__(self, message: str, **extra):
        super().__init__(message)
        self.message = message
        self.extra = extra


class IdempotencyKeyMissing(ApiError):
    status_code = status.HTTP_400_BAD_REQUEST
    code = "IDEMPOTENCY_KEY_MISSING"


class IdempotencyKeyInvalid(ApiError):
    status_code = status.HTTP_400_BAD_REQUEST
    code = "IDEMPOTENCY_KEY_INVALID"


class IdempotencyConflict(ApiError):
    status_code = status.HTTP_409_CONFLICT
    code = "IDEMPOTENCY_CONFLICT"


class OutputKeyConflict(ApiError):
    status_code = status.HTTP_409_CONFLICT
    code = "OUTPUT_KEY_CONFLICT"


class ReportNotSealed(ApiError):
    status_code = status.HTTP_409_CONFLICT
    code = "REPORT_NOT_SEALED"


class NotAReport(ApiError):
    """GET /v1/jobs/{id}/report of a media job: there is no report to wait for, so not a 409."""

    status_code = status.HTTP_404_NOT_FOUND
    code = "NOT_A_REPORT"


class TooManyStreams(ApiError):
    """One event stream more than SSE_MAX_PER_CLIENT (scope "client") or SSE_MAX_PER_PROCESS ("process")."""

    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    code = "TOO_MANY_STREAMS"


class RateLimited(ApiError):
    """A create over its client's creates per second (jobs.api.limits): nothing was read or written. The
    answer's Retry-After says when a token is there; the same request then, under the same key, is taken."""

    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    code = "RATE_LIMITED"

    def __init__(self, message: str, *, retry_after: int, **extra):
        super().__init__(message, **extra)
        self.retry_after = retry_after


class StoreUnavailable(ApiError):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    code = "STORE_UNAVAILABLE"


class InvalidRequest(ApiError):
    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    code = "INVALID_REQUEST"


class JobTerminal(ApiError):
    status_code = status.HTTP_409_CONFLICT
    code = "JOB_TERMINAL"


class JobNotRetryable(ApiError):
    status_code = status.HTTP_409_CONFLICT
    code = "JOB_NOT_RETRYABLE"


class JobNotSucceeded(ApiError):
    """GET /v1/jobs/{id}/output of a job of the client's own that has no output (yet): a conflict with
    the job's state, which the error names, not a missing job."""

    status_code = status.HTTP_409_CONFLICT
    code = "JOB_NOT_SUCCEEDED"


class PayloadTooLarge(ApiError):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    code = "PAYLOAD_TOO_LARGE"


class UnsupportedMediaType(ApiError):
    status_code = status.HTTP_415_UNSUPPORTED_MEDIA_TYPE
    code = "UNSUPPORTED_MEDIA_TYPE"


# Every code an answer of the API can carry (`error.code`), for the OpenAPI document's `ErrorCode` enum and
# so for the client libraries' error classes. tests/jobs/test_error_codes.py finds every code the code
# base answers with and fails on one missing here or from docs/api.md's table.
ERROR_CODES = (
    "BAD_REQUEST", "IDEMPOTENCY_KEY_MISSING", "IDEMPOTENCY_KEY_INVALID", "CALLBACK_UNVERIFIED",
    "UNAUTHENTICATED", "FORBIDDEN",
    "NOT_FOUND", "NOT_A_REPORT", "CALLBACK_NOT_CONFIGURED", "CALLBACK_UNKNOWN_GENERATION",
    "METHOD_NOT_ALLOWED", "NOT_ACCEPTABLE", "REQUEST_TIMEOUT",
    "IDEMPOTENCY_CONFLICT", "OUTPUT_KEY_CONFLICT", "JOB_TERMINAL", "JOB_NOT_RETRYABLE", "JOB_NOT_SUCCEEDED",
    "REPORT_NOT_SEALED", "CALLBACK_EARLY",
    "PAYLOAD_TOO_LARGE", "UNSUPPORTED_MEDIA_TYPE", "INVALID_REQUEST",
    "HEADERS_TOO_LARGE", "TOO_MANY_STREAMS", "RATE_LIMITED",
    "INTERNAL_ERROR", "ERROR",
    "DATABASE_UNAVAILABLE", "STORE_UNAVAILABLE",
)


def error_body(code: str, message: str, **extra) -> dict:
    return {"error": {"code": code, "message": message, **extra}}


def method_not_allowed(allow: str, message: str) -> JsonResponse:
    """The JSON 405 of a plain Django view (DRF's views answer theirs through the handler below), with the
    `Allow` header naming what the view does take."""
    response = JsonResponse(error_body("METHOD_NOT_ALLOWED", message), status=405)
    response["Allow"] = allow
    return response


# PostgreSQL restarting or unreachable (the storm restarts it): a passing outage, not a bug, so never a
# 500. DRF's views meet it in api_exception_handler; a plain Django view (a provider's callback, the
# event stream, the report page) through answers_database_outage. Both answer with database_unavailable.
DATABASE_OUTAGE = (OperationalError, InterfaceError)


def database_unavailable(exc: Exception, response_class=JsonResponse):
    """The answer to a request that met the database away: `503 DATABASE_UNAVAILABLE` with `Retry-After`.
    The caller sends it again: the same Idempotency-Key gives the same job, a provider its callback again
    (it retries a non-2xx), whatever was committed. `response_class` is DRF's Response for a DRF view."""
    logger.warning("database unavailable: %s", exc)
    response = response_class(error_body("DATABASE_UNAVAILABLE", "The database is unavailable; try again shortly."),
                              status=503)
    response["Retry-After"] = "1"
    return response


def answers_database_outage(view):
    """A plain Django view (sync or async) that answers a database outage as the API's DRF views do
    (database_unavailable), instead of Django's 500. Only what is raised before the answer is returned:
    a stream already started cannot change its status."""
    if iscoroutinefunction(view):
        @functools.wraps(view)
        async def guarded_async(request, *args, **kwargs):
            try:
                return await view(request, *args, **kwargs)
            except DATABASE_OUTAGE as exc:
                return database_unavailable(exc)

        return guarded_async

    @functools.wraps(view)
    def guarded(request, *args, **kwargs):
        try:
            return view(request, *args, **kwargs)
        except DATABASE_OUTAGE as exc:
            return database_unavailable(exc)

    return guarded


# DRF's own exceptions -> (code, default message).
_DRF_CODES = {
    exceptions.NotAuthenticated: "UNAUTHENTICATED",
    exceptions.AuthenticationFailed: "UNAUTHENTICATED",
    exceptions.PermissionDenied: "FORBIDDEN",
    exceptions.NotFound: "NOT_FOUND",
    exceptions.MethodNotAllowed: "METHOD_NOT_ALLOWED",
    exceptions.NotAcceptable: "NOT_ACCEPTABLE",
    exceptions.UnsupportedMediaType: "UNSUPPORTED_MEDIA_TYPE",
}


def api_exception_handler(exc, context):
    """DRF's EXCEPTION_HANDLER: map every exception to the JSON error body; never an HTML page."""
    if isinstance(exc, ApiError):
        response = Response(error_body(exc.code, exc.message, **exc.extra), status=exc.status_code)
        if getattr(exc, "retry_after", None) is not None:
            response["Retry-After"] = str(exc.retry_after)
        return response
    if isinstance(exc, exceptions.ValidationError) or isinstance(exc, exceptions.ParseError):
        detail = exc.detail if isinstance(exc, exceptions.ValidationError) else {"body": [str(exc.detail)]}
        return Response(
            error_body("INVALID_REQUEST", "The request body is not valid.", fields=detail),
            status=status.HTTP_422_UNPROCESSABLE_ENTITY,
        )
    if isinstance(exc, DATABASE_OUTAGE):
        return database_unavailable(exc, Response)
    if isinstance(exc, RequestDataTooBig):
        return Response(error_body("PAYLOAD_TOO_LARGE", "The request body is too large."), status=413)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    if isinstance(exc, exceptions.APIException):
        code = next((c for cls, c in _DRF_CODES.items() if isinstance(exc, cls)), "ERROR")
        response = Response(error_body(code, str(exc.detail)), status=exc.status_code)
        if isinstance(exc, (exceptions.NotAuthenticated, exceptions.AuthenticationFailed)):
            auth_header = getattr(exc, "auth_header", None)
            response["WWW-Authenticate"] = auth_header or 'Bearer realm="payonce"'
        if getattr(exc, "wait", None):
            response["Retry-After"] = str(int(exc.wait))
        return response
    return None  # Django answers with handler500 (JSON, below) and logs the traceback


def json_not_found(request, exception=None):
    return JsonResponse(error_body("NOT_FOUND", "Not found."), status=404)


def json_server_error(request):
    return JsonResponse(error_body("INTERNAL_ERROR", "Internal server error."), status=500)


def json_bad_request(request, exception=None):
    return JsonResponse(error_body("BAD_REQUEST", "Bad request."), status=400)


def json_permission_denied(request, exception=None):
    return JsonResponse(error_body("FORBIDDEN", "Forbidden."), status=403)
