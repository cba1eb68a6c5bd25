import {
  APIConnectionError,
  APIError,
  JobTerminal,
  PayonceError,
  TooManyStreams,
  WaitTimeout,
} from "./errors.js";
import { type Answer, type Call, INSPECT, Transport, answerError, backoffMs, sleep } from "./http.js";
import { EventStreamParser } from "./sse.js";
import type {
  Job,
  JobDetail,
  JobCreateParams,
  JobEvent,
  JobStatus,
  Order,
  OrderCreateRequest,
  Output,
  Report,
  ReportTemplateCreateRequest,
  ReportTemplateLive,
  ReportTemplateSummary,
  ReportTemplateVersion,
  ReportTemplateVersionCreated,
  Spend,
  WhoAmI,
} from "./types.js";

export interface PayonceOptions {
  /** Where payonce's `web` process answers, e.g. `https://payonce.example.com` (a path prefix is kept). */
  baseUrl: string;
  /** The client's API key (`Authorization: Bearer ...`). Required: `undefined` (an unset variable) throws here. */
  apiKey: string | undefined;
  /** Tries after the first, for the calls that may be tried again (default 5). */
  maxRetries?: number;
  /** How long one try may take, answer included, in milliseconds (default 30,000). */
  timeoutMs?: number;
  /** The `fetch` to use (default the runtime's own). */
  fetch?: typeof fetch;
}

export interface RequestOptions {
  /** Abort the call (and its retries). */
  signal?: AbortSignal;
}

export interface ListOptions extends RequestOptions {
  status?: JobStatus;
  /** Jobs per page (1 to 200; payonce's default 50). Every page is read either way. */
  limit?: number;
}

export interface WaitOptions extends RequestOptions {
  /** Give up after this long, in milliseconds, with `WaitTimeout` (default 10 minutes). */
  timeoutMs?: number;
  /** The gap between two reads of the job when polling, in milliseconds (default 2,000). */
  pollIntervalMs?: number;
}

export interface EventsOptions extends RequestOptions {
  /** The id of the last frame already seen: nothing up to it is sent again. */
  lastEventId?: string;
}

export interface ReportOptions extends RequestOptions {
  format?: "markdown" | "json";
}

/** The statuses `wait` returns on: the three final ones, and `waiting` (a person must decide). */
export const SETTLED_STATUSES: ReadonlySet<string> = new Set(["succeeded", "failed", "cancelled", "waiting"]);

const STREAM_FAILURES_BEFORE_POLLING = 3;
const STREAM_IDLE_MIN_MS = 20_000; // payonce sends a keep-alive comment every 15 s
const STREAM_HEALTHY_MS = 5_000;

const enc = encodeURIComponent;

/**
 * payonce's client.
 *
 *     const po = new Payonce({ baseUrl: "http://127.0.0.1:8000", apiKey: process.env.PAYONCE_KEY });
 *     const job = await po.jobs.create({ kind: "media", models: ["sandbox/video-keyed"], input: { prompt: "a lighthouse" } });
 *     const done = await po.jobs.wait(job.id);
 */
export class Payonce {
  readonly jobs: Jobs;
  readonly orders: Orders;
  readonly reportTemplates: ReportTemplates;
  /** @internal */
  readonly http: Transport;

  constructor(options: PayonceOptions) {
    if (!options || !options.baseUrl) throw new TypeError("Payonce: baseUrl is required.");
    if (!options.apiKey) throw new TypeError("Payonce: apiKey is required.");
    const maxRetries = options.maxRetries ?? 5;
    const timeoutMs = options.timeoutMs ?? 30_000;
    if (!(Number.isInteger(maxRetries) && maxRetries >= 0)) throw new RangeError("maxRetries is a whole number >= 0.");
    if (!(timeoutMs > 0)) throw new RangeError("timeoutMs must be positive.");
    const given = options.fetch;
    // Called detached: Workers and browsers refuse a `fetch` called as a method of another object.
    const doFetch: typeof fetch = given ?? ((input, init) => globalThis.fetch(input, init));
    const apiKey: string = options.apiKey;
    this.http = new Transport({ baseUrl: options.baseUrl, apiKey, maxRetries, timeoutMs, fetch: doFetch });
    this.jobs = new Jobs(this.http);
    this.orders = new Orders(this.http);
    this.reportTemplates = new ReportTemplates(this.http);
  }

  /** What `JSON.stringify(client)` shows: the base URL, never the API key. */
  toJSON(): { baseUrl: string } {
    return { baseUrl: this.http.baseUrl };
  }

  /** What `console.log(client)` shows in Node: the base URL, never the API key. */
  [INSPECT](): string {
    return `Payonce { baseUrl: ${JSON.stringify(this.http.baseUrl)} }`;
  }

  /** GET /v1/spend: the month's cap, spent, reserved, headroom and unpriced attempts, by model. */
  spend({ month, signal }: { month?: string } & RequestOptions = {}): Promise<Spend> {
    const query = month === undefined ? "" : `?month=${enc(month)}`;
    return this.http.json<Spend>({ method: "GET", path: `/v1/spend${query}`, mode: "idempotent", signal });
  }

  /** GET /v1/whoami: which client the API key belongs to. */
  whoami({ signal }: RequestOptions = {}): Promise<WhoAmI> {
    return this.http.json<WhoAmI>({ method: "GET", path: "/v1/whoami", mode: "idempotent", signal });
  }
}

export class Jobs {
  constructor(private readonly http: Transport) {}

  /**
   * POST /v1/jobs. Without `idempotencyKey` one is made for this call (`crypto.randomUUID()`); every try
   * of the call sends the same key and the same bytes, so a retry after a lost answer is answered `202`
   * with the job the first try made, never a second job. The same key with another body throws
   * `IdempotencyConflict`. `priority` (1 to 5) is sent only when given (payonce's default: 3).
   */
  async create(params: JobCreateParams, { signal }: RequestOptions = {}): Promise<Job> {
    const { idempotencyKey, ...body } = params;
    const key = idempotencyKey ?? randomKey();
    return this.http.json<Job>({
      method: "POST",
      path: "/v1/jobs",
      body: JSON.stringify(body),
      headers: { "Idempotency-Key": key },
      mode: "idempotent",
      signal,
    });
  }

  /** GET /v1/jobs/{id}: the job, with `waiting` (null, or why a job that has not sent its paid call yet waits). */
  get(id: string, { signal }: RequestOptions = {}): Promise<JobDetail> {
    return this.http.json<JobDetail>({ method: "GET", path: `/v1/jobs/${enc(id)}`, mode: "idempotent", signal });
  }

  /** Every job of the client, newest first, page after page (GET /v1/jobs, following `next`). */
  async *list({ status, limit, signal }: ListOptions = {}): AsyncGenerator<Job, void, undefined> {
    const query = new URLSearchParams();
    if (status !== undefined) query.set("status", status);
    if (limit !== undefined) query.set("limit", String(limit));
    const search = query.toString();
    let path: string | null = `/v1/jobs${search ? `?${search}` : ""}`;
    while (path !== null) {
      const page: { next: string | null; results: Job[] } = await this.http.json({
        method: "GET",
        path,
        mode: "idempotent",
        signal,
      });
      for (const job of page.results) yield job;
      path = page.next ? this.http.localPath(page.next) : null;
    }
  }

  /**
   * POST /v1/jobs/{id}/cancel: the cancelled job. Tried again like a GET; a retry answered
   * `409 JOB_TERMINAL` with the job now `cancelled` means an earlier try cancelled it: the job is returned.
   */
  async cancel(id: string, { signal }: RequestOptions = {}): Promise<Job> {
    const answer = await this.http.send({ method: "POST", path: `/v1/jobs/${enc(id)}/cancel`, mode: "idempotent", signal });
    if (answer.status >= 200 && answer.status < 300) return jsonOf<Job>(answer);
    const error = answerError(answer);
    if (error instanceof JobTerminal && error.error.status === "cancelled" && answer.maybeActed) {
      return this.get(id, { signal });
    }
    throw error;
  }

  /**
   * POST /v1/jobs/{id}/retry: a person's decision to pay again (a `failed` or `waiting` job), `202` and the
   * job in its next run. Sent once: tried again only on `429` or `503`, which prove payonce did not act.
   * A network error (refused, reset, timed out) throws `APIConnectionError` without a second try, since
   * fetch cannot tell "never sent" from "sent, answer lost": read the job (its `run`) before deciding again.
   */
  retry(id: string, { signal }: RequestOptions = {}): Promise<Job> {
    return this.http.json<Job>({ method: "POST", path: `/v1/jobs/${enc(id)}/retry`, mode: "unsent", signal });
  }

  /**
   * The job once its status is `succeeded`, `failed`, `cancelled` or `waiting` (a person must decide),
   * followed through its event stream, with polling (GET) as the fallback when streams are refused
   * (`429 TOO_MANY_STREAMS`) or keep failing. Throws `WaitTimeout` after `timeoutMs`.
   */
  async wait(id: string, { timeoutMs = 600_000, pollIntervalMs = 2_000, signal }: WaitOptions = {}): Promise<Job> {
    const controller = new AbortController();
    const timeout = new WaitTimeout(`Job ${id} did not settle within ${timeoutMs} ms.`, id);
    const timer = setTimeout(() => controller.abort(timeout), timeoutMs);
    const onAbort = () => controller.abort(signal?.reason);
    if (signal?.aborted) throw signal.reason;
    signal?.addEventListener("abort", onAbort, { once: true });
    const inner = { signal: controller.signal };
    let last: Job | undefined;
    try {
      last = await this.get(id, inner);
      if (SETTLED_STATUSES.has(last.status)) return last;
      let failures = 0;
      while (failures < STREAM_FAILURES_BEFORE_POLLING) {
        try {
          for await (const frame of this.stream(id, { ...inner, retry429: false, maxFailures: 1 })) {
            const status = (frame.data as { status?: unknown } | null)?.status;
            if (frame.event === "end" || (typeof status === "string" && SETTLED_STATUSES.has(status))) {
              last = await this.get(id, inner);
              if (SETTLED_STATUSES.has(last.status)) return last;
            }
          }
          break; // the stream ended without the job settling (it did, then was retried): poll
        } catch (error) {
          if (controller.signal.aborted) throw error;
          if (error instanceof TooManyStreams) break;
          if (error instanceof APIError && error.status < 500 && error.status !== 429) throw error;
          failures += 1;
        }
      }
      for (;;) {
        await sleep(pollIntervalMs, controller.signal);
        last = await this.get(id, inner);
        if (SETTLED_STATUSES.has(last.status)) return last;
      }
    } catch (error) {
      if (controller.signal.aborted && controller.signal.reason === timeout) {
        throw new WaitTimeout(timeout.message, id, last);
      }
      throw error;
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    }
  }

  /**
   * GET /v1/jobs/{id}/events as `{ id, event, data }` frames (`data` parsed from JSON): a frame whenever
   * the job's snapshot changes, then `event: end` after the terminal one, after which the iteration ends.
   * When the stream closes before `end` (payonce closes it after SSE_MAX_S; a network drop), it is opened
   * again with `Last-Event-ID`, so no frame comes twice. Breaking out of the loop closes the stream.
   */
  events(id: string, { lastEventId, signal }: EventsOptions = {}): AsyncGenerator<JobEvent, void, undefined> {
    return this.stream(id, { lastEventId, signal, retry429: true, maxFailures: this.http.maxRetries + 1 });
  }

  private async *stream(
    id: string,
    options: { lastEventId?: string; signal?: AbortSignal; retry429: boolean; maxFailures: number },
  ): AsyncGenerator<JobEvent, void, undefined> {
    const { signal } = options;
    let lastId = options.lastEventId;
    let failures = 0;
    let retryMs: number | undefined;
    const idleMs = Math.max(this.http.timeoutMs, STREAM_IDLE_MIN_MS);
    for (;;) {
      const headers: Record<string, string> = { Accept: "text/event-stream" };
      if (lastId) headers["Last-Event-ID"] = lastId;
      const call: Call = {
        method: "GET",
        path: `/v1/jobs/${enc(id)}/events`,
        headers,
        mode: "idempotent",
        stream: true,
        retry429: options.retry429,
        signal,
      };
      // Opening is a GET like any other: the transport's retries apply (and are spent when it throws).
      const answer: Answer = await this.http.send(call);
      if (answer.status !== 200 || !answer.response.body) {
        answer.abort();
        throw answerError(answer);
      }

      const opened = Date.now();
      const parser = new EventStreamParser();
      const decoder = new TextDecoder();
      const reader = answer.response.body.getReader();
      let broken: unknown;
      let idle: ReturnType<typeof setTimeout> | undefined;
      try {
        for (;;) {
          idle = setTimeout(answer.abort, idleMs);
          const chunk = await reader.read();
          clearTimeout(idle);
          if (chunk.done) break;
          for (const raw of parser.push(decoder.decode(chunk.value, { stream: true }))) {
            if (raw.retry !== undefined) retryMs = raw.retry;
            if (raw.id) lastId = raw.id;
            failures = 0;
            yield { id: raw.id, event: raw.event, data: parseData(raw.data) };
            if (raw.event === "end") return; // `finally` closes the connection
          }
        }
      } catch (error) {
        if (signal?.aborted) throw signal.reason;
        broken = error;
      } finally {
        clearTimeout(idle);
        reader.cancel().catch(() => undefined);
        answer.abort();
      }
      // Closed before `end`: payonce's SSE_MAX_S, or a dropped connection. Open it again from `lastId`.
      const healthy = Date.now() - opened >= STREAM_HEALTHY_MS;
      if (broken !== undefined || !healthy) {
        failures = healthy ? 1 : failures + 1;
        if (failures >= options.maxFailures) {
          throw new APIConnectionError(`The event stream of job ${id} keeps closing before its end.`, {
            cause: broken,
          });
        }
        await sleep(Math.max(retryMs ?? 0, backoffMs(failures - 1)), signal);
      } else if (retryMs) {
        await sleep(retryMs, signal);
      }
    }
  }

  /**
   * GET /v1/jobs/{id}/output: a succeeded media job's bytes. Redirects are followed here, not by fetch:
   * a `302` to a presigned URL is read WITHOUT the `Authorization` header (the API key never leaves for
   * the store), and a report's `303` is read at its `/report` (Markdown).
   */
  async output(id: string, { signal }: RequestOptions = {}): Promise<Output> {
    let path = `/v1/jobs/${enc(id)}/output`;
    for (let hop = 0; hop <= 5; hop++) {
      const local = !/^[a-z][a-z0-9+.-]*:/i.test(path);
      let answer = await this.http.send({ method: "GET", path, mode: "idempotent", redirect: "manual", auth: local, headers: { Accept: "*/*" }, signal });
      if (answer.type === "opaqueredirect" || answer.status === 0) {
        // A browser hides a manual redirect: let it follow (it drops Authorization on another origin).
        answer = await this.http.send({ method: "GET", path, mode: "idempotent", redirect: "follow", auth: local, headers: { Accept: "*/*" }, signal });
      }
      if (answer.status >= 300 && answer.status < 400) {
        const location = answer.headers.get("location");
        if (!location) throw answerError(answer);
        // payonce's own Location (a report's /report) is a path under the base URL; a presigned URL is not.
        path = answer.status === 303 || location.startsWith("/") ? this.http.localPath(location) : location;
        continue;
      }
      if (answer.status < 200 || answer.status >= 300) throw answerError(answer);
      return makeOutput(answer);
    }
    throw new PayonceError(`Too many redirects reading the output of job ${id}.`);
  }

  /** GET /v1/jobs/{id}/report of a sealed report: its Markdown (default), or `{job_id, sealed_at, figures, chapters}`. */
  report(id: string, options?: { format?: "markdown" } & RequestOptions): Promise<string>;
  report(id: string, options: { format: "json" } & RequestOptions): Promise<Report>;
  async report(id: string, { format = "markdown", signal }: ReportOptions = {}): Promise<string | Report> {
    const path = `/v1/jobs/${enc(id)}/report`;
    if (format === "json") return this.http.json<Report>({ method: "GET", path, mode: "idempotent", signal });
    const answer = await this.http.send({ method: "GET", path, mode: "idempotent", headers: { Accept: "text/markdown" }, signal });
    if (answer.status !== 200) throw answerError(answer);
    return new TextDecoder().decode(answer.bytes);
  }
}

export class Orders {
  constructor(private readonly http: Transport) {}

  /**
   * POST /v1/orders: a paid order, one report. The payment id is the order's idempotency key, so the call
   * is tried again like a GET: the same payment again is the same order.
   */
  create(body: OrderCreateRequest, { signal }: RequestOptions = {}): Promise<Order> {
    return this.http.json<Order>({ method: "POST", path: "/v1/orders", body: JSON.stringify(body), mode: "idempotent", signal });
  }

  /** GET /v1/orders/{id}: the order, with its report's status and cost. */
  get(id: string, { signal }: RequestOptions = {}): Promise<Order> {
    return this.http.json<Order>({ method: "GET", path: `/v1/orders/${enc(id)}`, mode: "idempotent", signal });
  }
}

/**
 * `po.reportTemplates`: your report templates, each a name and its immutable versions (docs/api.md,
 * "Report templates"). A report names one in its input (`template: { name, version? }`; the `live`
 * version by default), and an order's `product` of the same name is written from it.
 */
export class ReportTemplates {
  constructor(private readonly http: Transport) {}

  /**
   * POST /v1/report-templates: the template's next version (the first makes the template). A text that
   * reaches past its variables (`{{ ''.__class__ }}`, a call, a loop) throws `InvalidRequest` whose
   * `fields` name it, and nothing is stored. Sent once, tried again only on `429` and `503` (payonce did
   * not act): a second try of a lost answer would write a second version, so a network error throws
   * `APIConnectionError`; `list()` says how many versions there are before you write it again.
   */
  create(body: ReportTemplateCreateRequest, { signal }: RequestOptions = {}): Promise<ReportTemplateVersionCreated> {
    return this.http.json<ReportTemplateVersionCreated>({
      method: "POST",
      path: "/v1/report-templates",
      body: JSON.stringify(body),
      mode: "unsent",
      lostAnswer:
        "List the templates (reportTemplates.list: `versions`) to see whether it wrote the version before you write it again.",
      signal,
    });
  }

  /** GET /v1/report-templates: your templates by name, where `live` points and how many versions each has. */
  list({ signal }: RequestOptions = {}): Promise<ReportTemplateSummary[]> {
    const path = "/v1/report-templates";
    return this.http.json<ReportTemplateSummary[]>({ method: "GET", path, mode: "idempotent", signal });
  }

  /** GET /v1/report-templates/{name}/versions/{n}: one version, as it was written (`NotFound`: none of yours). */
  version(name: string, version: number, { signal }: RequestOptions = {}): Promise<ReportTemplateVersion> {
    const path = `/v1/report-templates/${enc(name)}/versions/${enc(String(version))}`;
    return this.http.json<ReportTemplateVersion>({ method: "GET", path, mode: "idempotent", signal });
  }

  /**
   * POST /v1/report-templates/{name}/live: point `live` at a version. Tried again like a GET: pointing it
   * twice is pointing it once. A job already accepted keeps the version it was pinned to.
   */
  setLive(name: string, version: number, { signal }: RequestOptions = {}): Promise<ReportTemplateLive> {
    return this.http.json<ReportTemplateLive>({
      method: "POST",
      path: `/v1/report-templates/${enc(name)}/live`,
      body: JSON.stringify({ version }),
      mode: "idempotent",
      signal,
    });
  }
}

function randomKey(): string {
  const crypto = globalThis.crypto;
  if (!crypto?.randomUUID) {
    throw new PayonceError(
      "crypto.randomUUID is not available in this runtime: pass idempotencyKey yourself (Node 18: --experimental-global-webcrypto).",
    );
  }
  return crypto.randomUUID();
}

function parseData(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

function jsonOf<T>(answer: Answer): T {
  return JSON.parse(new TextDecoder().decode(answer.bytes)) as T;
}

function makeOutput(answer: Answer): Output {
  const bytes = answer.bytes;
  return {
    contentType: answer.headers.get("content-type"),
    bytes,
    url: answer.url,
    arrayBuffer: () => bytes.slice().buffer as ArrayBuffer,
    text: () => new TextDecoder().decode(bytes),
  };
}
