#!/usr/bin/env bash
# The test command of the README: formatting and lints (so CI enforces them), then every unit
# and end-to-end test of the workspace.
# End-to-end tests start their own upstreams, gateway processes, etcd, Redis and Prometheus on
# random 127.0.0.1 ports (installing Debian's packages when missing).
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/build-deps.sh

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked "$@"
