"""schemathesis hooks for tests/schemathesis/run.sh (loaded through SCHEMATHESIS_HOOKS).

Two rules of a request that a schema cannot state, each answered with a 400 naming the
field; bodies that break them are dropped from generation, everything else is left as
generated, in every mode:

- in `files`, no entry's path may be a directory of another's (`{"path": "d/f"}` and
  `{"path": "d"}`: `d` cannot be both), refused on `files[i].path`
  (crates/airlock/tests/conformance.rs tests it);
- with `"isolation": "gvisor"`, `limits.memory_bytes` is at least 40 MiB (the cap covers
  the Sentry and Gofer too), refused on `limits.memory_bytes`; the schema's minimum is
  the other tiers' (crates/airlock-gvisor's tests check the refusal).
"""

GVISOR_MIN_MEMORY = 40 << 20

import schemathesis


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


@schemathesis.hook
def filter_body(context, body) -> bool:
    return not (isinstance(body, dict) and (_conflicting(body.get("files")) or _gvisor_under_its_floor(body)))
