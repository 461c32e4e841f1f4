#!/usr/bin/env bash
# The test command of the README: formatting and lints (so CI enforces them), then every unit
# and end-to-end test of the workspace.
# End-to-end tests start their own upstreams, gateway processes, etcd, Redis and Prometheus on
# random 127.0.0.1 ports (installing Debian's packages when missing).
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/build-deps.sh

cargo fmt --all -- --check
# cargo fmt follows `mod` items only: the plugin files listed through the `family!` macro are
# reached by no `mod` rustfmt can see, so every source file is checked by name as well.
find crates tests benches examples src -name '*.rs' 2>/dev/null | xargs rustfmt --edition 2021 --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked "$@"
