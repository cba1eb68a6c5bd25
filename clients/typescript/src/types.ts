/**
 * The public types: aliases of payonce's own OpenAPI document (clients/openapi.json, generated into
 * ./schema.ts by `npm run gen:types`), so they follow the server. A few shapes the document can only
 * state as text (an event frame's JSON data) are written here, after jobs/api/schema.py.
 */

import type { components, operations } from "./schema.js";

type Schemas = components["schemas"];

export type Job = Schemas["Job"];
export type Attempt = Schemas["Attempt"];
export type Cost = Schemas["Cost"];
export type ReportChapter = Schemas["ReportChapter"];
export type JobPage = Schemas["JobPage"];
export type JobCreateRequest = Schemas["JobCreateRequest"];
export type Policy = Schemas["PolicyRequest"];
export type Order = Schemas["Order"];
export type OrderCreateRequest = Schemas["OrderCreateRequest"];
export type Spend = Schemas["Spend"];
export type SpendByModel = Schemas["SpendByModel"];
export type Report = Schemas["Report"];
export type WhoAmI = Schemas["WhoAmI"];
export type ErrorAnswer = Schemas["Error"];

/** `status` filter of `jobs.list` (GET /v1/jobs `status`). */
export type JobStatus = NonNullable<NonNullable<operations["jobs_list"]["parameters"]["query"]>["status"]>;

/** `jobs.create`'s argument: the job's body, and the `Idempotency-Key` (made for you when left out). */
export type JobCreateParams = JobCreateRequest & {
  /** The `Idempotency-Key`: 1 to 255 visible ASCII characters. Default: a fresh `crypto.randomUUID()` for this call. */
  idempotencyKey?: string;
};

/** What an event frame's `data` holds (jobs.selectors.job_snapshot): status, run, steps, chapters, cost. */
export interface JobSnapshot {
  status: JobStatus;
  run: number;
  steps: { name: string; status: string }[];
  chapters?: { done: number; total: number };
  cost: { total_usd: string; unpriced_attempts: number };
}

/** One server-sent event of `jobs.api.events`. */
export interface JobEvent {
  /** The frame's `id:` (a snapshot frame's version); `undefined` for `end`, which carries none. */
  id: string | undefined;
  /** "message" for a snapshot frame, "end" after the terminal one. */
  event: "message" | "end" | (string & {});
  /** The frame's JSON data: the snapshot, or `{status}` for `end` (the raw text when it is not JSON). */
  data: JobSnapshot | { status: JobStatus } | unknown;
}

/** A webhook delivery's body (docs/api.md, "Webhooks"). */
export interface WebhookEvent {
  /** `<job_id>:<run>:<event>`. */
  id: string;
  type: "generation.succeeded" | "generation.failed" | "generation.cancelled" | "generation.needs_review" | (string & {});
  created_at: string;
  data: Job;
}

/** A media job's output bytes (`jobs.output`), or a report's Markdown through its 303. */
export interface Output {
  /** The answer's `Content-Type`. */
  contentType: string | null;
  bytes: Uint8Array;
  /** Where the bytes were read at last (the presigned URL, or the report's path), after redirects. */
  url: string;
  arrayBuffer(): ArrayBuffer;
  text(): string;
}
