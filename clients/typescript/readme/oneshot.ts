// readme/oneshot.ts
import { Airlock, isOk } from "airlock-sandbox";

const al = new Airlock(); // $AIRLOCK_URL (default http://127.0.0.1:8710), $AIRLOCK_API_KEY

await al.run({ code: "console.log(6*7)", language: "javascript" }); // python | javascript | bash
const r = await al.run({
  cmd: ["python3", "main.py"], // an argv; cmd[0] is looked up in PATH
  files: {
    "main.py": "import sys; print(sys.stdin.read().upper())", // string: UTF-8 text
    "data.bin": new Uint8Array([0, 1]), // bytes: sent as base64, byte for byte
    "run.sh": { content: "#!/bin/sh\necho hi\n", mode: 0o755 },
  },
  env: { DEBUG: "1" },
  stdin: "hello",
  limits: { memory_bytes: 128 * 2 ** 20, cpus: 1, pids: 64, output_bytes: 2 ** 20 },
  timeoutMs: 5_000, // the program's deadline (limits.timeout_ms)
  network: "none", // or { mode: "proxy", allow: ["pypi.org", "*.pythonhosted.org"] }
});
console.log(isOk(r), r.stdout); // true HELLO

const slow = await al.run({ cmd: ["sleep", "10"], timeoutMs: 200 });
console.log(slow.outcome, slow.timed_out); // timeout true: a result, not an error
