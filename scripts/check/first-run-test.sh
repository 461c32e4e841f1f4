#!/usr/bin/env bash
# The newcomer's walkthrough, checked: a fresh clone of this repository (HEAD, committed
# work only) in a temporary directory, the README's run command (./scripts/run.sh, nothing
# else), then the quick start's two curl lines as the README writes them, with the key the
# first start printed in place of <key>. Passes when they answer 201 and 200.
#
# Uses the fixed ports of the quick start (9080, 9180, 9090, 9091, 9443, 1980): run it under
# the conformance lock on a shared machine:
#   flock /tmp/ferrisix-conformance.lock scripts/check/first-run-test.sh
# FIRST_RUN_TARGET=dir reuses a cargo target directory (a release build there) instead of
# building from nothing in the clone; FIRST_RUN_KEEP=1 keeps the clone. FIRST_RUN_CHECKOUT=dir
# runs in that checkout instead of a clone (it must have no conf/ yet: the state a first start
# makes), for a machine where a release build from nothing takes too long; FIRST_RUN_WAIT is
# how long the build and start may take, in seconds (default 3600).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d /tmp/ferrisix-first-run.XXXXXX)"
clone="$work/ferrisix"
log="$work/run.log"
gw=""
had_logs=0
owns_conf=0
cleanup() {
  if [ -n "$gw" ]; then
    # run.sh leads its own process group (setsid): the build, the gateway and the upstream.
    kill -TERM -- "-$gw" 2>/dev/null || kill -TERM "$gw" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$gw" 2>/dev/null || break; sleep 0.1; done
  fi
  if [ "$owns_conf" = 1 ]; then
    rm -rf "$clone/conf"
    [ "$had_logs" = 1 ] || rm -rf "$clone/logs"
  fi
  if [ "${FIRST_RUN_KEEP:-0}" = 1 ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

if [ -n "${FIRST_RUN_CHECKOUT:-}" ]; then
  clone=$(cd "$FIRST_RUN_CHECKOUT" && pwd)
  [ ! -e "$clone/logs" ] || had_logs=1
  [ ! -e "$clone/conf" ] || { echo "$clone/conf exists: not a first run"; exit 1; }
  owns_conf=1
else
  git clone -q --no-hardlinks "$repo" "$clone"
fi
cd "$clone"
if [ -n "${FIRST_RUN_TARGET:-}" ]; then export CARGO_TARGET_DIR="$FIRST_RUN_TARGET"; fi
started=$(date +%s)
# The README's run command, as written there.
run_cmd=$(sed -n '/<!-- quick-start:run -->/,/<!-- \/quick-start:run -->/p' README.md | grep -E '^\./scripts/run\.sh' | head -1)
[ "$run_cmd" = "./scripts/run.sh" ] || { echo "README's run command is '$run_cmd'"; exit 1; }
# The log exists before the loop below reads it: the background job's own redirection may
# come after the loop's first read, and sed on a missing file fails the script.
: >"$log"
setsid ./scripts/run.sh >>"$log" 2>&1 &
gw=$!

key=""
for _ in $(seq "${FIRST_RUN_WAIT:-3600}"); do
  key=$(sed -n "s/^ferrisix: generated admin key for 'admin': \([A-Za-z0-9]*\) .*/\1/p" "$log" | head -1)
  if [ -n "$key" ] && (exec 3<>/dev/tcp/127.0.0.1/9080) 2>/dev/null; then break; fi
  kill -0 "$gw" 2>/dev/null || { echo "run.sh exited:"; tail -30 "$log"; exit 1; }
  sleep 1
done
[ -n "$key" ] || { echo "no generated key printed:"; tail -30 "$log"; exit 1; }
echo "serving $(( $(date +%s) - started )) s after the run command (build included)"
grep -E "generated admin key" "$log" | sed "s/$key/<key>/"

# The quick start's curl lines, with the printed key.
mapfile -t lines < <(sed -n '/<!-- quick-start:curl -->/,/<!-- \/quick-start:curl -->/p' README.md | grep -E '^curl ')
[ "${#lines[@]}" -ge 2 ] || { echo "README has no quick-start curl lines"; exit 1; }
codes=()
for line in "${lines[@]}"; do
  cmd="${line//<key>/$key}"
  code=$(eval "$cmd -s -o /dev/stderr -w '%{http_code}'" 2>>"$work/bodies.txt")
  echo "$line -> $code"
  codes+=("$code")
done
echo "answers: ${codes[*]}"
if [ "${codes[0]}" = 201 ] && [ "${codes[1]}" = 200 ]; then
  echo "first run: PASS"
else
  echo "first run: FAIL"; cat "$work/bodies.txt"; tail -30 "$log"; exit 1
fi
