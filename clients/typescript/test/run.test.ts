// One-shot execs against a real daemon: results, limits, typed errors.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  Airlock,
  AirlockConnectionError,
  AirlockError,
  InvalidRequest,
  isOk,
  PayloadTooLarge,
  RateLimited,
  SessionQuotaExceeded,
  Unauthorized,
  type ExecResult,
} from "airlock-sandbox";
import { API_KEY, closedPort, Daemon, startDaemon } from "./daemon.js";

let daemon: Daemon;
let al: Airlock;

before(async () => {
  daemon = await startDaemon();
  al = new Airlock({ url: daemon.url, apiKey: null });
});
after(async () => {
  await daemon?.stop();
});

describe("run", () => {
  test("python code: stdout, exit code 0, typed result", async () => {
    const r: ExecResult = await al.run({ code: "print(6*7)" });
    assert.equal(r.stdout, "42\n");
    assert.equal(r.exit_code, 0);
    assert.equal(r.outcome, "exited");
    assert.equal(r.isolation, "namespaces");
    assert.ok(isOk(r));
    assert.ok(r.memory_peak_bytes > 0);
    assert.ok(r.wall_ms > 0);
  });

  test("a cmd: nonzero exit code and stderr are a result, not an error", async () => {
    const r = await al.run({ cmd: ["sh", "-c", "echo out; echo err >&2; exit 3"] });
    assert.equal(r.exit_code, 3);
    assert.equal(r.stdout, "out\n");
    assert.equal(r.stderr, "err\n");
    assert.equal(isOk(r), false);
  });

  test("a command that does not exist exits 127", async () => {
    const r = await al.run({ cmd: ["no-such-program-here"] });
    assert.equal(r.exit_code, 127);
  });

  test("javascript and bash", async () => {
    assert.equal((await al.run({ code: "console.log(6*7)", language: "javascript" })).stdout, "42\n");
    assert.equal((await al.run({ code: "echo $((6*7))", language: "bash" })).stdout, "42\n");
  });

  test("stdin, env and files (text, bytes, mode)", async () => {
    const r = await al.run({
      cmd: ["sh", "-c", "cat; echo \" $GREETING\"; od -An -tx1 data.bin; ./run.sh; wc -c < main.py"],
      stdin: "from stdin",
      env: { GREETING: "hello" },
      files: {
        "main.py": "print(1)\n",
        "data.bin": new Uint8Array([0, 1, 255]),
        "run.sh": { content: "#!/bin/sh\necho ran\n", mode: 0o755 },
      },
    });
    assert.equal(r.exit_code, 0, r.stderr);
    assert.equal(r.stdout, "from stdin hello\n 00 01 ff\nran\n9\n");
  });

  test("timeoutMs: the program is killed, outcome timeout", async () => {
    const t0 = Date.now();
    const r = await al.run({ cmd: ["sleep", "30"], timeoutMs: 500 });
    assert.equal(r.outcome, "timeout");
    assert.equal(r.timed_out, true);
    assert.equal(r.exit_code, null);
    assert.ok(Date.now() - t0 < 15_000);
  });

  test("limits: output_bytes truncates, memory_bytes kills a memory hog", async () => {
    const r = await al.run({
      code: "import sys; sys.stdout.write('x' * 100000)",
      limits: { output_bytes: 1000 },
    });
    assert.equal(r.stdout.length, 1000);
    assert.equal(r.stdout_truncated, true);
    assert.equal(r.stdout_bytes, 100000);
    const oom = await al.run({
      code: "b = bytearray(200 * 1024 * 1024)\nprint('survived')",
      limits: { memory_bytes: 32 * 1024 * 1024, timeout_ms: 10_000 },
    });
    assert.equal(oom.outcome, "oom");
    assert.equal(oom.oom_killed, true);
    assert.ok(!oom.stdout.includes("survived"));
  });

  test("output callbacks stream the run and still return the result", async () => {
    const seen: string[] = [];
    const r = await al.run({
      cmd: ["sh", "-c", "echo one; echo two >&2"],
      onStdout: (d) => seen.push("out:" + d),
      onStderr: (d) => seen.push("err:" + d),
    });
    assert.equal(r.exit_code, 0);
    assert.deepEqual(seen.join(""), "out:one\nerr:two\n");
  });
});

describe("invalid requests are typed errors naming the field", () => {
  test("a limit above the server's maximum", async () => {
    await assert.rejects(al.run({ code: "1", limits: { memory_bytes: 2 ** 50 } }), (e: unknown) => {
      assert.ok(e instanceof InvalidRequest, String(e));
      assert.equal(e.status, 400);
      assert.equal(e.code, "invalid_request");
      assert.equal(e.field, "limits.memory_bytes");
      assert.match(e.message, /^400 invalid_request: .*\(field: limits\.memory_bytes\)$/);
      return true;
    });
  });

  test("an empty cmd, an empty program", async () => {
    await assert.rejects(al.run({ cmd: [] }), (e: unknown) => e instanceof InvalidRequest && e.field === "cmd");
    await assert.rejects(al.run({ cmd: [""] }), (e: unknown) => e instanceof InvalidRequest && e.field === "cmd[0]");
  });

  test("an unknown language; a bad file path", async () => {
    await assert.rejects(
      al.run({ code: "1", language: "cobol" as never }),
      (e: unknown) => e instanceof InvalidRequest && e.field === "language",
    );
    await assert.rejects(
      al.run({ cmd: ["true"], files: { "../escape": "x" } }),
      (e: unknown) => e instanceof InvalidRequest && e.field === "files[0].path",
    );
  });

  test("a string where an argv is wanted is caught before sending", async () => {
    assert.throws(() => al.run({ cmd: "ls -l" as never }), TypeError);
    assert.throws(() => al.run({ cmd: ["ls"], code: "1" }), TypeError);
  });
});

test("health, ready, openapi, metrics", async () => {
  assert.equal(await al.health(), true);
  const r = await al.ready();
  assert.equal(typeof r.ready, "boolean"); // false while the pool refills after the runs above
  assert.equal(r.stopping, false);
  assert.equal(r.pool_target, 1);
  const doc = await al.openapi();
  assert.ok((doc["paths"] as Record<string, unknown>)["/v1/exec"]);
  assert.match(await al.metrics(), /airlock_exec_total/);
});

test("nothing listening: AirlockConnectionError, and health() is false", async () => {
  const nobody = new Airlock({ url: `http://127.0.0.1:${await closedPort()}`, retries: 1, backoffMs: 1 });
  await assert.rejects(nobody.run({ code: "1" }), (e: unknown) => {
    assert.ok(e instanceof AirlockConnectionError && e instanceof AirlockError);
    assert.match(e.message, /ECONNREFUSED/);
    return true;
  });
  assert.equal(await nobody.health(), false);
});

describe("a daemon with API keys, a small body limit and one sandbox", () => {
  let strict: Daemon;
  before(async () => {
    strict = await startDaemon(
      ["--max-body", "16K", "--max-sandboxes", "1", "--queue-timeout", "200ms", "--pool", "1", "--max-sessions-per-key", "1"],
      { apiKey: API_KEY },
    );
  });
  after(async () => {
    await strict?.stop();
  });

  test("no key, a wrong key: Unauthorized; the right key runs", async () => {
    for (const apiKey of [null, "wrong-key-0123456789abcdef"]) {
      const c = new Airlock({ url: strict.url, apiKey });
      await assert.rejects(c.run({ code: "1" }), (e: unknown) => {
        assert.ok(e instanceof Unauthorized, String(e));
        assert.equal(e.status, 401);
        assert.equal(e.code, "unauthorized");
        return true;
      });
    }
    const ok = new Airlock({ url: strict.url, apiKey: API_KEY });
    assert.equal((await ok.run({ code: "print('in')" })).stdout, "in\n");
  });

  test("a body over --max-body: PayloadTooLarge", async () => {
    const c = new Airlock({ url: strict.url, apiKey: API_KEY });
    await assert.rejects(c.run({ code: "#" + "x".repeat(20_000) }), PayloadTooLarge);
  });

  test("over capacity: RateLimited with retryAfter (after the retries); the session quota: never retried", async () => {
    const c = new Airlock({ url: strict.url, apiKey: API_KEY, retries: 1, backoffMs: 1 });
    const sb = await c.createSandbox({ ttlS: 60 });
    try {
      await assert.rejects(c.run({ code: "1" }), (e: unknown) => {
        assert.ok(e instanceof RateLimited, String(e));
        assert.equal(e.status, 429);
        assert.ok(e.retryAfter !== null && e.retryAfter >= 0);
        return true;
      });
      const t0 = Date.now();
      await assert.rejects(c.createSandbox(), (e: unknown) => {
        assert.ok(e instanceof SessionQuotaExceeded, String(e));
        assert.equal(e.code, "session_quota");
        return true;
      });
      assert.ok(Date.now() - t0 < 5_000, "a session quota is not waited out");
    } finally {
      await sb.delete();
    }
  });
});
