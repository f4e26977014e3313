/**
 * Exec requests and the stream of a streamed exec.
 *
 * @module
 */

import { AirlockConnectionError, AirlockError, errorFromEvent } from "./errors.js";
import { sseEvents, toBase64, type Opened, type Transport } from "./http.js";
import type { ExecResult, Files, Isolation, Language, Limits, Network, StreamEvent } from "./types.js";

/** What to run in a session: `cmd` (an argv), or `code` with `language`. */
export interface SessionExecOptions {
  /** argv; `cmd[0]` is looked up in PATH. */
  cmd?: string[];
  /** Source code, run with `language` (default `python`). */
  code?: string;
  language?: Language;
  /** What the program reads on stdin (UTF-8). */
  stdin?: string;
  env?: Record<string, string>;
  /** Written into /workspace before the program starts. */
  files?: Files;
  limits?: Limits;
  /** The program's deadline in ms: a shorthand for `limits.timeout_ms`. */
  timeoutMs?: number;
  /**
   * Where the result's `files_changed` looks: `/workspace`, `/tmp` (default
   * `["/workspace"]`; `[]` for none). Sent as `files_changed_in`.
   */
  filesChangedIn?: string[];
  /** Called with stdout as it arrives (the exec is streamed when a callback is given). */
  onStdout?: (data: string) => void;
  /** Called with stderr as it arrives. */
  onStderr?: (data: string) => void;
  /** Cancels the request; the service kills the program when the connection closes. */
  signal?: AbortSignal;
}

/** A one-shot exec: a session exec's options plus the sandbox's own. */
export interface ExecOptions extends SessionExecOptions {
  /** Default: no network (`{mode: "none"}`). */
  network?: Network | "none";
  isolation?: Isolation;
  /** An image of the service's store (`python:3.12-slim`). */
  image?: string;
}

/** The JSON body of an exec request. */
export function execBody(o: ExecOptions, extra: Record<string, unknown> = {}): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  if (o.cmd !== undefined && o.code !== undefined) throw new TypeError("give cmd or code, not both");
  if (o.cmd !== undefined) {
    if (!Array.isArray(o.cmd)) {
      throw new TypeError("cmd is an argv array, e.g. ['ls', '-l']; for a shell line use ['bash', '-c', 'ls -l']");
    }
    body["cmd"] = o.cmd.map(String);
  } else if (o.code !== undefined) {
    body["language"] = o.language ?? "python";
    body["code"] = o.code;
  } else if (o.language !== undefined) {
    body["language"] = o.language;
  }
  if (o.stdin !== undefined) body["stdin"] = o.stdin;
  const files = filesBody(o.files);
  if (files.length) body["files"] = files;
  if (o.env && Object.keys(o.env).length) body["env"] = { ...o.env };
  const limits = limitsOf(o.limits, o.timeoutMs);
  if (limits) body["limits"] = limits;
  if (o.network !== undefined) body["network"] = o.network === "none" ? { mode: "none" } : o.network;
  if (o.isolation !== undefined) body["isolation"] = o.isolation;
  if (o.image !== undefined) body["image"] = o.image;
  if (o.filesChangedIn !== undefined) {
    if (!Array.isArray(o.filesChangedIn)) throw new TypeError("filesChangedIn is an array, e.g. ['/workspace', '/tmp']");
    body["files_changed_in"] = o.filesChangedIn.map(String);
  }
  return { ...body, ...extra };
}

/** `limits` with `timeoutMs` folded in; `undefined` when empty. */
export function limitsOf(limits: Limits | undefined, timeoutMs?: number): Limits | undefined {
  const l: Limits = { ...(limits ?? {}) };
  if (timeoutMs !== undefined) l.timeout_ms = timeoutMs;
  for (const k of Object.keys(l) as (keyof Limits)[]) if (l[k] === undefined) delete l[k];
  return Object.keys(l).length ? l : undefined;
}

/** `files` as the API's array. */
export function filesBody(files: Files | undefined): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  for (const [path, value] of Object.entries(files ?? {})) {
    const f = typeof value === "string" || value instanceof Uint8Array ? { content: value } : value;
    const entry: Record<string, unknown> =
      typeof f.content === "string"
        ? { path, content: f.content }
        : { path, content: toBase64(f.content), encoding: "base64" };
    if (f.mode !== undefined) entry["mode"] = f.mode;
    out.push(entry);
  }
  return out;
}

/** An exec stream's event from an SSE pair; throws the API error of an `error` event. */
function toEvent(name: string, data: string): StreamEvent | null {
  switch (name) {
    case "stdout":
      return { kind: "stdout", data: (JSON.parse(data) as { data: string }).data };
    case "stderr":
      return { kind: "stderr", data: (JSON.parse(data) as { data: string }).data };
    case "result":
      return { kind: "result", result: JSON.parse(data) as ExecResult };
    case "error":
      throw errorFromEvent(data);
    default:
      return null; // an event this SDK does not know
  }
}

/**
 * The events of a streamed exec: `stdout` and `stderr` as output arrives, then one
 * `result`. The request is sent when iteration starts (or by `wait()`); errors the service
 * reports, before or during the stream, are thrown. Stopping early (`break`, `close()`)
 * closes the connection, and the service kills the program.
 */
export class ExecStream implements AsyncIterable<StreamEvent> {
  /** The result, once the `result` event has arrived. */
  result: ExecResult | null = null;
  private opened: Opened | null = null;
  private started = false;
  private closed = false;

  constructor(
    private readonly transport: Transport,
    private readonly path: string,
    private readonly body: Record<string, unknown>,
    private readonly timeoutMs: number,
    private readonly signal?: AbortSignal,
  ) {}

  async *[Symbol.asyncIterator](): AsyncGenerator<StreamEvent> {
    if (this.started) throw new TypeError("an ExecStream can be iterated once");
    this.started = true;
    if (this.closed) return;
    const o = await this.transport.open("POST", this.path, {
      json: this.body,
      stream: true,
      timeoutMs: this.timeoutMs,
      signal: this.signal,
    });
    this.opened = o;
    try {
      if (!o.res.body) throw new AirlockConnectionError(`${this.path}: the response has no body`);
      for await (const [name, data] of sseEvents(o.res.body)) {
        const ev = toEvent(name, data);
        if (ev === null) continue;
        if (ev.kind === "result") this.result = ev.result;
        yield ev;
        if (ev.kind === "result") return;
      }
      if (this.result === null && !this.closed) {
        throw new AirlockConnectionError(`${this.transport.baseUrl + this.path}: the stream ended without a result event`);
      }
    } catch (e) {
      if (this.closed) return;
      if (e instanceof AirlockError) throw e;
      if (this.signal?.aborted) throw this.signal.reason;
      throw new AirlockConnectionError(`${this.transport.baseUrl + this.path}: ${String(e)}`, { cause: e });
    } finally {
      this.close();
    }
  }

  /** Consumes the remaining events and returns the result. */
  async wait(): Promise<ExecResult> {
    if (!this.started) for await (const _ of this) void _;
    if (this.result === null) throw new AirlockConnectionError("the stream was closed before its result");
    return this.result;
  }

  /** Closes the connection (the service kills the program if it still runs). */
  close(): void {
    this.closed = true;
    if (this.opened) {
      if (this.result === null) this.opened.abort();
      this.opened.release();
    }
  }
}

/** Runs an exec: one JSON answer, or a stream when output callbacks are given. */
export async function runExec(
  transport: Transport,
  path: string,
  opts: SessionExecOptions,
  body: Record<string, unknown>,
  defaultMs: number | null,
): Promise<ExecResult> {
  const timeoutMs = transport.execTimeout(body["limits"] as Limits | undefined, defaultMs);
  if (!opts.onStdout && !opts.onStderr) {
    return transport.json<ExecResult>("POST", path, { json: body, timeoutMs, signal: opts.signal });
  }
  const stream = new ExecStream(transport, path, body, timeoutMs, opts.signal);
  for await (const ev of stream) {
    if (ev.kind === "stdout") opts.onStdout?.(ev.data);
    else if (ev.kind === "stderr") opts.onStderr?.(ev.data);
  }
  return stream.wait();
}
