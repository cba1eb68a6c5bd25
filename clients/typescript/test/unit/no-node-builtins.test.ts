// src/ is the package: it must run unchanged on Workers, Deno and browsers, so no Node built-in may appear
// in it (tsconfig.json's `types: []` keeps @types/node out as well). This scan is the second lock.
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const SRC = fileURLToPath(new URL("../../src/", import.meta.url));

const FORBIDDEN: [RegExp, string][] = [
  [/\bfrom\s+["'](node:[^"']+)["']/, "an import of a node: module"],
  [/\bimport\s*\(\s*["'](node:[^"']+)["']\s*\)/, "a dynamic import of a node: module"],
  [
    /\bfrom\s+["'](fs|fs\/promises|http|https|http2|net|tls|dns|os|path|url|util|stream|stream\/web|crypto|buffer|events|child_process|zlib|worker_threads|process|timers|assert)["']/,
    "an import of a Node built-in",
  ],
  [/\brequire\s*\(/, "require()"],
  [/\bBuffer\b/, "Buffer"],
  [/\bprocess\s*\./, "process"],
  [/\b__dirname\b|\b__filename\b/, "__dirname/__filename"],
  [/\bsetImmediate\b/, "setImmediate"],
  [/\bglobal\s*\./, "global (use globalThis)"],
];

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) =>
    entry.isDirectory() ? sources(join(dir, entry.name)) : /\.[cm]?ts$/.test(entry.name) ? [join(dir, entry.name)] : [],
  );
}

describe("src/ uses no Node built-in", () => {
  it("finds the sources", () => {
    expect(sources(SRC).length).toBeGreaterThan(3);
  });

  for (const file of sources(SRC)) {
    it(file.slice(SRC.length), () => {
      const found: string[] = [];
      readFileSync(file, "utf8")
        .split("\n")
        .forEach((line, i) => {
          // Code only: a comment may name what is forbidden (this very rule, a README example).
          const code = line.replace(/^\s*(\/\/|\*|\/\*).*$/, "").replace(/\s\/\/.*$/, "");
          for (const [pattern, what] of FORBIDDEN) if (pattern.test(code)) found.push(`${i + 1}: ${what}: ${line.trim()}`);
        });
      expect(found, `Node built-ins in src/${file.slice(SRC.length)}`).toEqual([]);
    });
  }

  it("the scan catches what it should", () => {
    const hits = (code: string) => FORBIDDEN.some(([pattern]) => pattern.test(code));
    expect(hits('import { readFileSync } from "node:fs";')).toBe(true);
    expect(hits('import { createHmac } from "crypto";')).toBe(true);
    expect(hits("const b = Buffer.from(x);")).toBe(true);
    expect(hits("const k = process.env.KEY;")).toBe(true);
    expect(hits('const fs = require("fs");')).toBe(true);
    expect(hits('import { Transport } from "./http.js";')).toBe(false);
    expect(hits("const crypto = globalThis.crypto;")).toBe(false);
  });
});

describe("the build", () => {
  it("ships ESM with types and no runtime dependency", () => {
    const pkg = JSON.parse(readFileSync(fileURLToPath(new URL("../../package.json", import.meta.url)), "utf8"));
    expect(pkg.type).toBe("module");
    expect(pkg.dependencies ?? {}).toEqual({});
    expect(pkg.exports["."]).toEqual({ types: "./dist/index.d.ts", import: "./dist/index.js" });
    for (const version of Object.values(pkg.devDependencies)) expect(version).toMatch(/^\d+\.\d+\.\d+$/);
    const tsconfig = readFileSync(fileURLToPath(new URL("../../tsconfig.json", import.meta.url)), "utf8");
    expect(tsconfig).toMatch(/"types":\s*\[\]/);
  });
});
