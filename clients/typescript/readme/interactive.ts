// readme/interactive.ts
import { Airlock } from "airlock-sandbox";

const al = new Airlock();
await using sb = await al.createSandbox();

// Background processes: start, follow, signal, wait.
const server = await sb.processes.start(["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"]);
const job = await sb.processes.start(["sh", "-c", "for i in 1 2 3; do echo step $i; sleep 0.1; done"]);
for await (const ev of sb.processes.stream(job.process_id)) {
  if (ev.kind === "stdout") process.stdout.write(ev.data); // step 1, step 2, step 3
  if (ev.kind === "exit") console.log("exit code", ev.process.exit_code); // exit code 0
}

// Ports: reach the sandbox's 127.0.0.1:8000 through the service.
await sb.writeFile("index.html", "<h1>hi</h1>");
const port = await sb.expose(8000); // { port, token, url, host, path }
let page = await fetch(port.url, { headers: { "X-Airlock-Port-Token": port.token } });
for (let i = 0; page.status === 502 && i < 50; i++) { // 502: not listening yet
  await new Promise((r) => setTimeout(r, 100));
  page = await fetch(port.url, { headers: { "X-Airlock-Port-Token": port.token } });
}
console.log(page.status, (await page.text()).includes("<h1>hi</h1>")); // 200 true
console.log((await sb.ports()).map((p) => p.port)); // [ 8000 ]
await sb.unexpose(8000);
await sb.processes.signal(server.process_id, "SIGTERM");
console.log((await sb.processes.wait(server.process_id, { timeoutMs: 5_000 })).state); // exited

// The code interpreter: state persists between calls; rich results.
await sb.runCode("import math\nx = 21");
const exec = await sb.runCode("print('doubling')\nx * 2", { onStdout: (t) => process.stdout.write(t) });
console.log(exec.text); // 42
const fig = await sb.runCode("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()");
console.log(fig.png?.length! > 0); // true: the PNG's bytes (a Uint8Array)
console.log((await sb.runCode("1/0")).error?.name); // ZeroDivisionError
await sb.restartCode(); // a fresh kernel

// A terminal (Node 20/21: node --experimental-websocket).
let screen = "";
const pty = await sb.pty({ rows: 24, cols: 80, onData: (d) => (screen += new TextDecoder().decode(d)) });
pty.resize(30, 100);
pty.write("stty size; exit 7\n");
console.log(await pty.wait(), screen.includes("30 100")); // { exit_code: 7, signal: null } true
