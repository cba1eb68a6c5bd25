"""The errors this library raises.

Every answer payonce gives in error is JSON, ``{"error": {"code": "...", "message": "...", ...}}``, and the
code is stable: a program decides on ``code`` (or on the class it maps to), never on the message, which is
written for people. Each code payonce documents has a class of its own here, so that ``except
IdempotencyConflict:`` says what it means; a code this version does not know yet is still an
:class:`APIError`, with its code, so a newer server never breaks an older client.

What is *not* an answer is kept apart: :class:`APIConnectionError` means no answer came at all, which for
a request that spends money is a different thing from a refusal (it may or may not have been taken).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, Type, TypeVar

from ._retry import parse_retry_after

if TYPE_CHECKING:
    from ._models import Job

__all__ = [
    "ERROR_CLASSES",
    "APIConnectionError",
    "APIError",
    "BadRequest",
    "DatabaseUnavailable",
    "Forbidden",
    "IdempotencyConflict",
    "IdempotencyKeyInvalid",
    "IdempotencyKeyMissing",
    "InternalError",
    "InvalidRequest",
    "JobNotRetryable",
    "JobNotSucceeded",
    "JobTerminal",
    "MethodNotAllowed",
    "NotAReport",
    "NotAcceptable",
    "NotFound",
    "OutputKeyConflict",
    "PayloadTooLarge",
    "PayonceError",
    "ReportNotSealed",
    "RequestTimeout",
    "StoreUnavailable",
    "TooManyStreams",
    "RateLimited",
    "Unauthenticated",
    "UnsupportedMediaType",
    "WaitTimeout",
    "WebhookVerificationError",
    "error_for_code",
]


class PayonceError(Exception):
    """The base of every error of this library.

    ``status``, ``code``, ``body`` and ``headers`` are set when the error is an HTTP answer (an
    :class:`APIError`); they are ``None`` (``headers`` empty) otherwise.
    """

    def __init__(self, message: str, *, status: Optional[int] = None, code: Optional[str] = None,
                 body: Any = None, headers: Optional[Mapping[str, str]] = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.body = body
        self.headers: Dict[str, str] = {k.lower(): v for k, v in (headers or {}).items()}

    def __str__(self) -> str:
        if self.code is not None:
            return f"{self.status} {self.code}: {self.message}"
        return self.message


class APIError(PayonceError):
    """payonce answered, and the answer is an error (a status of 400 or more).

    ``body`` is the parsed JSON answer (``None`` when it was not JSON, for example an HTML page from a
    proxy in front of payonce); ``details`` is its ``error`` object, which carries what the code names
    (``fields`` for ``INVALID_REQUEST``, ``job_id`` for a conflict, ``status`` for a job that cannot do
    what was asked). ``attempts`` is how many times this request was sent before this answer was kept.
    """

    code_name: Optional[str] = None  # the payonce code a subclass stands for

    def __init__(self, message: str, *, status: int, code: Optional[str] = None, body: Any = None,
                 headers: Optional[Mapping[str, str]] = None, attempts: int = 1):
        super().__init__(message, status=status, code=code, body=body, headers=headers)
        self.attempts = attempts

    @property
    def details(self) -> Dict[str, Any]:
        error = self.body.get("error") if isinstance(self.body, dict) else None
        return error if isinstance(error, dict) else {}

    @property
    def retry_after(self) -> Optional[float]:
        """The answer's ``Retry-After`` in seconds, when it had one."""
        return parse_retry_after(self.headers.get("retry-after"))


class APIConnectionError(PayonceError):
    """No answer came: the connection could not be made, broke, timed out, or was closed before the
    answer arrived, on every try this library was allowed to make.

    ``maybe_sent`` says whether the request may have reached payonce (and been acted on) anyway: it is
    ``False`` only when no connection was ever made.
    """

    def __init__(self, message: str, *, maybe_sent: bool = True, attempts: int = 1):
        super().__init__(message)
        self.maybe_sent = maybe_sent
        self.attempts = attempts


class WaitTimeout(PayonceError):
    """``jobs.wait`` gave up before the job ended or waited for a person. The job goes on: ``job`` is the
    last state seen, and waiting again later is always fine."""

    def __init__(self, message: str, *, job: Optional[Job] = None):
        super().__init__(message)
        self.job = job


class WebhookVerificationError(PayonceError):
    """A webhook request that must not be trusted: a signature that does not match the secret, a body
    changed on the way, missing headers, or a timestamp outside the tolerance (a replay)."""


ERROR_CLASSES: Dict[str, Type[APIError]] = {}
"""payonce's error code -> the class raised for it."""


_E = TypeVar("_E", bound="Type[APIError]")


def _code(name: str) -> Callable[[_E], _E]:
    def register(cls: _E) -> _E:
        cls.code_name = name
        ERROR_CLASSES[name] = cls
        return cls

    return register


@_code("IDEMPOTENCY_KEY_MISSING")
class IdempotencyKeyMissing(APIError):
    """400: ``POST /v1/jobs`` without an ``Idempotency-Key`` (this library always sends one)."""


@_code("IDEMPOTENCY_KEY_INVALID")
class IdempotencyKeyInvalid(APIError):
    """400: a key that is not 1 to 255 visible ASCII characters."""


@_code("IDEMPOTENCY_CONFLICT")
class IdempotencyConflict(APIError):
    """409: the same ``Idempotency-Key`` (or payment id) was used with a different body. ``details["job_id"]``
    names the job the key already stands for. Nothing was created."""


@_code("OUTPUT_KEY_CONFLICT")
class OutputKeyConflict(APIError):
    """409: the ``output_key`` is held by another of your jobs (``details["job_id"]``)."""


@_code("INVALID_REQUEST")
class InvalidRequest(APIError):
    """422: a body, parameter or query that is not valid; ``fields`` (``details["fields"]``) names each field
    and why, e.g. ``{"system": ["The attribute '__class__' is not allowed: ..."]}``."""

    @property
    def fields(self) -> Dict[str, Any]:
        fields = self.details.get("fields")
        return fields if isinstance(fields, dict) else {}


@_code("UNAUTHENTICATED")
class Unauthenticated(APIError):
    """401: no API key, or a bad one."""


@_code("FORBIDDEN")
class Forbidden(APIError):
    """403: not allowed."""


@_code("NOT_FOUND")
class NotFound(APIError):
    """404: no such job or order *of yours* (another client's is the same 404), or no such path."""


@_code("NOT_A_REPORT")
class NotAReport(APIError):
    """404: ``report()`` of a media job."""


@_code("METHOD_NOT_ALLOWED")
class MethodNotAllowed(APIError):
    """405."""


@_code("NOT_ACCEPTABLE")
class NotAcceptable(APIError):
    """406."""


@_code("REQUEST_TIMEOUT")
class RequestTimeout(APIError):
    """408: the body did not arrive in time (nothing was acted on)."""


@_code("JOB_TERMINAL")
class JobTerminal(APIError):
    """409: cancel of a job that has already ended; ``details["status"]`` says how."""


@_code("JOB_NOT_RETRYABLE")
class JobNotRetryable(APIError):
    """409: retry of a job that is not ``failed`` or ``waiting``."""


@_code("JOB_NOT_SUCCEEDED")
class JobNotSucceeded(APIError):
    """409: ``output()`` of a job with no output (yet); ``details["status"]`` is its status."""


@_code("REPORT_NOT_SEALED")
class ReportNotSealed(APIError):
    """409: ``report()`` before the report is sealed."""


@_code("PAYLOAD_TOO_LARGE")
class PayloadTooLarge(APIError):
    """413."""


@_code("HEADERS_TOO_LARGE")
class HeadersTooLarge(APIError):
    """431: the request line and headers exceed the server's limit (16 KiB by default)."""


@_code("UNSUPPORTED_MEDIA_TYPE")
class UnsupportedMediaType(APIError):
    """415."""


@_code("TOO_MANY_STREAMS")
class TooManyStreams(APIError):
    """429: one event stream more than payonce allows (per client or per process)."""


@_code("RATE_LIMITED")
class RateLimited(APIError):
    """429: a create over the client's creates per second; sent again after ``Retry-After`` under the same key
    (the retry rule does it), so this is raised only once the retries are used up."""


@_code("INTERNAL_ERROR")
class InternalError(APIError):
    """500: a bug in payonce."""


@_code("DATABASE_UNAVAILABLE")
class DatabaseUnavailable(APIError):
    """503: payonce's database is restarting or unreachable."""


@_code("STORE_UNAVAILABLE")
class StoreUnavailable(APIError):
    """503: the output store cannot be reached."""


@_code("BAD_REQUEST")
class BadRequest(APIError):
    """400: a request payonce cannot read at all."""


def error_for_code(code: Optional[str]) -> Type[APIError]:
    """The class for an error code; :class:`APIError` for a code this version does not know."""
    return ERROR_CLASSES.get(code or "", APIError)
