/**
 * A terminal in a session, over a WebSocket (`GET /v1/sandboxes/{id}/pty`).
 *
 * @module
 */

import { AirlockConnectionError, AirlockError, WebSocketUnavailable } from "./errors.js";
import { sandboxPath, type Transport, type WebSocketLike } from "./http.js";

/** Options of `sandbox.pty()`. */
export interface PtyOptions {
  /** Default 24. */
  rows?: number;
  /** Default 80. */
  cols?: number;
  /** A command line to run on it (`sh -c 'exec CMD'`); default: bash where the sandbox has it, else sh. */
  cmd?: string;
  /** Called with the service's complaint about a frame it could not use (a bad resize). */
  onError?: (message: string) => void;
  /** Called with the terminal's output bytes as they arrive. */
  onData?: (data: Uint8Array) => void;
  /** How long to wait for the terminal to start (ms, default the client's timeout). */
  timeoutMs?: number;
}

/** How a terminal's program ended. */
export interface PtyExit {
  exit_code: number | null;
  signal: number | null;
}

const OPEN = 1;

/**
 * An open terminal: `write` keystrokes, `resize` it, `wait()` for its program to end,
 * `close()` to hang it up. `processId` and `pid` name it as a process of the session.
 */
export class Pty {
  /** Its id among the session's processes (`sandbox.processes.get(id)`). */
  readonly processId: string;
  /** Its pid inside the sandbox. */
  readonly pid: number;
  private readonly exited: Promise<PtyExit>;
  private readonly encoder = new TextEncoder();

  /** @internal Use `sandbox.pty()`. */
  constructor(
    private readonly ws: WebSocketLike,
    started: { process_id: string; pid: number },
    exited: Promise<PtyExit>,
  ) {
    this.processId = started.process_id;
    this.pid = started.pid;
    this.exited = exited;
    exited.catch(() => undefined); // observed by wait(); never an unhandled rejection
  }

  /** Sends keystrokes (a string is sent as UTF-8). */
  write(data: string | Uint8Array): void {
    if (this.ws.readyState !== OPEN) throw new AirlockConnectionError("the terminal is closed");
    this.ws.send(typeof data === "string" ? this.encoder.encode(data) : data);
  }

  /** Changes the terminal's size. */
  resize(rows: number, cols: number): void {
    if (this.ws.readyState !== OPEN) throw new AirlockConnectionError("the terminal is closed");
    this.ws.send(JSON.stringify({ type: "resize", rows, cols }));
  }

  /** Waits for the program on the terminal to end. */
  wait(): Promise<PtyExit> {
    return this.exited;
  }

  /** Hangs up (the service sends SIGHUP, then SIGKILL after 2 s). */
  close(): void {
    this.ws.close(1000);
  }

  /** `await using pty = await sandbox.pty()` closes it at the end of the block. */
  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
  }
}

/** Opens a terminal (see `Sandbox.pty`). */
export async function openPty(transport: Transport, sandboxId: string, opts: PtyOptions = {}): Promise<Pty> {
  const WS = transport.WebSocket;
  if (!WS) {
    throw new WebSocketUnavailable(
      "no WebSocket implementation: on Node 20 and 21 run node with --experimental-websocket, " +
        "or pass one: new Airlock({ WebSocket })",
    );
  }
  const query: Record<string, string | undefined> = {
    rows: opts.rows?.toString(),
    cols: opts.cols?.toString(),
    cmd: opts.cmd,
  };
  // A WebSocket cannot carry an Authorization header in every implementation: the service
  // takes the key in the query too.
  if (transport.apiKey) query["access_token"] = transport.apiKey;
  const path = sandboxPath(sandboxId, "/pty");
  const httpUrl = transport.url(path, query);
  const wsUrl = httpUrl.replace(/^http/, "ws");
  const ws = new WS(wsUrl);
  ws.binaryType = "arraybuffer";
  let resolveExit!: (e: PtyExit) => void;
  let rejectExit!: (e: unknown) => void;
  const exited = new Promise<PtyExit>((res, rej) => {
    resolveExit = res;
    rejectExit = rej;
  });
  let gotExit = false;
  const timeoutMs = opts.timeoutMs ?? transport.timeoutMs;
  const started = await new Promise<{ process_id: string; pid: number }>((resolve, reject) => {
    let done = false;
    const timer = setTimeout(() => {
      if (done) return;
      done = true;
      ws.close();
      reject(new AirlockConnectionError(`${httpUrl}: the terminal did not start in ${timeoutMs} ms`));
    }, timeoutMs);
    ws.addEventListener("message", (ev: { data: unknown }) => {
      const d = ev.data;
      if (typeof d === "string") {
        let msg: { type?: string; [k: string]: unknown };
        try {
          msg = JSON.parse(d);
        } catch {
          return;
        }
        if (msg.type === "started" && !done) {
          done = true;
          clearTimeout(timer);
          resolve(msg as unknown as { process_id: string; pid: number });
        } else if (msg.type === "error") {
          opts.onError?.(String(msg["message"]));
        } else if (msg.type === "exit") {
          gotExit = true;
          resolveExit({ exit_code: (msg["exit_code"] as number | null) ?? null, signal: (msg["signal"] as number | null) ?? null });
        }
        return;
      }
      const bytes = d instanceof ArrayBuffer ? new Uint8Array(d) : ArrayBuffer.isView(d) ? new Uint8Array(d.buffer, d.byteOffset, d.byteLength) : null;
      if (bytes && opts.onData) opts.onData(bytes);
      else if (bytes === null && typeof d === "object" && d !== null && "arrayBuffer" in d) {
        // A Blob (an implementation that ignores binaryType): best effort, in order.
        void (d as { arrayBuffer(): Promise<ArrayBuffer> }).arrayBuffer().then((b) => opts.onData?.(new Uint8Array(b)));
      }
    });
    const refused = () => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      // The upgrade was refused (or the connection failed): a plain request to the same
      // route gives the typed error (404, 401, 410...).
      diagnose(transport, path, query).then(reject, reject);
    };
    ws.addEventListener("close", (ev: { code?: number; reason?: string }) => {
      if (!gotExit) {
        rejectExit(new AirlockConnectionError(`the terminal closed without an exit (code ${ev.code ?? "?"}${ev.reason ? ": " + ev.reason : ""})`));
      }
      refused();
    });
    // Node 20's WebSocket fires only `error` (no `close`) when the upgrade is refused.
    ws.addEventListener("error", () => {
      if (!done) refused();
      else if (!gotExit) rejectExit(new AirlockConnectionError("the terminal's connection failed"));
    });
  });
  return new Pty(ws, started, exited);
}

/** The typed error of a refused upgrade, from a plain GET of the same route. */
async function diagnose(transport: Transport, path: string, query: Record<string, string | undefined>): Promise<AirlockError> {
  try {
    await transport.none("GET", path, { query });
  } catch (e) {
    if (e instanceof AirlockError) return e;
    return new AirlockConnectionError(`GET ${path}: ${String(e)}`, { cause: e });
  }
  return new AirlockConnectionError(`${transport.baseUrl + path}: the WebSocket upgrade failed`);
}
