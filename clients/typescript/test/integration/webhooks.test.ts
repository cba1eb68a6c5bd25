// A real delivery of payonce's `webhooks` worker, captured by the pytest wrapper's receiver and passed in
// PAYONCE_TEST_DELIVERY (body, headers, the client's secret, the job's id).
import { describe, expect, it } from "vitest";
import { WebhookDeduper, WebhookVerificationError, signWebhook, verifyWebhook } from "../../dist/index.js";
import { json } from "./stack.js";

interface Delivery {
  body: string;
  headers: Record<string, string>;
  secret: string;
  job_id: string;
}

describe("verifyWebhook on payonce's own delivery", () => {
  const delivery = json<Delivery>("PAYONCE_TEST_DELIVERY");

  it("verifies, as text and as bytes, and returns the envelope", async () => {
    const event = await verifyWebhook(delivery.body, delivery.headers, delivery.secret);
    expect(event.type).toBe("generation.succeeded");
    expect(event.data.id).toBe(delivery.job_id);
    expect(event.id).toBe(`${delivery.job_id}:1:generation.succeeded`);
    const again = await verifyWebhook(new TextEncoder().encode(delivery.body), new Headers(delivery.headers), delivery.secret);
    expect(again).toEqual(event);
  });

  it("signs exactly as payonce does", async () => {
    const { "webhook-id": id, "webhook-timestamp": ts, "webhook-signature": signature } = delivery.headers;
    expect(signature!.split(" ")).toContain(await signWebhook(delivery.secret, id!, ts!, delivery.body));
  });

  it("refuses a tampered body", async () => {
    const tampered = delivery.body.replace('"succeeded"', '"failed"');
    expect(tampered).not.toBe(delivery.body);
    await expect(verifyWebhook(tampered, delivery.headers, delivery.secret)).rejects.toBeInstanceOf(WebhookVerificationError);
  });

  it("refuses another secret", async () => {
    const other = "whsec_" + btoa("a different secret, 32 bytes long");
    await expect(verifyWebhook(delivery.body, delivery.headers, other)).rejects.toBeInstanceOf(WebhookVerificationError);
  });

  it("refuses an old timestamp, even properly signed", async () => {
    const old = Math.floor(Date.now() / 1000) - 600;
    const id = delivery.headers["webhook-id"]!;
    const headers = { ...delivery.headers, "webhook-timestamp": String(old), "webhook-signature": await signWebhook(delivery.secret, id, old, delivery.body) };
    await expect(verifyWebhook(delivery.body, headers, delivery.secret)).rejects.toThrow(/too old/);
    await expect(verifyWebhook(delivery.body, headers, delivery.secret, { toleranceS: 900 })).resolves.toBeTruthy();
  });

  it("de-duplicates on webhook-id", () => {
    const seen = new WebhookDeduper();
    expect(seen.isDuplicate(delivery.headers["webhook-id"])).toBe(false);
    expect(seen.isDuplicate(delivery.headers["webhook-id"])).toBe(true);
  });
});
