import { describe, expect, it } from "vitest";
import { Payonce } from "../../dist/index.js";
import { client, env, account, recordingFetch, render } from "./stack.js";

describe.concurrent("jobs on a real stack", () => {
  it("wait on a render, then its output bytes", async () => {
    const po = client("render");
    const job = await po.jobs.create(render(1, { size_bytes: 5000 }));
    expect(job.status).toMatch(/queued|running/);
    const done = await po.jobs.wait(job.id, { timeoutMs: 30_000 });
    expect(done.status).toBe("succeeded");
    expect(done.attempts[0]!.upstream_key).toBe(`payonce-${job.id}-1`);
    const output = await po.jobs.output(job.id);
    expect(output.contentType).toBe("video/mp4");
    expect(output.bytes.byteLength).toBe(5000);
    expect((done.output as { bytes: number }).bytes).toBe(5000);
    expect(output.arrayBuffer().byteLength).toBe(5000);
    // The provider's own books: one charge for the job, under the attempt's upstream key.
    const ledger = (await (await fetch(`${env("PAYONCE_TEST_SANDBOX_URL")}/ledger`)).json()) as {
      charges: { request_id: string; metadata: { payonce_job?: string } | null }[];
    };
    const charges = ledger.charges.filter((c) => c.metadata?.payonce_job === job.id);
    expect(charges.map((c) => c.request_id)).toEqual([`payonce-${job.id}-1`]);
  });

  it("a report through its events (increasing ids, then end), its Markdown and JSON, its output's 303", async () => {
    const po = client("report");
    const job = await po.jobs.create({
      kind: "report",
      models: ["sandbox/llm"],
      input: { subject: { name: "Ada", born: "1990-04-12T06:30" }, chapters: ["sun", "moon"], email: "ada@example.com" },
    });
    const frames = [];
    for await (const frame of po.jobs.events(job.id)) frames.push(frame);
    const last = frames.at(-1)!;
    expect(last.event).toBe("end");
    expect(last.id).toBeUndefined();
    expect(last.data).toEqual({ status: "succeeded" });
    const snapshots = frames.slice(0, -1);
    expect(snapshots.length).toBeGreaterThanOrEqual(1);
    const ids = snapshots.map((f) => BigInt(f.id!));
    for (let i = 1; i < ids.length; i++) expect(ids[i]! > ids[i - 1]!).toBe(true);
    expect(snapshots.at(-1)!.data).toMatchObject({ status: "succeeded", chapters: { done: 2, total: 2 } });

    const markdown = await po.jobs.report(job.id);
    const headings = markdown.split("\n").filter((line) => line.startsWith("#"));
    expect(headings).toEqual(["# Your report", "## Sun", "## Moon"]);
    const asJson = await po.jobs.report(job.id, { format: "json" });
    expect(asJson.job_id).toBe(job.id);
    expect(asJson.chapters.map((c) => c.key)).toEqual(["sun", "moon"]);
    const output = await po.jobs.output(job.id); // 303 to /report
    expect(output.contentType).toMatch(/^text\/markdown/);
    expect(output.text()).toBe(markdown);
    expect(new URL(output.url).pathname).toBe(`/v1/jobs/${job.id}/report`);
  });

  it("events reconnect with Last-Event-ID when payonce closes the stream (SSE_MAX_S) before the end", async () => {
    const recorder = recordingFetch();
    const po = new Payonce({ baseUrl: env("PAYONCE_TEST_URL"), apiKey: account("stream").api_key, fetch: recorder.fetch });
    const job = await po.jobs.create(render(10, { expected_s: 10 }));
    const frames = [];
    for await (const frame of po.jobs.events(job.id)) frames.push(frame);
    const opened = recorder.seen.filter((r) => r.url.endsWith("/events"));
    expect(opened.length).toBeGreaterThanOrEqual(2);
    const lastIds = opened.slice(1).map((r) => r.headers.get("last-event-id"));
    for (const lastId of lastIds) expect(lastId).toMatch(/^\d+$/);
    const ids = frames.filter((f) => f.id !== undefined).map((f) => f.id!);
    expect(new Set(ids).size).toBe(ids.length); // nothing twice across the reconnect
    expect(ids).toContain(lastIds[0]);
    expect(frames.at(-1)).toMatchObject({ event: "end", data: { status: "succeeded" } });
  });

  it("wait falls back to polling when the client's streams are all taken (429 TOO_MANY_STREAMS)", async () => {
    const recorder = recordingFetch();
    const po = new Payonce({ baseUrl: env("PAYONCE_TEST_URL"), apiKey: account("streams").api_key, fetch: recorder.fetch });
    const long = await po.jobs.create(render(20));
    const held = Array.from({ length: 20 }, () => po.jobs.events(long.id)); // SSE_MAX_PER_CLIENT
    try {
      await Promise.all(held.map((stream) => stream.next())); // each stream's first frame: its slot is taken
      // A render of 2 s: one of 0 s can settle before wait's first read, and then no stream is asked for.
      const job = await po.jobs.create(render(2));
      const done = await po.jobs.wait(job.id, { timeoutMs: 20_000, pollIntervalMs: 200 });
      expect(done.status).toBe("succeeded");
      const mine = recorder.seen.filter((r) => r.url.includes(job.id));
      expect(mine.filter((r) => r.url.endsWith("/events")).map((r) => r.status)).toEqual([429]); // refused once, then polled
      expect(mine.filter((r) => !r.url.endsWith("/events")).length).toBeGreaterThanOrEqual(2);
    } finally {
      await Promise.all(held.map((stream) => stream.return()));
      await po.jobs.cancel(long.id);
    }
  });

  it("cancel, and a second cancel is JobTerminal; output of a cancelled job is JobNotSucceeded", async () => {
    const po = client("errors");
    const job = await po.jobs.create(render(60));
    const cancelled = await po.jobs.cancel(job.id);
    expect(cancelled.status).toBe("cancelled");
    const again = await po.jobs.cancel(job.id).catch((e) => e);
    expect(again.name).toBe("JobTerminal");
    expect(again.status).toBe(409);
    expect(again.error.status).toBe("cancelled");
    const output = await po.jobs.output(job.id).catch((e) => e);
    expect(output.code).toBe("JOB_NOT_SUCCEEDED");
    expect((await po.jobs.wait(job.id, { timeoutMs: 5_000 })).status).toBe("cancelled");
  });

  it("list follows every page (limit 2), newest first, and filters by status", async () => {
    const recorder = recordingFetch();
    const po = new Payonce({ baseUrl: env("PAYONCE_TEST_URL"), apiKey: account("list").api_key, fetch: recorder.fetch });
    const made = [];
    for (let i = 0; i < 5; i++) made.push((await po.jobs.create(render(0, { prompt: `list ${i}` }))).id);
    const listed = [];
    for await (const job of po.jobs.list({ limit: 2 })) listed.push(job.id);
    expect(listed).toEqual([...made].reverse());
    const pages = recorder.seen.filter((r) => new URL(r.url).pathname === "/v1/jobs" && r.method === "GET");
    expect(pages).toHaveLength(3);
    expect(pages.every((r) => r.url.startsWith(env("PAYONCE_TEST_URL")))).toBe(true);
    for (const id of made) await po.jobs.wait(id, { timeoutMs: 30_000 });
    const succeeded = [];
    for await (const job of po.jobs.list({ status: "succeeded", limit: 200 })) succeeded.push(job.id);
    expect(succeeded.sort()).toEqual([...made].sort());
    const none = [];
    for await (const job of po.jobs.list({ status: "failed" })) none.push(job);
    expect(none).toEqual([]);
  });

  it("a paid failure, then a person's retry: the next run", async () => {
    const po = client("errors");
    const job = await po.jobs.create(render(0, { fail_render: "the render farm caught fire" }));
    const failed = await po.jobs.wait(job.id, { timeoutMs: 30_000 });
    expect(failed.status).toBe("failed");
    expect((failed.error as { code: string }).code).toBe("PAID_ATTEMPT_FAILED");
    const retried = await po.jobs.retry(job.id);
    expect(retried.run).toBe(2);
    const done = await po.jobs.wait(job.id, { timeoutMs: 30_000 });
    expect(done.run).toBe(2);
    expect(done.status).toMatch(/failed|succeeded/);
  });
});
