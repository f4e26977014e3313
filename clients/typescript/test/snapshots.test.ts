// Snapshots, restore, fork, pause and resume, and each exec's files_changed, against a real
// daemon (namespaces tier: filesystem snapshots) with a snapshot store of its own.

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import {
  Airlock,
  Conflict,
  InvalidRequest,
  Sandbox,
  SandboxNotFound,
  SandboxPaused,
  SnapshotBudgetExceeded,
  SnapshotNotFound,
  SnapshotsUnavailable,
} from "airlock-sandbox";
import { Daemon, startDaemon } from "./daemon.js";

let daemon: Daemon;
let al: Airlock;

before(async () => {
  daemon = await startDaemon();
  al = new Airlock({ url: daemon.url });
});
after(async () => {
  await daemon?.stop();
});

// Every path under /workspace and /tmp with its type and content (symlinks by target), sorted.
const TREE =
  "cd / && find workspace tmp -mindepth 1 | LC_ALL=C sort | while read -r p; do " +
  'if [ -L "$p" ]; then echo "$p -> $(readlink "$p")"; ' +
  'elif [ -d "$p" ]; then echo "$p/"; ' +
  'else echo "$p: $(cat "$p") $(stat -c %a "$p")"; fi; done';

async function tree(sb: Sandbox): Promise<string> {
  const r = await sb.exec(["bash", "-c", TREE]);
  assert.equal(r.exit_code, 0, r.stderr);
  return r.stdout;
}

/** A file, an executable, an empty directory, a symlink and a file in /tmp. */
async function prepare(sb: Sandbox): Promise<void> {
  await sb.writeFile("a.txt", "one");
  await sb.writeFile("bin/tool.sh", "#!/bin/sh\necho tool\n", { mode: 0o755 });
  const r = await sb.exec(["bash", "-c", "mkdir -p empty && ln -s a.txt link && echo scratch > /tmp/t"]);
  assert.equal(r.exit_code, 0, r.stderr);
}

const PREPARED =
  "tmp/t: scratch 644\n" +
  "workspace/a.txt: one 644\n" +
  "workspace/bin/\n" +
  "workspace/bin/tool.sh: #!/bin/sh\necho tool 755\n" +
  "workspace/empty/\n" +
  "workspace/link -> a.txt\n";

describe("snapshots", () => {
  test("snapshot, write more, restore: exactly the snapshot's files", async () => {
    await using sb = await al.createSandbox({ ttlS: 300 });
    await prepare(sb);
    assert.equal(await tree(sb), PREPARED);
    const snap = await sb.snapshot();
    assert.match(snap.snapshot_id, /^snap-[0-9a-f]{16}$/);
    assert.equal(snap.kind, "filesystem");
    assert.equal(snap.sandbox_id, sb.id);
    assert.equal(snap.isolation, "namespaces");
    assert.equal(snap.image, null);
    assert.ok(snap.files >= 3 && snap.bytes >= "one".length + "scratch\n".length, JSON.stringify(snap));
    assert.ok(Math.abs(snap.created_at - Date.now() / 1000) < 60);

    await sb.writeFile("a.txt", "changed");
    await sb.writeFile("later.txt", "written after the snapshot");
    await sb.exec(["bash", "-c", "rm bin/tool.sh && rmdir empty && rm /tmp/t && echo new > /tmp/new"]);
    assert.notEqual(await tree(sb), PREPARED);

    const info = await sb.restore(snap);
    assert.equal(info.id, sb.id);
    assert.equal(info.status, "running");
    assert.equal(await tree(sb), PREPARED);
    await sb.writeFile("again.txt", "x");
    await sb.restore(snap.snapshot_id); // by id
    assert.equal(await tree(sb), PREPARED);
  });

  test("fromSnapshot: a new session with the snapshot's files", async () => {
    await using sb = await al.createSandbox();
    await prepare(sb);
    const snap = await sb.snapshot({ kind: "filesystem" });
    await sb.writeFile("a.txt", "parent changed it later");
    {
      await using child = await Sandbox.fromSnapshot(al, snap, { ttlS: 120 });
      assert.notEqual(child.id, sb.id);
      assert.equal(await tree(child), PREPARED);
      const info = await child.info();
      assert.equal(info.from_snapshot, snap.snapshot_id);
      await child.writeFile("a.txt", "child's");
      assert.equal(await sb.readText("a.txt"), "parent changed it later");
    }
    {
      await using other = await al.createSandbox({ fromSnapshot: snap.snapshot_id });
      assert.equal(await tree(other), PREPARED);
    }
    await assert.rejects(
      al.createSandbox({ fromSnapshot: snap, isolation: "gvisor" }),
      (e: unknown) => e instanceof InvalidRequest && e.field === "isolation",
    );
  });

  test("fork 3: independent copies", async () => {
    await using sb = await al.createSandbox();
    await prepare(sb);
    const forks = await sb.fork(3, { ttlS: 120 });
    try {
      assert.equal(forks.length, 3);
      assert.equal(new Set([sb.id, ...forks.map((f) => f.id)]).size, 4);
      for (const [i, f] of forks.entries()) {
        assert.equal(await tree(f), PREPARED);
        await f.writeFile("a.txt", `fork ${i}`);
        await f.writeFile(`only-${i}.txt`, String(i));
      }
      for (const [i, f] of forks.entries()) {
        assert.equal(await f.readText("a.txt"), `fork ${i}`);
        const own = (await f.listFiles()).map((e) => e.path).filter((p) => p.startsWith("only-"));
        assert.deepEqual(own, [`only-${i}.txt`]);
      }
      assert.equal(await tree(sb), PREPARED);
    } finally {
      for (const f of forks) await f.close();
    }
    await assert.rejects(sb.fork(0), (e: unknown) => e instanceof InvalidRequest && e.field === "count");
    await assert.rejects(sb.fork(17), (e: unknown) => e instanceof InvalidRequest && e.field === "count");
  });

  test("pause: execs refused with SandboxPaused until resume", async () => {
    await using sb = await al.createSandbox();
    await sb.writeFile("a.txt", "one");
    assert.equal((await sb.pause()).status, "paused");
    assert.equal((await sb.info()).status, "paused");
    await assert.rejects(
      sb.exec(["true"]),
      (e: unknown) => e instanceof SandboxPaused && e instanceof Conflict && e.status === 409 && e.code === "paused",
    );
    await assert.rejects(sb.readFile("a.txt"), SandboxPaused);
    assert.equal((await sb.resume()).status, "running");
    const r = await sb.exec(["cat", "a.txt"]);
    assert.equal(r.stdout, "one");
  });

  test("onIdle pause: pauses itself, the next exec resumes it", async () => {
    await using sb = await al.createSandbox({ onIdle: "pause", idleTimeoutS: 1 });
    assert.equal((await sb.info()).on_idle, "pause");
    await sb.writeFile("a.txt", "kept");
    const deadline = Date.now() + 20_000;
    // the listing does not touch the session (a request to it would keep it awake)
    while ((await al.listSandboxes()).find((s) => s.id === sb.id)?.status !== "paused") {
      assert.ok(Date.now() < deadline, "not paused 20 s after its 1 s idle timeout");
      await new Promise((r) => setTimeout(r, 250));
    }
    assert.equal((await sb.exec(["cat", "a.txt"])).stdout, "kept");
    assert.equal((await sb.info()).status, "running");
  });

  test("files_changed: created, modified, deleted; filesChangedIn", async () => {
    await using sb = await al.createSandbox();
    await sb.writeFile("a.txt", "one");
    await sb.writeFile("gone.txt", "bye");
    await sb.writeFile("old-name.txt", "moved");
    const r = await sb.exec([
      "bash",
      "-c",
      "echo hello > new.txt && echo more >> a.txt && rm gone.txt && mkdir dir " +
        "&& mv old-name.txt new-name.txt && ln -s a.txt sym && echo t > /tmp/t",
    ]);
    assert.equal(r.exit_code, 0, r.stderr);
    assert.deepEqual(r.files_changed, [
      { path: "/workspace/a.txt", change: "modified", kind: "file", bytes: 8 },
      { path: "/workspace/dir", change: "created", kind: "dir", bytes: 0 },
      { path: "/workspace/gone.txt", change: "deleted", kind: "file", bytes: 3 },
      { path: "/workspace/new-name.txt", change: "created", kind: "file", bytes: 5 },
      { path: "/workspace/new.txt", change: "created", kind: "file", bytes: 6 },
      { path: "/workspace/old-name.txt", change: "deleted", kind: "file", bytes: 5 },
      { path: "/workspace/sym", change: "created", kind: "symlink", bytes: 5 },
    ]);
    assert.equal(r.files_changed_truncated, false);
    assert.deepEqual((await sb.exec(["cat", "a.txt"])).files_changed, []);
    const both = await sb.exec(["bash", "-c", "echo x > /tmp/v && echo y > w.txt"], {
      filesChangedIn: ["/workspace", "/tmp"],
    });
    assert.deepEqual(
      both.files_changed.map((c) => [c.path, c.change]),
      [
        ["/tmp/v", "created"],
        ["/workspace/w.txt", "created"],
      ],
    );
    const none = await sb.exec(["bash", "-c", "echo y > w2.txt"], { filesChangedIn: [] });
    assert.deepEqual(none.files_changed, []);
    await assert.rejects(
      sb.exec(["true"], { filesChangedIn: ["/etc"] }),
      (e: unknown) => e instanceof InvalidRequest && e.field === "files_changed_in[0]",
    );
    const oneShot = await al.run({ cmd: ["bash", "-c", "echo out > made.txt"] });
    assert.deepEqual(
      oneShot.files_changed.map((c) => [c.path, c.change, c.kind]),
      [["/workspace/made.txt", "created", "file"]],
    );
  });

  test("list, get, delete; unknown snapshot: SnapshotNotFound", async () => {
    await using sb = await al.createSandbox();
    await sb.writeFile("a.txt", "one");
    const snap = await sb.snapshot();
    const listed = await al.listSnapshots();
    assert.ok(listed.snapshots.some((s) => s.snapshot_id === snap.snapshot_id));
    assert.ok(listed.budget_bytes > 0 && listed.used_bytes > 0 && listed.used_bytes <= listed.budget_bytes);
    assert.deepEqual(await al.getSnapshot(snap.snapshot_id), snap);
    assert.deepEqual(await al.getSnapshot(snap), snap);
    await al.deleteSnapshot(snap);
    assert.ok(!(await al.listSnapshots()).snapshots.some((s) => s.snapshot_id === snap.snapshot_id));
    await assert.rejects(al.getSnapshot(snap), SnapshotNotFound);
    await assert.rejects(al.deleteSnapshot(snap.snapshot_id), SnapshotNotFound);
    await assert.rejects(sb.restore(snap), SnapshotNotFound);
    const unknown = "snap-0123456789abcdef";
    await assert.rejects(al.getSnapshot(unknown), (e: unknown) => e instanceof SnapshotNotFound && e.status === 404);
    await assert.rejects(al.createSandbox({ fromSnapshot: unknown }), SnapshotNotFound);
    // a 404 naming the sandbox stays SandboxNotFound
    const keep = await sb.snapshot();
    try {
      const gone = new Sandbox(al.transport, "0123456789abcdef", null, null);
      await assert.rejects(gone.restore(keep), SandboxNotFound);
    } finally {
      await al.deleteSnapshot(keep);
    }
    assert.equal((await sb.exec(["cat", "a.txt"])).stdout, "one");
  });

  test("kind full where the tier cannot: 400 on kind", async () => {
    await using sb = await al.createSandbox();
    await assert.rejects(sb.snapshot({ kind: "full" }), (e: unknown) => e instanceof InvalidRequest && e.field === "kind");
  });
});

describe("snapshot budget", () => {
  let small: Daemon;
  before(async () => {
    small = await startDaemon(["--pool", "1", "--snapshot-budget", "64K"]);
  });
  after(async () => {
    await small?.stop();
  });

  test("a snapshot over the budget: SnapshotBudgetExceeded, nothing kept", async () => {
    const c = new Airlock({ url: small.url });
    await using sb = await c.createSandbox();
    await sb.writeFile("small.txt", "fits");
    const kept = await sb.snapshot();
    await sb.exec(["bash", "-c", "head -c 1048576 /dev/urandom > big.bin"]);
    await assert.rejects(
      sb.snapshot(),
      (e: unknown) => e instanceof SnapshotBudgetExceeded && e.status === 507 && e.code === "snapshot_budget",
    );
    const listed = await c.listSnapshots();
    assert.deepEqual(
      listed.snapshots.map((s) => s.snapshot_id),
      [kept.snapshot_id],
    );
    assert.equal(listed.budget_bytes, 64 * 1024);
    await c.deleteSnapshot(kept);
    assert.equal((await c.listSnapshots()).used_bytes, 0);
  });
});

describe("a store in use by another daemon", () => {
  test("the second daemon serves everything but snapshots: SnapshotsUnavailable, not retried", async () => {
    const store = mkdtempSync(join(tmpdir(), "airlock-ts-test-store-"));
    const first = await startDaemon(["--pool", "0", "--snapshot-dir", store]);
    try {
      const second = await startDaemon(["--pool", "0", "--snapshot-dir", store]);
      try {
        const c = new Airlock({ url: second.url });
        const t0 = Date.now();
        await assert.rejects(
          c.listSnapshots(),
          (e: unknown) => e instanceof SnapshotsUnavailable && e.status === 503 && e.code === "snapshots_unavailable",
        );
        assert.ok(Date.now() - t0 < 5000, "retried");
        assert.equal(await c.health(), true);
      } finally {
        await second.stop();
      }
      assert.deepEqual((await new Airlock({ url: first.url }).listSnapshots()).snapshots, []);
    } finally {
      await first.stop();
      rmSync(store, { recursive: true, force: true });
    }
  });
});
