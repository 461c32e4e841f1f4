#!/usr/bin/env bash
# Runs APISIX's conformance cases (../shared/conformance) against a freshly started ferrisix:
# data port 9080, TLS port 9443 (certificates from ssls), Admin API 9180, prometheus on
# 127.0.0.1:9091, control API on 127.0.0.1:9090, stream ports 127.0.0.1:9100, 9101, 9110 (TLS)
# and UDP 9200, embedded store in a temp dir.
# Every case folder runs unless CONFORMANCE_FOLDERS names some (e.g. "auth plugins").
# The standalone-api folder runs on its own gateway, started afterwards in APISIX's API-driven
# standalone mode (config_provider: yaml, status API on 127.0.0.1:7085) and stopped after it:
# its cases pass once per gateway start. The pass count is the total of both runs.
# Usage: scripts/conformance.sh [--min N] [--etcd] [run.py args...]
#   --etcd  use a real etcd (Debian's etcd-server, installed when missing, started on random
#           ports with a temporary data dir) instead of the embedded store
# Exits non-zero when fewer than N cases pass (N defaults to .ci/conformance-min).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SHARED=${FERRISIX_SHARED:-$ROOT/../shared}
[ -f "$SHARED/conformance/run.py" ] || { echo "conformance: $SHARED/conformance not found; skipped"; exit 0; }

MIN=$(cat .ci/conformance-min 2>/dev/null || echo 0)
if [ "${1:-}" = "--min" ]; then MIN=$2; shift 2; fi
STORE=embedded
if [ "${1:-}" = "--etcd" ]; then STORE=etcd; shift; fi

BIN=${FERRISIX_BIN:-}
if [ -z "$BIN" ]; then
  cargo build --release --locked --bin ferrisix
  BIN=${CARGO_TARGET_DIR:-./target}/release/ferrisix
fi
WORK=$(mktemp -d)
KEY=conformance-admin-key
ETCD_PID=
PROVIDER_YAML="  role_traditional:
    config_provider: embedded"
if [ "$STORE" = etcd ]; then
  if ! command -v etcd >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null
  fi
  port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
  CP=$(port); PP=$(port)
  etcd --data-dir "$WORK/etcd" --listen-client-urls "http://127.0.0.1:$CP" --advertise-client-urls "http://127.0.0.1:$CP" \
       --listen-peer-urls "http://127.0.0.1:$PP" --initial-advertise-peer-urls "http://127.0.0.1:$PP" \
       --initial-cluster "default=http://127.0.0.1:$PP" >"$WORK/etcd.log" 2>&1 &
  ETCD_PID=$!
  for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/$CP) 2>/dev/null && break; sleep 0.1; done
  PROVIDER_YAML="  role_traditional:
    config_provider: etcd
  etcd:
    host:
      - http://127.0.0.1:$CP"
fi
# write_config FILE PROVIDER_YAML STATUS_YAML: the gateway's config.yaml.
write_config() {
  cat > "$1" <<YAML
apisix:
  node_listen:
    - ip: 127.0.0.1
      port: 9080
  enable_control: true
  control:
    ip: 127.0.0.1
    port: 9090
$3
  ssl:
    enable: true
    listen:
      - ip: 127.0.0.1
        port: 9443
  # APISIX's default zones (the transform cases name them), the disk one in the run's own
  # directory so that a run starts with nothing stored.
  proxy_cache:
    cache_ttl: 10s
    zones:
      - name: disk_cache_one
        memory_size: 50m
        disk_size: 1G
        disk_path: $WORK/disk_cache_one
        cache_levels: "1:2"
      - name: memory_cache
        memory_size: 50m
  # The stream cases' listeners (the runner's --stream, --stream2, --stream-tls, --stream-udp).
  proxy_mode: http&stream
  stream_proxy:
    tcp:
      - addr: "127.0.0.1:9100"
      - addr: "127.0.0.1:9101"
      - addr: "127.0.0.1:9110"
        tls: true
    udp:
      - "127.0.0.1:9200"
stream_plugins:
  - ip-restriction
  - limit-conn
  - mqtt-proxy
  - traffic-split
  - prometheus
  - syslog
deployment:
  role: traditional
$2
  admin:
    admin_listen:
      ip: 127.0.0.1
      port: 9180
    admin_key:
      - name: admin
        key: $KEY
        role: admin
nginx_config:
  worker_processes: 1
  http:
    access_log: $WORK/access.log
plugin_attr:
  prometheus:
    export_addr:
      ip: 127.0.0.1
      port: 9091
    refresh_interval: 0.1
ferrisix:
  data_dir: $WORK/data
YAML
}
[ -x "$BIN" ] || { echo "conformance: no gateway binary at $BIN" >&2; exit 1; }
PID=
LOG=$WORK/ferrisix.log
# start_gateway CONFIG LOG: starts the gateway and waits for its Admin API and data port.
start_gateway() {
  LOG=$2
  "$BIN" -c "$1" 2>"$LOG" &
  PID=$!
  for _ in $(seq 1 100); do
    (exec 3<>/dev/tcp/127.0.0.1/9180) 2>/dev/null && (exec 3<>/dev/tcp/127.0.0.1/9080) 2>/dev/null && break
    sleep 0.1
  done
}
stop_gateway() {
  [ -z "$PID" ] || { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; }
  PID=
}
cleanup() {
  stop_gateway
  [ -z "$ETCD_PID" ] || { kill "$ETCD_PID" 2>/dev/null || true; wait "$ETCD_PID" 2>/dev/null || true; }
  rm -rf "$WORK"
}
trap cleanup EXIT

FOLDERS=()
STANDALONE=
for f in ${CONFORMANCE_FOLDERS:-admin dataplane tls upstream auth plugins ai transform access stream standalone-api}; do
  if [ "$f" = standalone-api ]; then
    STANDALONE="$SHARED/conformance/cases/$f"
  else
    FOLDERS+=("$SHARED/conformance/cases/$f")
  fi
done
# passed_failed FILE: "PASSED FAILED" from a run's summary line (0 0 when there is none).
passed_failed() {
  local summary passed failed
  summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$1" | tail -1 || true)
  [ -n "$summary" ] || { echo "0 0"; return; }
  passed=${summary%% passed*}
  failed=${summary#*passed, }; failed=${failed%% failed*}
  echo "$passed $failed"
}
PASSED=0
FAILED=0
SUMMARIES=0
set +e
if [ ${#FOLDERS[@]} -gt 0 ]; then
  write_config "$WORK/config.yaml" "$PROVIDER_YAML" ""
  start_gateway "$WORK/config.yaml" "$WORK/ferrisix.log"
  python3 "$SHARED/conformance/run.py" --admin http://127.0.0.1:9180 --key "$KEY" \
    --data http://127.0.0.1:9080 --metrics http://127.0.0.1:9091 --tls https://127.0.0.1:9443 \
    --control http://127.0.0.1:9090 "$@" "${FOLDERS[@]}" | tee "$WORK/conformance.out"
  read -r p f < <(passed_failed "$WORK/conformance.out")
  PASSED=$((PASSED + p)); FAILED=$((FAILED + f))
  grep -qE '^[0-9]+ passed, [0-9]+ failed' "$WORK/conformance.out" && SUMMARIES=$((SUMMARIES + 1))
  stop_gateway
fi
if [ -n "$STANDALONE" ] && [ -d "$STANDALONE" ]; then
  # A gateway of its own, started afresh: the cases' explicit conf_versions hold for its life.
  write_config "$WORK/standalone.yaml" "  role_traditional:
    config_provider: yaml" "  status:
    ip: 127.0.0.1
    port: 7085"
  start_gateway "$WORK/standalone.yaml" "$WORK/ferrisix-standalone.log"
  python3 "$SHARED/conformance/run.py" --admin http://127.0.0.1:9180 --key "$KEY" \
    --data http://127.0.0.1:9080 --metrics http://127.0.0.1:9091 --tls https://127.0.0.1:9443 \
    --control http://127.0.0.1:7085 "$@" "$STANDALONE" | tee "$WORK/conformance-standalone.out"
  read -r p f < <(passed_failed "$WORK/conformance-standalone.out")
  PASSED=$((PASSED + p)); FAILED=$((FAILED + f))
  grep -qE '^[0-9]+ passed, [0-9]+ failed' "$WORK/conformance-standalone.out" && SUMMARIES=$((SUMMARIES + 1))
  stop_gateway
fi
set -e
echo "conformance ($STORE store, standalone-api on its own gateway): $PASSED of $(( PASSED + FAILED )) cases passed (minimum $MIN)"
if [ "$SUMMARIES" -eq 0 ] || [ "$PASSED" -lt "$MIN" ]; then
  echo "conformance: pass count $PASSED is below the recorded minimum $MIN" >&2
  tail -50 "$LOG" >&2
  exit 1
fi
