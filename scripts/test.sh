#!/usr/bin/env bash
# The test command of the README: every unit and end-to-end test of the workspace.
# End-to-end tests start their own upstreams and gateway processes on random 127.0.0.1 ports.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked "$@"
