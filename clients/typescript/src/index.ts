/**
 * airlock-sandbox: the TypeScript client of `airlock serve`, the tool-execution sandbox for
 * AI agents. No runtime dependencies: the platform's fetch, WebSocket and streams.
 *
 * @module
 */

export { Airlock, type CreateSandboxOptions } from "./client.js";
export { Sandbox, Processes, type RunCodeOptions, type StartOptions } from "./sandbox.js";
export { ExecStream, type ExecOptions, type SessionExecOptions } from "./exec.js";
export { Execution } from "./code.js";
export { Pty, type PtyExit, type PtyOptions } from "./pty.js";
export { VERSION, type AirlockOptions, type WebSocketConstructor, type WebSocketLike } from "./http.js";
export * from "./errors.js";
export * from "./types.js";
