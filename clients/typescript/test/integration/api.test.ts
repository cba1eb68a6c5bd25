import { describe, expect, it } from "vitest";
import {
  APIError,
  IdempotencyConflict,
  InvalidRequest,
  JobNotRetryable,
  NotAReport,
  NotFound,
  Payonce,
  PayonceError,
  Unauthenticated,
  type ReportInput,
} from "../../dist/index.js";
import { account, client, env, render } from "./stack.js";

const GARDEN = {
  name: "garden-plan",
  system: "You are a garden designer writing for {{ subject.name }}.",
  synthesis: "Sum up what a garden for this plot should be.",
  chapters: [
    { key: "soil", title: "Your soil", instruction: "Advise on a {{ subject.plot }} plot." },
    { key: "plants", title: "What to plant", instruction: "Choose ten plants for {{ subject.climate }} weather." },
  ],
  max_output_tokens: 1200,
  layout: {
    title: "A garden for {{ subject.name }}",
    chapter_heading: "{{ chapter.title }}",
    closing: "_Planned for {{ subject.name }}._",
    figures: false,
  },
  mail: { subject: "Your plan is ready", body: "Read it here: {{ link }}" },
  page_title: "Your garden plan",
};

describe.concurrent("answers and errors", () => {
  it("IdempotencyConflict: the same key with another body, naming the job", async () => {
    const po = client("errors");
    const key = `ts-conflict-${crypto.randomUUID()}`;
    const job = await po.jobs.create({ ...render(0, { prompt: "dusk" }), idempotencyKey: key });
    const error = await po.jobs.create({ ...render(0, { prompt: "dawn" }), idempotencyKey: key }).catch((e) => e);
    expect(error).toBeInstanceOf(IdempotencyConflict);
    expect(error).toBeInstanceOf(APIError);
    expect(error).toBeInstanceOf(PayonceError);
    expect(error.status).toBe(409);
    expect(error.code).toBe("IDEMPOTENCY_CONFLICT");
    expect(error.message).toBeTruthy();
    expect(error.jobId).toBe(job.id);
  });

  it("NotFound for a job that is not there, NotAReport for a media job's report", async () => {
    const po = client("errors");
    const missing = await po.jobs.get(crypto.randomUUID()).catch((e) => e);
    expect(missing).toBeInstanceOf(NotFound);
    expect(missing.code).toBe("NOT_FOUND");
    expect(missing.status).toBe(404);
    const job = await po.jobs.create(render(0));
    const notReport = await po.jobs.report(job.id).catch((e) => e);
    expect(notReport).toBeInstanceOf(NotAReport);
  });

  it("Unauthenticated for a bad key, with its code and message", async () => {
    const po = new Payonce({ baseUrl: env("PAYONCE_TEST_URL"), apiKey: "not-a-key" });
    const error = await po.whoami().catch((e) => e);
    expect(error).toBeInstanceOf(Unauthenticated);
    expect(error.code).toBe("UNAUTHENTICATED");
    expect(error.status).toBe(401);
    expect(typeof error.message).toBe("string");
    expect(error.message.length).toBeGreaterThan(0);
    expect(error.headers.get("www-authenticate")).toMatch(/^Bearer/);
  });

  it("InvalidRequest names the fields; JobNotRetryable for a job that cannot be retried", async () => {
    const po = client("errors");
    const invalid = await po.jobs.create({ ...render(0), polcy: {} } as never).catch((e) => e);
    expect(invalid).toBeInstanceOf(InvalidRequest);
    expect(invalid.status).toBe(422);
    expect(JSON.stringify(invalid.fields)).toContain("polcy");
    const job = await po.jobs.create(render(0));
    const done = await po.jobs.wait(job.id, { timeoutMs: 30_000 });
    expect(done.status).toBe("succeeded");
    const notRetryable = await po.jobs.retry(job.id).catch((e) => e);
    expect(notRetryable).toBeInstanceOf(JobNotRetryable);
    expect(notRetryable.error.status).toBe("succeeded");
  });

  it("report templates: written, listed, read, a version 2 made live, refused, another's 404, a job pinned", async () => {
    const po = client("templates");
    const made = await po.reportTemplates.create(GARDEN);
    expect(made).toEqual({ name: "garden-plan", version: 1, live: true });
    expect(await po.reportTemplates.list()).toEqual([{ name: "garden-plan", live: 1, versions: 1 }]);

    const v1 = await po.reportTemplates.version("garden-plan", 1);
    expect(v1).toMatchObject({ name: "garden-plan", version: 1, live: true, system: GARDEN.system, synthesis: GARDEN.synthesis });
    expect(v1.chapters).toEqual(GARDEN.chapters);
    expect(v1.layout).toEqual(GARDEN.layout);
    expect(v1.mail).toEqual(GARDEN.mail);
    expect([v1.max_output_tokens, v1.page_title]).toEqual([1200, "Your garden plan"]);
    expect(Math.abs(Date.now() - Date.parse(v1.created_at))).toBeLessThan(60_000);

    const { synthesis: _dropped, ...withoutSynthesis } = GARDEN;
    const two = await po.reportTemplates.create({ ...withoutSynthesis, max_output_tokens: 1500, live: false });
    expect(two).toEqual({ name: "garden-plan", version: 2, live: false });
    expect(await po.reportTemplates.list()).toEqual([{ name: "garden-plan", live: 1, versions: 2 }]);
    const v2 = await po.reportTemplates.version("garden-plan", 2);
    expect([v2.live, v2.max_output_tokens, "synthesis" in v2]).toEqual([false, 1500, false]);
    expect(await po.reportTemplates.setLive("garden-plan", 2)).toEqual({ name: "garden-plan", live: 2 });
    expect(await po.reportTemplates.list()).toEqual([{ name: "garden-plan", live: 2, versions: 2 }]);
    expect((await po.reportTemplates.version("garden-plan", 2)).live).toBe(true);
    expect((await po.reportTemplates.version("garden-plan", 1)).live).toBe(false);

    const refused = await po.reportTemplates
      .create({ name: "garden-plan", system: "{{ ''.__class__ }}", chapters: [{ key: "a", title: "A", instruction: "B" }] })
      .catch((e) => e);
    expect(refused).toBeInstanceOf(InvalidRequest);
    expect(refused.status).toBe(422);
    expect(Object.keys(refused.fields)).toEqual(["system"]);
    expect(refused.fields.system[0]).toContain("__class__");
    expect((await po.reportTemplates.list())[0]!.versions).toBe(2); // nothing stored
    const noVersion = await po.reportTemplates.version("garden-plan", 3).catch((e) => e);
    expect(noVersion).toBeInstanceOf(NotFound);

    const theirs = client("templates-other");
    const notTheirs = await theirs.reportTemplates.version("garden-plan", 1).catch((e) => e);
    expect(notTheirs).toBeInstanceOf(NotFound);
    expect([notTheirs.status, notTheirs.code]).toEqual([404, "NOT_FOUND"]);
    expect(await theirs.reportTemplates.setLive("garden-plan", 1).catch((e) => e)).toBeInstanceOf(NotFound);
    expect(await theirs.reportTemplates.list()).toEqual([]);

    const input: ReportInput = {
      subject: { name: "Ada", plot: "clay", climate: "maritime" },
      template: { name: "garden-plan" },
      email: "ada@example.com",
    };
    const job = await po.jobs.create({ kind: "report", models: ["sandbox/llm"], input });
    const stored = job.input as ReportInput; // as pinned at submit: the version `live` pointed at
    expect(stored.template).toEqual({ name: "garden-plan", version: 2 });
    expect(stored.chapters).toEqual(["soil", "plants"]);
    const done = await po.jobs.wait(job.id, { timeoutMs: 30_000 });
    expect(done.status).toBe("succeeded");
    const headings = (await po.jobs.report(job.id)).split("\n").filter((line) => line.startsWith("#"));
    expect(headings).toEqual(["# A garden for Ada", "## Your soil", "## What to plant"]);
  });

  it("whoami, spend, and an order: created, the same payment again, read back", async () => {
    const po = client("orders");
    expect(await po.whoami()).toMatchObject({ client_id: account("orders").client_id });
    const spend = await po.spend();
    expect(spend.month).toMatch(/^\d{4}-\d{2}$/);
    expect((spend as Record<string, unknown>).cap_usd).toBe("20.000000");
    const thisMonth = await po.spend({ month: spend.month });
    expect(thisMonth.month).toBe(spend.month);
    const bad = await po.spend({ month: "2026-13" }).catch((e) => e);
    expect(bad).toBeInstanceOf(InvalidRequest);

    const payment = `pi_ts_${crypto.randomUUID()}`;
    const body = {
      payment_id: payment,
      run_id: `run-${payment}`,
      product: "natal-chart",
      input: { subject: { name: "Ada", born: "1990-04-12T06:30" }, chapters: ["sun", "moon"] },
      email: "buyer@example.com",
    };
    const order = await po.orders.create(body);
    expect(order.status).toBe("paid");
    expect(order.job_id).toBeTruthy();
    const again = await po.orders.create(body);
    expect(again.id).toBe(order.id);
    const read = await po.orders.get(order.id);
    expect(read.id).toBe(order.id);
    expect(read.job?.status).toBeTruthy();
    const conflict = await po.orders.create({ ...body, email: "other@example.com" }).catch((e) => e);
    expect(conflict).toBeInstanceOf(IdempotencyConflict);
    const done = await po.jobs.wait(order.job_id!, { timeoutMs: 30_000 });
    expect(done.status).toBe("succeeded");
  });

  it("an order naming its buyer's email in its input too is taken, and is the same order without it", async () => {
    // As a report job's input does (commit d4e8cc6: a release refused it with 422).
    const po = client("orders");
    const payment = `pi_ts_${crypto.randomUUID()}`;
    const body = {
      payment_id: payment,
      run_id: `run-${payment}`,
      product: "natal-chart",
      input: { subject: { name: "Ada", born: "1990-04-12T06:30" }, chapters: ["sun"] },
      email: "buyer@example.com",
    };
    const order = await po.orders.create({ ...body, input: { ...body.input, email: "buyer@example.com" } });
    expect(order.status).toBe("paid");
    expect(order.job_id).toBeTruthy();
    const without = await po.orders.create(body);
    expect(without.id).toBe(order.id);
    const done = await po.jobs.wait(order.job_id!, { timeoutMs: 30_000 });
    expect(done.status).toBe("succeeded");
  });
});
