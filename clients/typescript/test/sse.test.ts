// The Server-Sent Events parser on byte streams cut anywhere (no daemon needed).

import assert from "node:assert/strict";
import { test } from "node:test";
import { sseEvents } from "#internal/http"; // package-private (package.json "imports");

function streamOf(chunks: string[]): ReadableStream<Uint8Array> {
  const enc = new TextEncoder();
  return new ReadableStream({
    start(c) {
      for (const ch of chunks) c.enqueue(enc.encode(ch));
      c.close();
    },
  });
}

async function all(chunks: string[]): Promise<[string, string][]> {
  const out: [string, string][] = [];
  for await (const ev of sseEvents(streamOf(chunks))) out.push(ev);
  return out;
}

test("events, comments, multi-line data, CRLF and CR line ends", async () => {
  const text = ": keep-alive\n\nevent: stdout\ndata: {\"data\":\"a\"}\n\r\nevent: x\r\ndata: 1\r\ndata: 2\r\rdata:no-space\n\n";
  const expected: [string, string][] = [
    ["stdout", '{"data":"a"}'],
    ["x", "1\n2"],
    ["message", "no-space"],
  ];
  assert.deepEqual(await all([text]), expected);
  // cut at every byte: the same events
  assert.deepEqual(await all(text.split("")), expected);
});

test("multi-byte UTF-8 split across chunks; a last event without its blank line", async () => {
  const enc = new TextEncoder();
  const bytes = enc.encode("event: stdout\ndata: héllo ✓\n\nevent: result\ndata: {}");
  const s = new ReadableStream<Uint8Array>({
    start(c) {
      for (const b of bytes) c.enqueue(new Uint8Array([b]));
      c.close();
    },
  });
  const out: [string, string][] = [];
  for await (const ev of sseEvents(s)) out.push(ev);
  assert.deepEqual(out, [
    ["stdout", "héllo ✓"],
    ["result", "{}"],
  ]);
});
