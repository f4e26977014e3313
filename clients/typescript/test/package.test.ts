// The package as a user gets it: `npm pack`, installed into a fresh project, type-checked
// by tsc through its "exports" and "types", and run against a real daemon.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { Daemon, PKG, startDaemon } from "./daemon.js";

let daemon: Daemon;
let dir: string;
before(async () => {
  daemon = await startDaemon();
  dir = mkdtempSync(join(tmpdir(), "airlock-ts-consumer-"));
});
after(async () => {
  await daemon?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const CONSUMER = `import { Airlock, InvalidRequest, isOk, type ExecResult } from "airlock-sandbox";

const al = new Airlock({ url: process.argv[2]! });
const r: ExecResult = await al.run({ cmd: ["echo", "from a consumer"] });
let field: string | null = null;
try {
  await al.run({ cmd: [] });
} catch (e) {
  if (e instanceof InvalidRequest) field = e.field;
}
console.log(isOk(r), r.stdout.trim(), field);
`;

test("packed, installed, type-checked and run by a consumer project", () => {
  const npm = (args: string[], cwd: string) =>
    execFileSync("npm", [...args, "--no-audit", "--no-fund", "--loglevel=error"], { cwd, encoding: "utf8" });
  const packed = JSON.parse(npm(["pack", "--json", "--ignore-scripts", "--pack-destination", dir], PKG)) as { filename: string; files: { path: string }[] }[];
  const files = packed[0]!.files.map((f) => f.path).sort();
  assert.ok(files.includes("dist/index.js") && files.includes("dist/index.d.ts"), files.join(" "));
  assert.ok(!files.some((f) => f.startsWith("src/") || f.startsWith("test/") || f.startsWith("build/")), files.join(" "));
  const app = join(dir, "app");
  execFileSync("mkdir", ["-p", app]);
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "consumer", private: true, type: "module" }));
  npm(["install", "--offline", join(dir, packed[0]!.filename)], app);
  const manifest = JSON.parse(readFileSync(join(app, "node_modules/airlock-sandbox/package.json"), "utf8"));
  assert.equal(manifest.dependencies, undefined, "no runtime dependencies");
  writeFileSync(join(app, "main.ts"), CONSUMER);
  // @types/node only for the consumer's own process.argv; the SDK's types need none.
  execFileSync(
    process.execPath,
    [
      join(PKG, "node_modules/typescript/bin/tsc"),
      "--strict", "--target", "es2022", "--module", "nodenext", "--moduleResolution", "nodenext",
      "--lib", "es2022,dom", "--types", "node", "--typeRoots", join(PKG, "node_modules/@types"), "main.ts",
    ],
    { cwd: app, encoding: "utf8" },
  );
  const out = execFileSync(process.execPath, ["main.js", daemon.url], { cwd: app, encoding: "utf8" });
  assert.equal(out, "true from a consumer cmd\n");
});
