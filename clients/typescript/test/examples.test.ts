// The README's examples (each is a file in readme/, embedded verbatim) and
// examples/typescript/agent_loop.ts, run as a user would against a real daemon.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { Airlock } from "airlock-sandbox";
import { closedPort, Daemon, orSkipMissingRoute, PKG, startDaemon } from "./daemon.js";

const BUILD = join(PKG, "build");

let daemon: Daemon;
before(async () => {
  daemon = await startDaemon();
});
after(async () => {
  await daemon?.stop();
});

interface Ran {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs a compiled example with node (and the WebSocket flag Node 20 needs). */
function runJs(file: string, url: string): Promise<Ran> {
  return new Promise((resolve, reject) => {
    const env: Record<string, string | undefined> = { ...process.env, AIRLOCK_URL: url };
    delete env["AIRLOCK_API_KEY"];
    // the runner's own --experimental-websocket (Node 20 and 21), if it has it
    const flags = process.execArgv.filter((a) => a === "--experimental-websocket");
    const p = spawn(process.execPath, [...flags, "--no-warnings", file], { env, cwd: PKG });
    let stdout = "";
    let stderr = "";
    p.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    p.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => p.kill("SIGKILL"), 120_000);
    p.on("error", reject);
    p.on("close", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

async function runReadme(name: string): Promise<string> {
  const r = await runJs(join(BUILD, "clients/typescript/readme", name + ".js"), daemon.url);
  assert.equal(r.code, 0, `readme/${name}.ts exited ${r.code}\nstdout:\n${r.stdout}\nstderr:\n${r.stderr}`);
  return r.stdout;
}

describe("README", () => {
  test("every ts block naming a readme/ file is that file, and every file is in the README", () => {
    const readme = readFileSync(join(PKG, "README.md"), "utf8");
    const blocks = [...readme.matchAll(/```ts\n(\/\/ (readme\/[\w-]+\.ts)\n[\s\S]*?)```/g)];
    const named = new Set<string>();
    for (const [, body, file] of blocks) {
      named.add(file!);
      assert.equal(body, readFileSync(join(PKG, file!), "utf8"), `README's block of ${file} differs from the file`);
    }
    const files = readdirSync(join(PKG, "readme")).filter((f) => f.endsWith(".ts")).map((f) => "readme/" + f);
    assert.deepEqual([...named].sort(), files.sort());
    // and no other TypeScript block escapes the tests
    const tsBlocks = [...readme.matchAll(/```(ts|typescript)\n/g)].length;
    assert.equal(tsBlocks, blocks.length, "a ts block in the README that is not a readme/ file");
  });

  test("quickstart", async () => {
    assert.equal(await runReadme("quickstart"), "42 0 exited\n");
  });

  test("one-shot execs", async () => {
    assert.equal(await runReadme("oneshot"), "true HELLO\n\ntimeout true\n");
  });

  test("streaming", async () => {
    assert.equal(
      await runReadme("streaming"),
      "stdout: 0\nstdout: 1\nstdout: 2\nexit code 0\nlive stdout: out\nlive stderr: err\ntrue\n",
    );
  });

  test("sessions", async () => {
    assert.equal(await runReadme("sessions"), "2 data.csv\nmade\ndata.csv out.txt tool.sh\ntrue\nnone\n");
  });

  test("snapshots", async () => {
    assert.equal(
      await runReadme("snapshots"),
      "created file /workspace/plan.txt 6\n" +
        "filesystem\nv1\n[ 'v1', 'v1', 'v1' ]\ndraft\npaused\ntrue\nrunning\ntrue true\n",
    );
  });

  test("network", async () => {
    const out = await runReadme("network");
    assert.match(out, /mode: 'proxy'/);
    assert.match(out, /\npypi\.org,files\.pythonhosted\.org\n$/);
  });

  test("errors", async () => {
    assert.equal(await runReadme("errors"), "400 invalid_request limits.memory_bytes\n");
  });

  test("interactive sessions", async (t) => {
    const probe = await new Airlock({ url: daemon.url }).createSandbox();
    try {
      const probes: [string, () => Promise<unknown>][] = [
        ["GET /v1/sandboxes/{id}/processes", () => probe.processes.list()],
        ["GET /v1/sandboxes/{id}/ports", () => probe.ports()],
        ["POST /v1/sandboxes/{id}/code/restart", () => probe.restartCode().then(() => true)],
      ];
      for (const [what, f] of probes) {
        if ((await orSkipMissingRoute(t, what, f)) === undefined) return;
      }
    } finally {
      await probe.delete();
    }
    const r = await runJs(join(BUILD, "clients/typescript/readme/interactive.js"), daemon.url);
    assert.equal(r.code, 0, `stdout:\n${r.stdout}\nstderr:\n${r.stderr}`);
    assert.equal(
      r.stdout,
      "step 1\nstep 2\nstep 3\nexit code 0\n200 true\n[ 8000 ]\nexited\ndoubling\n42\ntrue\nZeroDivisionError\n" +
        "{ exit_code: 7, signal: null } true\n",
    );
  });
});

describe("examples/typescript/agent_loop.ts", () => {
  const file = join(BUILD, "examples/typescript/agent_loop.js");

  test("the scripted model sees both errors, fixes them and answers", async () => {
    const r = await runJs(file, daemon.url);
    assert.equal(r.code, 0, `stdout:\n${r.stdout}\nstderr:\n${r.stderr}`);
    assert.match(r.stdout, /ValueError: invalid literal for int\(\)/);
    assert.match(r.stdout, /NameError: name 'total' is not defined/);
    assert.ok(r.stdout.includes("final answer:\nblue: 8.50\nred: 6.00\ngreen: 6.00"), r.stdout);
  });

  test("against nothing, it fails cleanly", async () => {
    const r = await runJs(file, `http://127.0.0.1:${await closedPort()}`);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /^AirlockConnectionError: POST http:\/\/127\.0\.0\.1:\d+\/v1\/sandboxes: ECONNREFUSED/);
  });
});
