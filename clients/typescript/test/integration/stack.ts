// The stack these tests run against, as tests/clients/test_typescript_client.py starts it and names it in
// PAYONCE_TEST_* variables. Missing, a test FAILS (never skips), saying how to run it.
import { Payonce, type PayonceOptions } from "../../dist/index.js";

const HOW = "these tests run against a real payonce stack: run them through " +
  "`.venv/bin/python -m pytest tests/clients/test_typescript_client.py` from the repository root";

export function env(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: ${HOW}.`);
  return value;
}

export function json<T>(name: string): T {
  return JSON.parse(env(name)) as T;
}

export interface Account {
  api_key: string;
  client_id: string;
  webhook_secret: string;
}

/** A client of its own per scenario, so each scenario's job count is checkable. */
export function account(name: string): Account {
  const accounts = json<Record<string, Account>>("PAYONCE_TEST_ACCOUNTS");
  const found = accounts[name];
  if (!found) throw new Error(`PAYONCE_TEST_ACCOUNTS has no "${name}" account: ${HOW}.`);
  return found;
}

export function client(name: string, options: Partial<PayonceOptions> = {}): Payonce {
  return new Payonce({ baseUrl: env("PAYONCE_TEST_URL"), apiKey: account(name).api_key, ...options });
}

export function render(seconds = 0, extra: Record<string, unknown> = {}) {
  return {
    kind: "media" as const,
    models: ["sandbox/video-keyed"],
    input: { prompt: "a lighthouse at dusk", render_s: seconds, ...extra },
  };
}

/** A fetch that records every request it carries (URL, method, headers) and the status it got, if any. */
export function recordingFetch() {
  const seen: { url: string; method: string; headers: Headers; status?: number }[] = [];
  const wrapped: typeof fetch = async (input, init) => {
    const request: (typeof seen)[number] = { url: String(input), method: init?.method ?? "GET", headers: new Headers(init?.headers) };
    seen.push(request);
    const response = await fetch(input, init);
    request.status = response.status;
    return response;
  };
  return { fetch: wrapped, seen };
}
