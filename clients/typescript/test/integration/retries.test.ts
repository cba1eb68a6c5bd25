// The whole point: a create whose answer is lost, or refused with 503, is sent again under the same
// Idempotency-Key and answered with the job the first try made. tests/clients/test_typescript_client.py
// then checks with the database and the sandbox's ledger: one job, one charge, per client.
import { describe, expect, it } from "vitest";
import { Payonce } from "../../dist/index.js";
import { account, client, env, recordingFetch, render } from "./stack.js";

describe.concurrent("create through a flaky network", () => {
  it("an answer lost after payonce made the job: the retry returns that job, and there is one", async () => {
    const recorder = recordingFetch();
    const po = new Payonce({ baseUrl: env("PAYONCE_TEST_PROXY_LOSE_URL"), apiKey: account("lose").api_key, fetch: recorder.fetch });
    const job = await po.jobs.create(render(0, { prompt: "lost answer" }));
    const posts = recorder.seen.filter((r) => r.method === "POST");
    expect(posts.map((r) => r.status)).toEqual([undefined, 202]); // no answer heard; then "the same job"
    expect(posts[1]!.headers.get("idempotency-key")).toBe(posts[0]!.headers.get("idempotency-key"));
    expect(job.idempotency_key).toBe(posts[0]!.headers.get("idempotency-key"));
    const done = await po.jobs.wait(job.id, { timeoutMs: 30_000 });
    expect(done.status).toBe("succeeded");
    const all = [];
    for await (const listed of po.jobs.list()) all.push(listed.id);
    expect(all).toEqual([job.id]);
  });

  it("a 503 with Retry-After: 1: the retry waits a second, then makes the one job", async () => {
    const recorder = recordingFetch();
    const po = new Payonce({ baseUrl: env("PAYONCE_TEST_PROXY_503_URL"), apiKey: account("answer503").api_key, fetch: recorder.fetch });
    const started = performance.now();
    const job = await po.jobs.create(render(0, { prompt: "503 first" }));
    expect(performance.now() - started).toBeGreaterThanOrEqual(1_000);
    const posts = recorder.seen.filter((r) => r.method === "POST");
    expect(posts.map((r) => r.status)).toEqual([503, 201]); // payonce never saw the first
    expect(posts[1]!.headers.get("idempotency-key")).toBe(posts[0]!.headers.get("idempotency-key"));
    expect((await po.jobs.wait(job.id, { timeoutMs: 30_000 })).status).toBe("succeeded");
    const all = [];
    for await (const listed of po.jobs.list()) all.push(listed.id);
    expect(all).toEqual([job.id]);
  });

  it("a create sent again with the same key is the same job (202)", async () => {
    const po = client("errors");
    const key = `ts-same-${crypto.randomUUID()}`;
    const first = await po.jobs.create({ ...render(0), idempotencyKey: key });
    const again = await po.jobs.create({ ...render(0), idempotencyKey: key });
    expect(again.id).toBe(first.id);
  });
});
