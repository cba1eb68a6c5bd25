/**
 * Every error this library throws is a `PayonceError`:
 *
 * - `APIError`: payonce (or something in front of it) answered with an error status. payonce's errors are
 *   `{"error": {"code", "message", ...}}` (docs/api.md, "Every error code"); each code has a subclass below,
 *   and a code this version does not know is a plain `APIError` with that `code`.
 * - `APIConnectionError`: no answer was heard (refused, reset, closed without an answer, timed out), after
 *   the retries the call allows.
 * - `WaitTimeout`: `jobs.wait` ran out of time before the job settled.
 * - `WebhookVerificationError`: `verifyWebhook` refused a delivery.
 */

import type { components } from "./schema.js";

export class PayonceError extends Error {
  /** The HTTP status of the answer, when there was one. */
  readonly status: number | undefined;
  /** payonce's error code (`IDEMPOTENCY_CONFLICT`, ...), when the answer named one. */
  readonly code: string | undefined;
  /** The answer's body: parsed JSON when it was JSON, else its text. */
  readonly body: unknown;
  /** The answer's headers (`Retry-After`, ...). */
  readonly headers: Headers | undefined;

  constructor(
    message: string,
    init: { status?: number; code?: string; body?: unknown; headers?: Headers; cause?: unknown } = {},
  ) {
    super(message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = new.target.name;
    this.status = init.status;
    this.code = init.code;
    this.body = init.body;
    this.headers = init.headers;
  }
}

/** An error answer. `error` is the whole `{"code", "message", ...}` object, with the fields the code names. */
export class APIError extends PayonceError {
  declare readonly status: number;
  /** The answer's `error` object, with whatever the code names (`job_id`, `fields`, `status`, ...). */
  readonly error: { code?: string; message?: string; [field: string]: unknown };

  constructor(message: string, init: { status: number; code?: string; body?: unknown; headers?: Headers }) {
    super(message, init);
    const body = init.body as { error?: unknown } | undefined;
    this.error =
      body && typeof body === "object" && body.error && typeof body.error === "object"
        ? (body.error as APIError["error"])
        : {};
  }

  /** `job_id` of a conflict (`IDEMPOTENCY_CONFLICT`, `OUTPUT_KEY_CONFLICT`): the job that holds the key. */
  get jobId(): string | undefined {
    return typeof this.error.job_id === "string" ? this.error.job_id : undefined;
  }

  /** `fields` of a `422 INVALID_REQUEST`: each field and why. */
  get fields(): unknown {
    return this.error.fields;
  }

  /** `Retry-After` in seconds, when the answer said. */
  get retryAfterS(): number | undefined {
    return parseRetryAfter(this.headers?.get("retry-after") ?? null);
  }
}

// One subclass per code of docs/api.md, "Every error code" (the document's `ErrorCode` enum, and the two
// of /metrics, which the document leaves out). `instanceof` picks them out; `.code` is the same string.
export class IdempotencyKeyMissing extends APIError {}
export class IdempotencyKeyInvalid extends APIError {}
export class CallbackUnverified extends APIError {}
export class BadRequest extends APIError {}
export class Unauthenticated extends APIError {}
export class MetricsUnauthorized extends APIError {}
export class MetricsForbidden extends APIError {}
export class Forbidden extends APIError {}
export class NotFound extends APIError {}
export class NotAReport extends APIError {}
export class CallbackNotConfigured extends APIError {}
export class CallbackUnknownGeneration extends APIError {}
export class MethodNotAllowed extends APIError {}
export class NotAcceptable extends APIError {}
export class RequestTimeout extends APIError {}
export class IdempotencyConflict extends APIError {}
export class OutputKeyConflict extends APIError {}
export class JobTerminal extends APIError {}
export class JobNotRetryable extends APIError {}
export class JobNotSucceeded extends APIError {}
export class ReportNotSealed extends APIError {}
export class CallbackEarly extends APIError {}
export class PayloadTooLarge extends APIError {}
export class HeadersTooLarge extends APIError {}
export class UnsupportedMediaType extends APIError {}
export class InvalidRequest extends APIError {}
export class TooManyStreams extends APIError {}
export class RateLimited extends APIError {}
export class InternalError extends APIError {}
export class DatabaseUnavailable extends APIError {}
export class StoreUnavailable extends APIError {}

type APIErrorClass = new (message: string, init: ConstructorParameters<typeof APIError>[1]) => APIError;

/** Every code payonce answers an error with (its OpenAPI document's `ErrorCode`). */
export type ErrorCode = components["schemas"]["ErrorCode"];

/**
 * payonce's error code -> the class thrown for it. Typed by the document's enum: a code added to payonce
 * does not compile here until it has its class (`ERROR`, a refusal no code names, is a plain APIError).
 */
export const ERROR_CLASSES: Readonly<Record<ErrorCode | "METRICS_UNAUTHORIZED" | "METRICS_FORBIDDEN", APIErrorClass>> = Object.freeze({
  IDEMPOTENCY_KEY_MISSING: IdempotencyKeyMissing,
  IDEMPOTENCY_KEY_INVALID: IdempotencyKeyInvalid,
  CALLBACK_UNVERIFIED: CallbackUnverified,
  BAD_REQUEST: BadRequest,
  UNAUTHENTICATED: Unauthenticated,
  METRICS_UNAUTHORIZED: MetricsUnauthorized,
  METRICS_FORBIDDEN: MetricsForbidden,
  FORBIDDEN: Forbidden,
  NOT_FOUND: NotFound,
  NOT_A_REPORT: NotAReport,
  CALLBACK_NOT_CONFIGURED: CallbackNotConfigured,
  CALLBACK_UNKNOWN_GENERATION: CallbackUnknownGeneration,
  METHOD_NOT_ALLOWED: MethodNotAllowed,
  NOT_ACCEPTABLE: NotAcceptable,
  REQUEST_TIMEOUT: RequestTimeout,
  IDEMPOTENCY_CONFLICT: IdempotencyConflict,
  OUTPUT_KEY_CONFLICT: OutputKeyConflict,
  JOB_TERMINAL: JobTerminal,
  JOB_NOT_RETRYABLE: JobNotRetryable,
  JOB_NOT_SUCCEEDED: JobNotSucceeded,
  REPORT_NOT_SEALED: ReportNotSealed,
  CALLBACK_EARLY: CallbackEarly,
  PAYLOAD_TOO_LARGE: PayloadTooLarge,
  HEADERS_TOO_LARGE: HeadersTooLarge,
  UNSUPPORTED_MEDIA_TYPE: UnsupportedMediaType,
  INVALID_REQUEST: InvalidRequest,
  TOO_MANY_STREAMS: TooManyStreams,
  RATE_LIMITED: RateLimited,
  INTERNAL_ERROR: InternalError,
  ERROR: APIError,
  DATABASE_UNAVAILABLE: DatabaseUnavailable,
  STORE_UNAVAILABLE: StoreUnavailable,
});

/** The error for an answer: the class of its code, else `APIError`. */
export function errorFromAnswer(status: number, body: unknown, headers: Headers): APIError {
  const error = (body && typeof body === "object" ? (body as { error?: unknown }).error : undefined) as
    | { code?: unknown; message?: unknown }
    | undefined;
  const code = error && typeof error.code === "string" ? error.code : undefined;
  const message =
    error && typeof error.message === "string"
      ? error.message
      : `HTTP ${status}${typeof body === "string" && body ? `: ${body.slice(0, 200)}` : ""}`;
  const classes: Readonly<Record<string, APIErrorClass>> = ERROR_CLASSES;
  const Class = (code !== undefined && Object.hasOwn(classes, code) ? classes[code] : undefined) ?? APIError;
  return new Class(message, { status, code, body, headers });
}

/** No answer was heard: the request may or may not have reached payonce. */
export class APIConnectionError extends PayonceError {}

/** `jobs.wait` ran out of time; `job` is the last state seen (if any). */
export class WaitTimeout extends PayonceError {
  readonly jobId: string;
  readonly job: unknown;

  constructor(message: string, jobId: string, job?: unknown) {
    super(message);
    this.jobId = jobId;
    this.job = job;
  }
}

/** A webhook delivery that does not verify: bad signature, missing headers, or a timestamp out of tolerance. */
export class WebhookVerificationError extends PayonceError {}

/** `Retry-After` (seconds, or an HTTP date) in seconds, or undefined when absent or unreadable. */
export function parseRetryAfter(value: string | null, now: number = Date.now()): number | undefined {
  if (value === null) return undefined;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Number(text);
  if (/^\d+\.\d+$/.test(text)) return Number(text);
  const at = Date.parse(text);
  if (Number.isNaN(at)) return undefined;
  return Math.max(0, (at - now) / 1000);
}
