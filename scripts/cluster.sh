#!/usr/bin/env bash
# A ferrisix cluster on one machine, on loopback: a 3-member etcd cluster, Redis, 3 ferrisix
# nodes (each with its own Admin API, one shared config apart from the ports) and an upstream
# (ferrisix-echo). For operators, a demo of the deployment; for us, a test.
#
#   scripts/cluster.sh up       start everything (in $CLUSTER_DIR), print the addresses
#   scripts/cluster.sh down     stop everything started by `up`
#   scripts/cluster.sh status   what runs
#   scripts/cluster.sh test     up, the checks below, down; exits 1 when one fails:
#     1. a route PUT on any node is served by all three within CLUSTER_PROPAGATION_MS (default
#        100 ms; each node in turn);
#     2. the etcd leader killed (SIGKILL) during wrk -c 64 on the three nodes loses no
#        request, and a PUT after it is served by all;
#     3. limit-count with policy redis across the three nodes is exact: of 150 parallel
#        requests spread over them with count 50, exactly 50 pass.
#
# Needs etcd, redis-server, wrk, curl and python3 (Debian: etcd-server, redis-server, wrk, curl,
# python3) and the
# binaries: FERRISIX_BIN (default target/release/ferrisix, else target/debug/ferrisix),
# ECHO_BIN likewise. Ports: CLUSTER_PORT_BASE (default 24000) + fixed offsets, all on
# 127.0.0.1. CLUSTER_DIR (default /tmp/ferrisix-cluster) holds data, configs, logs and pid
# files; `down` signals only the processes this script started (see start_bg).
# scripts/check/cluster-test.sh runs `test` from a fresh CLUSTER_DIR, as CI does.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
dir=${CLUSTER_DIR:-/tmp/ferrisix-cluster}
base=${CLUSTER_PORT_BASE:-24000}
bound_ms=${CLUSTER_PROPAGATION_MS:-100}
pick() { for b in "$@"; do if [ -x "$b" ]; then echo "$b"; return; fi; done; echo "${1}"; }
bin=${FERRISIX_BIN:-$(pick "$root/target/release/ferrisix" "$root/target/debug/ferrisix")}
echo_bin=${ECHO_BIN:-$(pick "$root/target/release/ferrisix-echo" "$root/target/debug/ferrisix-echo")}

etcd_client() { echo $((base + 10 + $1)); }   # 24011..24013
etcd_peer() { echo $((base + 20 + $1)); }     # 24021..24023
redis_port=$((base + 30))                      # 24030
echo_port=$((base + 40))                       # 24040
node_data() { echo $((base + 100 + $1)); }    # 24101..24103
node_admin() { echo $((base + 200 + $1)); }   # 24201..24203
node_control() { echo $((base + 300 + $1)); } # 24301..24303
node_metrics() { echo $((base + 400 + $1)); } # 24401..24403

log() { echo "cluster: $*" >&2; }
now_ms() { date +%s%3N; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() {
  local port=$1 what=$2
  for _ in $(seq 300); do port_open "$port" && return 0; sleep 0.1; done
  log "$what did not listen on $port"; return 1
}

# A pid file holds more than the pid: "pid start-time boot-id", the process's start time
# (field 22 of /proc/<pid>/stat, in clock ticks since boot) and the kernel's boot id, both read
# at launch. A pid names a process only until it exits: after a reboot, or once the member died,
# the number may belong to any process. The pair (pid, start time) within one boot names one
# process for good, so a pid is signalled only while /proc/<pid>/stat still shows the start
# time recorded and the boot is the same; a pid file of any other form is ignored.
start_time() { # pid: prints its start time, or nothing when there is no such process
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  # The command name (field 2) may hold spaces and parentheses: count after the last ')'.
  local rest=${stat##*) } fields
  read -ra fields <<<"$rest"
  # A zombie has exited already: there is nothing left to signal.
  [ "${fields[0]}" != Z ] || return 0
  echo "${fields[19]}"
}
boot_id() { cat /proc/sys/kernel/random/boot_id; }

start_bg() { # name, command...: runs it in the background, its identity in $dir/name.pid
  local name=$1; shift
  "$@" >"$dir/$name.log" 2>&1 &
  # The start time is the fork's, so reading it before the exec is done is no race.
  echo "$! $(start_time $!) $(boot_id)" >"$dir/$name.pid"
}

ours() { # name: prints the pid of the process $dir/name.pid recorded, when it still runs
  local f="$dir/$1.pid" pid started boot extra
  [ -f "$f" ] || return 1
  read -r pid started boot extra <"$f" || true
  [[ "$pid" =~ ^[0-9]+$ && -n "$started" && -n "$boot" && -z "$extra" ]] || return 1
  [ "$boot" = "$(boot_id)" ] && [ "$(start_time "$pid")" = "$started" ] || return 1
  echo "$pid"
}

stop_pid() {
  local f="$dir/$1.pid" sig=${2:-TERM}
  [ -f "$f" ] || return 0
  local pid
  if ! pid=$(ours "$1"); then
    log "$1 is not running (its pid file names no process this script started): left alone"
    rm -f "$f"
    return 0
  fi
  kill "-$sig" "$pid" 2>/dev/null || true
  for _ in $(seq 100); do ours "$1" >/dev/null || break; sleep 0.1; done
  if ours "$1" >/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -f "$f"
}

initial_cluster() {
  local out=""
  for i in 1 2 3; do out="${out:+$out,}m$i=http://127.0.0.1:$(etcd_peer "$i")"; done
  echo "$out"
}

start_etcd() { # member, state (new|existing)
  local i=$1
  start_bg "etcd$i" etcd --name "m$i" --data-dir "$dir/etcd$i" \
    --listen-client-urls "http://127.0.0.1:$(etcd_client "$i")" \
    --advertise-client-urls "http://127.0.0.1:$(etcd_client "$i")" \
    --listen-peer-urls "http://127.0.0.1:$(etcd_peer "$i")" \
    --initial-advertise-peer-urls "http://127.0.0.1:$(etcd_peer "$i")" \
    --initial-cluster "$(initial_cluster)" --initial-cluster-token ferrisix-demo \
    --initial-cluster-state "${2:-new}"
}

node_config() { # node
  local i=$1
  cat <<EOF
# ferrisix node $i of the loopback demo cluster (scripts/cluster.sh); only the ports differ.
apisix:
  node_listen:
    - ip: 127.0.0.1
      port: $(node_data "$i")
  enable_control: true
  control:
    ip: 127.0.0.1
    port: $(node_control "$i")
  ssl:
    enable: false
deployment:
  role: traditional
  role_traditional:
    config_provider: etcd
  etcd:
    host:
      - "http://127.0.0.1:$(etcd_client 1)"
      - "http://127.0.0.1:$(etcd_client 2)"
      - "http://127.0.0.1:$(etcd_client 3)"
    prefix: /apisix
    timeout: 5
  admin:
    admin_listen:
      ip: 127.0.0.1
      port: $(node_admin "$i")
    admin_key:
      - name: admin
        key: $(cat "$dir/admin.key")
        role: admin
plugin_attr:
  prometheus:
    export_addr:
      ip: 127.0.0.1
      port: $(node_metrics "$i")
nginx_config:
  worker_processes: 1
  http:
    access_log: "off"
ferrisix:
  data_dir: $dir/node$i/data
EOF
}

new_key() { # prints 32 random letters
  # A fixed number of bytes read first, then filtered: no reader in the pipeline stops early
  # (`tr </dev/urandom | head -c 32` killed tr with SIGPIPE, which pipefail made the script's
  # failure). 512 bytes hold 104 letters on average; fewer than 32 means another draw.
  local key=""
  while [ "${#key}" -lt 32 ]; do key=$(head -c 512 /dev/urandom | LC_ALL=C tr -dc A-Za-z); done
  echo "${key:0:32}"
}

up() {
  for b in etcd redis-server; do command -v "$b" >/dev/null || { log "$b is not installed (apt-get install etcd-server redis-server)"; exit 1; }; done
  for b in "$bin" "$echo_bin"; do [ -x "$b" ] || { log "$b is not built (cargo build --release --bin ferrisix; cargo build --release -p ferrisix-echo-upstream)"; exit 1; }; done
  mkdir -p "$dir"
  if ours node1 >/dev/null; then log "already up ($dir)"; return; fi
  rm -rf "$dir"/etcd? "$dir"/node?
  [ -f "$dir/admin.key" ] || new_key >"$dir/admin.key"
  for i in 1 2 3; do start_etcd "$i" new; done
  start_bg redis redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no
  start_bg echo "$echo_bin" "127.0.0.1:$echo_port"
  for i in 1 2 3; do wait_port "$(etcd_client "$i")" "etcd member $i"; done
  wait_port "$redis_port" redis
  wait_port "$echo_port" "the upstream"
  for i in 1 2 3; do
    mkdir -p "$dir/node$i"
    node_config "$i" >"$dir/node$i/config.yaml"
    RUST_LOG=${RUST_LOG:-info} start_bg "node$i" "$bin" -c "$dir/node$i/config.yaml"
  done
  for i in 1 2 3; do wait_port "$(node_admin "$i")" "node $i's Admin API"; wait_port "$(node_data "$i")" "node $i"; done
  log "up in $dir: etcd 127.0.0.1:$(etcd_client 1),$(etcd_client 2),$(etcd_client 3); redis 127.0.0.1:$redis_port; upstream 127.0.0.1:$echo_port"
  for i in 1 2 3; do
    log "node $i: data http://127.0.0.1:$(node_data "$i")  admin http://127.0.0.1:$(node_admin "$i")  control http://127.0.0.1:$(node_control "$i")"
  done
  log "admin key: $(cat "$dir/admin.key")  (e.g. curl http://127.0.0.1:$(node_admin 1)/apisix/admin/routes -H \"X-API-KEY: \$(cat $dir/admin.key)\")"
}

down() {
  for i in 1 2 3; do stop_pid "node$i"; done
  stop_pid echo; stop_pid redis
  for i in 1 2 3; do stop_pid "etcd$i"; done
  log "down"
}

status() {
  for name in etcd1 etcd2 etcd3 redis echo node1 node2 node3; do
    local pid
    if pid=$(ours "$name"); then echo "$name: running (pid $pid)"; else echo "$name: stopped"; fi
  done
}

# ---- the test --------------------------------------------------------------------------

admin() { # node, method, path, [body]: prints the status code
  curl -s -o "$dir/last-admin.json" -w '%{http_code}' -X "$2" "http://127.0.0.1:$(node_admin "$1")/apisix/admin$3" \
    -H "X-API-KEY: $(cat "$dir/admin.key")" ${4:+-d "$4"}
}
status_of() { curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$(node_data "$1")$2"; }

failures=0
check() { if [ "$1" = ok ]; then echo "  PASS: $2"; else echo "  FAIL: $2"; failures=$((failures + 1)); fi; }

test_propagation() {
  echo "1. a PUT on any node is served by every node within $bound_ms ms"
  # Probed from one python3 process, one thread and kept-alive connection per node, so that
  # the figure is the gateway's and not the probe's process starts.
  local out
  if ! out=$(python3 - "$base" "$echo_port" "$(cat "$dir/admin.key")" <<'PY'
import http.client, json, sys, threading, time
base, echo_port, key = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
worst = 0.0
failed = False
for writer in (1, 2, 3):
    for rnd in (1, 2, 3):
        rid = f"prop-{writer}-{rnd}"
        uri = "/" + rid
        seen = {}
        conns = {n: http.client.HTTPConnection("127.0.0.1", base + 100 + n, timeout=5) for n in (1, 2, 3)}
        def probe(n, t0):
            c = conns[n]
            while time.monotonic() - t0 < 5:
                try:
                    c.request("GET", uri)
                    r = c.getresponse(); r.read()
                    if r.status == 200:
                        seen[n] = (time.monotonic() - t0) * 1000
                        return
                except Exception:
                    c.close()
        admin = http.client.HTTPConnection("127.0.0.1", base + 200 + writer, timeout=5)
        body = json.dumps({"uri": uri, "upstream": {"type": "roundrobin", "nodes": {f"127.0.0.1:{echo_port}": 1}}})
        admin.request("PUT", f"/apisix/admin/routes/{rid}", body, {"X-API-KEY": key})
        r = admin.getresponse(); text = r.read()
        # Counted from the Admin API's answer: the write is acknowledged then.
        t0 = time.monotonic()
        if r.status not in (200, 201):
            print(f"    PUT on node {writer} answered {r.status}: {text!r}"); failed = True; continue
        threads = [threading.Thread(target=probe, args=(n, t0)) for n in (1, 2, 3)]
        for t in threads: t.start()
        for t in threads: t.join()
        times = ",".join(f"{seen[n]:.1f}" if n in seen else "never" for n in (1, 2, 3))
        print(f"    PUT on node {writer} (round {rnd}): served by nodes 1,2,3 after {times} ms")
        if len(seen) < 3:
            failed = True
        else:
            worst = max(worst, max(seen.values()))
print(f"WORST {worst:.1f} {'FAILED' if failed else 'OK'}")
PY
  ); then check fail "the propagation probe failed"; return; fi
  grep -v '^WORST' <<<"$out"
  local worst state
  read -r _ worst state < <(grep '^WORST' <<<"$out")
  if [ "$state" != OK ]; then check fail "a PUT was not served by every node within 5 s"; return; fi
  if awk -v w="$worst" -v b="$bound_ms" 'BEGIN { exit !(w <= b) }'; then check ok "every PUT served by all nodes within $bound_ms ms (slowest $worst ms)"; else check fail "slowest propagation $worst ms > $bound_ms ms"; fi
}

etcd_leader() { # prints the member number of the leader
  local ids=() leader=""
  for i in 1 2 3; do
    local s; s=$(curl -s -m 2 -X POST "http://127.0.0.1:$(etcd_client "$i")/v3/maintenance/status" -d '{}' || true)
    ids[i]=$(sed -n 's/.*"member_id":"\([0-9]*\)".*/\1/p' <<<"$s")
    [ -n "$leader" ] || leader=$(sed -n 's/.*"leader":"\([0-9]*\)".*/\1/p' <<<"$s")
  done
  for i in 1 2 3; do [ -n "${ids[$i]}" ] && [ "${ids[$i]}" = "$leader" ] && { echo "$i"; return; }; done
  echo 1
}

wrk_errors() { # wrk output file: prints "requests non2xx socket_errors"
  local f=$1
  local req non sock
  req=$(sed -n 's/^ *\([0-9]*\) requests in.*/\1/p' "$f")
  non=$(sed -n 's/^ *Non-2xx or 3xx responses: *\([0-9]*\).*/\1/p' "$f")
  sock=$(sed -n 's/^ *Socket errors: connect \([0-9]*\), read \([0-9]*\), write \([0-9]*\), timeout \([0-9]*\).*/\1 \2 \3 \4/p' "$f" | awk '{print $1+$2+$3+$4}')
  echo "${req:-0} ${non:-0} ${sock:-0}"
}

test_etcd_member_killed() {
  echo "2. the etcd leader killed during wrk -c 64 (over the three nodes) loses no request"
  command -v wrk >/dev/null || { check fail "wrk is not installed (apt-get install wrk)"; return; }
  admin 1 PUT /routes/load "{\"uri\": \"/load\", \"upstream\": {\"type\": \"roundrobin\", \"nodes\": {\"127.0.0.1:$echo_port\": 1}}}" >/dev/null
  for _ in $(seq 100); do [ "$(status_of 3 /load)" = 200 ] && break; sleep 0.05; done
  local wrks=()
  for n in 1 2 3; do
    wrk -t 1 -c 22 -d 15 --timeout 10 "http://127.0.0.1:$(node_data "$n")/load" >"$dir/wrk-etcd-$n.txt" 2>&1 &
    wrks+=($!)
  done
  sleep 4
  local leader; leader=$(etcd_leader)
  echo "    killing etcd member $leader (the leader) with SIGKILL"
  stop_pid "etcd$leader" KILL
  sleep 2
  # Writes go on through the two members left (after the new election).
  local code t0; t0=$(now_ms)
  for _ in $(seq 50); do
    code=$(admin 2 PUT /routes/after-kill "{\"uri\": \"/after-kill\", \"upstream\": {\"type\": \"roundrobin\", \"nodes\": {\"127.0.0.1:$echo_port\": 1}}}")
    { [ "$code" = 201 ] || [ "$code" = 200 ]; } && break
    sleep 0.2
  done
  local served=0
  for _ in $(seq 200); do
    if [ "$(status_of 1 /after-kill)" = 200 ] && [ "$(status_of 2 /after-kill)" = 200 ] && [ "$(status_of 3 /after-kill)" = 200 ]; then served=1; break; fi
    sleep 0.05
  done
  echo "    PUT after the kill answered $code; served by all after $(( $(now_ms) - t0 )) ms"
  wait "${wrks[@]}"
  local total=0 bad=0
  for n in 1 2 3; do
    read -r req non sock < <(wrk_errors "$dir/wrk-etcd-$n.txt")
    echo "    node $n: $req requests, $non non-2xx, $sock socket errors"
    total=$((total + req)); bad=$((bad + non + sock))
  done
  if [ "$total" -gt 0 ] && [ "$bad" = 0 ]; then check ok "no request lost while etcd member $leader was killed ($total requests)"; else check fail "$bad failed of $total requests"; fi
  if [ "$served" = 1 ]; then check ok "a PUT after the kill is served by all nodes"; else check fail "the PUT after the kill is not served by all nodes"; fi
  start_etcd "$leader" existing
  wait_port "$(etcd_client "$leader")" "etcd member $leader (restarted)"
}

test_limit_count_redis() {
  echo "3. limit-count (policy redis) is exact across the three nodes"
  local count=50 sent=150
  local code; code=$(admin 3 PUT /routes/limited "{\"uri\": \"/limited\", \"plugins\": {\"limit-count\": {\"count\": $count, \"time_window\": 300, \"rejected_code\": 503, \"key\": \"remote_addr\", \"policy\": \"redis\", \"redis_host\": \"127.0.0.1\", \"redis_port\": $redis_port}}, \"upstream\": {\"type\": \"roundrobin\", \"nodes\": {\"127.0.0.1:$echo_port\": 1}}}")
  [ "$code" = 201 ] || [ "$code" = 200 ] || { check fail "PUT /routes/limited answered $code: $(cat "$dir/last-admin.json")"; return; }
  # Every node has the route before counting (asked on the control API: a request would count).
  for _ in $(seq 200); do
    local have=0
    for n in 1 2 3; do [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$(node_control "$n")/v1/route/limited")" = 200 ] && have=$((have + 1)); done
    [ "$have" = 3 ] && break
    sleep 0.05
  done
  redis-cli -p "$redis_port" flushall >/dev/null
  seq "$sent" | xargs -P 12 -I{} sh -c 'n=$(( {} % 3 + 1 )); curl -s -o /dev/null -w "%{http_code}\n" "http://127.0.0.1:$(( '"$base"' + 100 + n ))/limited"' >"$dir/limited.txt"
  local ok rejected other
  ok=$(grep -c '^200$' "$dir/limited.txt" || true)
  rejected=$(grep -c '^503$' "$dir/limited.txt" || true)
  other=$(grep -vc '^\(200\|503\)$' "$dir/limited.txt" || true)
  echo "    $sent requests over 3 nodes (12 at a time): $ok passed, $rejected rejected (503), $other other"
  if [ "$ok" = "$count" ] && [ "$rejected" = $((sent - count)) ]; then check ok "exactly $count of $sent passed"; else check fail "$ok passed, $rejected rejected, $other other (expected $count / $((sent - count)))"; fi
}

run_test() {
  down >/dev/null 2>&1 || true
  up
  trap down EXIT
  sleep 1
  test_propagation
  test_etcd_member_killed
  test_limit_count_redis
  echo
  if [ "$failures" = 0 ]; then echo "cluster test: PASS"; else echo "cluster test: $failures FAILED"; exit 1; fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  test) run_test ;;
  *) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
