/**
 * The code interpreter's answer: `Execution`.
 *
 * @module
 */

import { fromBase64 } from "./http.js";
import type { ExecutionData, ExecutionError, ExecutionResult } from "./types.js";

/** The answer of `sandbox.runCode()`: logs, rich results, the error if one was raised. */
export class Execution {
  /** The kernel's counter (1 for the first call of a kernel). */
  readonly executionCount: number;
  /** stdout and stderr as the kernel sent them, in chunks. */
  readonly logs: { stdout: string[]; stderr: string[] };
  /** `execute_result` (the value of the last expression) and `display_data` (figures...). */
  readonly results: ExecutionResult[];
  /** The exception the code raised (`KeyboardInterrupt` when it timed out). */
  readonly error: ExecutionError | null;
  /** It ran past its `timeoutMs` and was interrupted (the state is kept). */
  readonly timedOut: boolean;
  readonly durationMs: number;
  /** Time this call spent starting the kernel (the first call; 0 after). */
  readonly kernelStartMs: number;
  /** The JSON the service answered. */
  readonly raw: ExecutionData;

  constructor(data: ExecutionData) {
    this.raw = data;
    this.executionCount = data.execution_count;
    this.logs = { stdout: data.logs?.stdout ?? [], stderr: data.logs?.stderr ?? [] };
    this.results = data.results ?? [];
    this.error = data.error ?? null;
    this.timedOut = data.timed_out;
    this.durationMs = data.duration_ms;
    this.kernelStartMs = data.kernel_start_ms;
  }

  /** All of stdout. */
  get stdout(): string {
    return this.logs.stdout.join("");
  }

  /** All of stderr. */
  get stderr(): string {
    return this.logs.stderr.join("");
  }

  /** `text/plain` of the `execute_result` (the last expression's value), if any. */
  get text(): string | undefined {
    const r = this.results.find((x) => x.kind === "execute_result");
    return r?.data["text/plain"];
  }

  /** The bytes of the first `image/png` result, if any. */
  get png(): Uint8Array | undefined {
    const r = this.results.find((x) => typeof x.data["image/png"] === "string");
    return r ? fromBase64(r.data["image/png"] as string) : undefined;
  }
}
