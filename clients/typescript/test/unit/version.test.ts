// Every call names this library and its version in User-Agent; the version is package.json's (and the
// server's: tests/project/test_version.py).
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { Payonce, VERSION } from "../../dist/index.js";

describe("the library's version", () => {
  it("is package.json's", () => {
    const pkg = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8"));
    expect(VERSION).toBe(pkg.version);
  });

  it("is sent in User-Agent on every call", async () => {
    const sent: string[] = [];
    const client = new Payonce({
      baseUrl: "http://127.0.0.1:8000",
      apiKey: "Ab3dE5gH.key",
      fetch: async (_input, init) => {
        sent.push(new Headers(init?.headers).get("User-Agent") ?? "");
        return new Response(JSON.stringify({ client_id: "c", name: "n" }), {
          status: 200,
          headers: { "Content-Type": "application/json" },
        });
      },
    });
    await client.whoami();
    expect(sent).toEqual([`payonce-client-typescript/${VERSION}`]);
  });
});
