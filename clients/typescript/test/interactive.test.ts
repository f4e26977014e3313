// The interactive-session API (/work/interactive-api.md): background processes, terminals,
// exposed ports, the code interpreter. Against a daemon without those routes each test is
// skipped, naming the route the daemon lacks.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { request as httpRequest } from "node:http";
import { after, before, describe, test } from "node:test";
import {
  Airlock,
  BadGateway,
  Conflict,
  InvalidRequest,
  PortNotFound,
  ProcessNotFound,
  Unauthorized,
  type Process,
  type ProcessEvent,
  type Sandbox,
} from "airlock-sandbox";
import { API_KEY, Daemon, orSkipMissingRoute, PKG, startDaemon } from "./daemon.js";

let daemon: Daemon;
let al: Airlock;
let sb: Sandbox;

before(async () => {
  daemon = await startDaemon();
  al = new Airlock({ url: daemon.url });
  sb = await al.createSandbox({ ttlS: 300 });
});
after(async () => {
  await sb?.close();
  await daemon?.stop();
});

const decoder = new TextDecoder();

async function collect(it: AsyncIterable<ProcessEvent>): Promise<ProcessEvent[]> {
  const out: ProcessEvent[] = [];
  for await (const ev of it) out.push(ev);
  return out;
}

describe("background processes", () => {
  test("start, list, get, stdin, wait, output", async (t) => {
    if ((await orSkipMissingRoute(t, "GET /v1/sandboxes/{id}/processes", () => sb.processes.list())) === undefined) return;
    const code = "import sys\nprint('ready', flush=True)\nfor line in sys.stdin: print('got', line.strip(), flush=True)\nsys.exit(5)";
    const p = await sb.processes.start(["python3", "-u", "-c", code], { stdin: "a\n" });
    assert.match(p.process_id, /^proc-\d+$/);
    assert.equal(p.state, "running");
    assert.equal(p.tty, false);
    assert.deepEqual(p.command, ["python3", "-u", "-c", code]);
    assert.equal(p.exit_code, null);
    assert.ok((await sb.processes.list()).some((q) => q.process_id === p.process_id));
    assert.equal((await sb.processes.get(p.process_id)).state, "running");
    await sb.processes.writeStdin(p.process_id, "b\n");
    await sb.processes.writeStdin(p.process_id, new TextEncoder().encode("c\n"), { eof: true });
    await assert.rejects(sb.processes.writeStdin(p.process_id, "late\n"), (e: unknown) => e instanceof Conflict && e.status === 409);
    const done = await sb.processes.wait(p.process_id, { timeoutMs: 10_000 });
    assert.equal(done.state, "exited");
    assert.equal(done.exit_code, 5);
    assert.equal(done.signal, null);
    assert.equal(done.timed_out, false);
    assert.ok(done.ended_at !== null && done.ended_at >= done.started_at);
    const out = await sb.processes.output(p.process_id);
    assert.equal(out.stdout, "ready\ngot a\ngot b\ngot c\n");
    assert.equal(out.stderr, "");
    assert.equal(out.stdout_dropped, 0);
    assert.equal(out.process.stdout_bytes, out.stdout.length);
    // followed after its end: the kept output, then its exit
    const evs = await collect(sb.processes.stream(p.process_id));
    assert.equal(evs.filter((e) => e.kind === "stdout").map((e) => (e as { data: string }).data).join(""), out.stdout);
    const last = evs.at(-1);
    assert.ok(last?.kind === "exit" && last.process.exit_code === 5, JSON.stringify(last));
  });

  test("stream follows output as it is written, then the exit", async (t) => {
    if ((await orSkipMissingRoute(t, "GET /v1/sandboxes/{id}/processes", () => sb.processes.list())) === undefined) return;
    const p = await sb.processes.start(["sh", "-c", "for i in 1 2 3; do echo $i; echo e$i >&2; sleep 0.2; done"]);
    const evs = await collect(sb.processes.stream(p.process_id));
    const text = (k: string) => evs.filter((e) => e.kind === k).map((e) => (e as { data: string }).data).join("");
    assert.equal(text("stdout"), "1\n2\n3\n");
    assert.equal(text("stderr"), "e1\ne2\ne3\n");
    const last = evs.at(-1) as { kind: string; process: Process };
    assert.equal(last.kind, "exit");
    assert.equal(last.process.exit_code, 0);
  });

  test("follow: false ends once the kept output is sent, while it runs", async (t) => {
    if ((await orSkipMissingRoute(t, "GET /v1/sandboxes/{id}/processes", () => sb.processes.list())) === undefined) return;
    const p = await sb.processes.start(["sh", "-c", "echo now; sleep 30"]);
    // wait for the line to be kept
    for (let i = 0; i < 100 && (await sb.processes.output(p.process_id)).stdout === ""; i++) await new Promise((r) => setTimeout(r, 50));
    const evs = await collect(sb.processes.stream(p.process_id, { follow: false }));
    assert.deepEqual(evs[0], { kind: "stdout", data: "now\n" });
    const last = evs.at(-1) as { kind: string; process: Process };
    assert.equal(last.kind, "end");
    assert.equal(last.process.state, "running");
    await sb.processes.signal(p.process_id, "SIGKILL");
  });

  test("signal, timeoutMs, unknown ids", async (t) => {
    if ((await orSkipMissingRoute(t, "GET /v1/sandboxes/{id}/processes", () => sb.processes.list())) === undefined) return;
    const p = await sb.processes.start(["sleep", "60"]);
    await sb.processes.signal(p.process_id, "SIGTERM");
    const ended = await sb.processes.wait(p.process_id, { timeoutMs: 10_000 });
    assert.equal(ended.state, "exited");
    assert.equal(ended.signal, 15);
    assert.equal(ended.exit_code, null);
    const q = await sb.processes.start(["sleep", "60"], { timeoutMs: 300 });
    const killed = await sb.processes.wait(q.process_id, { timeoutMs: 10_000 });
    assert.equal(killed.timed_out, true);
    assert.equal(killed.signal, 9);
    const r = await sb.processes.start(["sleep", "60"]);
    const still = await sb.processes.wait(r.process_id, { timeoutMs: 100 });
    assert.equal(still.state, "running");
    await sb.processes.signal(r.process_id, 9);
    await assert.rejects(sb.processes.get("proc-999999"), ProcessNotFound);
    await assert.rejects(sb.processes.signal(r.process_id, "SIGNOPE" as never), (e: unknown) => e instanceof InvalidRequest && e.field === "signal");
  });
});

describe("terminal", () => {
  test("write, resize, output, exit code; listed as a tty process", async (t) => {
    let data = "";
    const pty = await orSkipMissingRoute(t, "GET /v1/sandboxes/{id}/pty", () =>
      sb.pty({ rows: 24, cols: 80, onData: (d) => (data += decoder.decode(d, { stream: true })) }),
    );
    if (pty === undefined) return;
    assert.match(pty.processId, /^proc-\d+$/);
    const listed = (await sb.processes.list()).find((p) => p.process_id === pty.processId);
    assert.equal(listed?.tty, true);
    const until = async (re: RegExp) => {
      for (let i = 0; i < 200 && !re.test(data); i++) await new Promise((r) => setTimeout(r, 25));
      assert.match(data, re);
    };
    pty.write("echo $((6*7))\n");
    await until(/42/);
    pty.resize(40, 100);
    pty.write("stty size\n");
    await until(/40 100/);
    pty.write("exit 3\n");
    assert.deepEqual(await pty.wait(), { exit_code: 3, signal: null });
  });

  test("close() hangs up the terminal", async (t) => {
    const pty = await orSkipMissingRoute(t, "GET /v1/sandboxes/{id}/pty", () => sb.pty({ cmd: "sh" }));
    if (pty === undefined) return;
    pty.close();
    for (let i = 0; i < 200; i++) {
      if ((await sb.processes.get(pty.processId)).state === "exited") return;
      await new Promise((r) => setTimeout(r, 25));
    }
    assert.fail("the terminal's shell still runs after close()");
  });

  test("without a WebSocket (Node 20 without the flag): a typed error", (t) => {
    if (Number(process.versions.node.split(".")[0]) >= 22) {
      t.skip("Node 22 and later have a global WebSocket by default");
      return;
    }
    const script = `
      import { Airlock, WebSocketUnavailable } from "airlock-sandbox";
      const sb = await new Airlock({ url: process.argv[1] }).getSandbox(process.argv[2]);
      try { await sb.pty(); console.log("opened"); }
      catch (e) { console.log(e instanceof WebSocketUnavailable ? "typed: " + e.message : "other: " + e); }
    `;
    const r = spawnSync(process.execPath, ["--input-type=module", "-e", script, daemon.url, sb.id], {
      cwd: PKG,
      encoding: "utf8",
      env: { ...process.env, NODE_OPTIONS: "" },
    });
    assert.match(r.stdout, /^typed: no WebSocket implementation: on Node 20 and 21 run node with --experimental-websocket/, r.stderr);
  });
});

describe("ports", () => {
  test("expose a server in the sandbox, reach it, list, unexpose", async (t) => {
    if ((await orSkipMissingRoute(t, "GET /v1/sandboxes/{id}/ports", () => sb.ports())) === undefined) return;
    await sb.writeFile("site/hello.txt", "hello from the sandbox\n");
    const server = await sb.processes.start(["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "site"]);
    try {
      const port = await sb.expose(8000);
      assert.equal(port.port, 8000);
      assert.match(port.token, /^[A-Za-z0-9_-]{43}$/);
      assert.equal(port.path, `/v1/sandboxes/${sb.id}/ports/8000/`);
      assert.equal(port.url, daemon.url + port.path);
      assert.ok(port.host.startsWith(`8000-${sb.id}.`), port.host);
      let body = "";
      for (let i = 0; i < 100; i++) {
        const res = await fetch(port.url + "hello.txt", { headers: { "X-Airlock-Port-Token": port.token } });
        if (res.status === 200) {
          body = await res.text();
          break;
        }
        await res.arrayBuffer();
        assert.equal(res.status, 502, "before the server listens: 502");
        await new Promise((r) => setTimeout(r, 100));
      }
      assert.equal(body, "hello from the sandbox\n");
      // by Host too, with the token in the query
      // (fetch does not let a caller set Host: node:http does)
      const byHost = await new Promise<string>((resolve, reject) => {
        const u = new URL(daemon.url);
        const req = httpRequest(
          { host: u.hostname, port: u.port, path: `/hello.txt?airlock_token=${port.token}`, headers: { host: port.host } },
          (res) => {
            let body = "";
            res.on("data", (d: Buffer) => (body += d.toString()));
            res.on("end", () => resolve(`${res.statusCode} ${body}`));
          },
        );
        req.on("error", reject);
        req.end();
      });
      assert.equal(byHost, "200 hello from the sandbox\n");
      assert.deepEqual((await sb.ports()).map((p) => p.port), [8000]);
      await sb.unexpose(8000);
      assert.deepEqual(await sb.ports(), []);
      const gone = await fetch(port.url + "hello.txt");
      assert.equal(gone.status, 404);
      await gone.arrayBuffer();
      await assert.rejects(sb.unexpose(8000), PortNotFound);
      // exposed with nothing listening: 502 BadGateway through the SDK's errors
      const idle = await sb.expose(8001);
      const res = await fetch(idle.url);
      assert.equal(res.status, 502);
      await res.arrayBuffer();
      await assert.rejects(sb.expose(0), (e: unknown) => e instanceof InvalidRequest && e.field === "port");
      assert.ok(BadGateway);
    } finally {
      await sb.processes.signal(server.process_id, "SIGKILL").catch(() => undefined);
    }
  });
});

describe("code interpreter", () => {
  test("state persists; values, stdout, errors, images, timeouts, restart", async (t) => {
    const first = await orSkipMissingRoute(t, "POST /v1/sandboxes/{id}/code", () =>
      sb.runCode("x = 1\nx + 1").catch((e: unknown) => {
        if (e instanceof InvalidRequest && e.field === "image") return e;
        throw e;
      }),
    );
    if (first === undefined) return;
    if (first instanceof InvalidRequest) {
      t.skip(`no Jupyter kernel in the sandbox: ${first.message}`);
      return;
    }
    assert.equal(first.text, "2");
    assert.equal(first.error, null);
    assert.ok(first.kernelStartMs > 0);
    const second = await sb.runCode("print(x)");
    assert.equal(second.stdout, "1\n");
    assert.equal(second.executionCount, first.executionCount + 1);
    assert.equal(second.kernelStartMs, 0);
    const err = await sb.runCode("1/0");
    assert.equal(err.error?.name, "ZeroDivisionError");
    assert.equal(err.error?.value, "division by zero");
    assert.ok(!err.error?.traceback.join("\n").includes("\x1b["), "no ANSI colours");
    const fig = await sb.runCode(
      "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()",
    );
    const png = fig.png;
    assert.ok(png, JSON.stringify(fig.raw).slice(0, 500));
    assert.deepEqual([...png.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
    await sb.runCode("y = 5");
    const slow = await sb.runCode("import time\ny = 6\ntime.sleep(30)", { timeoutMs: 2000 });
    assert.equal(slow.timedOut, true);
    assert.equal(slow.error?.name, "KeyboardInterrupt");
    assert.match((await sb.runCode("y")).text ?? "", /^[56]$/, "the state outlives the interrupt");
    // streamed: callbacks in order, then the whole execution
    const seen: string[] = [];
    const streamed = await sb.runCode("import sys\nprint('a')\nprint('b', file=sys.stderr)\n6*7", {
      onStdout: (s) => seen.push("out:" + s),
      onStderr: (s) => seen.push("err:" + s),
      onResult: (r) => seen.push("result:" + r.data["text/plain"]),
    });
    // stdout and stderr are flushed separately by the kernel: their order is not kept
    assert.deepEqual([...seen.slice(0, 2)].sort(), ["err:b\n", "out:a\n"], seen.join("|"));
    assert.equal(seen[2], "result:42", seen.join("|"));
    assert.equal(seen.length, 3, seen.join("|"));
    assert.equal(streamed.text, "42");
    await sb.restartCode();
    const after = await sb.runCode("x");
    assert.equal(after.error?.name, "NameError");
  });
});

describe("with API keys", () => {
  let keyed: Daemon;
  before(async () => {
    keyed = await startDaemon(["--pool", "1", "--grace", "5s"], { apiKey: API_KEY });
  });
  after(async () => {
    await keyed?.stop();
  });

  test("a terminal authenticates with the key in the query; a wrong key is Unauthorized", async (t) => {
    const kal = new Airlock({ url: keyed.url, apiKey: API_KEY });
    await using ksb = await kal.createSandbox();
    let data = "";
    const pty = await orSkipMissingRoute(t, "GET /v1/sandboxes/{id}/pty", () =>
      ksb.pty({ cmd: "sh", onData: (d) => (data += decoder.decode(d)) }),
    );
    if (pty === undefined) return;
    pty.write("echo keyed; exit 0\n");
    assert.deepEqual(await pty.wait(), { exit_code: 0, signal: null });
    assert.match(data, /keyed/);
    const wrong = new Airlock({ url: keyed.url, apiKey: "wrong-key-0123456789abcdef" });
    const wsb = await wrong.getSandbox(ksb.id).catch((e: unknown) => e);
    assert.ok(wsb instanceof Unauthorized, String(wsb));
    // the upgrade itself refused: the SDK reports the route's typed error
    const { Sandbox } = await import("airlock-sandbox");
    const forged = new Sandbox(wrong.transport, ksb.id, null, null);
    await assert.rejects(forged.pty(), Unauthorized);
  });

  test("a port takes its token without the API key; nothing else", async (t) => {
    const kal = new Airlock({ url: keyed.url, apiKey: API_KEY });
    await using ksb = await kal.createSandbox();
    if ((await orSkipMissingRoute(t, "GET /v1/sandboxes/{id}/ports", () => ksb.ports())) === undefined) return;
    await ksb.writeFile("hello.txt", "hi\n");
    await ksb.processes.start(["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"]);
    const port = await ksb.expose(8000);
    let res = await fetch(port.url + "hello.txt", { headers: { "X-Airlock-Port-Token": port.token } });
    for (let i = 0; res.status === 502 && i < 100; i++) {
      await new Promise((r) => setTimeout(r, 100));
      res = await fetch(port.url + "hello.txt", { headers: { "X-Airlock-Port-Token": port.token } });
    }
    assert.equal(`${res.status} ${await res.text()}`, "200 hi\n");
    const byQuery = await fetch(`${port.url}hello.txt?airlock_token=${port.token}`);
    assert.equal(`${byQuery.status} ${await byQuery.text()}`, "200 hi\n");
    const none = await fetch(port.url + "hello.txt");
    assert.equal(none.status, 401);
    await none.arrayBuffer();
    const forged = await fetch(port.url + "hello.txt", { headers: { "X-Airlock-Port-Token": "x".repeat(43) } });
    assert.equal(forged.status, 401);
    await forged.arrayBuffer();
  });
});
