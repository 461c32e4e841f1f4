#!/usr/bin/env bash
# Soak (CI runs it for one minute, .ci/run): one ferrisix node on etcd with a limit-count (policy redis) route under
# wrk -c 256 for SOAK_MINUTES (default 30), while routes churn (a PUT or DELETE every
# SOAK_CHURN_MS, default 500), etcd is restarted once (at a third of the run) and Redis
# several times (at each sixth). Prints a markdown table, one row per minute: requests,
# requests/s, non-2xx answers, socket errors, p99 latency, the gateway's RSS, and what
# happened in that minute. The route allows degradation (allow_degradation: true), as an
# operator running a counter in Redis would configure it, so a Redis restart shows as its
# effect on latency rather than as errors; set SOAK_DEGRADE=false to count them as errors.
#
# Needs etcd, redis-server, wrk, curl; FERRISIX_BIN (default target/release/ferrisix) and
# ECHO_BIN (default target/release/ferrisix-echo). Ports from SOAK_PORT_BASE (default 25000).
# Output: stdout, and $SOAK_DIR/soak.md (default /tmp/ferrisix-soak).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
minutes=${SOAK_MINUTES:-30}
conns=${SOAK_CONNS:-256}
threads=${SOAK_THREADS:-2}
churn_ms=${SOAK_CHURN_MS:-500}
degrade=${SOAK_DEGRADE:-true}
dir=${SOAK_DIR:-/tmp/ferrisix-soak}
base=${SOAK_PORT_BASE:-25000}
bin=${FERRISIX_BIN:-$root/target/release/ferrisix}
echo_bin=${ECHO_BIN:-$root/target/release/ferrisix-echo}
etcd_port=$((base + 1)); etcd_peer=$((base + 2)); redis_port=$((base + 3)); echo_port=$((base + 4))
data=$((base + 10)); admin=$((base + 11)); control=$((base + 12)); metrics=$((base + 13))
key=soak-admin-key-0123456789abcdef

rm -rf "$dir"; mkdir -p "$dir"
pids=()
cleanup() {
  [ -n "${churn_pid:-}" ] && kill "$churn_pid" 2>/dev/null || true
  for f in "$dir"/*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
}
trap cleanup EXIT
start_bg() { local name=$1; shift; "$@" >>"$dir/$name.log" 2>&1 & echo $! >"$dir/$name.pid"; }
stop_bg() { local f="$dir/$1.pid"; [ -f "$f" ] || return 0; kill "$(cat "$f")" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$(cat "$f")" 2>/dev/null || break; sleep 0.1; done; rm -f "$f"; }
wait_port() { for _ in $(seq 300); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "nothing on $1" >&2; exit 1; }

start_etcd() { start_bg etcd etcd --name soak --data-dir "$dir/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
  --advertise-client-urls "http://127.0.0.1:$etcd_port" --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" --initial-cluster "soak=http://127.0.0.1:$etcd_peer"; wait_port "$etcd_port"; }
start_redis() { start_bg redis redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no; wait_port "$redis_port"; }

start_etcd; start_redis
start_bg echo "$echo_bin" "127.0.0.1:$echo_port"; wait_port "$echo_port"
cat >"$dir/config.yaml" <<EOF
apisix:
  node_listen:
    - ip: 127.0.0.1
      port: $data
  control:
    ip: 127.0.0.1
    port: $control
  ssl:
    enable: false
deployment:
  role: traditional
  role_traditional:
    config_provider: etcd
  etcd:
    host:
      - "http://127.0.0.1:$etcd_port"
    prefix: /apisix
    timeout: 5
  admin:
    admin_listen:
      ip: 127.0.0.1
      port: $admin
    admin_key:
      - name: admin
        key: $key
        role: admin
plugin_attr:
  prometheus:
    export_addr:
      ip: 127.0.0.1
      port: $metrics
nginx_config:
  worker_processes: ${SOAK_WORKERS:-1}
  http:
    access_log: "off"
ferrisix:
  data_dir: $dir/data
EOF
RUST_LOG=${RUST_LOG:-warn} start_bg ferrisix "$bin" -c "$dir/config.yaml"
wait_port "$admin"; wait_port "$data"
gw=$(cat "$dir/ferrisix.pid")

put() { curl -s -o /dev/null -w '%{http_code}' -X PUT "http://127.0.0.1:$admin/apisix/admin/routes/$1" -H "X-API-KEY: $key" -d "$2"; }
up="{\"type\": \"roundrobin\", \"nodes\": {\"127.0.0.1:$echo_port\": 1}}"
code=$(put soak "{\"uri\": \"/soak\", \"plugins\": {\"limit-count\": {\"count\": 1000000000, \"time_window\": 3600, \"key\": \"remote_addr\", \"policy\": \"redis\", \"redis_host\": \"127.0.0.1\", \"redis_port\": $redis_port, \"redis_timeout\": 200, \"allow_degradation\": $degrade}}, \"upstream\": $up}")
[ "$code" = 201 ] || { echo "PUT /soak answered $code" >&2; exit 1; }
for _ in $(seq 100); do [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$data/soak")" = 200 ] && break; sleep 0.1; done

# Route churn: 200 route ids, PUT (new uri each time) or DELETE, in the background.
(
  i=0
  while :; do
    id=$((RANDOM % 200)); i=$((i + 1))
    if [ $((RANDOM % 3)) = 0 ]; then
      curl -s -o /dev/null -X DELETE "http://127.0.0.1:$admin/apisix/admin/routes/churn-$id" -H "X-API-KEY: $key" || true
    else
      put "churn-$id" "{\"uri\": \"/churn/$id/$i\", \"upstream\": $up}" >/dev/null || true
    fi
    sleep "$(awk -v ms="$churn_ms" 'BEGIN { printf "%.3f", ms / 1000 }')"
  done
) &
churn_pid=$!

rss_mib() { awk '/^VmRSS:/ { printf "%.1f", $2 / 1024 }' "/proc/$gw/status" 2>/dev/null || echo "?"; }
to_ms() { # wrk latency (e.g. 1.23ms, 456.00us, 1.02s) in ms
  awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n = n; else if (v ~ /s$/) n *= 1000; printf "%.2f", n }'
}

out="$dir/soak.md"
{
  echo "| minute | requests | req/s | non-2xx | socket errors | p99 (ms) | RSS (MiB) | event |"
  echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
} | tee "$out"
rss0=$(rss_mib)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
etcd_at=$(( minutes / 3 )); [ "$etcd_at" -ge 1 ] || etcd_at=1
total_req=0; total_err=0
for m in $(seq 1 "$minutes"); do
  event=""
  # Events happen 20 s into their minute, while wrk runs.
  if [ "$m" = "$etcd_at" ]; then
    ( sleep 20; stop_bg etcd; sleep 5; start_etcd ) >/dev/null 2>&1 &
    event="etcd stopped for 5 s, restarted"
  elif [ $(( m % (minutes / 6 > 0 ? minutes / 6 : 1) )) = 0 ] && [ "$m" != "$minutes" ]; then
    ( sleep 20; stop_bg redis; sleep 2; start_redis ) >/dev/null 2>&1 &
    event="redis stopped for 2 s, restarted"
  fi
  wrk -t "$threads" -c "$conns" -d 60s --timeout 10s --latency "http://127.0.0.1:$data/soak" >"$dir/wrk-$m.txt" 2>&1 || true
  f="$dir/wrk-$m.txt"
  req=$(sed -n 's/^ *\([0-9]*\) requests in.*/\1/p' "$f"); req=${req:-0}
  rps=$(sed -n 's/^Requests\/sec: *\([0-9.]*\).*/\1/p' "$f")
  non=$(sed -n 's/^ *Non-2xx or 3xx responses: *\([0-9]*\).*/\1/p' "$f"); non=${non:-0}
  sock=$(sed -n 's/^ *Socket errors: connect \([0-9]*\), read \([0-9]*\), write \([0-9]*\), timeout \([0-9]*\).*/\1 \2 \3 \4/p' "$f" | awk '{print $1+$2+$3+$4}'); sock=${sock:-0}
  p99=$(awk '$1 == "99%" { print $2 }' "$f")
  total_req=$((total_req + req)); total_err=$((total_err + non + sock))
  kill -0 "$gw" 2>/dev/null || { echo "| $m | the gateway exited |" | tee -a "$out"; exit 1; }
  echo "| $m | $req | ${rps:-?} | $non | $sock | $(to_ms "${p99:-0}") | $(rss_mib) | $event |" | tee -a "$out"
done
# No reader that stops early in a pipeline: under pipefail its writer's SIGPIPE fails the script.
routes=$(curl -s "http://127.0.0.1:$admin/apisix/admin/routes" -H "X-API-KEY: $key" | sed -n 's/.*"total":\([0-9]*\).*/\1/p')
{
  echo
  echo "RSS $rss0 MiB after the first PUT, $(rss_mib) MiB at the end; $total_req requests, $total_err errors (non-2xx + socket)."
  echo "Load average (1, 5, 15 min) at the start: $load0, at the end: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs; routes at the end: ${routes:-?}."
  echo "wrk -t $threads -c $conns, churn every $churn_ms ms, binary $bin ($("$bin" --version | sed -n 2p))."
} | tee -a "$out"
