/**
 * The transport: configuration, one request with the retry policy and timeouts, and the
 * Server-Sent Events parser. Internal to the SDK.
 *
 * @module
 */

import {
  AirlockConnectionError,
  AirlockError,
  AirlockTimeout,
  errorFromResponse,
  type NotFoundClass,
  SandboxNotFound,
} from "./errors.js";

/** The SDK's version (sent in `User-Agent`). */
export const VERSION = "0.1.0";

/** The server's default `limits.timeout_ms` (sizes the client timeout of an exec). */
export const DEFAULT_EXEC_TIMEOUT_MS = 10_000;

/** A WebSocket constructor as the platform defines it (`globalThis.WebSocket`). */
export interface WebSocketLike {
  binaryType: string;
  readonly readyState: number;
  send(data: string | ArrayBufferView | ArrayBuffer): void;
  close(code?: number, reason?: string): void;
  addEventListener(type: string, listener: (ev: any) => void): void;
}

/** What constructs a WebSocket: the global one, or one the caller brings. */
export type WebSocketConstructor = new (url: string, protocols?: string | string[]) => WebSocketLike;

/** Options of `new Airlock()`. */
export interface AirlockOptions {
  /** The service's URL; default `$AIRLOCK_URL` or `http://127.0.0.1:8710`. */
  url?: string;
  /** Sent as `Authorization: Bearer KEY`; default `$AIRLOCK_API_KEY`. */
  apiKey?: string | null;
  /** Client timeout of a plain request, in ms (default 30 000). */
  timeoutMs?: number;
  /**
   * Added to an exec's own deadline (`limits.timeout_ms`, else the sandbox's, else 10 s)
   * for its client timeout: the admission queue, provisioning, transfer (default 30 000).
   */
  execMarginMs?: number;
  /**
   * Retries at most (default 2): connection failures before the request was sent; 429
   * (and 503, except for an exec), waiting as `Retry-After` says; idempotent requests
   * (GET, PUT) also after a broken connection. An exec is never repeated once it may have
   * reached the service.
   */
  retries?: number;
  /** Give up rather than wait longer than this for a retry (ms, default 60 000). */
  maxRetryWaitMs?: number;
  /** First backoff between retries without `Retry-After`, doubled each time (ms, default 250). */
  backoffMs?: number;
  /** Extra headers sent with every request. */
  headers?: Record<string, string>;
  /** A `fetch` to use instead of the global one. */
  fetch?: typeof fetch;
  /** A WebSocket constructor for `sandbox.pty()` (default: `globalThis.WebSocket`). */
  WebSocket?: WebSocketConstructor;
}

/** Per-request options. */
export interface RequestOptions {
  /** A JSON body. */
  json?: unknown;
  /** A raw body (sent as application/octet-stream). */
  body?: Uint8Array;
  query?: Record<string, string | undefined>;
  /** Client timeout in ms; `null`: none (a followed stream). */
  timeoutMs?: number | null;
  /** The 404 class this route implies. */
  notFound?: NotFoundClass;
  /** Ask for `text/event-stream` and hand back the open response. */
  stream?: boolean;
  /** Statuses that are answers, not errors (`/readyz`'s 503). */
  acceptStatus?: number[];
  /** Cancels the request (and a stream). */
  signal?: AbortSignal | undefined;
}

/** An open response and what releases its timer. */
export interface Opened {
  res: Response;
  /** Clears the timeout and the abort listeners; idempotent. */
  release(): void;
  /** Aborts the request (closes a stream). */
  abort(): void;
}

const env = (name: string): string | undefined => {
  const proc = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  const v = proc?.env?.[name];
  return v ? v : undefined;
};

const IDEMPOTENT = new Set(["GET", "HEAD", "PUT"]);
// Codes of failures before any byte of the request left (undici's and the OS's).
const NOT_SENT = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "UND_ERR_CONNECT_TIMEOUT",
]);
const BROKEN = new Set(["ECONNRESET", "EPIPE", "UND_ERR_SOCKET", "UND_ERR_CLOSED"]);

function causeCode(e: unknown): string | undefined {
  let cur: unknown = e;
  for (let i = 0; i < 4 && cur && typeof cur === "object"; i++) {
    const code = (cur as { code?: unknown }).code;
    if (typeof code === "string") return code;
    cur = (cur as { cause?: unknown }).cause;
  }
  return undefined;
}

/** Whether an exec route (`POST …/exec`): never repeated after a 503 or a broken connection. */
export function isExec(method: string, path: string): boolean {
  return method === "POST" && path.endsWith("/exec");
}

/** Whether a status allows a retry (see `AirlockOptions.retries`). */
export function retryOnStatus(method: string, path: string, status: number, code: string | null): boolean {
  if (status === 429) return code !== "session_quota";
  if (status === 503) return !(code ?? "").endsWith("_unavailable") && !isExec(method, path);
  return false;
}

const sleep = (ms: number, signal?: AbortSignal): Promise<void> =>
  new Promise((resolve, reject) => {
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });

/** The configured transport shared by the client and its sandboxes. */
export class Transport {
  readonly baseUrl: string;
  readonly apiKey: string | null;
  readonly timeoutMs: number;
  readonly execMarginMs: number;
  readonly retries: number;
  readonly maxRetryWaitMs: number;
  readonly backoffMs: number;
  readonly headers: Record<string, string>;
  readonly WebSocket: WebSocketConstructor | undefined;
  private readonly fetchFn: typeof fetch;

  constructor(opts: AirlockOptions = {}) {
    const url = opts.url ?? env("AIRLOCK_URL") ?? "http://127.0.0.1:8710";
    this.baseUrl = url.replace(/\/+$/, "");
    this.apiKey = opts.apiKey === undefined ? (env("AIRLOCK_API_KEY") ?? null) : opts.apiKey;
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.execMarginMs = opts.execMarginMs ?? 30_000;
    this.retries = opts.retries ?? 2;
    if (!Number.isInteger(this.retries) || this.retries < 0) throw new RangeError("retries must be an integer >= 0");
    this.maxRetryWaitMs = opts.maxRetryWaitMs ?? 60_000;
    this.backoffMs = opts.backoffMs ?? 250;
    const h: Record<string, string> = { "user-agent": `airlock-sandbox-typescript/${VERSION}` };
    for (const [k, v] of Object.entries(opts.headers ?? {})) h[k.toLowerCase()] = v;
    if (this.apiKey) h["authorization"] = `Bearer ${this.apiKey}`;
    this.headers = h;
    const f = opts.fetch ?? globalThis.fetch;
    if (typeof f !== "function") throw new AirlockError("no fetch: this SDK needs Node 20 or later (or pass fetch)");
    this.fetchFn = f;
    this.WebSocket =
      opts.WebSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket ?? undefined;
  }

  /**
   * The client timeout of a request that copies a session's state (snapshot, restore,
   * fork, a creation from a snapshot): a plain request's plus the exec margin.
   */
  get stateTimeoutMs(): number {
    return this.timeoutMs + this.execMarginMs;
  }

  /** The client timeout of an exec with these limits. */
  execTimeout(limits: { timeout_ms?: number } | undefined, defaultMs: number | null): number {
    return (limits?.timeout_ms ?? defaultMs ?? DEFAULT_EXEC_TIMEOUT_MS) + this.execMarginMs;
  }

  url(path: string, query?: Record<string, string | undefined>): string {
    let u = this.baseUrl + path;
    if (query) {
      const q = new URLSearchParams();
      for (const [k, v] of Object.entries(query)) if (v !== undefined) q.set(k, v);
      const s = q.toString();
      if (s) u += "?" + s;
    }
    return u;
  }

  private retryDelay(attempt: number, retryAfter: number | null): number | null {
    if (retryAfter !== null) {
      const ms = retryAfter * 1000;
      return ms > this.maxRetryWaitMs ? null : ms;
    }
    const base = this.backoffMs * 2 ** attempt;
    return Math.min(this.maxRetryWaitMs, base * (0.5 + Math.random()));
  }

  /** Sends one request (with retries) and returns the open response of a success status. */
  async open(method: string, path: string, opts: RequestOptions = {}): Promise<Opened> {
    const url = this.url(path, opts.query);
    const headers: Record<string, string> = { ...this.headers };
    let body: BodyInit | undefined;
    if (opts.json !== undefined) {
      body = JSON.stringify(opts.json);
      headers["content-type"] = "application/json";
    } else if (opts.body !== undefined) {
      body = opts.body as unknown as BodyInit;
      headers["content-type"] = "application/octet-stream";
    }
    headers["accept"] = opts.stream ? "text/event-stream" : "application/json";
    const timeoutMs = opts.timeoutMs === undefined ? this.timeoutMs : opts.timeoutMs;
    for (let attempt = 0; ; attempt++) {
      if (opts.signal?.aborted) throw opts.signal.reason;
      const ctl = new AbortController();
      let timedOut = false;
      const timer =
        timeoutMs === null
          ? undefined
          : setTimeout(() => {
              timedOut = true;
              ctl.abort(new AirlockTimeout(`${method} ${url}: timed out after ${timeoutMs} ms`));
            }, timeoutMs);
      const onAbort = () => ctl.abort(opts.signal?.reason);
      opts.signal?.addEventListener("abort", onAbort, { once: true });
      let released = false;
      const release = () => {
        if (released) return;
        released = true;
        if (timer !== undefined) clearTimeout(timer);
        opts.signal?.removeEventListener("abort", onAbort);
      };
      let res: Response;
      try {
        res = await this.fetchFn(url, { method, headers, body: body ?? null, signal: ctl.signal });
      } catch (e) {
        release();
        if (timedOut) throw ctl.signal.reason as AirlockTimeout;
        if (opts.signal?.aborted) throw opts.signal.reason;
        const code = causeCode(e);
        const retryable =
          (code !== undefined && NOT_SENT.has(code)) ||
          (IDEMPOTENT.has(method) && code !== undefined && BROKEN.has(code));
        if (attempt < this.retries && retryable) {
          await sleep(this.retryDelay(attempt, null) ?? 0, opts.signal);
          continue;
        }
        const cause = (e as { cause?: unknown }).cause ?? e;
        const what = cause instanceof Error ? `${code ?? cause.name}: ${cause.message}` : String(cause);
        throw new AirlockConnectionError(`${method} ${url}: ${what}`, { cause: e });
      }
      if (res.status < 400 || opts.acceptStatus?.includes(res.status)) {
        return { res, release, abort: () => ctl.abort(new AirlockConnectionError("closed by the client")) };
      }
      let text: string;
      try {
        text = await res.text();
      } catch (e) {
        release();
        if (timedOut) throw ctl.signal.reason as AirlockTimeout;
        throw new AirlockConnectionError(`${method} ${url}: reading the error: ${String(e)}`, { cause: e });
      }
      release();
      const err = errorFromResponse(res.status, text, res.headers.get("retry-after"), opts.notFound ?? SandboxNotFound);
      if (attempt < this.retries && retryOnStatus(method, path, res.status, err.code)) {
        const delay = this.retryDelay(attempt, err.retryAfter);
        if (delay !== null) {
          await sleep(delay, opts.signal);
          continue;
        }
      }
      throw err;
    }
  }

  /** Reads a whole response inside its timeout. */
  private async read<T>(method: string, path: string, opts: RequestOptions, f: (r: Response) => Promise<T>): Promise<T> {
    const o = await this.open(method, path, opts);
    try {
      return await f(o.res);
    } catch (e) {
      if (e instanceof AirlockError) throw e;
      if (opts.signal?.aborted) throw opts.signal.reason;
      throw new AirlockConnectionError(`${method} ${this.baseUrl + path}: ${String(e)}`, { cause: e });
    } finally {
      o.release();
    }
  }

  /** A request answering JSON. */
  json<T>(method: string, path: string, opts: RequestOptions = {}): Promise<T> {
    return this.read(method, path, opts, async (res) => {
      const text = await res.text();
      try {
        return JSON.parse(text) as T;
      } catch (e) {
        throw new AirlockError(`the service answered ${res.status} with a body that is not JSON: ${String(e)}`, {
          status: res.status,
        });
      }
    });
  }

  /** A request answering raw bytes. */
  bytes(method: string, path: string, opts: RequestOptions = {}): Promise<Uint8Array> {
    return this.read(method, path, opts, async (res) => new Uint8Array(await res.arrayBuffer()));
  }

  /** A request answering text. */
  text(method: string, path: string, opts: RequestOptions = {}): Promise<string> {
    return this.read(method, path, opts, (res) => res.text());
  }

  /** A request whose answer has no body worth reading (204). */
  async none(method: string, path: string, opts: RequestOptions = {}): Promise<void> {
    await this.read(method, path, opts, async (res) => {
      await res.arrayBuffer();
    });
  }
}

/** The path of a session (or something under it). */
export function sandboxPath(id: string, rest = ""): string {
  return `/v1/sandboxes/${encodeURIComponent(id)}${rest}`;
}

/** A snapshot's id, from the snapshot or the id itself. */
export function snapshotId(snapshot: { snapshot_id: string } | string): string {
  return typeof snapshot === "string" ? snapshot : snapshot.snapshot_id;
}

/** The path of a snapshot. */
export function snapshotPath(snapshot: { snapshot_id: string } | string): string {
  return `/v1/snapshots/${encodeURIComponent(snapshotId(snapshot))}`;
}

/**
 * Server-Sent Events of a response body, as `[event, data]` pairs: dispatched at a blank
 * line, `data` lines joined by newlines, comment lines (`:`) ignored.
 */
export async function* sseEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<[string, string]> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  let event = "";
  let data: string[] = [];
  const feed = function* (line: string): Generator<[string, string]> {
    if (line === "") {
      if (data.length || event) yield [event || "message", data.join("\n")];
      event = "";
      data = [];
      return;
    }
    if (line.startsWith(":")) return;
    const i = line.indexOf(":");
    const name = i < 0 ? line : line.slice(0, i);
    let value = i < 0 ? "" : line.slice(i + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "event") event = value;
    else if (name === "data") data.push(value);
  };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let m: RegExpExecArray | null;
      const re = /\r\n|\r|\n/g;
      let start = 0;
      while ((m = re.exec(buf)) !== null) {
        // A lone \r at the end may be the first half of \r\n: wait for more.
        if (m[0] === "\r" && m.index === buf.length - 1) break;
        yield* feed(buf.slice(start, m.index));
        start = m.index + m[0].length;
      }
      buf = buf.slice(start);
    }
    buf += decoder.decode();
    if (buf) yield* feed(buf.replace(/\r$/, ""));
    yield* feed("");
  } finally {
    reader.releaseLock();
    await body.cancel().catch(() => undefined);
  }
}

/** A `Uint8Array` as standard base64. */
export function toBase64(bytes: Uint8Array): string {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

/** Standard base64 as bytes. */
export function fromBase64(b64: string): Uint8Array {
  const s = atob(b64);
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}
