// readme/quickstart.ts
import { Airlock } from "airlock-sandbox";

const al = new Airlock({ url: process.env.AIRLOCK_URL ?? "http://127.0.0.1:8710" });
const r = await al.run({ code: "print(6*7)" });
console.log(r.stdout.trim(), r.exit_code, r.outcome); // 42 0 exited
