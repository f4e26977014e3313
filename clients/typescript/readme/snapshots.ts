// readme/snapshots.ts
import { Airlock, Sandbox, SandboxPaused } from "airlock-sandbox";

const al = new Airlock();
{
  await using sb = await al.createSandbox({ ttlS: 600 });
  const r = await sb.exec(["bash", "-c", "echo draft > plan.txt"]); // every exec says what it changed
  for (const c of r.files_changed) console.log(c.change, c.kind, c.path, c.bytes); // created file /workspace/plan.txt 6
  await sb.writeFile("state.txt", "v1");
  const snap = await sb.snapshot(); // { snapshot_id, kind, bytes, files, ... }
  console.log(snap.kind); // filesystem ("full" on gVisor, micro-VMs)
  await sb.exec(["bash", "-c", "echo v2 > state.txt; rm plan.txt"]); // try something...
  await sb.restore(snap); // ...and go back: exactly the snapshot's files
  console.log(await sb.readText("state.txt")); // v1

  const forks = await sb.fork(3); // 3 independent copies of the session now
  console.log(await Promise.all(forks.map((f) => f.readText("state.txt")))); // [ 'v1', 'v1', 'v1' ]
  for (const f of forks) await f.delete();
  {
    await using again = await Sandbox.fromSnapshot(al, snap); // = createSandbox({ fromSnapshot: snap })
    console.log((await again.readText("plan.txt")).trim()); // draft
  }

  await sb.pause(); // frozen until resume()
  console.log((await sb.info()).status); // paused
  try {
    await sb.exec(["true"]);
  } catch (e) {
    console.log(e instanceof SandboxPaused); // true (409 "paused")
  }
  console.log((await sb.resume()).status); // running

  const { snapshots, used_bytes, budget_bytes } = await al.listSnapshots();
  console.log(snapshots.some((s) => s.snapshot_id === snap.snapshot_id), used_bytes <= budget_bytes); // true true
  await al.deleteSnapshot(snap); // getSnapshot(id) too; SnapshotNotFound once gone
}
