#!/usr/bin/env bash
# Runs APISIX's conformance cases (../shared/conformance) against a freshly started ferrisix:
# data port 9080, TLS port 9443 (certificates from ssls), Admin API 9180, prometheus on
# 127.0.0.1:9091, control API on 127.0.0.1:9090, stream ports 127.0.0.1:9100, 9101, 9110 (TLS)
# and UDP 9200, embedded store in a temp dir.
# Every case folder runs unless CONFORMANCE_FOLDERS names some (e.g. "auth plugins").
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
cat > "$WORK/config.yaml" <<YAML
apisix:
  node_listen:
    - ip: 127.0.0.1
      port: 9080
  enable_control: true
  control:
    ip: 127.0.0.1
    port: 9090
  ssl:
    enable: true
    listen:
      - ip: 127.0.0.1
        port: 9443
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
$PROVIDER_YAML
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
[ -x "$BIN" ] || { echo "conformance: no gateway binary at $BIN" >&2; exit 1; }
"$BIN" -c "$WORK/config.yaml" 2>"$WORK/ferrisix.log" &
PID=$!
cleanup() {
  kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true
  [ -z "$ETCD_PID" ] || { kill "$ETCD_PID" 2>/dev/null || true; wait "$ETCD_PID" 2>/dev/null || true; }
  rm -rf "$WORK"
}
trap cleanup EXIT
for _ in $(seq 1 100); do
  (exec 3<>/dev/tcp/127.0.0.1/9180) 2>/dev/null && (exec 3<>/dev/tcp/127.0.0.1/9080) 2>/dev/null && break
  sleep 0.1
done

FOLDERS=()
for f in ${CONFORMANCE_FOLDERS:-admin dataplane tls upstream auth plugins stream}; do
  FOLDERS+=("$SHARED/conformance/cases/$f")
done
set +e
python3 "$SHARED/conformance/run.py" --admin http://127.0.0.1:9180 --key "$KEY" \
  --data http://127.0.0.1:9080 --metrics http://127.0.0.1:9091 --tls https://127.0.0.1:9443 \
  --control http://127.0.0.1:9090 "$@" "${FOLDERS[@]}" | tee "$WORK/conformance.out"
set -e
SUMMARY=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$WORK/conformance.out" | tail -1 || true)
PASSED=${SUMMARY%% passed*}
FAILED=${SUMMARY#*passed, }; FAILED=${FAILED%% failed*}
echo "conformance ($STORE store): ${PASSED:-0} of $(( ${PASSED:-0} + ${FAILED:-0} )) cases passed (minimum $MIN)"
if [ -z "$PASSED" ] || [ "$PASSED" -lt "$MIN" ]; then
  echo "conformance: pass count ${PASSED:-0} is below the recorded minimum $MIN" >&2
  tail -50 "$WORK/ferrisix.log" >&2
  exit 1
fi
