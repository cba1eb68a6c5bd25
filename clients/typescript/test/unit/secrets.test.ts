// The API key never shows in what a person prints or logs: `console.log(client)` (util.inspect, even
// with hidden properties and at any depth) and `JSON.stringify(client)`; the base URL does. The key is
// still sent, as the Authorization header.
import { inspect } from "node:util";
import { describe, expect, it } from "vitest";
import { Payonce } from "../../dist/index.js";

const KEY = "Ab3dE5gH.sEcReTsEcReTsEcReTsEcReTsEcReTsE";
const BASE = "http://127.0.0.1:8000/payonce";

describe("the API key stays out of what is printed", () => {
  const sent: string[] = [];
  const client = new Payonce({
    baseUrl: BASE,
    apiKey: KEY,
    fetch: async (_input, init) => {
      sent.push(new Headers(init?.headers).get("Authorization") ?? "");
      return new Response(JSON.stringify({ client_id: "c", name: "n" }), {
        status: 200,
        headers: { "Content-Type": "application/json" },
      });
    },
  });

  it("is not in console.log's view of the client or of its parts", () => {
    for (const shown of [client, client.jobs, client.orders, client.http, { nested: { client } }]) {
      for (const options of [{}, { depth: Infinity, showHidden: true }]) {
        const text = inspect(shown, options);
        expect(text).not.toContain(KEY);
        expect(text).not.toContain("sEcReT");
      }
    }
    expect(inspect(client)).toBe(`Payonce { baseUrl: "${BASE}" }`);
  });

  it("is not in JSON.stringify's", () => {
    for (const shown of [client, client.jobs, client.http, { client }]) {
      expect(JSON.stringify(shown)).not.toContain("sEcReT");
    }
    expect(JSON.parse(JSON.stringify(client))).toEqual({ baseUrl: BASE });
  });

  it("is not an enumerable or own property anywhere", () => {
    const seen = new Set<unknown>();
    const walk = (value: unknown): void => {
      if (value === null || typeof value !== "object" || seen.has(value)) return;
      seen.add(value);
      for (const key of Reflect.ownKeys(value)) {
        const item = (value as Record<PropertyKey, unknown>)[key];
        expect(item).not.toBe(KEY);
        walk(item);
      }
    };
    walk(client);
  });

  it("is still sent as the Authorization header", async () => {
    await client.whoami();
    expect(sent).toEqual([`Bearer ${KEY}`]);
  });
});
