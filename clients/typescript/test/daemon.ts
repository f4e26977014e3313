/**
 * Test fixtures: real `airlock serve` daemons, as clients/python/tests/conftest.py starts
 * them. The binary comes from $AIRLOCK_BIN (default <repo>/target/debug/airlock); each
 * daemon listens on 127.0.0.1:0, the port is read from its first stdout line, /readyz is
 * awaited, and SIGTERM stops it. Nothing here reaches beyond loopback.
 */

import { spawn, type ChildProcess } from "node:child_process";
import { chmodSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import type { TestContext } from "node:test";
import { RouteNotFound } from "airlock-sandbox";

/** clients/typescript (the compiled tests live in build/clients/typescript/test). */
export const PKG = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");
export const REPO = resolve(PKG, "../..");
export const API_KEY = "sdk-test-key-0123456789abcdef";

export function airlockBin(): string {
  return process.env["AIRLOCK_BIN"] || resolve(PKG, "../../target/debug/airlock");
}

/** A running `airlock serve`. */
export class Daemon {
  constructor(
    readonly url: string,
    readonly proc: ChildProcess,
    readonly dir: string,
    readonly apiKey: string | null,
  ) {}

  log(): string {
    try {
      return readFileSync(join(this.dir, "stderr"), "utf8");
    } catch {
      return "";
    }
  }

  /** SIGTERM, then SIGKILL after 20 s; removes its directory. */
  async stop(): Promise<number | null> {
    const p = this.proc;
    if (p.exitCode === null && p.signalCode === null) {
      const exited = new Promise<void>((r) => p.once("exit", () => r()));
      p.kill("SIGTERM");
      const t = setTimeout(() => p.kill("SIGKILL"), 20_000);
      await exited;
      clearTimeout(t);
    }
    rmSync(this.dir, { recursive: true, force: true });
    return p.exitCode;
  }
}

const running = new Set<ChildProcess>();
process.once("exit", () => {
  for (const p of running) p.kill("SIGKILL");
});

/**
 * Starts `airlock serve --listen 127.0.0.1:0 --snapshot-dir DIR/snapshots ARGS` (without
 * `--snapshot-dir` when ARGS give one) and waits until it is ready.
 */
export async function startDaemon(
  args: string[] = ["--pool", "1", "--grace", "5s"],
  opts: { apiKey?: string; readyTimeoutMs?: number } = {},
): Promise<Daemon> {
  const bin = airlockBin();
  if (!existsSync(bin)) {
    throw new Error(`airlock binary not found at ${bin}: run \`cargo build\` in ${REPO} or set AIRLOCK_BIN`);
  }
  const dir = mkdtempSync(join(tmpdir(), "airlock-ts-test-"));
  // A snapshot store of its own unless `args` name one: two daemons never share one (the
  // default, /var/lib/airlock/snapshots, is held by one daemon at a time).
  const own = args.includes("--snapshot-dir") ? [] : ["--snapshot-dir", join(dir, "snapshots")];
  const argv = ["serve", "--listen", "127.0.0.1:0", ...own, ...args];
  if (opts.apiKey) {
    const keys = join(dir, "keys");
    writeFileSync(keys, `sdk-tests:${opts.apiKey}\n`);
    chmodSync(keys, 0o600);
    argv.push("--api-keys", keys);
  }
  const env = { ...process.env };
  delete env["AIRLOCK_API_KEYS"];
  const out = join(dir, "stdout");
  const proc = spawn(bin, argv, {
    stdio: ["ignore", openSync(out, "w"), openSync(join(dir, "stderr"), "w")],
    env,
  });
  running.add(proc);
  proc.once("exit", () => running.delete(proc));
  const deadline = Date.now() + (opts.readyTimeoutMs ?? 60_000);
  let url: string | undefined;
  while (Date.now() < deadline) {
    if (proc.exitCode !== null) {
      throw new Error(`airlock ${argv.join(" ")} exited ${proc.exitCode}:\n${readFileSync(join(dir, "stderr"), "utf8")}`);
    }
    const m = /listening on (http:\/\/\S+)/.exec(readFileSync(out, "utf8"));
    if (m) {
      url = m[1];
      break;
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  const daemon = new Daemon(url ?? "", proc, dir, opts.apiKey ?? null);
  if (!url) {
    await daemon.stop();
    throw new Error(`airlock ${argv.join(" ")} did not print its address`);
  }
  while (Date.now() < deadline) {
    try {
      if ((await fetch(url + "/readyz")).status === 200) return daemon;
    } catch {
      /* not yet */
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  const log = daemon.log();
  await daemon.stop();
  throw new Error(`airlock ${argv.join(" ")} was not ready:\n${log}`);
}

/**
 * Runs `f`; if the service does not know the route (an `airlock serve` older than the
 * interactive API), marks the test skipped with that reason and returns `undefined`.
 */
export async function orSkipMissingRoute<T>(t: TestContext, what: string, f: () => Promise<T>): Promise<T | undefined> {
  try {
    return await f();
  } catch (e) {
    if (e instanceof RouteNotFound) {
      t.skip(`${what}: this airlock serve has no such route (${e.message})`);
      return undefined;
    }
    throw e;
  }
}

/** A loopback port nothing listens on (bound, then closed). */
export async function closedPort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", () => r()));
  const port = (srv.address() as { port: number }).port;
  await new Promise<void>((r) => srv.close(() => r()));
  return port;
}
