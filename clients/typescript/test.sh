#!/bin/sh
# The TypeScript SDK's tests, against the real `airlock serve` ($AIRLOCK_BIN, default
# ../../target/debug/airlock): install the pinned dev tools, build the package and the
# tests, run them with Node's own runner. Extra arguments go to `node --test` (a file's
# compiled path, or --test-name-pattern=...).
set -eu
cd "$(dirname "$0")"
# npm's cache (~/.npm) keeps the two dev packages between runs; --prefer-offline uses it.
npm ci --prefer-offline --no-audit --no-fund --loglevel=error
npm run --silent build
npm run --silent build:test
if [ "$#" -eq 0 ]; then
    set -- build/clients/typescript/test/*.test.js
fi
# Node 20 and 21: the global WebSocket (sandbox.pty()) is behind a flag; later Nodes have it.
ws=
node -e 'process.exit(typeof WebSocket === "function" ? 0 : 1)' || ws=--experimental-websocket
exec node $ws --test --test-concurrency=1 "$@"
