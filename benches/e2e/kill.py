#!/usr/bin/env python3
"""Kill test: one of three upstream nodes dies under load and comes back.

Three single-process nginx nodes answer /hello; ferrisix (4 workers) balances over them with
`checks` (active interval 1, unhealthy.tcp_failures 2, healthy.successes 2). `wrk -c 64` loads
/hello; after KILL_AT seconds the third node is SIGKILLed, after BACK_AT seconds it is started
again. For each configuration it reports:
  errors       client-visible non-2xx answers and socket errors (wrk)
  last_try     seconds from the kill to the last try ferrisix made on the dead node (its
               'while proxying' failure log lines)
  back_after   seconds from the restart to the first request the node served again
Configurations: retries default / retries 0, each with active probes (interval 1) and with
passive counting only (active interval 100, so only retried failures and answers count).

Usage: benches/e2e/kill.py [--duration 14] [--bin target/release/ferrisix]
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import datetime

# The helpers the benchmarks share (harness.py beside this file).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, free_port, wait_port  # noqa: E402

KILL_AT = 4.0
BACK_AT = 9.0


def start_node(work, i, port):
    conf = os.path.join(work, f"node{i}.conf")
    with open(conf, "w") as f:
        f.write(f"""daemon off; master_process off; worker_processes 1; error_log /dev/null;
pid {work}/node{i}.pid;
events {{ worker_connections 4096; }}
http {{ log_format t '$msec $http_x_real_ip'; access_log {work}/node{i}.log t;
  server {{ listen 127.0.0.1:{port} reuseport; keepalive_requests 100000;
    location / {{ return 200 "node{i}\\n"; }} }} }}
""")
    p = subprocess.Popen(["nginx", "-p", work, "-c", conf], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    wait_port(port)
    return p


def run_case(args, name, retries, active):
    work = tempfile.mkdtemp(prefix="ferrisix-kill-")
    ports = [free_port() for _ in range(3)]
    nodes = [start_node(work, i, p) for i, p in enumerate(ports)]
    gw_port = free_port()
    interval = 1 if active else 100
    upstream = {
        "type": "roundrobin",
        "nodes": {f"127.0.0.1:{p}": 1 for p in ports},
        "checks": {"active": {"http_path": "/hello",
                              "healthy": {"interval": interval, "successes": 2},
                              "unhealthy": {"interval": interval, "tcp_failures": 2}}},
    }
    if not active:
        upstream["checks"]["passive"] = {"unhealthy": {"tcp_failures": 2, "http_statuses": [502], "http_failures": 2}}
    if retries is not None:
        upstream["retries"] = retries
    import json
    with open(os.path.join(work, "apisix.yaml"), "w") as f:
        f.write(json.dumps({"routes": [{"id": "1", "uri": "/hello", "upstream": upstream}]}) + "\n#END\n")
    with open(os.path.join(work, "config.yaml"), "w") as f:
        f.write(f"""apisix:
  node_listen:
    - ip: 127.0.0.1
      port: {gw_port}
  enable_admin: false
  enable_control: false
deployment:
  role: data_plane
  role_data_plane:
    config_provider: yaml
nginx_config:
  worker_processes: 4
  http:
    access_log: /dev/null
plugin_attr:
  prometheus:
    export_addr:
      ip: 127.0.0.1
      port: {free_port()}
""")
    log = open(os.path.join(work, "ferrisix.log"), "w")
    gw = subprocess.Popen([args.bin, "-c", os.path.join(work, "config.yaml")], stdout=log,
                          stderr=log, env={**os.environ, "RUST_LOG": "warn", "NO_COLOR": "1"})
    wait_port(gw_port)
    time.sleep(1.5)
    wrk = subprocess.Popen(["wrk", "-t", "2", "-c", "64", "-d", f"{args.duration}s",
                            f"http://127.0.0.1:{gw_port}/hello"], stdout=subprocess.PIPE, text=True)
    time.sleep(KILL_AT)
    killed_at = time.time()
    nodes[2].send_signal(signal.SIGKILL)
    nodes[2].wait()
    time.sleep(BACK_AT - KILL_AT)
    back_at = time.time()
    nodes[2] = start_node(work, "2b", ports[2])
    out, _ = wrk.communicate()
    gw.send_signal(signal.SIGTERM)
    gw.wait()
    for n in nodes:
        n.send_signal(signal.SIGKILL)
        n.wait()
    log.close()
    non2xx = int((re.search(r"Non-2xx or 3xx responses: (\d+)", out) or [0, 0])[1])
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    sock_errors = sum(int(x) for x in sock.groups()) if sock else 0
    reqs = int(re.search(r"(\d+) requests in", out)[1])
    last_try = None
    dead = f"127.0.0.1:{ports[2]}"
    for line in open(os.path.join(work, "ferrisix.log")):
        # Every failed try logs "... while proxying upstream=<addr>" (refused, reset, timed out).
        if "while proxying" in line and dead in line:
            ts = datetime.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00")).timestamp()
            if killed_at <= ts < back_at:
                last_try = ts - killed_at
    back_after = None
    path = os.path.join(work, "node2b.log")
    if os.path.exists(path):
        # Proxied requests carry X-Real-IP; health probes do not.
        stamps = [float(l.split()[0]) for l in open(path) if len(l.split()) > 1 and l.split()[1] != "-"]
        if stamps:
            back_after = min(stamps) - back_at
    return {"case": name, "requests": reqs, "errors": non2xx + sock_errors,
            "last_try_on_dead_s": None if last_try is None else round(last_try, 3),
            "back_after_s": None if back_after is None else round(back_after, 3)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=int, default=14)
    ap.add_argument("--bin", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "ferrisix"))
    args = ap.parse_args()
    results = []
    for name, retries, active in [("active, retries default", None, True),
                                  ("active, retries 0", 0, True),
                                  ("passive, retries default", None, False),
                                  ("passive, retries 0", 0, False)]:
        r = run_case(args, name, retries, active)
        print(r, flush=True)
        results.append(r)
    print("| case | requests | client errors | last try on the dead node after the kill (s) | back in traffic after restart (s) |")
    print("| --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['case']} | {r['requests']} | {r['errors']} | {r['last_try_on_dead_s']} | {r['back_after_s']} |")


main()
