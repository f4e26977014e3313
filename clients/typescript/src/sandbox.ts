/**
 * A session sandbox and its parts: files, network, approvals, background processes, the
 * code interpreter, terminals, exposed ports.
 *
 * @module
 */

import { Execution } from "./code.js";
import {
  AirlockConnectionError,
  AirlockError,
  ApprovalNotFound,
  errorFromEvent,
  FileNotFound,
  NotFound,
  PortNotFound,
  ProcessNotFound,
  SandboxExpired,
  SnapshotNotFound,
} from "./errors.js";
import { execBody, ExecStream, runExec, type SessionExecOptions } from "./exec.js";
import { sandboxPath, snapshotId, sseEvents, toBase64, type Transport } from "./http.js";
import type { Airlock, CreateSandboxOptions } from "./client.js";
import { openPty, type Pty, type PtyOptions } from "./pty.js";
import type {
  Approval,
  Decision,
  ExecResult,
  ExecutionData,
  ExecutionError,
  ExecutionResult,
  FileEntry,
  NetworkPatch,
  NetworkShown,
  Port,
  Process,
  ProcessEvent,
  ProcessOutput,
  SandboxInfo,
  SignalName,
  Snapshot,
  SnapshotKind,
} from "./types.js";

/** Options of `sandbox.runCode()`. */
export interface RunCodeOptions {
  /** Only `python`. */
  language?: "python";
  /** Interrupt the kernel after this long (ms; the state is kept). */
  timeoutMs?: number;
  /** stdout text as it arrives (the call is streamed when a callback is given). */
  onStdout?: (text: string) => void;
  onStderr?: (text: string) => void;
  /** Each rich result (a value, a figure) as it arrives. */
  onResult?: (result: ExecutionResult) => void;
  /** The exception, when the code raised one. */
  onError?: (error: ExecutionError) => void;
  signal?: AbortSignal;
}

/** The longest wait the service takes in one request (`POST …/wait`). */
const MAX_WAIT_MS = 60_000;

/** Options of `sandbox.processes.start()`. */
export interface StartOptions {
  env?: Record<string, string>;
  /**
   * Where it runs (default /workspace). Sent as `workdir`, which interactive-api.md names
   * but the service does not take yet (a 400 on `workdir`).
   */
  workdir?: string;
  /** Written to its stdin at start; stdin stays open (`writeStdin`). */
  stdin?: string;
  /** SIGKILL after this long (ms; `timed_out` says so); default: until it ends or the session does. */
  timeoutMs?: number;
}

/** The background processes of a session. */
export class Processes {
  /** @internal */
  constructor(private readonly sb: Sandbox) {}

  private path(id?: string, rest = ""): string {
    return sandboxPath(this.sb.id, "/processes" + (id === undefined ? "" : "/" + encodeURIComponent(id)) + rest);
  }

  /** Starts `cmd` (an argv) in the background; answers at once with its `Process`. */
  start(cmd: string[], opts: StartOptions = {}): Promise<Process> {
    const extra: Record<string, unknown> = { background: true };
    if (opts.workdir !== undefined) extra["workdir"] = opts.workdir;
    // The deadline is the exec's own `limits.timeout_ms` (the server reads it there).
    const body = execBody({ cmd, env: opts.env, stdin: opts.stdin, timeoutMs: opts.timeoutMs }, extra);
    return this.sb.transport.json<Process>("POST", sandboxPath(this.sb.id, "/exec"), { json: body });
  }

  /** Running and recently ended processes. */
  async list(): Promise<Process[]> {
    return (await this.sb.transport.json<{ processes: Process[] }>("GET", this.path())).processes;
  }

  /** One process now. */
  get(id: string): Promise<Process> {
    return this.sb.transport.json<Process>("GET", this.path(id), { notFound: ProcessNotFound });
  }

  /** What is kept now of its output (the last N bytes of each stream). */
  output(id: string): Promise<ProcessOutput> {
    return this.sb.transport.json<ProcessOutput>("GET", this.path(id, "/output"), { notFound: ProcessNotFound });
  }

  /**
   * Its output from the start of what is kept: `stdout`/`stderr` events, then `exit` when
   * it ends (`follow`, the default) or `end` once the kept output is sent (`follow: false`).
   * Breaking out of the loop closes the connection; the process goes on.
   */
  async *stream(id: string, opts: { follow?: boolean; signal?: AbortSignal } = {}): AsyncGenerator<ProcessEvent> {
    const follow = opts.follow ?? true;
    const o = await this.sb.transport.open("GET", this.path(id, "/output"), {
      stream: true,
      query: { follow: String(follow) },
      timeoutMs: follow ? null : undefined,
      notFound: ProcessNotFound,
      signal: opts.signal,
    });
    let ended = false;
    try {
      if (!o.res.body) throw new AirlockConnectionError("the response has no body");
      for await (const [name, data] of sseEvents(o.res.body)) {
        if (name === "stdout" || name === "stderr") {
          yield { kind: name, data: (JSON.parse(data) as { data: string }).data };
        } else if (name === "exit" || name === "end") {
          ended = true;
          yield { kind: name, process: JSON.parse(data) as Process };
          return;
        } else if (name === "error") {
          throw errorFromEvent(data);
        }
      }
      throw new AirlockConnectionError(`the output stream of ${id} ended without an exit event`);
    } catch (e) {
      if (e instanceof AirlockError) throw e;
      if (opts.signal?.aborted) throw opts.signal.reason;
      throw new AirlockConnectionError(`streaming the output of ${id}: ${String(e)}`, { cause: e });
    } finally {
      if (!ended) o.abort();
      o.release();
    }
  }

  /** Sends a signal (a name such as `SIGTERM`, or a number). */
  signal(id: string, signal: SignalName | number = "SIGTERM"): Promise<Process> {
    return this.sb.transport.json<Process>("POST", this.path(id, "/signal"), {
      json: { signal },
      notFound: ProcessNotFound,
    });
  }

  /**
   * Waits at most `timeoutMs` (default 30 000) for it to end; `state` says whether it did.
   * The service waits at most 60 s per request: a longer wait is several requests.
   */
  async wait(id: string, opts: { timeoutMs?: number } = {}): Promise<Process> {
    let remaining = Math.max(1, Math.round(opts.timeoutMs ?? 30_000));
    for (;;) {
      const chunk = Math.min(remaining, MAX_WAIT_MS);
      const p = await this.sb.transport.json<Process>("POST", this.path(id, "/wait"), {
        json: { timeout_ms: chunk },
        timeoutMs: chunk + this.sb.transport.timeoutMs,
        notFound: ProcessNotFound,
      });
      remaining -= chunk;
      if (p.state !== "running" || remaining <= 0) return p;
    }
  }

  /** Writes to its stdin (a string as UTF-8, bytes as base64); `eof` closes it after. */
  writeStdin(id: string, data: string | Uint8Array, opts: { eof?: boolean } = {}): Promise<Process> {
    const body =
      typeof data === "string"
        ? { data, eof: opts.eof ?? false } // the default encoding: UTF-8 text
        : { data: toBase64(data), encoding: "base64", eof: opts.eof ?? false };
    return this.sb.transport.json<Process>("POST", this.path(id, "/stdin"), { json: body, notFound: ProcessNotFound });
  }
}

/**
 * A session sandbox: /workspace and /tmp persist between its execs. `delete()` it when
 * done (or `await using sb = await al.createSandbox()`); otherwise it lives its TTL.
 */
export class Sandbox {
  /** The session's id. */
  readonly id: string;
  /** When its TTL ends, in seconds since the epoch. */
  readonly expiresAt: number | null;
  /** Its background processes. */
  readonly processes: Processes;
  private deleted = false;

  /** @internal Use `Airlock.createSandbox()` or `Airlock.getSandbox()`. */
  constructor(
    readonly transport: Transport,
    id: string,
    expiresAt: number | null,
    private readonly defaultTimeoutMs: number | null,
  ) {
    this.id = id;
    this.expiresAt = expiresAt;
    this.processes = new Processes(this);
  }

  /** Runs `cmd` (an argv) in the session, in /workspace. */
  exec(cmd: string[], opts: Omit<SessionExecOptions, "cmd" | "code" | "language"> = {}): Promise<ExecResult> {
    return this.run({ ...opts, cmd });
  }

  /** Runs `cmd` or `code` in the session (streamed to `onStdout`/`onStderr` when given). */
  run(opts: SessionExecOptions): Promise<ExecResult> {
    const body = execBody(opts);
    return runExec(this.transport, sandboxPath(this.id, "/exec"), opts, body, this.defaultTimeoutMs);
  }

  /** Like `run`, as a stream of events: `for await (const ev of sb.stream({...}))`. */
  stream(opts: SessionExecOptions): ExecStream {
    const body = execBody(opts);
    const timeoutMs = this.transport.execTimeout(body["limits"] as { timeout_ms?: number }, this.defaultTimeoutMs);
    return new ExecStream(this.transport, sandboxPath(this.id, "/exec"), body, timeoutMs, opts.signal);
  }

  /** The session as the service shows it (`status`: `running` or `paused`). */
  info(): Promise<SandboxInfo> {
    return this.transport.json<SandboxInfo>("GET", sandboxPath(this.id));
  }

  // --- snapshots, forks, pause ------------------------------------------------------------

  /** `al.createSandbox({ ...opts, fromSnapshot: snapshot })`: a new session starting from it. */
  static fromSnapshot(
    al: Airlock,
    snapshot: Snapshot | string,
    opts: Omit<CreateSandboxOptions, "fromSnapshot"> = {},
  ): Promise<Sandbox> {
    return al.createSandbox({ ...opts, fromSnapshot: snapshot });
  }

  /**
   * Saves the session's state now: its writable files, limits, network policy and image;
   * `full` (the default `auto` where the tier can: gVisor, micro-VMs) its memory and processes too.
   * `kind: "full"` where the tier cannot is a 400 on `kind`; `SnapshotBudgetExceeded` when
   * the server's snapshot budget is full.
   */
  snapshot(opts: { kind?: SnapshotKind } = {}): Promise<Snapshot> {
    const body: Record<string, unknown> = {};
    if (opts.kind !== undefined) body["kind"] = opts.kind;
    return this.transport.json<Snapshot>("POST", sandboxPath(this.id, "/snapshots"), {
      json: body,
      timeoutMs: this.transport.stateTimeoutMs,
    });
  }

  /**
   * Rolls the session back to `snapshot` in place: its files become exactly the snapshot's;
   * its background processes, terminals and code kernel are ended first.
   * `SnapshotNotFound`; `IncompatibleSnapshot` for a snapshot of another image.
   */
  restore(snapshot: Snapshot | string): Promise<SandboxInfo> {
    return this.transport.json<SandboxInfo>("POST", sandboxPath(this.id, "/restore"), {
      json: { snapshot_id: snapshotId(snapshot) },
      timeoutMs: this.transport.stateTimeoutMs,
      notFound: SnapshotNotFound,
    });
  }

  /**
   * `count` new sessions, each a copy of this one now, independent of it and of each other
   * (delete them when done). `count` is 1..the server's `--max-fork` (16): else a 400 on `count`.
   */
  async fork(count: number, opts: { ttlS?: number } = {}): Promise<Sandbox[]> {
    const body: Record<string, unknown> = { count };
    if (opts.ttlS !== undefined) body["ttl_s"] = opts.ttlS;
    const r = await this.transport.json<{ sandboxes: { id: string; expires_at: number }[] }>(
      "POST",
      sandboxPath(this.id, "/fork"),
      { json: body, timeoutMs: this.transport.stateTimeoutMs },
    );
    return r.sandboxes.map((s) => new Sandbox(this.transport, s.id, s.expires_at ?? null, this.defaultTimeoutMs));
  }

  /** Freezes the session: it runs nothing (`SandboxPaused`) until `resume()`. Idempotent. */
  pause(): Promise<SandboxInfo> {
    return this.transport.json<SandboxInfo>("POST", sandboxPath(this.id, "/pause"), { json: {} });
  }

  /** Thaws a paused session: its processes go on where they were. Idempotent. */
  resume(): Promise<SandboxInfo> {
    return this.transport.json<SandboxInfo>("POST", sandboxPath(this.id, "/resume"), { json: {} });
  }

  // --- files --------------------------------------------------------------------------

  /** Writes `data` (a string as UTF-8) to `path` under /workspace, creating parents; `mode` like 0o755. */
  writeFile(path: string, data: string | Uint8Array, opts: { mode?: number } = {}): Promise<void> {
    const body = typeof data === "string" ? new TextEncoder().encode(data) : data;
    return this.transport.none("PUT", sandboxPath(this.id, "/files"), {
      body,
      query: { path, mode: opts.mode?.toString(8) },
    });
  }

  /** The bytes of `path`; `FileNotFound` if it does not exist. */
  readFile(path: string): Promise<Uint8Array> {
    return this.transport.bytes("GET", sandboxPath(this.id, "/files"), { query: { path }, notFound: FileNotFound });
  }

  /** The text of `path` (UTF-8). */
  async readText(path: string): Promise<string> {
    return new TextDecoder().decode(await this.readFile(path));
  }

  /** Everything under /workspace, recursively. */
  listFiles(): Promise<FileEntry[]> {
    return this.transport.json<FileEntry[]>("GET", sandboxPath(this.id, "/files"));
  }

  // --- network ------------------------------------------------------------------------

  /** The session's network policy now (secret values left out). */
  network(): Promise<NetworkShown> {
    return this.transport.json<NetworkShown>("GET", sandboxPath(this.id, "/network"));
  }

  /** Changes the policy for its next connections: each list given replaces the session's. */
  updateNetwork(patch: NetworkPatch): Promise<NetworkShown> {
    return this.transport.json<NetworkShown>("PATCH", sandboxPath(this.id, "/network"), { json: patch });
  }

  /** Connections held for approval now; `waitMs` (at most 60 000) waits for one when none is. */
  async approvals(opts: { waitMs?: number } = {}): Promise<Approval[]> {
    const r = await this.transport.json<{ approvals: Approval[] }>("GET", sandboxPath(this.id, "/approvals"), {
      query: { wait_ms: opts.waitMs?.toString() },
      timeoutMs: (opts.waitMs ?? 0) + this.transport.timeoutMs,
    });
    return r.approvals;
  }

  /** Answers a held connection; `ApprovalNotFound` when it no longer waits. */
  approve(approval: Approval | number, decision: Decision | boolean): Promise<void> {
    const id = typeof approval === "number" ? approval : approval.id;
    const d = decision === true ? "allow_once" : decision === false ? "deny" : decision;
    return this.transport.none("POST", sandboxPath(this.id, `/approvals/${id}`), {
      json: { decision: d },
      notFound: ApprovalNotFound,
    });
  }

  // --- code interpreter -----------------------------------------------------------------

  /**
   * Runs `code` in the session's Python kernel: variables, imports and open files persist
   * between calls. Streamed when a callback is given.
   */
  async runCode(code: string, opts: RunCodeOptions = {}): Promise<Execution> {
    const body: Record<string, unknown> = { code };
    if (opts.language !== undefined) body["language"] = opts.language;
    if (opts.timeoutMs !== undefined) body["timeout_ms"] = opts.timeoutMs;
    // The service's default is the session's `limits.timeout_ms`; the first call also
    // starts the kernel (within the margin).
    const timeoutMs = (opts.timeoutMs ?? this.defaultTimeoutMs ?? 30_000) + this.transport.execMarginMs;
    const path = sandboxPath(this.id, "/code");
    if (!opts.onStdout && !opts.onStderr && !opts.onResult && !opts.onError) {
      return new Execution(await this.transport.json<ExecutionData>("POST", path, { json: body, timeoutMs, signal: opts.signal }));
    }
    const o = await this.transport.open("POST", path, { json: body, stream: true, timeoutMs, signal: opts.signal });
    let done: ExecutionData | null = null;
    try {
      if (!o.res.body) throw new AirlockConnectionError("the response has no body");
      for await (const [name, data] of sseEvents(o.res.body)) {
        const d = JSON.parse(data) as Record<string, unknown>;
        if (name === "stdout") opts.onStdout?.(d["text"] as string);
        else if (name === "stderr") opts.onStderr?.(d["text"] as string);
        else if (name === "result") opts.onResult?.(d as unknown as ExecutionResult);
        // `failed` (or an `error` carrying the API's envelope): the call itself failed.
        else if (name === "failed" || (name === "error" && typeof d["error"] === "object")) throw errorFromEvent(data);
        else if (name === "error") opts.onError?.(d as unknown as ExecutionError);
        else if (name === "done") {
          done = d as unknown as ExecutionData;
          break;
        }
      }
    } catch (e) {
      if (e instanceof AirlockError) throw e;
      if (opts.signal?.aborted) throw opts.signal.reason;
      throw new AirlockConnectionError(`POST ${path}: ${String(e)}`, { cause: e });
    } finally {
      if (done === null) o.abort();
      o.release();
    }
    if (done === null) throw new AirlockConnectionError(`POST ${path}: the stream ended without a done event`);
    return new Execution(done);
  }

  /** A new kernel: the interpreter's state is cleared. */
  async restartCode(): Promise<void> {
    await this.transport.json<{ restarted: boolean }>("POST", sandboxPath(this.id, "/code/restart"), {
      json: {},
      timeoutMs: this.transport.execMarginMs + this.transport.timeoutMs,
    });
  }

  // --- terminal -------------------------------------------------------------------------

  /**
   * Opens a terminal over a WebSocket (Node 20/21: run with `--experimental-websocket`, or
   * pass `new Airlock({ WebSocket })`). Resolves once its program has started.
   */
  pty(opts: PtyOptions = {}): Promise<Pty> {
    return openPty(this.transport, this.id, opts);
  }

  // --- ports ----------------------------------------------------------------------------

  private port(p: Omit<Port, "url">): Port {
    return { ...p, url: this.transport.baseUrl + p.path };
  }

  /** Exposes the sandbox's `127.0.0.1:port`: `url` (with the API key or `token`) reaches it. */
  async expose(port: number): Promise<Port> {
    return this.port(await this.transport.json<Port>("POST", sandboxPath(this.id, "/ports"), { json: { port } }));
  }

  /** Stops exposing `port`. */
  unexpose(port: number): Promise<void> {
    return this.transport.none("DELETE", sandboxPath(this.id, `/ports/${port}`), { notFound: PortNotFound });
  }

  /** The exposed ports. */
  async ports(): Promise<Port[]> {
    const r = await this.transport.json<{ ports: Port[] }>("GET", sandboxPath(this.id, "/ports"));
    return r.ports.map((p) => this.port(p));
  }

  // --- lifetime -------------------------------------------------------------------------

  /** Purges the sandbox now (throws if it is unknown or expired). */
  async delete(): Promise<void> {
    await this.transport.none("DELETE", sandboxPath(this.id));
    this.deleted = true;
  }

  /** Deletes the sandbox unless already gone (idempotent). */
  async close(): Promise<void> {
    if (this.deleted) return;
    try {
      await this.delete();
    } catch (e) {
      if (e instanceof NotFound || e instanceof SandboxExpired) this.deleted = true;
      else throw e;
    }
  }

  /** `await using sb = await al.createSandbox()` deletes it at the end of the block. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
