// readme/streaming.ts
import { Airlock } from "airlock-sandbox";

const al = new Airlock();
const code = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.1)";

// An async iterator of events: stdout/stderr as output arrives, then the result.
for await (const ev of al.stream({ code })) {
  if (ev.kind === "stdout") process.stdout.write(`stdout: ${ev.data}`);
  else if (ev.kind === "stderr") process.stdout.write(`stderr: ${ev.data}`);
  else console.log(`exit code ${ev.result.exit_code}`);
}

// Or callbacks, with the result returned as run() returns it.
const r = await al.run({
  cmd: ["sh", "-c", "echo out; echo err >&2"],
  onStdout: (data) => process.stdout.write(`live stdout: ${data}`),
  onStderr: (data) => process.stdout.write(`live stderr: ${data}`),
});
console.log(r.stdout === "out\n");
