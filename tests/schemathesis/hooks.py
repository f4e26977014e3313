"""schemathesis hooks for tests/schemathesis/run.sh (loaded through SCHEMATHESIS_HOOKS).

Two rules of a request that a schema cannot state, each answered with a 400 naming the
field; bodies that break them are dropped from generation, everything else is left as
generated, in every mode (but for `image`, below):

- in `files`, no entry's path may be a directory of another's (`{"path": "d/f"}` and
  `{"path": "d"}`: `d` cannot be both), refused on `files[i].path`
  (crates/airlock/tests/conformance.rs tests it);
- with `"isolation": "gvisor"`, `limits.memory_bytes` is at least 40 MiB (the cap covers
  the Sentry and Gofer too), refused on `limits.memory_bytes`; the schema's minimum is
  the other tiers' (crates/airlock-gvisor's tests check the refusal).

- a one-shot exec (`POST /v1/exec`) may not ask about denied connections
  (`"network": {"on_denied": "ask"}`): nobody could answer; refused on
  `network.on_denied` (crates/airlock-server's tests check it).

- a proxy policy's `secrets` have distinct names, none of them a variable airlock sets
  itself (PATH, HOME, HTTP_PROXY, SSL_CERT_FILE, ..., compared ignoring case) or one the
  request's `env` sets too; a value never contains the placeholder prefix `airlock-ph-`;
  refused on `network.secrets[i].name` / `.value`. Every phase generates such bodies
  (the coverage phase repeats an item to test arrays), so at the call their names are
  made distinct (`S<i>_NAME`, still schema-valid) rather than the bodies dropped.

Waiting is bounded here, not by the schema: `GET .../approvals?wait_ms=N` may wait up to
a minute for a held connection, and `POST .../processes/{process_id}/wait` up to a minute
for a process, more than a request of this run may take; both are cut to 100 ms (what is
tested is the answer, not the waiting).

And facts no schema states: which directories exist in a sandbox (a schema-valid
`workdir` becomes `/tmp`; a missing one is refused with 400 on `workdir`, tested by
crates/airlock-sandbox's tests), and which images the service's store holds. A generated
`image` that the schema allows (1 to 512 printable ASCII characters, no spaces) is
replaced by the one image run.sh put in the store, `tools:1`; an
image the schema refuses is left as generated, for the server to refuse (400 on `image`).
An image the store lacks is refused the same way (crates/airlock/tests/images.rs tests it).
"""

GVISOR_MIN_MEMORY = 40 << 20
STORED_IMAGE = "tools:1"

import re

import schemathesis

_IMAGE = re.compile(r"^[!-~]{1,512}$")


def _conflicting(files) -> bool:
    if not isinstance(files, list):
        return False
    paths = [f["path"] for f in files if isinstance(f, dict) and isinstance(f.get("path"), str)]
    dirs = set()
    for p in paths:
        parts = p.split("/")
        for i in range(1, len(parts)):
            dirs.add("/".join(parts[:i]))
    return any(p in dirs for p in paths)


def _gvisor_under_its_floor(body) -> bool:
    if body.get("isolation") != "gvisor":
        return False
    limits = body.get("limits")
    memory = limits.get("memory_bytes") if isinstance(limits, dict) else None
    return isinstance(memory, (int, float)) and not isinstance(memory, bool) and memory < GVISOR_MIN_MEMORY


RESERVED_SECRET_NAMES = {
    "http_proxy", "https_proxy", "all_proxy", "no_proxy", "ssl_cert_file", "ssl_cert_dir",
    "requests_ca_bundle", "curl_ca_bundle", "node_extra_ca_certs", "path", "home",
    "ld_preload", "ld_library_path",
}


def _bad_secrets(body) -> bool:
    network = body.get("network")
    if not isinstance(network, dict) or not isinstance(network.get("secrets"), list):
        return False
    env = body.get("env") if isinstance(body.get("env"), dict) else {}
    names = []
    for s in network["secrets"]:
        if not isinstance(s, dict):
            continue
        name, value = s.get("name"), s.get("value")
        if isinstance(name, str):
            if name.lower() in RESERVED_SECRET_NAMES or name in env or name in names:
                return True
            names.append(name)
        if isinstance(value, str) and "airlock-ph-" in value.lower():
            return True
    return False


def _distinct_secret_names(body) -> None:
    """Renames secrets whose name repeats an earlier one, is airlock's own or is in `env`."""
    network = body.get("network")
    if not isinstance(network, dict) or not isinstance(network.get("secrets"), list):
        return
    env = body.get("env") if isinstance(body.get("env"), dict) else {}
    seen = set()
    for i, s in enumerate(network["secrets"]):
        if not isinstance(s, dict) or not isinstance(s.get("name"), str) or not _NAME.match(s["name"]):
            continue
        name = s["name"]
        if name.lower() in RESERVED_SECRET_NAMES or name in env or name in seen:
            name = f"S{i}_{name}"[:128]
            s["name"] = name
        seen.add(name)


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def _one_shot_asks(context, body) -> bool:
    operation = getattr(context, "operation", None)
    if getattr(operation, "path", None) != "/v1/exec":
        return False
    network = body.get("network")
    return isinstance(network, dict) and network.get("on_denied") == "ask"


@schemathesis.hook
def filter_body(context, body) -> bool:
    return not (
        isinstance(body, dict)
        and (
            _conflicting(body.get("files"))
            or _gvisor_under_its_floor(body)
            or _one_shot_asks(context, body)
            or _bad_secrets(body)
        )
    )


@schemathesis.hook
def before_call(context, case, **kwargs):
    # At the call, so every phase's requests get it (the examples' included).
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("image"), str) and _IMAGE.match(body["image"]):
        case.body = {**body, "image": STORED_IMAGE}
    # Which directories exist in a sandbox no schema states: a schema-valid workdir (an
    # absolute path) becomes one that does; others stay, for the server to refuse.
    if isinstance(case.body, dict) and isinstance(case.body.get("workdir"), str) and case.body["workdir"].startswith("/") and "\x00" not in case.body["workdir"]:
        case.body = {**case.body, "workdir": "/tmp"}
    if isinstance(body, dict):
        _distinct_secret_names(case.body)
        # Every phase generates it (filter_body does not reach the coverage phase): a
        # one-shot exec that would ask is made one that refuses.
        if _one_shot_asks(case, body):
            case.body["network"]["on_denied"] = "deny"
    # A generated snapshot id names no snapshot: the create would be a 404 and the
    # stateful phase would get no sessions (crates/airlock/tests/snapshots.rs tests it).
    if isinstance(case.body, dict) and case.path == "/v1/sandboxes" and "from_snapshot" in case.body:
        case.body = {k: v for k, v in case.body.items() if k != "from_snapshot"}
    # A process wait may last a minute; cut to 100 ms (the answer is tested, not the wait).
    if (
        isinstance(case.body, dict)
        and case.path.endswith("/wait")
        and isinstance(case.body.get("timeout_ms"), int)
        and not isinstance(case.body.get("timeout_ms"), bool)
        and case.body["timeout_ms"] > 100
    ):
        case.body = {**case.body, "timeout_ms": 100}
    query = case.query
    if isinstance(query, dict) and "wait_ms" in query:
        wait = query["wait_ms"]
        if isinstance(wait, str) and wait.isdigit():
            case.query = {**query, "wait_ms": str(min(int(wait), 100))}
        elif isinstance(wait, int) and not isinstance(wait, bool):
            case.query = {**query, "wait_ms": min(wait, 100)}
