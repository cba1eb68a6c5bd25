import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import * as payonce from "../../dist/index.js";
import { APIError, ERROR_CLASSES, PayonceError, errorFromAnswer } from "../../dist/index.js";

const documentCodes: string[] = JSON.parse(
  readFileSync(new URL("../../../openapi.json", import.meta.url), "utf8"),
).components.schemas.ErrorCode.enum;

const pascal = (code: string) => code.toLowerCase().replace(/(^|_)([a-z])/g, (_, __, c: string) => c.toUpperCase());

describe("error classes", () => {
  it("one per code of payonce's document, exported under the code's name", () => {
    expect(documentCodes.length).toBeGreaterThan(20);
    for (const code of documentCodes) {
      const Class = (ERROR_CLASSES as Record<string, unknown>)[code];
      expect(Class, code).toBeDefined();
      if (code === "ERROR") {
        expect(Class).toBe(APIError);
        continue;
      }
      expect((payonce as Record<string, unknown>)[pascal(code)], code).toBe(Class);
    }
  });

  it("an answer becomes its code's class, with status, code, message, body and headers", () => {
    const headers = new Headers({ "Retry-After": "1" });
    const body = { error: { code: "DATABASE_UNAVAILABLE", message: "The database is unavailable; try again shortly." } };
    const error = errorFromAnswer(503, body, headers);
    expect(error).toBeInstanceOf(payonce.DatabaseUnavailable);
    expect(error).toBeInstanceOf(APIError);
    expect(error).toBeInstanceOf(PayonceError);
    expect(error).toBeInstanceOf(Error);
    expect([error.name, error.status, error.code, error.message]).toEqual([
      "DatabaseUnavailable",
      503,
      "DATABASE_UNAVAILABLE",
      "The database is unavailable; try again shortly.",
    ]);
    expect(error.body).toBe(body);
    expect(error.retryAfterS).toBe(1);
    const conflict = errorFromAnswer(409, { error: { code: "IDEMPOTENCY_CONFLICT", message: "m", job_id: "j" } }, new Headers());
    expect(conflict.jobId).toBe("j");
    expect(errorFromAnswer(400, { error: { code: "hasOwnProperty", message: "m" } }, new Headers()).constructor).toBe(APIError);
  });
});
