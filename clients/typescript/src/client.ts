/**
 * The client: `Airlock`.
 *
 * @module
 */

import { AirlockConnectionError, SnapshotNotFound } from "./errors.js";
import { execBody, ExecStream, limitsOf, runExec, type ExecOptions } from "./exec.js";
import { sandboxPath, snapshotId, snapshotPath, Transport, type AirlockOptions } from "./http.js";
import { Sandbox } from "./sandbox.js";
import type {
  ExecResult,
  Isolation,
  Limits,
  Network,
  Readiness,
  SandboxInfo,
  Snapshot,
  SnapshotList,
} from "./types.js";

/** Options of `createSandbox()`. */
export interface CreateSandboxOptions {
  /** Lifetime in seconds (server default 600). */
  ttlS?: number;
  /** Limits every exec of the session starts from. */
  limits?: Limits;
  /** A shorthand for `limits.timeout_ms`: the default deadline of its execs. */
  timeoutMs?: number;
  network?: Network | "none";
  isolation?: Isolation;
  image?: string;
  /**
   * Start from this snapshot (or its id): its files, image and isolation (giving either is
   * a 400), and its limits and network unless given. `SnapshotNotFound` if there is none.
   */
  fromSnapshot?: Snapshot | string;
  /** `pause`: the session pauses itself after `idleTimeoutS` without a request, and resumes on the next. */
  onIdle?: "none" | "pause";
  /** Seconds without a request before `onIdle` acts. */
  idleTimeoutS?: number;
}

/**
 * A client of `airlock serve`.
 *
 * ```ts
 * const al = new Airlock({ url: "http://127.0.0.1:8710" });
 * const r = await al.run({ code: "print(6*7)" });
 * ```
 */
export class Airlock {
  /** @internal */
  readonly transport: Transport;

  constructor(opts: AirlockOptions = {}) {
    this.transport = new Transport(opts);
  }

  /** The service's URL. */
  get url(): string {
    return this.transport.baseUrl;
  }

  /**
   * Runs `cmd` (an argv) or `code` (`language`, default python) in a fresh sandbox and
   * returns its result, whatever the program did. With `onStdout`/`onStderr` the exec is
   * streamed and the callbacks see output as it arrives.
   */
  run(opts: ExecOptions): Promise<ExecResult> {
    const body = execBody(opts);
    return runExec(this.transport, "/v1/exec", opts, body, null);
  }

  /** Like `run`, as a stream of events: `for await (const ev of al.stream({...}))`. */
  stream(opts: ExecOptions): ExecStream {
    const body = execBody(opts);
    const timeoutMs = this.transport.execTimeout(body["limits"] as Limits | undefined, null);
    return new ExecStream(this.transport, "/v1/exec", body, timeoutMs, opts.signal);
  }

  /**
   * Creates a session sandbox (files in /workspace and /tmp persist between its execs).
   * `await using sb = await al.createSandbox()` deletes it at the end of the block.
   */
  async createSandbox(opts: CreateSandboxOptions = {}): Promise<Sandbox> {
    const body: Record<string, unknown> = {};
    if (opts.ttlS !== undefined) body["ttl_s"] = opts.ttlS;
    const limits = limitsOf(opts.limits, opts.timeoutMs);
    if (limits) body["limits"] = limits;
    if (opts.network !== undefined) body["network"] = opts.network === "none" ? { mode: "none" } : opts.network;
    if (opts.isolation !== undefined) body["isolation"] = opts.isolation;
    if (opts.image !== undefined) body["image"] = opts.image;
    if (opts.fromSnapshot !== undefined) body["from_snapshot"] = snapshotId(opts.fromSnapshot);
    if (opts.onIdle !== undefined) body["on_idle"] = opts.onIdle;
    if (opts.idleTimeoutS !== undefined) body["idle_timeout_s"] = opts.idleTimeoutS;
    const r = await this.transport.json<{ id: string; expires_at: number }>("POST", "/v1/sandboxes", {
      json: body,
      notFound: SnapshotNotFound,
      // copying a snapshot's state in takes longer than a plain request
      timeoutMs: opts.fromSnapshot !== undefined ? this.transport.stateTimeoutMs : undefined,
    });
    return new Sandbox(this.transport, r.id, r.expires_at ?? null, limits?.timeout_ms ?? null);
  }

  /** A handle on an existing session (checked with the service). */
  async getSandbox(id: string): Promise<Sandbox> {
    const info = await this.transport.json<SandboxInfo>("GET", sandboxPath(id));
    return new Sandbox(this.transport, info.id, info.expires_at, null);
  }

  /** The caller's live sessions, oldest first. */
  listSandboxes(): Promise<SandboxInfo[]> {
    return this.transport.json<SandboxInfo[]>("GET", "/v1/sandboxes");
  }

  /** The caller's snapshots, with the store's `used_bytes` and `budget_bytes`. */
  listSnapshots(): Promise<SnapshotList> {
    return this.transport.json<SnapshotList>("GET", "/v1/snapshots");
  }

  /** A snapshot by id; `SnapshotNotFound` if there is none (or it is another key's). */
  getSnapshot(snapshot: Snapshot | string): Promise<Snapshot> {
    return this.transport.json<Snapshot>("GET", snapshotPath(snapshot), { notFound: SnapshotNotFound });
  }

  /** Deletes a snapshot (sessions started from it go on); `SnapshotNotFound` if there is none. */
  deleteSnapshot(snapshot: Snapshot | string): Promise<void> {
    return this.transport.none("DELETE", snapshotPath(snapshot), { notFound: SnapshotNotFound });
  }

  /** `GET /healthz`: whether the process answers. */
  async health(): Promise<boolean> {
    try {
      const r = await this.transport.json<{ status?: string }>("GET", "/healthz");
      return r.status === "ok";
    } catch (e) {
      if (e instanceof AirlockConnectionError) return false;
      throw e;
    }
  }

  /** `GET /readyz`: the warm pool's state. */
  ready(): Promise<Readiness> {
    return this.transport.json<Readiness>("GET", "/readyz", { acceptStatus: [503] });
  }

  /** `GET /metrics`: Prometheus text. */
  metrics(): Promise<string> {
    return this.transport.text("GET", "/metrics");
  }

  /** `GET /openapi.json`: the API's OpenAPI document. */
  openapi(): Promise<Record<string, unknown>> {
    return this.transport.json<Record<string, unknown>>("GET", "/openapi.json");
  }
}
