// Sessions, files, network and streaming against a real daemon.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  Airlock,
  AirlockConnectionError,
  ApprovalNotFound,
  FileNotFound,
  InvalidRequest,
  SandboxNotFound,
  type StreamEvent,
} from "airlock-sandbox";
import { Daemon, startDaemon } from "./daemon.js";

let daemon: Daemon;
let al: Airlock;

before(async () => {
  daemon = await startDaemon();
  al = new Airlock({ url: daemon.url });
});
after(async () => {
  await daemon?.stop();
});

describe("sessions", () => {
  test("files persist between execs; write, read, list; delete", async () => {
    const sb = await al.createSandbox({ ttlS: 120 });
    assert.match(sb.id, /^[0-9a-f]{16}$/);
    assert.ok(sb.expiresAt !== null && sb.expiresAt > Date.now() / 1000);
    await sb.writeFile("data.csv", "a,b\n1,2\n");
    await sb.writeFile("bin/blob", new Uint8Array([0, 200, 255, 10]));
    await sb.writeFile("tool.sh", "#!/bin/sh\necho tool\n", { mode: 0o755 });
    const r = await sb.exec(["sh", "-c", "wc -l < data.csv; ./tool.sh; echo made > out.txt"]);
    assert.equal(r.stdout, "2\ntool\n");
    assert.equal(r.id, sb.id);
    assert.equal((await sb.exec(["cat", "out.txt"])).stdout, "made\n");
    assert.equal(await sb.readText("out.txt"), "made\n");
    assert.deepEqual(await sb.readFile("bin/blob"), new Uint8Array([0, 200, 255, 10]));
    const entries = await sb.listFiles();
    const byPath = new Map(entries.map((e) => [e.path, e]));
    assert.equal(byPath.get("bin")?.dir, true);
    assert.equal(byPath.get("tool.sh")?.mode, 0o755);
    assert.equal(byPath.get("data.csv")?.size, 8);
    await assert.rejects(sb.readFile("nope.txt"), FileNotFound);
    await assert.rejects(sb.writeFile("../x", "y"), (e: unknown) => e instanceof InvalidRequest && e.field === "path");
    const info = await sb.info();
    assert.equal(info.id, sb.id);
    assert.equal(info.usage.execs, 2);
    assert.ok((await al.listSandboxes()).some((s) => s.id === sb.id));
    assert.equal((await al.getSandbox(sb.id)).id, sb.id);
    await sb.delete();
    await assert.rejects(sb.exec(["true"]), SandboxNotFound);
    await assert.rejects(al.getSandbox(sb.id), SandboxNotFound);
    await sb.close(); // idempotent
  });

  test("await using deletes the sandbox at the end of the block", async () => {
    let id = "";
    {
      await using sb = await al.createSandbox();
      id = sb.id;
      assert.equal((await sb.run({ code: "print('in a session')" })).stdout, "in a session\n");
    }
    await assert.rejects(al.getSandbox(id), SandboxNotFound);
  });

  test("a session's timeoutMs is its execs' deadline", async () => {
    await using sb = await al.createSandbox({ timeoutMs: 300 });
    const r = await sb.exec(["sleep", "10"]);
    assert.equal(r.outcome, "timeout");
    const ok = await sb.exec(["sleep", "1"], { timeoutMs: 5000 });
    assert.equal(ok.outcome, "exited");
  });

  test("network: shown, updated, approvals", async () => {
    await using none = await al.createSandbox();
    assert.deepEqual(await none.network(), { mode: "none" });
    await assert.rejects(none.updateNetwork({ allow: ["example.com"] }), (e: unknown) => e instanceof InvalidRequest && e.field === "network");

    await using sb = await al.createSandbox({
      network: { mode: "proxy", allow: ["example.com"], on_denied: "ask", approval_timeout_ms: 5000 },
    });
    const shown = await sb.network();
    assert.equal(shown.mode, "proxy");
    if (shown.mode === "proxy") {
      assert.deepEqual(shown.allow, ["example.com"]);
      assert.equal(shown.on_denied, "ask");
      assert.equal(shown.approval_timeout_ms, 5000);
    }
    const updated = await sb.updateNetwork({ allow: ["pypi.org"], deny: ["*.internal.example"] });
    assert.ok(updated.mode === "proxy" && updated.allow[0] === "pypi.org" && updated.deny[0] === "*.internal.example");
    await assert.rejects(sb.updateNetwork({ deny: ["not a host!"] }), (e: unknown) => e instanceof InvalidRequest && e.field === "network.deny[0]");
    assert.deepEqual(await sb.approvals(), []);
    assert.deepEqual(await sb.approvals({ waitMs: 100 }), []);
    await assert.rejects(sb.approve(12345, "deny"), ApprovalNotFound);
  });
});

describe("streaming", () => {
  const script = "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.2; done; exit 4";

  test("events arrive in order, as they are written, then the result", async () => {
    const stream = al.stream({ cmd: ["bash", "-c", script] });
    const events: StreamEvent[] = [];
    const times: number[] = [];
    for await (const ev of stream) {
      events.push(ev);
      times.push(Date.now());
    }
    const last = events.at(-1);
    assert.ok(last && last.kind === "result");
    assert.equal(last.result.exit_code, 4);
    assert.equal(stream.result?.exit_code, 4);
    const out = events.filter((e) => e.kind !== "result").map((e) => `${e.kind}:${(e as { data: string }).data}`);
    assert.deepEqual(out, ["stdout:out1\n", "stderr:err1\n", "stdout:out2\n", "stderr:err2\n", "stdout:out3\n", "stderr:err3\n"]);
    // the first line arrived well before the end: it was streamed, not buffered
    assert.ok(times.at(-1)! - times[0]! >= 300, `${times.at(-1)! - times[0]!} ms`);
  });

  test("a session's stream; wait(); breaking out closes the connection", async () => {
    await using sb = await al.createSandbox();
    const r = await sb.stream({ code: "print('streamed')" }).wait();
    assert.equal(r.stdout, "streamed\n");
    const s = sb.stream({ cmd: ["bash", "-c", "echo first; sleep 30"] });
    const t0 = Date.now();
    for await (const ev of s) {
      assert.deepEqual(ev, { kind: "stdout", data: "first\n" });
      break;
    }
    assert.ok(Date.now() - t0 < 10_000);
    assert.equal(s.result, null);
    // the session is free again: the killed exec does not hold it
    assert.equal((await sb.exec(["echo", "next"], { timeoutMs: 5000 })).stdout, "next\n");
  });

  test("a refused stream throws the typed error at iteration", async () => {
    const s = al.stream({ cmd: [], limits: {} });
    await assert.rejects(
      (async () => {
        for await (const _ of s) void _;
      })(),
      (e: unknown) => e instanceof InvalidRequest && e.field === "cmd",
    );
  });

  test("an AbortSignal cancels a running exec", async () => {
    const ctl = new AbortController();
    setTimeout(() => ctl.abort(new Error("enough")), 300);
    await assert.rejects(al.run({ cmd: ["sleep", "30"], signal: ctl.signal }), /enough/);
    const s = al.stream({ cmd: ["sleep", "30"], signal: AbortSignal.timeout(300) });
    await assert.rejects(s.wait(), (e: unknown) => (e as Error).name === "TimeoutError" || e instanceof AirlockConnectionError);
  });
});
