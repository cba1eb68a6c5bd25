/**
 * A server-sent events parser (the WHATWG "event stream interpretation"), over a ReadableStream of bytes:
 * `id:`, `event:`, `data:` (several are joined with "\n") and `retry:` fields, `:` comments ignored, any
 * of CRLF, LF or CR ending a line (also split across chunks), a leading BOM dropped, and an event
 * dispatched at a blank line when it has data. UTF-8 split across chunks is decoded whole.
 */

/** One event as it came off the wire: `data` is the raw text. */
export interface RawEvent {
  /** The event's own `id:` field, if it had one. */
  id: string | undefined;
  /** `event:`, or "message" when the event named none. */
  event: string;
  data: string;
  /** `retry:` in milliseconds, if the event carried one. */
  retry: number | undefined;
}

/** A push parser: feed it text, take the events each feed completes. */
export class EventStreamParser {
  private buffer = "";
  private started = false;
  private pendingCR = false;
  private id: string | undefined;
  private event = "";
  private data: string[] = [];
  private retry: number | undefined;
  /** The last event id the stream set (what a reconnect sends as `Last-Event-ID`). */
  lastEventId: string | undefined;

  /** Parse a chunk of text; returns the events it completed. */
  push(text: string): RawEvent[] {
    if (!this.started && text.length > 0) {
      this.started = true;
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
    }
    if (this.pendingCR) {
      // A CR ended the previous chunk: a LF starting this one belongs to the same line ending.
      this.pendingCR = false;
      if (text.startsWith("\n")) text = text.slice(1);
    }
    this.buffer += text;
    const events: RawEvent[] = [];
    let start = 0;
    for (;;) {
      let end = -1;
      for (let i = start; i < this.buffer.length; i++) {
        const ch = this.buffer.charCodeAt(i);
        if (ch === 10 || ch === 13) {
          end = i;
          break;
        }
      }
      if (end === -1) break;
      const line = this.buffer.slice(start, end);
      if (this.buffer.charCodeAt(end) === 13) {
        if (end + 1 === this.buffer.length) {
          this.pendingCR = true;
          start = end + 1;
        } else {
          start = this.buffer.charCodeAt(end + 1) === 10 ? end + 2 : end + 1;
        }
      } else {
        start = end + 1;
      }
      const event = this.line(line);
      if (event) events.push(event);
    }
    this.buffer = this.buffer.slice(start);
    return events;
  }

  /** The stream ended: an event without its blank line is dropped, as the standard says. */
  end(): void {
    this.buffer = "";
    this.data = [];
    this.event = "";
    this.id = undefined;
    this.retry = undefined;
  }

  private line(line: string): RawEvent | undefined {
    if (line === "") return this.dispatch();
    if (line.startsWith(":")) return undefined; // a comment (`: keep-alive`)
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (field) {
      case "data":
        this.data.push(value);
        break;
      case "event":
        this.event = value;
        break;
      case "id":
        if (!value.includes("\u0000")) {
          this.id = value;
          this.lastEventId = value;
        }
        break;
      case "retry":
        if (/^\d+$/.test(value)) this.retry = Number(value);
        break;
      default: // unknown fields are ignored
    }
    return undefined;
  }

  private dispatch(): RawEvent | undefined {
    const had = this.data.length > 0;
    const event: RawEvent = { id: this.id, event: this.event || "message", data: this.data.join("\n"), retry: this.retry };
    this.data = [];
    this.event = "";
    this.id = undefined;
    this.retry = undefined;
    return had ? event : undefined;
  }
}

/**
 * The events of a byte stream, in order, as they arrive (a `fetch` answer's `body`). Ends when the stream
 * does; cancelling the iteration (`break`, `return`) cancels the stream.
 */
export async function* parseEventStream(
  body: ReadableStream<Uint8Array>,
  parser: EventStreamParser = new EventStreamParser(),
): AsyncGenerator<RawEvent, void, undefined> {
  const reader = body.getReader();
  const decoder = new TextDecoder("utf-8");
  let done = false;
  try {
    for (;;) {
      const chunk = await reader.read();
      if (chunk.done) {
        done = true;
        const rest = decoder.decode();
        if (rest) yield* parser.push(rest);
        parser.end();
        return;
      }
      const events = parser.push(decoder.decode(chunk.value, { stream: true }));
      for (const event of events) yield event;
    }
  } finally {
    if (!done) {
      await reader.cancel().catch(() => undefined);
    }
    reader.releaseLock();
  }
}
