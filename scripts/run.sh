#!/usr/bin/env bash
# The run command of the README: builds the release binaries (a Rust toolchain is all the
# build needs), starts the quick start's upstream and runs the gateway.
#
# With no arguments ferrisix runs as the APISIX walkthrough expects: the embedded store (in
# conf/data/), the Admin API on :9180 with a key generated at the first start (printed once,
# saved in conf/config.yaml), the data plane on :9080. Arguments go to ferrisix instead, e.g.
# the standalone example (routes from config/apisix.yaml, no Admin API):
#   ./scripts/run.sh -c config/config.yaml
#
# The upstream is ferrisix-echo on 127.0.0.1:1980 (the address APISIX's walkthrough and test
# suite use), answering 200 with the request it got; it is started only when nothing listens
# there yet (FERRISIX_ECHO=0 leaves it out) and stopped with the gateway.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --bin ferrisix
cargo build --release --locked -p ferrisix-echo-upstream
bin="${CARGO_TARGET_DIR:-./target}/release"

echo_pid=""
if [ "${FERRISIX_ECHO:-1}" != 0 ] && ! (exec 3<>/dev/tcp/127.0.0.1/1980) 2>/dev/null; then
  "$bin/ferrisix-echo" 127.0.0.1:1980 &
  echo_pid=$!
fi
stop_echo() { if [ -n "$echo_pid" ]; then kill "$echo_pid" 2>/dev/null || true; fi; }
trap stop_echo EXIT
# Not exec'd, so that the upstream goes with it; TERM, HUP, USR1 and USR2 sent to this
# script are passed on.
"$bin/ferrisix" "$@" &
gw_pid=$!
for sig in TERM HUP USR1 USR2; do trap "kill -$sig $gw_pid 2>/dev/null || true" "$sig"; done
trap 'kill -INT $gw_pid 2>/dev/null || true' INT
status=0
while :; do
  # A trapped signal interrupts the wait; the gateway's own exit ends the loop.
  wait "$gw_pid" && status=0 || status=$?
  kill -0 "$gw_pid" 2>/dev/null || break
done
exit "$status"
