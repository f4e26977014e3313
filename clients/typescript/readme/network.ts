// readme/network.ts
import { Airlock } from "airlock-sandbox";

const al = new Airlock();
const sb = await al.createSandbox({
  network: { mode: "proxy", allow: ["pypi.org"], on_denied: "ask" },
});
try {
  console.log(await sb.network()); // the policy now (secret values left out)
  const now = await sb.updateNetwork({ allow: ["pypi.org", "files.pythonhosted.org"], deny: ["*.internal.example"] });
  console.log(now.mode === "proxy" && now.allow.join(",")); // pypi.org,files.pythonhosted.org
  for (const a of await sb.approvals({ waitMs: 100 })) {
    await sb.approve(a, a.host.endsWith(".pythonhosted.org") ? "allow_session" : "deny");
  }
} finally {
  await sb.delete();
}
