/**
 * @payonce/client: payonce's TypeScript client. No dependency: `fetch`, Web Crypto and web streams only,
 * so it runs unchanged on Node 18+, Deno, Cloudflare Workers and browsers.
 */

export { Payonce, Jobs, Orders, ReportTemplates, SETTLED_STATUSES } from "./client.js";
export { VERSION } from "./version.js";
export type { PayonceOptions, RequestOptions, ListOptions, WaitOptions, EventsOptions, ReportOptions } from "./client.js";
export * from "./errors.js";
export { verifyWebhook, signWebhook, WebhookDeduper } from "./webhooks.js";
export type { VerifyOptions, DeduperOptions } from "./webhooks.js";
export { EventStreamParser, parseEventStream } from "./sse.js";
export type { RawEvent } from "./sse.js";
export type * from "./types.js";
export type { components, paths, operations } from "./schema.js";
