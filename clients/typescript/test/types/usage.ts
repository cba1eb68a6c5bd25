// Type-checked (never run) by test/unit/types.test.ts against the built declarations: the README's calls
// compile as written, and what should not compile does not.
import {
  IdempotencyConflict,
  type Job,
  type JobEvent,
  type Order,
  Payonce,
  type Report,
  type ReportInput,
  type ReportTemplateSummary,
  type ReportTemplateVersion,
  type Spend,
  verifyWebhook,
  type WebhookEvent,
} from "../../dist/index.js";

declare const key: string | undefined;

export async function usage(): Promise<void> {
  const po = new Payonce({ baseUrl: "http://127.0.0.1:8000", apiKey: key, maxRetries: 3, timeoutMs: 10_000, fetch });
  const job: Job = await po.jobs.create({ kind: "media", models: ["sandbox/video-keyed"], input: { prompt: "p" } });
  await po.jobs.create({
    kind: "report",
    models: ["sandbox/llm"],
    input: { subject: { name: "Ada" }, chapters: ["sun"], email: "a@example.com" },
    policy: { paid_retries: 1 },
    metadata: { campaign: "spring" },
    idempotencyKey: "spring-17",
    priority: 5,
  });
  const priority: number = job.priority;
  const detail = await po.jobs.get(job.id);
  const why: "client_limit" | "turn" | "provider_limit" | undefined = detail.waiting?.reason;
  const limit: number | string | undefined = detail.waiting?.limit;
  const asJob: Job = detail;
  void [priority, why, limit, asJob];
  const done: Job = await po.jobs.wait(job.id, { timeoutMs: 60_000, pollIntervalMs: 500 });
  const status: string = done.status;
  for await (const frame of po.jobs.events(job.id, { lastEventId: "1" })) {
    const event: JobEvent = frame;
    void event;
  }
  for await (const listed of po.jobs.list({ status: "succeeded", limit: 2 })) void listed.attempts[0]?.upstream_key;
  const markdown: string = await po.jobs.report(job.id);
  const report: Report = await po.jobs.report(job.id, { format: "json" });
  const bytes: Uint8Array = (await po.jobs.output(job.id)).bytes;
  const order: Order = await po.orders.create({
    payment_id: "pi_1", run_id: "run-1", product: "natal-chart", input: { subject: {}, chapters: ["sun"] }, email: "a@example.com",
  });
  const made: { name: string; version: number; live: boolean } = await po.reportTemplates.create({
    name: "garden-plan",
    system: "You write for {{ subject.name }}.",
    synthesis: null,
    chapters: [{ key: "soil", title: "Your soil", instruction: "Advise on a {{ subject.plot }} plot." }],
    max_output_tokens: 1200,
    layout: { title: "A garden", chapter_heading: "{{ chapter.title }}", closing: null, figures: false },
    mail: { subject: "Ready", body: "{{ link }}" },
    page_title: "Your garden plan",
    live: false,
  });
  const templates: ReportTemplateSummary[] = await po.reportTemplates.list();
  const version: ReportTemplateVersion = await po.reportTemplates.version("garden-plan", made.version);
  const heading: string | undefined = version.layout?.chapter_heading;
  const instruction: string | undefined = version.chapters[0]?.instruction;
  const live: number = (await po.reportTemplates.setLive("garden-plan", 2)).live;
  const input: ReportInput = { subject: { name: "Ada" }, template: { name: "garden-plan", version: 2 }, email: "a@example.com" };
  await po.jobs.create({ kind: "report", models: ["sandbox/llm"], input });
  await po.orders.create({
    payment_id: "pi_2", run_id: "run-2", product: "garden-plan", input: { subject: {}, template: { name: "garden-plan", label: "live" } },
    email: "a@example.com",
  });
  void [templates, heading, instruction, live];
  const spend: Spend = await po.spend({ month: "2026-12" });
  const me: { client_id: string; name: string } = await po.whoami();
  const event: WebhookEvent = await verifyWebhook("{}", new Headers(), "whsec_x");
  try {
    await po.jobs.cancel(job.id);
  } catch (e) {
    if (e instanceof IdempotencyConflict) void [e.code, e.message, e.status, e.jobId, e.headers, e.body];
  }
  void [status, markdown, report, bytes, order, spend, me, event];

  // @ts-expect-error: kind is media or report
  await po.jobs.create({ kind: "video", models: [], input: {} });
  // @ts-expect-error: a priority is a number
  await po.jobs.create({ kind: "media", models: [], input: {}, priority: "high" });
  // @ts-expect-error: an unknown status
  po.jobs.list({ status: "done" });
  // @ts-expect-error: a report is markdown or json
  await po.jobs.report(job.id, { format: "html" });
  // @ts-expect-error: a template's chapters are {key, title, instruction}
  await po.reportTemplates.create({ name: "x", system: "s", chapters: ["sun"] });
  // @ts-expect-error: a version is a number
  await po.reportTemplates.setLive("x", "2");
  // @ts-expect-error: the only label is live
  const labelled: ReportInput = { subject: {}, template: { name: "x", label: "draft" } };
  void labelled;
}
