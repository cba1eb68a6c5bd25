// The retry rule and the redirects, against a scripted fetch: what is sent again, what is not, and how long
// it waits. (The real network's versions are in test/integration/retries.test.ts.)
import { describe, expect, it } from "vitest";
import {
  APIConnectionError,
  APIError,
  DatabaseUnavailable,
  IdempotencyConflict,
  InternalError,
  JobTerminal,
  Payonce,
  TooManyStreams,
  WaitTimeout,
} from "../../dist/index.js";

interface Seen {
  url: string;
  method: string;
  headers: Headers;
  body: string | undefined;
  redirect: RequestRedirect | undefined;
  at: number;
}

type Step = Response | Error | ((seen: Seen, signal: AbortSignal) => Response | Promise<Response>);

/** A fetch that answers each request with the next step of `script` (the last one repeats). */
function scripted(script: Step[] | ((seen: Seen, index: number) => Step)) {
  const calls: Seen[] = [];
  const fetch: typeof globalThis.fetch = async (input, init) => {
    const seen: Seen = {
      url: String(input),
      method: init?.method ?? "GET",
      headers: new Headers(init?.headers),
      body: init?.body as string | undefined,
      redirect: init?.redirect,
      at: performance.now(),
    };
    calls.push(seen);
    const step = typeof script === "function" ? script(seen, calls.length - 1) : script[Math.min(calls.length - 1, script.length - 1)]!;
    if (step instanceof Error) throw step;
    if (typeof step === "function") return step(seen, init!.signal!);
    return step.clone();
  };
  return { fetch, calls };
}

const json = (status: number, body: unknown, headers: Record<string, string> = {}) =>
  new Response(JSON.stringify(body), { status, headers: { "Content-Type": "application/json", ...headers } });
const error = (status: number, code: string, extra: Record<string, unknown> = {}, headers: Record<string, string> = {}) =>
  json(status, { error: { code, message: `${code} message`, ...extra } }, headers);
const JOB = { id: "6386a69f-92b8-4f76-ab78-051c94883eed", status: "queued", run: 1 };
const lost = () => new TypeError("fetch failed", { cause: new Error("other side closed") });
const BASE = "http://payonce.test";
const client = (fetch: typeof globalThis.fetch, options = {}) => new Payonce({ baseUrl: BASE, apiKey: "k", fetch, ...options });
const BODY = { kind: "media" as const, models: ["sandbox/video-keyed"], input: { prompt: "p" } };

describe.concurrent("the retry rule", () => {
  it("create: the same Idempotency-Key and bytes on every try, through lost answers and 5xx", async () => {
    const { fetch, calls } = scripted([lost(), json(502, {}), json(202, JOB)]);
    const job = await client(fetch).jobs.create(BODY);
    expect(job.id).toBe(JOB.id);
    expect(calls).toHaveLength(3);
    const keys = calls.map((c) => c.headers.get("idempotency-key"));
    expect(keys[0]).toMatch(/^[0-9a-f-]{36}$/);
    expect(new Set(keys).size).toBe(1);
    expect(new Set(calls.map((c) => c.body)).size).toBe(1);
    expect(JSON.parse(calls[0]!.body!)).toEqual(BODY); // idempotencyKey is a header, not a field
    expect(calls[0]!.headers.get("authorization")).toBe("Bearer k");
    expect(calls[0]!.headers.get("content-type")).toBe("application/json");
  });

  it("create: a given key is sent as is; each call without one gets its own", async () => {
    const { fetch, calls } = scripted([json(201, JOB)]);
    const po = client(fetch);
    await po.jobs.create({ ...BODY, idempotencyKey: "mine-1" });
    await po.jobs.create(BODY);
    await po.jobs.create(BODY);
    expect(calls.map((c) => c.headers.get("idempotency-key"))[0]).toBe("mine-1");
    expect(calls[1]!.headers.get("idempotency-key")).not.toBe(calls[2]!.headers.get("idempotency-key"));
  });

  it("create: priority is sent when given, and left out of the body (the hashed bytes) when not", async () => {
    const { fetch, calls } = scripted([json(201, { ...JOB, priority: 5 })]);
    const po = client(fetch);
    const job = await po.jobs.create({ ...BODY, priority: 5 });
    await po.jobs.create(BODY);
    await po.jobs.create({ ...BODY, priority: undefined });
    expect(job.priority).toBe(5);
    expect(JSON.parse(calls[0]!.body!)).toEqual({ ...BODY, priority: 5 });
    expect(calls[1]!.body).toBe(JSON.stringify(BODY));
    expect(calls[2]!.body).toBe(JSON.stringify(BODY));
  });

  it("429 and 503: waits Retry-After, never less; other answers are not retried", async () => {
    const { fetch, calls } = scripted([error(503, "DATABASE_UNAVAILABLE", {}, { "Retry-After": "1" }), json(200, JOB)]);
    await client(fetch).jobs.get(JOB.id);
    expect(calls[1]!.at - calls[0]!.at).toBeGreaterThanOrEqual(1_000);
    const conflict = scripted([error(409, "IDEMPOTENCY_CONFLICT", { job_id: JOB.id })]);
    await expect(client(conflict.fetch).jobs.create(BODY)).rejects.toBeInstanceOf(IdempotencyConflict);
    expect(conflict.calls).toHaveLength(1);
  });

  it("a Retry-After over 60 s is not waited: the error is thrown, with the header", async () => {
    const { fetch, calls } = scripted([error(429, "TOO_MANY_STREAMS", {}, { "Retry-After": "120" })]);
    const thrown = await client(fetch).whoami().catch((e) => e);
    expect(thrown).toBeInstanceOf(TooManyStreams);
    expect(thrown.retryAfterS).toBe(120);
    expect(calls).toHaveLength(1);
  });

  it("gives up after maxRetries, with the last error", async () => {
    const down = scripted([lost()]);
    const thrown = await client(down.fetch, { maxRetries: 2 }).jobs.get(JOB.id).catch((e) => e);
    expect(thrown).toBeInstanceOf(APIConnectionError);
    expect(thrown.message).toContain("other side closed");
    expect(down.calls).toHaveLength(3);
    const failing = scripted([error(500, "INTERNAL_ERROR")]);
    await expect(client(failing.fetch, { maxRetries: 1 }).jobs.get(JOB.id)).rejects.toBeInstanceOf(InternalError);
    expect(failing.calls).toHaveLength(2);
    const unavailable = scripted([error(503, "DATABASE_UNAVAILABLE", {}, { "Retry-After": "0" })]);
    await expect(client(unavailable.fetch, { maxRetries: 0 }).jobs.get(JOB.id)).rejects.toBeInstanceOf(DatabaseUnavailable);
    expect(unavailable.calls).toHaveLength(1);
  });

  it("a try that takes longer than timeoutMs is aborted and tried again", async () => {
    const hang = (_: Seen, signal: AbortSignal) =>
      new Promise<Response>((_, reject) => signal.addEventListener("abort", () => reject(signal.reason)));
    const { fetch, calls } = scripted([hang, json(200, JOB)]);
    const job = await client(fetch, { timeoutMs: 100 }).jobs.get(JOB.id);
    expect(job.id).toBe(JOB.id);
    expect(calls).toHaveLength(2);
    const never = scripted([hang]);
    const thrown = await client(never.fetch, { timeoutMs: 50, maxRetries: 0 }).jobs.get(JOB.id).catch((e) => e);
    expect(thrown).toBeInstanceOf(APIConnectionError);
    expect(thrown.message).toMatch(/no answer within 50 ms/);
  });

  it("retry (paying again): a network error or a timeout is thrown, never sent again", async () => {
    const { fetch, calls } = scripted([lost(), json(202, JOB)]);
    const thrown = await client(fetch).jobs.retry(JOB.id).catch((e) => e);
    expect(thrown).toBeInstanceOf(APIConnectionError);
    expect(thrown.message).toMatch(/not sent again/);
    expect(calls).toHaveLength(1);
    const failing = scripted([error(500, "INTERNAL_ERROR"), json(202, JOB)]);
    await expect(client(failing.fetch).jobs.retry(JOB.id)).rejects.toBeInstanceOf(InternalError);
    expect(failing.calls).toHaveLength(1);
  });

  it("retry (paying again): 429 and 503 prove payonce did not act, so they are tried again", async () => {
    const { fetch, calls } = scripted([
      error(503, "DATABASE_UNAVAILABLE", {}, { "Retry-After": "0" }),
      error(429, "TOO_MANY_STREAMS", {}, { "Retry-After": "0" }),
      json(202, { ...JOB, run: 2 }),
    ]);
    expect((await client(fetch).jobs.retry(JOB.id)).run).toBe(2);
    expect(calls.map((c) => c.method + " " + new URL(c.url).pathname)).toEqual(Array(3).fill(`POST /v1/jobs/${JOB.id}/retry`));
  });

  it("a template's version is sent once (a second try would write another); live and reads are sent again", async () => {
    const TEMPLATE = { name: "a b/c", system: "s", chapters: [{ key: "a", title: "A", instruction: "i" }] };
    const { fetch, calls } = scripted([lost(), json(201, { name: "a b/c", version: 1, live: true })]);
    const thrown = await client(fetch).reportTemplates.create(TEMPLATE).catch((e) => e);
    expect(thrown).toBeInstanceOf(APIConnectionError);
    expect(thrown.message).toMatch(/not sent again.*reportTemplates\.list/);
    expect(calls).toHaveLength(1);
    expect(JSON.parse(calls[0]!.body!)).toEqual(TEMPLATE); // nothing left undefined is sent
    const busy = scripted([error(503, "DATABASE_UNAVAILABLE", {}, { "Retry-After": "0" }), json(201, { name: "x", version: 1, live: true })]);
    expect((await client(busy.fetch).reportTemplates.create(TEMPLATE)).version).toBe(1);
    expect(busy.calls).toHaveLength(2);
    const live = scripted([lost(), json(200, { name: "a b/c", live: 2 })]);
    expect(await client(live.fetch).reportTemplates.setLive("a b/c", 2)).toEqual({ name: "a b/c", live: 2 });
    expect(live.calls.map((c) => [c.method, new URL(c.url).pathname, c.body])).toEqual(
      Array(2).fill(["POST", "/v1/report-templates/a%20b%2Fc/live", '{"version":2}']),
    );
    const read = scripted([lost(), json(200, { name: "a b/c", version: 3 })]);
    expect((await client(read.fetch).reportTemplates.version("a b/c", 3)).version).toBe(3);
    expect(read.calls.map((c) => new URL(c.url).pathname)).toEqual(Array(2).fill("/v1/report-templates/a%20b%2Fc/versions/3"));
  });

  it("cancel: a retry answered JOB_TERMINAL (cancelled) after a lost answer returns the job", async () => {
    const cancelled = { ...JOB, status: "cancelled" };
    const { fetch, calls } = scripted([lost(), error(409, "JOB_TERMINAL", { status: "cancelled" }), json(200, cancelled)]);
    expect(await client(fetch).jobs.cancel(JOB.id)).toEqual(cancelled);
    expect(calls.map((c) => c.method)).toEqual(["POST", "POST", "GET"]);
    // A first try answered JOB_TERMINAL: the job had ended before; that is an error.
    const ended = scripted([error(409, "JOB_TERMINAL", { status: "cancelled" })]);
    await expect(client(ended.fetch).jobs.cancel(JOB.id)).rejects.toBeInstanceOf(JobTerminal);
    // After a 503 (payonce never saw it), the same.
    const refused = scripted([error(503, "DATABASE_UNAVAILABLE", {}, { "Retry-After": "0" }), error(409, "JOB_TERMINAL", { status: "succeeded" })]);
    await expect(client(refused.fetch).jobs.cancel(JOB.id)).rejects.toBeInstanceOf(JobTerminal);
  });
});

describe.concurrent("answers", () => {
  it("an unknown code is an APIError with it; a body that is not JSON still makes an error", async () => {
    const unknown = scripted([error(418, "TEAPOT")]);
    const thrown = await client(unknown.fetch).whoami().catch((e) => e);
    expect(thrown.constructor).toBe(APIError);
    expect([thrown.code, thrown.status, thrown.message]).toEqual(["TEAPOT", 418, "TEAPOT message"]);
    const html = scripted([new Response("<h1>Bad gateway</h1>", { status: 502 })]);
    const gateway = await client(html.fetch, { maxRetries: 0 }).whoami().catch((e) => e);
    expect(gateway).toBeInstanceOf(APIError);
    expect(gateway.code).toBeUndefined();
    expect(gateway.message).toMatch(/HTTP 502/);
    expect(gateway.body).toBe("<h1>Bad gateway</h1>");
  });

  it("get: `waiting` says why a job waits, or is null", async () => {
    const why = { reason: "client_limit", message: "2 of your jobs are in progress, your limit.", limit: 2, running: 2 };
    const { fetch } = scripted([json(200, { ...JOB, priority: 3, waiting: why }), json(200, { ...JOB, priority: 3, waiting: null })]);
    const po = client(fetch);
    const queued = await po.jobs.get(JOB.id);
    expect(queued.waiting).toEqual(why);
    expect(queued.priority).toBe(3);
    expect((await po.jobs.get(JOB.id)).waiting).toBeNull();
  });

  it("list follows `next` under its own base URL, whatever host payonce put in it", async () => {
    const page = (ids: string[], next: string | null) => json(200, { next, previous: null, results: ids.map((id) => ({ id })) });
    const { fetch, calls } = scripted([
      page(["a", "b"], "http://internal-host:8000/v1/jobs?cursor=c1&limit=2"),
      page(["c"], null),
    ]);
    const po = new Payonce({ baseUrl: "https://edge.example.com/payonce/", apiKey: "k", fetch });
    const ids = [];
    for await (const job of po.jobs.list({ limit: 2, status: "succeeded" })) ids.push(job.id);
    expect(ids).toEqual(["a", "b", "c"]);
    expect(calls.map((c) => c.url)).toEqual([
      "https://edge.example.com/payonce/v1/jobs?status=succeeded&limit=2",
      "https://edge.example.com/payonce/v1/jobs?cursor=c1&limit=2",
    ]);
  });

  it("output: a 302 to a presigned URL is read without the API key; a 303 at the report's path", async () => {
    const presigned = "https://bucket.s3.example.com/outputs/x.mp4?X-Amz-Signature=abc";
    const { fetch, calls } = scripted([
      new Response(null, { status: 302, headers: { Location: presigned } }),
      new Response(new Uint8Array([1, 2, 3]), { status: 200, headers: { "Content-Type": "video/mp4" } }),
    ]);
    const output = await client(fetch).jobs.output(JOB.id);
    expect(Array.from(output.bytes)).toEqual([1, 2, 3]);
    expect(output.contentType).toBe("video/mp4");
    expect(calls[0]!.redirect).toBe("manual");
    expect(calls[0]!.headers.get("authorization")).toBe("Bearer k");
    expect(calls[1]!.url).toBe(presigned);
    expect(calls[1]!.headers.get("authorization")).toBeNull();

    const report = scripted([
      new Response(null, { status: 303, headers: { Location: `/v1/jobs/${JOB.id}/report` } }),
      new Response("# Your report\n", { status: 200, headers: { "Content-Type": "text/markdown; charset=utf-8" } }),
    ]);
    const text = await new Payonce({ baseUrl: "https://edge.example.com/payonce", apiKey: "k", fetch: report.fetch }).jobs.output(JOB.id);
    expect(text.text()).toBe("# Your report\n");
    expect(report.calls[1]!.url).toBe(`https://edge.example.com/payonce/v1/jobs/${JOB.id}/report`);
    expect(report.calls[1]!.headers.get("authorization")).toBe("Bearer k");
  });
});

/** An event stream answer: the frames, then (unless `hold`) the end of the stream. */
function stream(text: string, { hold = false } = {}) {
  return (_: Seen, signal: AbortSignal) =>
    new Response(
      new ReadableStream({
        start(controller) {
          controller.enqueue(new TextEncoder().encode(text));
          if (!hold) controller.close();
          signal.addEventListener("abort", () => controller.error(signal.reason));
        },
      }),
      { status: 200, headers: { "Content-Type": "text/event-stream" } },
    );
}

describe.concurrent("events and wait", () => {
  it("events reconnect with Last-Event-ID when the stream closes before `end`", async () => {
    const { fetch, calls } = scripted([
      stream('id: 10\ndata: {"status":"running"}\n\n: keep-alive\n\n'),
      stream('id: 11\ndata: {"status":"succeeded"}\n\nevent: end\ndata: {"status":"succeeded"}\n\n'),
    ]);
    const frames = [];
    for await (const frame of client(fetch).jobs.events(JOB.id, { lastEventId: "9" })) frames.push(frame);
    expect(frames).toEqual([
      { id: "10", event: "message", data: { status: "running" } },
      { id: "11", event: "message", data: { status: "succeeded" } },
      { id: undefined, event: "end", data: { status: "succeeded" } },
    ]);
    expect(calls.map((c) => c.headers.get("last-event-id"))).toEqual(["9", "10"]);
    expect(calls[0]!.headers.get("accept")).toBe("text/event-stream");
  });

  it("breaking out of events closes the stream", async () => {
    let aborted = false;
    const { fetch } = scripted([
      (seen, signal) => {
        signal.addEventListener("abort", () => (aborted = true));
        return stream('id: 1\ndata: {"status":"running"}\n\n', { hold: true })(seen, signal);
      },
    ]);
    for await (const frame of client(fetch).jobs.events(JOB.id)) {
      expect(frame.id).toBe("1");
      break;
    }
    expect(aborted).toBe(true);
  });

  it("wait returns at `waiting` (a person decides), read from the stream", async () => {
    const { fetch, calls } = scripted((seen) => {
      if (seen.url.endsWith("/events")) return stream('id: 5\ndata: {"status":"waiting"}\n\n', { hold: true });
      const gets = calls.filter((c) => !c.url.endsWith("/events")).length;
      return json(200, { ...JOB, status: gets === 1 ? "running" : "waiting" });
    });
    expect((await client(fetch).jobs.wait(JOB.id)).status).toBe("waiting");
  });

  it("wait polls when streams are refused (429 TOO_MANY_STREAMS), without waiting out its Retry-After", async () => {
    const statuses = ["queued", "running", "running", "succeeded"];
    let gets = 0;
    const { fetch, calls } = scripted((seen) =>
      seen.url.endsWith("/events")
        ? error(429, "TOO_MANY_STREAMS", { scope: "client" }, { "Retry-After": "10" })
        : json(200, { ...JOB, status: statuses[Math.min(gets++, statuses.length - 1)] }),
    );
    const started = performance.now();
    const job = await client(fetch).jobs.wait(JOB.id, { pollIntervalMs: 20 });
    expect(job.status).toBe("succeeded");
    expect(calls.filter((c) => c.url.endsWith("/events"))).toHaveLength(1);
    expect(performance.now() - started).toBeLessThan(2_000);
  });

  it("wait throws WaitTimeout with the last job seen", async () => {
    const { fetch } = scripted((seen) =>
      seen.url.endsWith("/events") ? stream('id: 1\ndata: {"status":"running"}\n\n', { hold: true }) : json(200, { ...JOB, status: "running" }),
    );
    const thrown = await client(fetch).jobs.wait(JOB.id, { timeoutMs: 300 }).catch((e) => e);
    expect(thrown).toBeInstanceOf(WaitTimeout);
    expect(thrown.jobId).toBe(JOB.id);
    expect(thrown.job.status).toBe("running");
  });

  it("events: a refused stream (429) is waited out by its Retry-After, then read", async () => {
    const { fetch, calls } = scripted([
      error(429, "TOO_MANY_STREAMS", {}, { "Retry-After": "0" }),
      stream('event: end\ndata: {"status":"failed"}\n\n'),
    ]);
    const frames = [];
    for await (const frame of client(fetch).jobs.events(JOB.id)) frames.push(frame.event);
    expect(frames).toEqual(["end"]);
    expect(calls).toHaveLength(2);
    const refused = scripted([error(429, "TOO_MANY_STREAMS", {}, { "Retry-After": "0" })]);
    const iterate = async () => {
      for await (const _ of client(refused.fetch, { maxRetries: 1 }).jobs.events(JOB.id)) void _;
    };
    await expect(iterate()).rejects.toBeInstanceOf(TooManyStreams);
  });
});
