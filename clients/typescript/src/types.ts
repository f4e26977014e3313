/**
 * Typed values of the airlock API. What crosses the wire keeps the API's own field names
 * (`exit_code`, `limits.memory_bytes`: the names errors report in `field`, and the names of
 * `GET /openapi.json`); options that exist only in this SDK are camelCase (`timeoutMs`,
 * `onStdout`). Fields may be added to results by newer servers, never renamed.
 *
 * @module
 */

/** How the program ended. */
export type Outcome = "exited" | "signaled" | "timeout" | "oom";

/** The isolation tiers. */
export type Isolation = "namespaces" | "gvisor" | "microvm";

/** Languages of `code` in an exec. */
export type Language = "python" | "javascript" | "bash";

/** Per-request resource limits; an absent limit takes the server's default. */
export interface Limits {
  /** Memory cap for everything in the sandbox, tmpfs included (default 256 MiB). */
  memory_bytes?: number;
  /** CPU quota in cores (default 0.5). */
  cpus?: number;
  /** Processes plus threads (default 64). */
  pids?: number;
  /** Wall-clock deadline in milliseconds (default 10 000). */
  timeout_ms?: number;
  /** Size of the tmpfs shared by /tmp, /workspace and /dev/shm (default 64 MiB). */
  disk_bytes?: number;
  /** Bytes of stdout and of stderr kept, each (default 1 MiB). */
  output_bytes?: number;
}

/** A value the sandboxed program may use but never read (see docs/network.md, "Secrets the sandbox can use but never read"). */
export interface Secret {
  /** The environment variable holding a placeholder. */
  name: string;
  /** The secret; absent (null) in a policy the service showed back. */
  value?: string | null;
  /** Host patterns the value may go to. */
  hosts: string[];
  /** Replace the placeholder in the URL's query too. */
  query?: boolean;
}

/** No network: an own namespace with only loopback (the default). */
export interface NetworkNone {
  mode: "none";
}

/** Out only through airlock's filtering egress proxy. */
export interface NetworkProxy {
  mode: "proxy";
  /** Host patterns: `pypi.org`, `*.pythonhosted.org`, `api.example.com:8443`, `*`. */
  allow?: string[];
  /** Private ranges reachable on purpose: `10.1.2.3/32`. */
  allow_cidrs?: string[];
  /** Hosts, `*.DOMAIN` and ranges never reached: deny wins over allow. */
  deny?: string[];
  secrets?: Secret[];
  /** `ask` (sessions only): hold a denied connection while airlock asks. */
  on_denied?: "deny" | "ask";
  /** How long a held connection waits for an answer (server default 30 000). */
  approval_timeout_ms?: number;
}

/** A network policy; the string `"none"` is accepted for `{mode: "none"}`. */
export type Network = NetworkNone | NetworkProxy;

/** A policy as the service shows it (`GET …/network`): every list present, no secret values. */
export type NetworkShown =
  | NetworkNone
  | (Required<Omit<NetworkProxy, "secrets">> & { secrets: Secret[] });

/** A change of a session's policy: each list given replaces the session's. */
export interface NetworkPatch {
  allow?: string[];
  allow_cidrs?: string[];
  deny?: string[];
  on_denied?: "deny" | "ask";
}

/** A file written into /workspace before the program starts. */
export interface FileSpec {
  /** `string`: UTF-8 text; `Uint8Array`: sent as base64, byte for byte. */
  content: string | Uint8Array;
  /** Permission bits, e.g. `0o755` (default 0o644). */
  mode?: number;
}

/** `{"path/in/workspace": content | FileSpec}`. */
export type Files = Record<string, string | Uint8Array | FileSpec>;

/** One connection, request, DNS query or policy change seen by the egress proxy. */
export interface EgressEntry {
  kind: "proxy" | "redirected" | "dns" | "policy" | string;
  host: string;
  port: number;
  addr: string | null;
  allowed: boolean;
  reason: string;
  bytes_up: number;
  bytes_down: number;
  ms: number;
}

/** One path an exec created, modified or deleted (a rename is a delete plus a create). */
export interface FileChange {
  /** Absolute: `/workspace/a/b.txt`, `/tmp/x`. */
  path: string;
  /** A path whose kind changed is `modified`, with the new kind. */
  change: "created" | "modified" | "deleted";
  kind: "file" | "dir" | "symlink";
  /** Its size after the exec; for `deleted`, before; 0 for directories. */
  bytes: number;
}

/** The result of an exec (`airlock run --json`'s ExecResult plus `queue_ms`). */
export interface ExecResult {
  id: string;
  outcome: Outcome;
  exit_code: number | null;
  signal: number | null;
  timed_out: boolean;
  oom_killed: boolean;
  stdout: string;
  stderr: string;
  stdout_truncated: boolean;
  stderr_truncated: boolean;
  stdout_bytes: number;
  stderr_bytes: number;
  wall_ms: number;
  setup_ms: number;
  cpu_ms: number;
  memory_peak_bytes: number;
  egress: EgressEntry[];
  isolation: Isolation;
  platform: string | null;
  queue_ms: number;
  /**
   * What the exec created, modified and deleted under its `filesChangedIn` (default
   * `["/workspace"]`), sorted by path; at most 1000.
   */
  files_changed: FileChange[];
  /** More changed than `files_changed` lists. */
  files_changed_truncated: boolean;
  /** Fields a newer server adds. */
  [extra: string]: unknown;
}

/** Whether the program exited by itself with status 0. */
export function isOk(r: ExecResult): boolean {
  return r.outcome === "exited" && r.exit_code === 0;
}

/** Output the program wrote to stdout, as it arrived. */
export interface StdoutEvent {
  kind: "stdout";
  data: string;
}

/** Output the program wrote to stderr, as it arrived. */
export interface StderrEvent {
  kind: "stderr";
  data: string;
}

/** The last event of an exec stream: its result. */
export interface ResultEvent {
  kind: "result";
  result: ExecResult;
}

/** The events of a streamed exec. */
export type StreamEvent = StdoutEvent | StderrEvent | ResultEvent;

/** A session's usage so far. */
export interface SandboxUsage {
  execs: number;
  cpu_ms: number;
  memory_peak_bytes: number;
}

/** A session as `GET /v1/sandboxes[/{id}]` shows it (times in seconds since the epoch). */
export interface SandboxInfo {
  id: string;
  isolation: Isolation;
  created_at: number;
  expires_at: number;
  usage: SandboxUsage;
  image: { name: string; digest: string } | null;
  /** `paused` after `sandbox.pause()` (or while idle, with `onIdle: "pause"`). */
  status: "running" | "paused";
  on_idle: "none" | "pause";
  /** The snapshot it was created from. */
  from_snapshot: string | null;
  [extra: string]: unknown;
}

/** What `sandbox.snapshot()` asks for: `auto` (default) is `full` where the tier can. */
export type SnapshotKind = "auto" | "filesystem" | "full";

/**
 * A snapshot of a session: its writable files (/workspace, /tmp, /dev/shm), limits,
 * network policy and image; a `full` one (gVisor, micro-VMs) its memory and processes too.
 */
export interface Snapshot {
  /** `snap-` and 16 hex digits. */
  snapshot_id: string;
  kind: "filesystem" | "full";
  /** The session it was taken of. */
  sandbox_id: string;
  isolation: Isolation;
  image: { name: string; digest: string } | null;
  /** Seconds since the epoch. */
  created_at: number;
  /** The files' logical size. */
  bytes: number;
  /** What it added on the server's disk (files another snapshot of the key holds are shared). */
  stored_bytes: number;
  files: number;
  [extra: string]: unknown;
}

/** `GET /v1/snapshots`: the caller's snapshots and the store's usage. */
export interface SnapshotList {
  /** Oldest first. */
  snapshots: Snapshot[];
  /** Bytes the server's snapshot store holds on disk (every API key's snapshots). */
  used_bytes: number;
  /** Its budget (`--snapshot-budget`). */
  budget_bytes: number;
}

/** One entry of a /workspace listing. */
export interface FileEntry {
  /** Relative to /workspace. */
  path: string;
  size: number;
  /** Permission bits (420 = 0o644). */
  mode: number;
  dir: boolean;
}

/** `GET /readyz`. */
export interface Readiness {
  ready: boolean;
  pool_ready: number;
  pool_target: number;
  stopping: boolean;
  sandboxes_active: number;
}

/** An answer to a held connection. */
export type Decision = "allow_once" | "allow_session" | "deny";

/** A connection the session's policy denied, held while airlock asks. */
export interface Approval {
  id: number;
  host: string;
  port: number;
  reason: string;
  expires_in_ms: number;
}

// --- interactive sessions ---------------------------------------------------------------

/** A background process (or terminal) of a session. */
export interface Process {
  process_id: string;
  command: string[];
  pid: number;
  /** Whether it runs on a terminal (`sandbox.pty()`). */
  tty: boolean;
  state: "running" | "exited";
  /** Seconds since the epoch. */
  started_at: number;
  ended_at: number | null;
  /** When exited: exactly one of `exit_code` and `signal` is set. */
  exit_code: number | null;
  signal: number | null;
  /** SIGKILLed after its `timeout_ms`. */
  timed_out: boolean;
  /** Every byte ever written (what is kept is the last N, N = the output limit). */
  stdout_bytes: number;
  stderr_bytes: number;
  [extra: string]: unknown;
}

/** What is kept now of a background process's output. */
export interface ProcessOutput {
  stdout: string;
  stderr: string;
  /** Bytes no longer kept (the oldest). */
  stdout_dropped: number;
  stderr_dropped: number;
  process: Process;
}

/** An event of `processes.stream()`. */
export type ProcessEvent =
  | { kind: "stdout"; data: string }
  | { kind: "stderr"; data: string }
  /** It ended (with `follow`). */
  | { kind: "exit"; process: Process }
  /** The kept output was sent (without `follow`). */
  | { kind: "end"; process: Process };

/** Signal names the service takes (or a number). */
export type SignalName =
  | "SIGTERM"
  | "SIGKILL"
  | "SIGINT"
  | "SIGHUP"
  | "SIGQUIT"
  | "SIGUSR1"
  | "SIGUSR2"
  | "SIGSTOP"
  | "SIGCONT";

/** An exposed port of a session. */
export interface Port {
  port: number;
  /** The port's own token (header `X-Airlock-Port-Token` or query `airlock_token=`). */
  token: string;
  /** `/v1/sandboxes/{id}/ports/{port}/`. */
  path: string;
  /** `{port}-{id}.<host>`: requests whose Host is this reach the port too. */
  host: string;
  /** The client's base URL plus `path`: forwarded to the sandbox's `127.0.0.1:{port}`. */
  url: string;
}

/** The `{name, value, traceback}` of an exception the interpreter raised. */
export interface ExecutionError {
  name: string;
  value: string;
  traceback: string[];
}

/** A rich result of the interpreter, by MIME type (images as base64, JSON as a value). */
export interface ExecutionResult {
  kind: "execute_result" | "display_data" | string;
  data: {
    "text/plain"?: string;
    "text/html"?: string;
    "text/markdown"?: string;
    "text/latex"?: string;
    "image/png"?: string;
    "image/jpeg"?: string;
    "image/svg+xml"?: string;
    "application/json"?: unknown;
    [mime: string]: unknown;
  };
}

/** The JSON of `POST …/code`. */
export interface ExecutionData {
  execution_count: number;
  logs: { stdout: string[]; stderr: string[] };
  results: ExecutionResult[];
  error: ExecutionError | null;
  timed_out: boolean;
  duration_ms: number;
  kernel_start_ms: number;
  [extra: string]: unknown;
}
