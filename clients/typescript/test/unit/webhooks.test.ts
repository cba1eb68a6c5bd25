import { describe, expect, it } from "vitest";
import { WebhookDeduper, WebhookVerificationError, signWebhook, verifyWebhook } from "../../dist/index.js";

// The Standard Webhooks reference vector (standard-webhooks' own test suite), checked against
// Python's hmac and the standardwebhooks library.
const SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const ID = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const TS = 1614265330;
const BODY = '{"test": 2432232314}';
const SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
const AT = TS * 1000;

// Non-ASCII body, signed over its UTF-8 bytes (computed with Python's hmac).
const UNICODE_BODY = '{"data":{"prompt":"phare à l’aube 🌅"},"type":"generation.succeeded"}';
const UNICODE_SIGNATURE = "v1,/lEkxDvs6aBwTA2BPrIFWqZKQJU5ZhY2JnvN/uuKx30=";

const headers = (signature = SIGNATURE, timestamp: number | string = TS, id = ID) => ({
  "webhook-id": id,
  "webhook-timestamp": String(timestamp),
  "webhook-signature": signature,
});

describe("verifyWebhook", () => {
  it("accepts the reference vector, as text, bytes, Headers or any header case", async () => {
    expect(await verifyWebhook(BODY, headers(), SECRET, { now: AT })).toEqual({ test: 2432232314 });
    expect(await verifyWebhook(new TextEncoder().encode(BODY), new Headers(headers()), SECRET, { now: AT })).toEqual({
      test: 2432232314,
    });
    const upper = { "Webhook-Id": ID, "WEBHOOK-TIMESTAMP": String(TS), "Webhook-Signature": SIGNATURE };
    expect(await verifyWebhook(BODY, upper, SECRET, { now: AT })).toEqual({ test: 2432232314 });
  });

  it("signs as the reference does", async () => {
    expect(await signWebhook(SECRET, ID, TS, BODY)).toBe(SIGNATURE);
    expect(await signWebhook(SECRET, "wh_1", 1700000000, UNICODE_BODY)).toBe(UNICODE_SIGNATURE);
  });

  it("verifies a UTF-8 body over its bytes", async () => {
    const event = await verifyWebhook<{ data: { prompt: string } }>(
      UNICODE_BODY,
      headers(UNICODE_SIGNATURE, 1700000000, "wh_1"),
      SECRET,
      { now: 1700000000_000 },
    );
    expect(event.data.prompt).toBe("phare à l’aube 🌅");
  });

  it("takes any matching signature of several (a secret rotation)", async () => {
    const other = "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    await expect(verifyWebhook(BODY, headers(`${other} ${SIGNATURE}`), SECRET, { now: AT })).resolves.toBeTruthy();
    await expect(verifyWebhook(BODY, headers(`v2,xyz ${SIGNATURE}`), SECRET, { now: AT })).resolves.toBeTruthy();
  });

  it("refuses a tampered body, a wrong secret, a wrong id, a non-v1 or garbled signature", async () => {
    const refusals = [
      () => verifyWebhook(BODY.replace("2", "3"), headers(), SECRET, { now: AT }),
      () => verifyWebhook(BODY, headers(), "whsec_" + btoa("another secret of 24 bytes"), { now: AT }),
      () => verifyWebhook(BODY, headers(SIGNATURE, TS, "msg_other"), SECRET, { now: AT }),
      () => verifyWebhook(BODY, headers(SIGNATURE.replace("v1,", "v2,")), SECRET, { now: AT }),
      () => verifyWebhook(BODY, headers("v1,not base64!"), SECRET, { now: AT }),
      () => verifyWebhook(BODY, headers(SIGNATURE.slice(0, -4)), SECRET, { now: AT }),
    ];
    for (const refused of refusals) await expect(refused()).rejects.toBeInstanceOf(WebhookVerificationError);
  });

  it("refuses a timestamp outside the tolerance, either way, and a missing header", async () => {
    await expect(verifyWebhook(BODY, headers(), SECRET, { now: AT + 301_000 })).rejects.toThrow(/too old/);
    await expect(verifyWebhook(BODY, headers(), SECRET, { now: AT - 301_000 })).rejects.toThrow(/too new/);
    await expect(verifyWebhook(BODY, headers(), SECRET, { now: AT + 299_000 })).resolves.toBeTruthy();
    await expect(verifyWebhook(BODY, headers(), SECRET, { now: AT + 3_600_000, toleranceS: 3_601 })).resolves.toBeTruthy();
    await expect(verifyWebhook(BODY, headers(SIGNATURE, "soon"), SECRET, { now: AT })).rejects.toBeInstanceOf(
      WebhookVerificationError,
    );
    const { "webhook-signature": _, ...unsigned } = headers();
    await expect(verifyWebhook(BODY, unsigned, SECRET, { now: AT })).rejects.toThrow(/Missing/);
  });

  it("refuses a signed body that is not JSON", async () => {
    const signature = await signWebhook(SECRET, ID, TS, "not json");
    await expect(verifyWebhook("not json", headers(signature), SECRET, { now: AT })).rejects.toBeInstanceOf(
      WebhookVerificationError,
    );
  });
});

describe("WebhookDeduper", () => {
  it("acts on an id once, forgets it after the TTL or when told", () => {
    const seen = new WebhookDeduper({ ttlMs: 1_000 });
    expect(seen.isDuplicate("a", 0)).toBe(false);
    expect(seen.isDuplicate("a", 500)).toBe(true);
    expect(seen.isDuplicate("b", 600)).toBe(false);
    expect(seen.isDuplicate("a", 1_001)).toBe(false); // expired: seen anew
    seen.forget("b");
    expect(seen.isDuplicate("b", 1_002)).toBe(false);
    expect(seen.isDuplicate(null)).toBe(false);
  });

  it("keeps at most maxSize ids, dropping the oldest", () => {
    const seen = new WebhookDeduper({ ttlMs: 60_000, maxSize: 3 });
    for (const id of ["a", "b", "c", "d"]) expect(seen.isDuplicate(id, 0)).toBe(false);
    expect(seen.size).toBe(3);
    expect(seen.isDuplicate("d", 1)).toBe(true);
    expect(seen.isDuplicate("a", 1)).toBe(false); // pushed out by d
  });
});
