"""schemathesis hooks for tests/schemathesis/run.sh (loaded through SCHEMATHESIS_HOOKS).

One rule of an exec request that a schema cannot state: in `files`, no entry's path may be
a directory of another's (`{"path": "d/f"}` and `{"path": "d"}`: `d` cannot be both), which
the API refuses with a 400 on `files[i].path` (crates/airlock/tests/conformance.rs tests
it). Bodies that break it are dropped from generation; everything else is left as
generated, in every mode.
"""

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


@schemathesis.hook
def filter_body(context, body) -> bool:
    return not (isinstance(body, dict) and _conflicting(body.get("files")))
