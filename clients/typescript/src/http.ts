/**
 * The transport: one `fetch` per try, a timeout per try, and the retry rule.
 *
 * - `idempotent` calls (every GET, `jobs.create` under its Idempotency-Key, `orders.create` under its
 *   payment id, `jobs.cancel`, `reportTemplates.setLive`) are tried again on any network error (refused,
 *   reset, closed without an answer, timed out), on `429` and `503` (after `Retry-After` when the answer
 *   says, at most 60 s), and on `500`, `502` and `504` (exponential back-off: 500 ms * 2^n, at most 8 s,
 *   with jitter).
 * - `unsent` calls (`jobs.retry`: a decision to pay again; `reportTemplates.create`, whose second try
 *   would write a second version) are tried again only on `429` and `503`, answers that prove payonce did
 *   not act. A network error may come after payonce acted, and fetch cannot tell a refused connection
 *   from a lost answer: it is thrown, never retried.
 */

import { APIConnectionError, APIError, PayonceError, errorFromAnswer, parseRetryAfter } from "./errors.js";
import { VERSION } from "./version.js";

export type RetryMode = "idempotent" | "unsent";

export interface Call {
  method: "GET" | "POST";
  /** A path (and query) under the client's base URL, or an absolute URL (a presigned one). */
  path: string;
  /** JSON text, sent as `application/json`. */
  body?: string;
  headers?: Record<string, string>;
  /** Send `Authorization` (default true; never to a URL outside the base URL). */
  auth?: boolean;
  mode: RetryMode;
  redirect?: RequestRedirect;
  signal?: AbortSignal;
  /** Leave the body unread (an event stream): the timeout then covers the answer's head only. */
  stream?: boolean;
  /** Try a 429 again (default true; `jobs.wait` wants TOO_MANY_STREAMS at once, to poll instead). */
  retry429?: boolean;
  /** An `unsent` call's advice when its answer may have been lost (default: read the job). */
  lostAnswer?: string;
}

export interface Answer {
  status: number;
  headers: Headers;
  url: string;
  /** The body (empty for a stream). */
  bytes: Uint8Array;
  /** A stream's response (its body unread), when `stream` was asked. */
  response: Response;
  /** Aborts a stream's connection. */
  abort: () => void;
  /** Whether an earlier try of this call may have reached payonce and been acted on. */
  maybeActed: boolean;
  /** The fetch `type`: "opaqueredirect" when a browser hides a redirect from `redirect: "manual"`. */
  type: ResponseType;
}

export interface TransportOptions {
  baseUrl: string;
  apiKey: string;
  maxRetries: number;
  timeoutMs: number;
  fetch: typeof fetch;
}

export const RETRY_AFTER_MAX_S = 60;
const BACKOFF_BASE_MS = 500;
const BACKOFF_MAX_MS = 8_000;

/** Exponential back-off with jitter: between half and all of min(500 ms * 2^n, 8 s). */
export function backoffMs(retry: number): number {
  const full = Math.min(BACKOFF_MAX_MS, BACKOFF_BASE_MS * 2 ** retry);
  return full / 2 + Math.random() * (full / 2);
}

/** Resolves after `ms`, or rejects with the signal's reason when it aborts first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

class TimedOut extends Error {}

/** Node's hook for `console.log` and `util.inspect` (a registered symbol: no Node import needed). */
export const INSPECT = Symbol.for("nodejs.util.inspect.custom");

export class Transport {
  readonly baseUrl: string;
  private readonly origin: string;
  private readonly prefix: string;
  private readonly options: Omit<TransportOptions, "apiKey">;
  // A private field, not a property: `console.log`, `JSON.stringify` and a debugger's object view of the
  // client (which holds this transport) never show the key.
  readonly #apiKey: string;

  constructor(options: TransportOptions) {
    const { apiKey, ...rest } = options;
    this.#apiKey = apiKey;
    this.options = rest;
    const base = new URL(options.baseUrl);
    this.baseUrl = base.href.replace(/\/+$/, "");
    this.origin = base.origin;
    this.prefix = base.pathname.replace(/\/+$/, "");
  }

  /** What `JSON.stringify` shows: where it sends, never the key. */
  toJSON(): { baseUrl: string } {
    return { baseUrl: this.baseUrl };
  }

  [INSPECT](): string {
    return `Transport { baseUrl: ${JSON.stringify(this.baseUrl)} }`;
  }

  get maxRetries(): number {
    return this.options.maxRetries;
  }

  get timeoutMs(): number {
    return this.options.timeoutMs;
  }

  /**
   * A URL payonce gave out (`next` of a page, a `Location`), as a path and query under this client's own
   * base URL: behind a proxy the host payonce sees is not the one this client reaches it at.
   */
  localPath(url: string): string {
    const parsed = new URL(url, this.baseUrl + "/");
    let path = parsed.pathname;
    if (this.prefix && (path === this.prefix || path.startsWith(this.prefix + "/"))) path = path.slice(this.prefix.length);
    return path + parsed.search;
  }

  private urlOf(path: string): string {
    return /^[a-z][a-z0-9+.-]*:/i.test(path) ? path : this.baseUrl + (path.startsWith("/") ? path : "/" + path);
  }

  /** The final answer of a call, after the retries its mode allows; an error status is returned, not thrown. */
  async send(call: Call): Promise<Answer> {
    const url = this.urlOf(call.path);
    const sameOrigin = new URL(url).origin === this.origin;
    // User-Agent names this library and its version (a browser may keep its own: it is not an error).
    const headers: Record<string, string> = {
      Accept: "application/json",
      "User-Agent": `payonce-client-typescript/${VERSION}`,
      ...call.headers,
    };
    if (call.auth !== false && sameOrigin) headers.Authorization = `Bearer ${this.#apiKey}`;
    if (call.body !== undefined) headers["Content-Type"] = "application/json";
    let maybeActed = false;

    for (let attempt = 0; ; attempt++) {
      const canRetry = attempt < this.options.maxRetries;
      const controller = new AbortController();
      const onAbort = () => controller.abort(call.signal?.reason);
      if (call.signal?.aborted) throw call.signal.reason;
      call.signal?.addEventListener("abort", onAbort, { once: true });
      const release = () => call.signal?.removeEventListener("abort", onAbort);
      const timer = setTimeout(() => controller.abort(new TimedOut()), this.options.timeoutMs);
      let response: Response;
      let bytes = new Uint8Array(0);
      try {
        const doFetch = this.options.fetch;
        response = await doFetch(url, {
          method: call.method,
          headers,
          body: call.body,
          redirect: call.redirect ?? "follow",
          signal: controller.signal,
        });
        if (!call.stream || response.status >= 300 || response.status === 0) {
          bytes = new Uint8Array(await response.arrayBuffer());
        }
      } catch (cause) {
        clearTimeout(timer);
        release();
        if (call.signal?.aborted) throw call.signal.reason;
        const timedOut = controller.signal.reason instanceof TimedOut;
        const error = new APIConnectionError(
          timedOut
            ? `${call.method} ${url}: no answer within ${this.options.timeoutMs} ms`
            : `${call.method} ${url}: ${describe(cause)}`,
          { cause },
        );
        maybeActed = true;
        if (call.mode === "idempotent" && canRetry) {
          await sleep(backoffMs(attempt), call.signal);
          continue;
        }
        if (call.mode === "unsent") {
          throw new APIConnectionError(
            `${error.message}. It was not sent again: payonce may have acted on it. ` +
              (call.lostAnswer ?? "Read the job (jobs.get) to see whether it did before you try again."),
            { cause },
          );
        }
        throw error;
      }
      clearTimeout(timer);
      if (!call.stream) release();
      const status = response.status;

      if ((status === 429 && call.retry429 !== false) || status === 503) {
        const retryAfterS = parseRetryAfter(response.headers.get("retry-after"));
        if (canRetry && (retryAfterS === undefined || retryAfterS <= RETRY_AFTER_MAX_S)) {
          release();
          // Never sooner than it says: the jitter is added, never taken off.
          const wait = retryAfterS === undefined ? backoffMs(attempt) : retryAfterS * 1000 + Math.random() * 250;
          await sleep(wait, call.signal);
          continue;
        }
      } else if ((status === 500 || status === 502 || status === 504) && call.mode === "idempotent") {
        maybeActed = true;
        if (canRetry) {
          release();
          await sleep(backoffMs(attempt), call.signal);
          continue;
        }
      }
      return {
        status,
        headers: response.headers,
        url: response.url || url,
        bytes,
        response,
        abort: () => {
          controller.abort();
          release();
        },
        maybeActed,
        type: response.type,
      };
    }
  }

  /** A call whose answer must be 2xx JSON: the parsed body, or the error of the answer thrown. */
  async json<T>(call: Call): Promise<T> {
    const answer = await this.send(call);
    if (answer.status >= 200 && answer.status < 300) return parseJson(answer) as T;
    throw answerError(answer);
  }
}

/** The error of a non-2xx answer. */
export function answerError(answer: Answer): APIError {
  return errorFromAnswer(answer.status, bodyOf(answer), answer.headers);
}

/** A body as JSON when it says so (or parses), else text. */
export function bodyOf(answer: Answer): unknown {
  const text = new TextDecoder().decode(answer.bytes);
  if (!text) return undefined;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

function parseJson(answer: Answer): unknown {
  const text = new TextDecoder().decode(answer.bytes);
  try {
    return JSON.parse(text);
  } catch (cause) {
    throw new PayonceError(`Expected JSON from ${answer.url}, got ${JSON.stringify(text.slice(0, 100))}`, {
      status: answer.status,
      body: text,
      headers: answer.headers,
      cause,
    });
  }
}

function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const cause = (error as { cause?: unknown }).cause;
  if (cause instanceof Error && cause.message && cause.message !== error.message) {
    return `${error.message} (${cause.message})`;
  }
  return error.message;
}
