// readme/sessions.ts
import { Airlock, FileNotFound } from "airlock-sandbox";

const al = new Airlock();
{
  await using sb = await al.createSandbox({ ttlS: 600, timeoutMs: 10_000 }); // deleted at the block's end
  await sb.writeFile("data.csv", "a,b\n1,2\n");
  await sb.writeFile("tool.sh", "#!/bin/sh\necho tool\n", { mode: 0o755 });
  const r = await sb.exec(["wc", "-l", "data.csv"]); // in /workspace; files persist between execs
  console.log(r.stdout.trim()); // 2 data.csv
  await sb.run({ code: "open('out.txt', 'w').write('made')" });
  console.log(await sb.readText("out.txt")); // made (readFile gives a Uint8Array)
  console.log((await sb.listFiles()).map((f) => f.path).join(" ")); // data.csv out.txt tool.sh
  try {
    await sb.readFile("missing.txt");
  } catch (e) {
    console.log(e instanceof FileNotFound); // true
  }
  console.log((await sb.network()).mode); // none
}
