/**
 * The public types: aliases of payonce's own OpenAPI document (clients/openapi.json, generated into
 * ./schema.ts by `npm run gen:types`), so they follow the server. A few shapes the document can only
 * state as text (an event frame's JSON data) are written here, after jobs/api/schema.py.
 */

import type { components, operations } from "./schema.js";

type Schemas = components["schemas"];

/**
 * A job as payonce answers it. `priority` is 1 to 5 (higher starts sooner). `waiting` is only in
 * `jobs.get`'s answer (see `JobDetail`), not in a list's, a create's or a webhook event's.
 */
export type Job = Schemas["Job"] & {
  readonly waiting?: JobWaiting | null;
};
/**
 * Why a job that has not sent its paid call yet waits: `client_limit` (queued: your jobs in progress are
 * at your limit, `limit` the number, `running` how many), `turn` (queued: started in its turn across
 * clients, by priority), `provider_limit` (started: its call waits unsent while a provider's calls in
 * flight are at their limit, `limit` the provider's name, `in_flight` how many).
 */
export type JobWaiting = Omit<Schemas["JobWaiting"], "limit"> & {
  /** `client_limit`: the number; `provider_limit`: its name (a provider, or provider/model). */
  limit?: number | string;
};
/**
 * `jobs.get`'s answer (GET /v1/jobs/{id}, the document's `JobDetail`): the job, and `waiting`: null, or
 * why it waits. Written on `Job` so that `chapters` stays what it is, a report's only.
 */
export type JobDetail = Job & {
  readonly waiting: JobWaiting | null;
};
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

/** `reportTemplates.create`'s argument (POST /v1/report-templates): a template's next version. */
export type ReportTemplateCreateRequest = Schemas["ReportTemplateRequest"];
/** A template's chapter as it is written: `{key, title, instruction}`. */
export type ReportTemplateChapterRequest = Schemas["ChapterRequest"];
/** A template's `layout`: `title`, `chapter_heading`, and optionally `closing` and `figures`. */
export type ReportTemplateLayout = Schemas["LayoutRequest"];
/** A template's delivery `mail`: `subject` and text `body`. */
export type ReportTemplateMail = Schemas["MailRequest"];
/** `reportTemplates.create`'s answer: the version written, and whether `live` points at it now. */
export type ReportTemplateVersionCreated = Schemas["ReportTemplateVersionCreated"];
/** One of `reportTemplates.list()`: a template's name, the version `live` points at, how many versions. */
export type ReportTemplateSummary = Schemas["ReportTemplateSummary"];
/** A version's chapter, as it was written. */
export type ReportTemplateChapter = Schemas["ReportTemplateChapter"];
/**
 * `reportTemplates.version(name, n)`: one version as it was written, with `name`, `version`, `live` and
 * `created_at`. The document states `layout` and `mail` as any JSON; they are what was written.
 */
export type ReportTemplateVersion = Omit<Schemas["ReportTemplateVersion"], "layout" | "mail"> & {
  layout?: ReportTemplateLayout;
  mail?: ReportTemplateMail;
};
/** `reportTemplates.setLive`'s answer: where `live` points now. */
export type ReportTemplateLive = Schemas["ReportTemplateLive"];

/** `status` filter of `jobs.list` (GET /v1/jobs `status`). */
export type JobStatus = NonNullable<NonNullable<operations["jobs_list"]["parameters"]["query"]>["status"]>;

/**
 * `jobs.create`'s argument: the job's body (with the optional `priority`, 1 to 5, sent only when given:
 * payonce's default is 3), and the `Idempotency-Key` (made for you when left out).
 */
export type JobCreateParams = JobCreateRequest & {
  /** The `Idempotency-Key`: 1 to 255 visible ASCII characters. Default: a fresh `crypto.randomUUID()` for this call. */
  idempotencyKey?: string;
};

/**
 * Which of your templates a report is written from (a report's `input.template`): a version number, or
 * the label `live` (the default). The job's stored input names the version it was pinned to,
 * `{name, version}`.
 */
export type ReportTemplateRef = {
  name: string;
  version?: number;
  label?: "live";
};

/**
 * A report's `input` (a report job's, an order's), which the document states only as text: the subject,
 * the chapters (optional with a `template`: all of the template's, or a subset of its keys), the template,
 * and the email the link goes to (a job's; an order's is the order's own). Assignable to
 * `JobCreateRequest["input"]` and `OrderCreateRequest["input"]`.
 */
export type ReportInput = {
  subject: Record<string, unknown>;
  chapters?: string[];
  template?: ReportTemplateRef;
  email?: string;
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
