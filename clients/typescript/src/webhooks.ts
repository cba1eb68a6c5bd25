/**
 * Webhook deliveries (docs/api.md, "Webhooks"): Standard Webhooks signatures, checked with Web Crypto, and
 * a small de-duplication helper on `webhook-id`.
 */

import { WebhookVerificationError } from "./errors.js";
import type { WebhookEvent } from "./types.js";

const encoder = new TextEncoder();

export interface VerifyOptions {
  /** How far the `webhook-timestamp` may be from now, either way, in seconds (default 300). */
  toleranceS?: number;
  /** "Now" in milliseconds since the epoch (tests); default `Date.now()`. */
  now?: number;
}

/**
 * Verify a delivery as Standard Webhooks does and return its parsed envelope
 * (`{"id", "type", "created_at", "data": <the job>}`). `body` must be the raw bytes (or their exact text)
 * as received: re-serialised JSON does not verify. `secret` is the client's `whsec_...` secret.
 *
 * Throws `WebhookVerificationError` when a header is missing, the timestamp is more than `toleranceS` away
 * from now, or no `v1` signature of `webhook-signature` matches (during a secret rotation payonce sends two).
 */
export async function verifyWebhook<T = WebhookEvent>(
  body: string | Uint8Array | ArrayBuffer,
  headers: Headers | Record<string, string | string[] | undefined>,
  secret: string,
  { toleranceS = 300, now = Date.now() }: VerifyOptions = {},
): Promise<T> {
  const id = header(headers, "webhook-id");
  const timestamp = header(headers, "webhook-timestamp");
  const signatures = header(headers, "webhook-signature");
  if (!id || !timestamp || !signatures) {
    throw new WebhookVerificationError("Missing webhook-id, webhook-timestamp or webhook-signature header.");
  }
  if (!/^\d{1,15}$/.test(timestamp.trim())) {
    throw new WebhookVerificationError("Invalid webhook-timestamp.");
  }
  const sentS = Number(timestamp.trim());
  const nowS = Math.floor(now / 1000);
  if (sentS < nowS - toleranceS) throw new WebhookVerificationError("Message timestamp too old.");
  if (sentS > nowS + toleranceS) throw new WebhookVerificationError("Message timestamp too new.");

  const bytes = typeof body === "string" ? encoder.encode(body) : body instanceof Uint8Array ? body : new Uint8Array(body);
  const expected = await sign(secret, id, timestamp.trim(), bytes);
  let matched = false;
  for (const part of signatures.split(" ")) {
    const comma = part.indexOf(",");
    if (comma === -1 || part.slice(0, comma) !== "v1") continue;
    const given = decodeBase64(part.slice(comma + 1));
    // Every candidate is compared in full (no early exit on the first match either).
    if (given !== undefined && timingSafeEqual(given, expected)) matched = true;
  }
  if (!matched) throw new WebhookVerificationError("No matching signature found.");
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
    return JSON.parse(text) as T;
  } catch (cause) {
    throw new WebhookVerificationError("The body is signed but is not JSON in UTF-8.", { cause });
  }
}

/**
 * The `v1,<base64>` signature of a delivery: HMAC-SHA256 over `${id}.${timestamp}.${body}` with the
 * secret's bytes (`whsec_` + base64). Exported for tests and for re-signing fixtures.
 */
export async function signWebhook(
  secret: string,
  id: string,
  timestamp: number | string,
  body: string | Uint8Array,
): Promise<string> {
  const bytes = typeof body === "string" ? encoder.encode(body) : body;
  return `v1,${encodeBase64(await sign(secret, id, String(timestamp), bytes))}`;
}

async function sign(secret: string, id: string, timestamp: string, body: Uint8Array): Promise<Uint8Array> {
  const raw = secret.startsWith("whsec_") ? secret.slice("whsec_".length) : secret;
  const keyBytes = decodeBase64(raw);
  if (keyBytes === undefined || keyBytes.length === 0) {
    throw new WebhookVerificationError("The webhook secret is not `whsec_` followed by base64.");
  }
  const prefix = encoder.encode(`${id}.${timestamp}.`);
  const content = new Uint8Array(prefix.length + body.length);
  content.set(prefix, 0);
  content.set(body, prefix.length);
  const subtle = globalThis.crypto?.subtle;
  if (!subtle) throw new WebhookVerificationError("Web Crypto (crypto.subtle) is not available in this runtime.");
  const key = await subtle.importKey("raw", keyBytes as BufferSource, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  return new Uint8Array(await subtle.sign("HMAC", key, content as BufferSource));
}

function header(headers: Headers | Record<string, string | string[] | undefined>, name: string): string | undefined {
  if (typeof (headers as Headers).get === "function") return (headers as Headers).get(name) ?? undefined;
  for (const [key, value] of Object.entries(headers)) {
    if (key.toLowerCase() === name) return Array.isArray(value) ? value.join(" ") : value;
  }
  return undefined;
}

/** Constant time in the length of the expected value. */
function timingSafeEqual(a: Uint8Array, b: Uint8Array): boolean {
  let diff = a.length ^ b.length;
  for (let i = 0; i < b.length; i++) diff |= (a[i] ?? 0) ^ (b[i] ?? 0);
  return diff === 0;
}

function decodeBase64(text: string): Uint8Array | undefined {
  try {
    const binary = atob(text.trim());
    const out = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) out[i] = binary.charCodeAt(i);
    return out;
  } catch {
    return undefined;
  }
}

function encodeBase64(bytes: Uint8Array): string {
  let binary = "";
  for (let i = 0; i < bytes.length; i++) binary += String.fromCharCode(bytes[i] as number);
  return btoa(binary);
}

export interface DeduperOptions {
  /** How long a `webhook-id` is remembered, in milliseconds (default 24 h: longer than payonce's retry schedule's first day). */
  ttlMs?: number;
  /** At most this many ids are kept; the oldest go first (default 10,000). */
  maxSize?: number;
}

/**
 * Remembers `webhook-id`s for a while, in this process's memory, so a delivery payonce sends again (a
 * retry after a lost 2xx, a replay) is acted on once. It forgets after `ttlMs`, past `maxSize`, and on a
 * restart, and each process has its own: in production, record the `webhook-id` under a unique
 * constraint in your database, in the same transaction as what the event does.
 *
 *     const seen = new WebhookDeduper();
 *     if (seen.isDuplicate(headers.get("webhook-id"))) return new Response(null, { status: 200 });
 *     try { await handle(event); } catch (e) { seen.forget(id); throw e; }
 */
export class WebhookDeduper {
  private readonly ttlMs: number;
  private readonly maxSize: number;
  private readonly seen = new Map<string, number>(); // id -> expiry, in insertion order

  constructor({ ttlMs = 24 * 60 * 60 * 1000, maxSize = 10_000 }: DeduperOptions = {}) {
    if (!(ttlMs > 0) || !(maxSize > 0)) throw new RangeError("ttlMs and maxSize must be positive.");
    this.ttlMs = ttlMs;
    this.maxSize = maxSize;
  }

  /** True when this id was seen (and not forgotten) before; otherwise remembers it and returns false. */
  isDuplicate(webhookId: string | null | undefined, now: number = Date.now()): boolean {
    if (!webhookId) return false;
    this.prune(now);
    const expiry = this.seen.get(webhookId);
    if (expiry !== undefined && expiry > now) return true;
    this.seen.delete(webhookId);
    this.seen.set(webhookId, now + this.ttlMs);
    while (this.seen.size > this.maxSize) {
      const oldest = this.seen.keys().next().value as string;
      this.seen.delete(oldest);
    }
    return false;
  }

  /** Forget an id (its handling failed: let payonce's next try through). */
  forget(webhookId: string): void {
    this.seen.delete(webhookId);
  }

  get size(): number {
    return this.seen.size;
  }

  private prune(now: number): void {
    // Insertion order is expiry order (the TTL is fixed), so the expired ones are at the front.
    for (const [id, expiry] of this.seen) {
      if (expiry > now) break;
      this.seen.delete(id);
    }
  }
}
