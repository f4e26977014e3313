#!/usr/bin/env bash
# Runs schemathesis (PyPI, pinned below) against a real `airlock serve` with API keys on
# 127.0.0.1 (a random port), reading the OpenAPI document the daemon serves: its
# examples, coverage, fuzzing and stateful phases, bounded in time, failing on any
# failure or error. Called by .ci/run after the Rust tests; runs as root (the daemon
# builds sandboxes). Usage: tests/schemathesis/run.sh [path/to/airlock]
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

SCHEMATHESIS_VERSION=4.32.5
# Whole run: the examples and coverage phases run to completion, fuzzing and stateful
# testing repeat until this budget is spent (100 s: about 6,000 cases; CI's whole run
# stays near 25 minutes).
MAX_TIME=${SCHEMATHESIS_MAX_TIME:-100}
AIRLOCK=$(realpath "${1:-target/debug/airlock}")
VENV=$(realpath -m "${SCHEMATHESIS_VENV:-target/schemathesis-venv}")

# Its own virtualenv: its dependencies (hypothesis, jsonschema-rs...) stay apart from the
# SDK's test requirements.
if [ ! -x "$VENV/bin/schemathesis" ] || ! "$VENV/bin/schemathesis" --version | grep -q "$SCHEMATHESIS_VERSION"; then
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q "schemathesis==$SCHEMATHESIS_VERSION"
fi

work=$(mktemp -d)
daemon=""
cleanup() {
    if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then
        kill -TERM "$daemon"
        for _ in $(seq 1 150); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$daemon" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# The service's image store, with the one image generated requests name (hooks.py maps
# every valid `image` to it): busybox, made from the host's static busybox. Its parents
# must be searchable by others (sandboxes reach image roots by path).
chmod 755 "$work"
python3 "$repo/bench/oci_layout.py" "$work/layout" --busybox --ref tools:1 --env PATH=/bin \
    --cmd sh,-c,'echo from the image' >/dev/null
"$AIRLOCK" image --image-store "$work/images" import "$work/layout" --name tools:1 2>/dev/null

key="st-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
echo "schemathesis:$key" > "$work/keys"
# Micro-VMs unavailable (their state directory would be under a regular file): see
# schemathesis.toml. Small maxima keep whatever the generated programs do short and
# small; the document the daemon serves states them, so schemathesis generates within.
: > "$work/not-a-directory"
AIRLOCK_VM_STATE="$work/not-a-directory/vm" "$AIRLOCK" serve \
    --listen 127.0.0.1:0 --api-keys "$work/keys" --pool 2 --image-store "$work/images" \
    --max-timeout 5s --max-memory 512M --max-disk 256M --max-output 1M --max-pids 256 \
    --max-cpus 1 --default-ttl 30s --max-ttl 60s --queue-timeout 2s --per-key-concurrency 256 \
    --snapshot-dir "$work/snapshots" --snapshot-budget 64M --max-fork 4 \
    >"$work/serve.out" 2>"$work/serve.log" &
daemon=$!
base=""
for _ in $(seq 1 600); do
    base=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$work/serve.out" | head -1 || true)
    [ -n "$base" ] && break
    kill -0 "$daemon" 2>/dev/null || { cat "$work/serve.log"; echo "airlock serve exited" >&2; exit 1; }
    sleep 0.1
done
[ -n "$base" ] || { echo "airlock serve did not listen" >&2; exit 1; }
echo "schemathesis $SCHEMATHESIS_VERSION against $base (budget ${MAX_TIME}s)"

status=0
# From the scratch directory: schemathesis keeps a cache of found failures (replayed on
# the next run) in the current directory; each run here starts clean.
(cd "$work" && SCHEMATHESIS_HOOKS=hooks PYTHONPATH="$repo/tests/schemathesis" "$VENV/bin/schemathesis" --config-file "$repo/tests/schemathesis/schemathesis.toml" run "$base/openapi.json" \
    -H "Authorization: Bearer $key" \
    --phases examples,coverage,fuzzing,stateful \
    --max-time "$MAX_TIME" --max-examples 50 \
    --workers 1 --request-timeout 30 \
    --generation-database none --no-color) \
    || status=$?
if [ "$status" -ne 0 ]; then
    echo "--- airlock serve log (last 40 lines) ---"
    tail -40 "$work/serve.log"
fi
exit "$status"
