#!/usr/bin/env python3
"""CPU cost of active health checks: ferrisix's CPU time (user+sys from /proc) over a window
with (a) 1,000 upstreams of one node each, probed every second, and (b) one upstream of 10,000
nodes probed every second (concurrency 10, rounds never overlap), against the same
configuration without `checks`. The nodes are one nginx answering on every loopback address.

Usage: benches/e2e/health_cpu.py [--bin target/release/ferrisix] [--window 10]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

# The helpers the benchmarks share (harness.py beside this file).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import CLK_TCK, ROOT, free_port, wait_port  # noqa: E402


def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / CLK_TCK


def measure(args, work, routes, label):
    gw_port = free_port()
    with open(os.path.join(work, "apisix.yaml"), "w") as f:
        f.write(json.dumps(routes) + "\n#END\n")
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
  worker_processes: 1
  http:
    access_log: /dev/null
plugin_attr:
  prometheus:
    export_addr:
      ip: 127.0.0.1
      port: {free_port()}
""")
    gw = subprocess.Popen([args.bin, "-c", os.path.join(work, "config.yaml")],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          env={**os.environ, "RUST_LOG": "error"})
    wait_port(gw_port)
    time.sleep(3)
    start = cpu(gw.pid)
    time.sleep(args.window)
    used = cpu(gw.pid) - start
    gw.send_signal(signal.SIGTERM)
    gw.wait()
    pct = 100 * used / args.window
    print(f"{label}: {used:.2f} s CPU in {args.window} s ({pct:.1f}% of one core)", flush=True)
    return pct


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "ferrisix"))
    ap.add_argument("--window", type=int, default=10)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ferrisix-hcpu-")
    port = free_port()
    conf = os.path.join(work, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""daemon off; master_process off; worker_processes 1; error_log /dev/null;
pid {work}/nginx.pid; events {{ worker_connections 8192; }}
http {{ access_log off; server {{ listen {port} reuseport backlog=4096; location / {{ return 200 "ok"; }} }} }}
""")
    nginx = subprocess.Popen(["nginx", "-p", work, "-c", conf])
    wait_port(port)
    checks = {"active": {"http_path": "/", "healthy": {"interval": 1, "successes": 2},
                         "unhealthy": {"interval": 1}}}
    try:
        many = lambda with_checks: {"upstreams": [
            dict({"id": str(i), "nodes": {f"127.0.{i // 250}.{i % 250 + 1}:{port}": 1}, "type": "roundrobin"},
                 **({"checks": checks} if with_checks else {})) for i in range(1000)]}
        measure(args, work, many(False), "1,000 upstreams, no checks")
        measure(args, work, many(True), "1,000 upstreams x 1 node, probes every 1 s")
        big = lambda with_checks: {"upstreams": [dict(
            {"id": "big", "type": "roundrobin",
             "nodes": {f"127.0.{i // 250}.{i % 250 + 1}:{port}": 1 for i in range(10000)}},
            **({"checks": checks} if with_checks else {}))]}
        measure(args, work, big(False), "1 upstream x 10,000 nodes, no checks")
        measure(args, work, big(True), "1 upstream x 10,000 nodes, probes every 1 s")
    finally:
        nginx.send_signal(signal.SIGKILL)
        nginx.wait()


main()
