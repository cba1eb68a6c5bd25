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
} from "../../dist/index.js";
import { account, client, env, render } from "./stack.js";

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
});
