import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));

describe("the published types", () => {
  it("compile the documented calls, and refuse what they should (tsc on test/types/usage.ts)", () => {
    const done = spawnSync(process.execPath, ["node_modules/typescript/bin/tsc", "-p", "tsconfig.types.json"], {
      cwd: ROOT,
      encoding: "utf8",
    });
    expect(done.stdout + done.stderr).toBe("");
    expect(done.status).toBe(0);
  }, 60_000);
});
