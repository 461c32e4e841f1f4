#!/usr/bin/env bash
# Builds the proxy-wasm test modules from source (tests/e2e/wasm.rs runs it before its tests):
# AssemblyScript with the @solo-io/proxy-runtime SDK, both pinned in package.json and
# installed by scripts/test.sh into node_modules/ here. A module is rebuilt when its source or
# the shared JSON reader is newer than it. Output: build/<name>.wasm.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x node_modules/.bin/asc ]; then
  echo "tests/wasm: AssemblyScript is not installed; run: (cd tests/wasm && npm ci)" >&2
  exit 1
fi
mkdir -p build
for src in src/*.ts; do
  name=$(basename "$src" .ts)
  [ "$name" = json ] || [ "$name" = conf ] && continue
  out="build/$name.wasm"
  if [ -f "$out" ] && [ "$out" -nt "$src" ] && [ "$out" -nt src/json.ts ]; then
    continue
  fi
  node_modules/.bin/asc "$src" -b "$out.tmp" --use abort=abort_proc_exit -O2 --noAssert >/dev/null
  mv "$out.tmp" "$out"
done
