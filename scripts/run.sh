#!/usr/bin/env bash
# The run command of the README: builds the release binary (installing its build
# dependencies when missing) and runs it. With no arguments it serves the example
# configuration (config/config.yaml: standalone mode, routes from config/apisix.yaml);
# arguments are passed to ferrisix (e.g. `scripts/run.sh -c my/config.yaml`).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/build-deps.sh
cargo build --release --locked --bin ferrisix
if [ $# -eq 0 ]; then set -- -c config/config.yaml; fi
exec "${CARGO_TARGET_DIR:-./target}/release/ferrisix" "$@"
