import { describe, expect, it } from "vitest";
import { EventStreamParser, parseEventStream } from "../../dist/index.js";

function streamOf(chunks: (string | Uint8Array)[]): ReadableStream<Uint8Array> {
  const encoder = new TextEncoder();
  return new ReadableStream({
    start(controller) {
      for (const chunk of chunks) controller.enqueue(typeof chunk === "string" ? encoder.encode(chunk) : chunk);
      controller.close();
    },
  });
}

async function collect(chunks: (string | Uint8Array)[]) {
  const events = [];
  for await (const event of parseEventStream(streamOf(chunks))) events.push(event);
  return events;
}

// What payonce's jobs/api/events.py writes: frames, a keep-alive comment, then `event: end` without an id.
const PAYONCE = [
  'id: 1796228416165841\ndata: {"status":"running","run":1}\n\n',
  ": keep-alive\n\n",
  'id: 1796228418000000\ndata: {"status":"succeeded","run":1}\n\n',
  'event: end\ndata: {"status":"succeeded"}\n\n',
].join("");

describe("the event stream parser", () => {
  it("reads payonce's frames, skips comments, and ends with `end`", async () => {
    expect(await collect([PAYONCE])).toEqual([
      { id: "1796228416165841", event: "message", data: '{"status":"running","run":1}', retry: undefined },
      { id: "1796228418000000", event: "message", data: '{"status":"succeeded","run":1}', retry: undefined },
      { id: undefined, event: "end", data: '{"status":"succeeded"}', retry: undefined },
    ]);
  });

  it("gives the same events however the bytes are cut, one byte at a time included", async () => {
    const whole = await collect([PAYONCE]);
    const bytes = new TextEncoder().encode(PAYONCE);
    const single = Array.from(bytes, (b) => new Uint8Array([b]));
    expect(await collect(single)).toEqual(whole);
    for (const cut of [1, 7, 13, 40, 64]) {
      const chunks = [];
      for (let i = 0; i < bytes.length; i += cut) chunks.push(bytes.slice(i, i + cut));
      expect(await collect(chunks)).toEqual(whole);
    }
  });

  it("decodes UTF-8 split across chunks", async () => {
    const bytes = new TextEncoder().encode('data: {"prompt":"phare 🌅 à l’aube"}\n\n');
    const split = bytes.indexOf(0xf0) + 2; // in the middle of the emoji
    const events = await collect([bytes.slice(0, split), bytes.slice(split)]);
    expect(events.map((e) => e.data)).toEqual(['{"prompt":"phare 🌅 à l’aube"}']);
  });

  it("takes CRLF, CR and LF line endings, a CRLF cut between CR and LF included", async () => {
    const expected = [{ id: "1", event: "message", data: "a", retry: undefined }, { id: "2", event: "message", data: "b", retry: undefined }];
    expect(await collect(["id: 1\r\ndata: a\r\n\r\nid: 2\r\ndata: b\r\n\r\n"])).toEqual(expected);
    expect(await collect(["id: 1\rdata: a\r\rid: 2\rdata: b\r\r"])).toEqual(expected);
    expect(await collect(["id: 1\r", "\ndata: a\r", "\n\r", "\nid: 2\r\ndata: b\r\n\r", "\n"])).toEqual(expected);
  });

  it("joins data lines, keeps the field's value after one space, drops a BOM and unknown fields", async () => {
    const events = await collect(["\uFEFFdata:x\ndata:  y\nfoo: bar\ndata\n\n"]);
    expect(events).toEqual([{ id: undefined, event: "message", data: "x\n y\n", retry: undefined }]);
  });

  it("dispatches nothing without data, nor an event the stream cut before its blank line", async () => {
    expect(await collect(["event: end\n\n", "id: 5\n\n", 'id: 6\ndata: {"cut":true}\n'])).toEqual([]);
  });

  it("remembers the last id for a reconnect, and reads retry:", () => {
    const parser = new EventStreamParser();
    const events = parser.push("retry: 2500\nid: 41\ndata: a\n\nevent: end\ndata: b\n\n");
    expect(events.map((e) => [e.id, e.event, e.retry])).toEqual([
      ["41", "message", 2500],
      [undefined, "end", undefined],
    ]);
    expect(parser.lastEventId).toBe("41");
  });
});
