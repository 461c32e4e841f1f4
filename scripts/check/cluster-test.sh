#!/usr/bin/env bash
# Checks scripts/cluster.sh the way a new operator meets it (CI runs this):
#   1. `down` leaves alone a process that a stale pid file names (a `sleep` this check starts,
#      named by a pid file of the old pid-only form, by one whose start time is another
#      process's, and by one from another boot), and stops it when the pid file is the one
#      `up` would have written: pid files are trusted only for the processes they recorded;
#   2. `cluster.sh test` in a fresh state directory (CLUSTER_DIR) passes on its first run.
# Uses the binaries FERRISIX_BIN and ECHO_BIN when set, else builds the debug ones. Needs
# what cluster.sh needs (etcd, redis-server, wrk, curl, python3: scripts/test.sh installs them).
# Ports: CLUSTER_PORT_BASE, else a random base between 20000 and 29500 (up to +403 used).
# Takes about a minute once the binaries are built.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d /tmp/ferrisix-cluster-check.XXXXXX)
sleeper=""
cleanup() {
  if [ -n "$sleeper" ]; then kill "$sleeper" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "cluster-test: FAIL: $*" >&2; exit 1; }
start_time() { local s; s=$(cat "/proc/$1/stat"); s=${s##*) }; local f; read -ra f <<<"$s"; echo "${f[19]}"; }

echo "cluster-test: 1. stale pid files"
stale=$work/stale
mkdir -p "$stale"
sleep 300 &
sleeper=$!
boot=$(cat /proc/sys/kernel/random/boot_id)
echo "$sleeper" >"$stale/node1.pid"
echo "$sleeper $(( $(start_time "$sleeper") + 1 )) $boot" >"$stale/node2.pid"
echo "$sleeper $(start_time "$sleeper") 00000000-0000-0000-0000-000000000000" >"$stale/node3.pid"
CLUSTER_DIR=$stale scripts/cluster.sh down
kill -0 "$sleeper" 2>/dev/null || fail "down killed an unrelated process (pid $sleeper) named by a stale pid file"
[ ! -e "$stale/node1.pid" ] || fail "down left the stale pid file node1.pid"
echo "  PASS: a process named by stale pid files is left alive"
# The same process recorded as `up` records its members: now it is the cluster's, and stopped.
echo "$sleeper $(start_time "$sleeper") $boot" >"$stale/etcd1.pid"
CLUSTER_DIR=$stale scripts/cluster.sh down
for _ in $(seq 50); do kill -0 "$sleeper" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$sleeper" 2>/dev/null; then fail "down did not stop a process its pid file recorded"; fi
wait "$sleeper" 2>/dev/null || true
sleeper=""
echo "  PASS: a process recorded at launch is stopped"

echo "cluster-test: 2. scripts/cluster.sh test in a fresh directory"
if [ -z "${FERRISIX_BIN:-}" ] || [ -z "${ECHO_BIN:-}" ]; then
  cargo build --locked -p ferrisix -p ferrisix-echo-upstream --bins
  target=${CARGO_TARGET_DIR:-$PWD/target}/debug
  export FERRISIX_BIN=${FERRISIX_BIN:-$target/ferrisix} ECHO_BIN=${ECHO_BIN:-$target/ferrisix-echo}
fi
export CLUSTER_DIR=$work/cluster CLUSTER_PORT_BASE=${CLUSTER_PORT_BASE:-$((20000 + RANDOM % 20 * 500))}
# The 100 ms propagation bound is the release build's on a quiet machine; the debug binaries
# on a shared CI machine are checked for propagating at all, within a second.
export CLUSTER_PROPAGATION_MS=${CLUSTER_PROPAGATION_MS:-1000}
scripts/cluster.sh test || fail "scripts/cluster.sh test failed on its first run (status $?)"
echo "cluster-test: PASS"
