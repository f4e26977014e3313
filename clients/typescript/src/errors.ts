/**
 * Errors: one class per API status, each carrying the API's `code`, `message` and `field`
 * (the envelope `{"error": {"code", "message", "field"}}`).
 *
 * A program that fails, times out or is OOM-killed is *not* an error: the API answers an
 * `ExecResult` for it. Errors are for requests the service refused or could not serve.
 *
 * @module
 */

/** What every error of this SDK carries besides its message. */
export interface AirlockErrorInit {
  /** The API's stable machine-readable code, e.g. `invalid_request`. */
  code?: string | null;
  /** The request field at fault, in the API's spelling (`limits.memory_bytes`, `cmd[0]`). */
  field?: string | null;
  /** The HTTP status; `null` for transport errors and stream `error` events. */
  status?: number | null;
  /** Seconds to wait before trying again, from `Retry-After`. */
  retryAfter?: number | null;
  /** The parsed response body, when there was one. */
  body?: unknown;
  /** The underlying error (a transport failure). */
  cause?: unknown;
}

/** Base of every error this SDK throws. */
export class AirlockError extends Error {
  /** The API's stable machine-readable code (`invalid_request`, `not_found`, ...). */
  readonly code: string | null;
  /** The request field at fault, in the API's own spelling (`limits.memory_bytes`). */
  readonly field: string | null;
  /** The HTTP status (`null` for transport errors and errors inside a stream). */
  readonly status: number | null;
  /** Seconds the service asked to wait (`Retry-After`), when it did. */
  readonly retryAfter: number | null;
  /** The parsed error body. */
  readonly body: unknown;
  /** The message the service sent, without the status/code/field decoration. */
  readonly detail: string;

  constructor(message: string, init: AirlockErrorInit = {}) {
    super(decorate(message, init), init.cause !== undefined ? { cause: init.cause } : undefined);
    this.name = new.target.name;
    this.detail = message;
    this.code = init.code ?? null;
    this.field = init.field ?? null;
    this.status = init.status ?? null;
    this.retryAfter = init.retryAfter ?? null;
    this.body = init.body;
  }
}

function decorate(message: string, init: AirlockErrorInit): string {
  const head = [init.status != null ? String(init.status) : "", init.code ?? ""].filter(Boolean).join(" ");
  let text = head ? `${head}: ${message}` : message;
  if (init.field) text += ` (field: ${init.field})`;
  return text;
}

/** 400: the request is invalid (`invalid_request` with `field`, or `malformed_json`). */
export class InvalidRequest extends AirlockError {}
/** 401: API keys are configured and the request has no valid one. */
export class Unauthorized extends AirlockError {}
/** 404: something does not exist (see the subclasses). */
export class NotFound extends AirlockError {}
/** 404: no such sandbox (or it belongs to another API key). */
export class SandboxNotFound extends NotFound {}
/** 404: the sandbox exists but the file does not. */
export class FileNotFound extends NotFound {}
/** 404: no such connection waits for approval (answered, expired, or its program ended). */
export class ApprovalNotFound extends NotFound {}
/** 404: the sandbox has no such background process. */
export class ProcessNotFound extends NotFound {}
/** 404: the port is not exposed. */
export class PortNotFound extends NotFound {}
/** 404: no such snapshot (deleted, or another API key's). */
export class SnapshotNotFound extends NotFound {}
/**
 * 404 `no such route`: the service does not know this route at all (an older `airlock
 * serve` than this SDK: upgrade the daemon).
 */
export class RouteNotFound extends NotFound {}
/**
 * 409: a conflict: the sandbox's init (or its VM) is gone, or a limit of the session is
 * reached (16 running background processes).
 */
export class Conflict extends AirlockError {}
/** 409 `paused`: the session was paused with `pause()`; it runs nothing until `resume()`. */
export class SandboxPaused extends Conflict {}
/** 409 `incompatible_snapshot`: a restore of a snapshot of another image; nothing changed. */
export class IncompatibleSnapshot extends Conflict {}
/** 410: the session's TTL passed (or it was deleted while the request waited). */
export class SandboxExpired extends AirlockError {}
/** 413: the request body exceeds the server's `--max-body`. */
export class PayloadTooLarge extends AirlockError {}
/** 415: the body was not JSON. */
export class UnsupportedMediaType extends AirlockError {}
/**
 * 429: the service is at capacity (`queue_full`, `queue_timeout`, `key_concurrency`);
 * `retryAfter` says when to try again. The client already retried `retries` times.
 */
export class RateLimited extends AirlockError {}
/**
 * 429 `session_quota`: this API key holds as many sessions as the server allows. Never
 * retried: delete a session you no longer need (`listSandboxes()` lists yours).
 */
export class SessionQuotaExceeded extends RateLimited {}
/** 500: the sandbox could not be built (a host problem the daemon logged). */
export class ServerError extends AirlockError {}
/** 502: an exposed port has nothing listening behind it. */
export class BadGateway extends AirlockError {}
/** 503: the service is shutting down. */
export class ServiceUnavailable extends AirlockError {}
/** 503 `<tier>_unavailable`: this host cannot run the isolation tier asked for (not retried). */
export class IsolationUnavailable extends ServiceUnavailable {}
/** 503 `microvm_unavailable`. */
export class MicroVmUnavailable extends IsolationUnavailable {}
/** 503 `gvisor_unavailable`. */
export class GvisorUnavailable extends IsolationUnavailable {}
/** 503 `snapshots_unavailable`: the server's snapshot store is unusable (not retried). */
export class SnapshotsUnavailable extends ServiceUnavailable {}
/** 507: a file does not fit the sandbox's disk; nothing of it was left behind. */
export class DiskFull extends AirlockError {}
/** 507 `snapshot_budget`: the snapshot does not fit the server's `--snapshot-budget`; nothing was kept. */
export class SnapshotBudgetExceeded extends DiskFull {}
/** The service could not be reached, or the connection broke. */
export class AirlockConnectionError extends AirlockError {}
/** The client-side timeout passed before the service answered. */
export class AirlockTimeout extends AirlockConnectionError {}
/**
 * No WebSocket implementation: Node 20 and 21 have a global `WebSocket` only with
 * `--experimental-websocket` (Node 22 and later have it by default). Run with that flag,
 * or pass one: `new Airlock({ WebSocket: ... })`.
 */
export class WebSocketUnavailable extends AirlockError {}

/** The 404 class a route implies when the message does not name something else. */
export type NotFoundClass = new (message: string, init?: AirlockErrorInit) => NotFound;

const BY_STATUS: Record<number, new (message: string, init?: AirlockErrorInit) => AirlockError> = {
  400: InvalidRequest,
  401: Unauthorized,
  404: NotFound,
  409: Conflict,
  410: SandboxExpired,
  413: PayloadTooLarge,
  415: UnsupportedMediaType,
  429: RateLimited,
  500: ServerError,
  502: BadGateway,
  503: ServiceUnavailable,
  507: DiskFull,
};

// Codes as they arrive in a stream's `error` event (the status is not sent there).
const BY_CODE: Record<string, new (message: string, init?: AirlockErrorInit) => AirlockError> = {
  invalid_request: InvalidRequest,
  malformed_json: InvalidRequest,
  unauthorized: Unauthorized,
  not_found: SandboxNotFound,
  busy: Conflict,
  conflict: Conflict,
  paused: SandboxPaused,
  incompatible_snapshot: IncompatibleSnapshot,
  expired: SandboxExpired,
  body_too_large: PayloadTooLarge,
  unsupported_media_type: UnsupportedMediaType,
  disk_full: DiskFull,
  snapshot_budget: SnapshotBudgetExceeded,
  queue_full: RateLimited,
  queue_timeout: RateLimited,
  key_concurrency: RateLimited,
  session_quota: SessionQuotaExceeded,
  shutting_down: ServiceUnavailable,
  microvm_unavailable: MicroVmUnavailable,
  gvisor_unavailable: GvisorUnavailable,
  namespaces_unavailable: IsolationUnavailable,
  snapshots_unavailable: SnapshotsUnavailable,
  sandbox_error: ServerError,
  internal: ServerError,
};

/** `Retry-After` in seconds (delta-seconds form; airlock sends no HTTP dates). */
export function parseRetryAfter(value: string | null | undefined): number | null {
  if (!value) return null;
  const secs = Number(value.trim());
  return Number.isFinite(secs) && secs >= 0 ? secs : null;
}

function envelope(body: unknown): { code: string | null; message: string | null; field: string | null } {
  const err = typeof body === "object" && body !== null ? (body as Record<string, unknown>)["error"] : undefined;
  if (typeof err !== "object" || err === null) return { code: null, message: null, field: null };
  const e = err as Record<string, unknown>;
  const str = (v: unknown): string | null => (typeof v === "string" ? v : null);
  return { code: str(e["code"]), message: str(e["message"]), field: str(e["field"]) };
}

/**
 * The error for a response with an error status. `notFound` is the 404 class the route
 * implies (a file read may 404 on the file); a 404 naming the sandbox stays
 * `SandboxNotFound`, and `no such route` is `RouteNotFound`.
 */
export function errorFromResponse(
  status: number,
  text: string,
  retryAfterHeader: string | null,
  notFound: NotFoundClass = SandboxNotFound,
): AirlockError {
  let body: unknown = undefined;
  try {
    body = text ? JSON.parse(text) : undefined;
  } catch {
    body = undefined;
  }
  const { code, message: msg, field } = envelope(body);
  const message = msg ?? (text.trim().slice(0, 500) || `HTTP ${status}`);
  let cls = BY_STATUS[status];
  if (status === 429 && code === "session_quota") cls = SessionQuotaExceeded;
  if (status === 503 && code && code.endsWith("_unavailable") && BY_CODE[code]) cls = BY_CODE[code];
  if (status === 409 && (code === "paused" || code === "incompatible_snapshot")) cls = BY_CODE[code];
  if (status === 507 && code === "snapshot_budget") cls = SnapshotBudgetExceeded;
  if (cls === NotFound) {
    cls = notFound;
    if (message.startsWith("no sandbox")) cls = SandboxNotFound;
    if (message === "no such route") cls = RouteNotFound;
  }
  if (cls === undefined) cls = status >= 500 ? ServerError : AirlockError;
  return new cls(message, { code, field, status, retryAfter: parseRetryAfter(retryAfterHeader), body });
}

/** The error for a stream's `error` event (its data is the error envelope). */
export function errorFromEvent(data: string): AirlockError {
  let body: unknown = undefined;
  try {
    body = JSON.parse(data);
  } catch {
    body = undefined;
  }
  const { code, message, field } = envelope(body);
  const cls = (code && BY_CODE[code]) || AirlockError;
  return new cls(message ?? data, { code, field, body });
}
