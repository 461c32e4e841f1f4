#!/usr/bin/env python3
"""HTTP/2 to an upstream over multiplexed connections against HTTP/1.1 pooled connections.

One nginx (one worker) listens twice: HTTP/1.1, and h2c (`listen ... http2`, whose
`http2_max_concurrent_streams` is 128). ferrisix (one worker) has two routes to it: `/h1`
with an ordinary upstream, `/h2` with the label `ferrisix.http_version: "2"`. `wrk -c 64` (64
requests in flight) loads each route in turn; for each it reports
  rps              requests per second (wrk)
  cpu_us_per_req   the gateway's CPU time (user + system) per request
  upstream_conns   connections from the gateway to the upstream's port, counted mid-run
  errors           non-2xx answers and socket errors
Client side HTTP/1.1 both times: the difference is only the gateway's upstream side.

Uses the benchmarks' fixed ports (9080, 9180): run it under the same flock as the others.

Usage: benches/e2e/h2_upstream.py --binary target/release/ferrisix [--seconds 10] [--rounds 2]
"""

import argparse
import statistics
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

# The helpers the benchmarks share (harness.py beside this file).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (  # noqa: E402
    CLK_TCK, FERRISIX_ADMIN, FERRISIX_PORT, admin_put, cpu_ticks, free_port, nginx_bin,
    nginx_main, parse_wrk, start_ferrisix, wait_port,
)

ADMIN_KEY = "benchmark-admin-key"


def start_nginx(work, h1_port, h2_port):
    conf = os.path.join(work, "h2-upstream.conf")
    with open(conf, "w") as f:
        f.write(nginx_main(work, "h2-upstream", "worker_connections 4096;") + f"""http {{
  access_log off;
  server {{
    listen 127.0.0.1:{h1_port};
    listen 127.0.0.1:{h2_port} http2;
    keepalive_requests 100000;
    http2_max_requests 100000;
    location / {{ return 200 "1234567890"; }}
  }}
}}
""")
    p = subprocess.Popen([nginx_bin(), "-c", conf, "-p", work], stderr=subprocess.DEVNULL)
    wait_port(h1_port)
    wait_port(h2_port)
    return p


def count_conns(port):
    out = subprocess.run(["ss", "-Htn", "state", "established", f"( dport = :{port} )"],
                         capture_output=True, text=True).stdout
    return len([line for line in out.splitlines() if line.strip()])


def load(path, port_to_count, gateway, seconds, connections):
    seen = []

    def sample():
        time.sleep(seconds / 2)
        seen.append(count_conns(port_to_count))

    t = threading.Thread(target=sample)
    before = cpu_ticks([gateway.pid])
    t.start()
    out = subprocess.run(["wrk", "-t", "2", "-c", str(connections), "-d", f"{seconds}s",
                          "--latency", f"http://127.0.0.1:{FERRISIX_PORT}{path}"],
                         capture_output=True, text=True, check=True).stdout
    t.join()
    after = cpu_ticks([gateway.pid])
    r = parse_wrk(out)
    ticks = (after[0] - before[0]) + (after[1] - before[1])
    return {
        "rps": r["rps"],
        "mean_ms": r["mean_ms"],
        "p99_ms": r["p99_ms"],
        "cpu_us_per_req": round(ticks / CLK_TCK * 1e6 / max(r["requests"], 1), 1),
        "upstream_conns": seen[0] if seen else None,
        "errors": r["non2xx"] + (1 if r["socket_errors"] else 0),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="target/release/ferrisix")
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--connections", type=int, default=64)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ferrisix-h2up-")
    h1_port, h2_port = free_port(), free_port()
    nginx = start_nginx(work, h1_port, h2_port)
    gw = start_ferrisix(work, None, args.binary)
    try:
        admin = f"http://127.0.0.1:{FERRISIX_ADMIN}"
        admin_put(admin, ADMIN_KEY, "routes/1", {"uri": "/h1", "upstream": {
            "type": "roundrobin", "nodes": {f"127.0.0.1:{h1_port}": 1}}})
        admin_put(admin, ADMIN_KEY, "routes/2", {"uri": "/h2", "upstream": {
            "type": "roundrobin", "nodes": {f"127.0.0.1:{h2_port}": 1},
            "labels": {"ferrisix.http_version": "2"}}})
        time.sleep(1)
        results = {"h1": [], "h2": []}
        for _ in range(args.rounds):
            results["h1"].append(load("/h1", h1_port, gw, args.seconds, args.connections))
            results["h2"].append(load("/h2", h2_port, gw, args.seconds, args.connections))
        # Medians of the rounds, each figure on its own (the benchmarks' rule: never the best).
        median = {k: {f: statistics.median(r[f] for r in v) for f in v[0]}
                  for k, v in results.items()}
        print(json.dumps({"binary": args.binary, "connections": args.connections,
                          "seconds": args.seconds, "rounds": results, "median": median,
                          "h2_over_h1_rps": round(median["h2"]["rps"] / median["h1"]["rps"], 3),
                          "h2_over_h1_cpu": round(median["h2"]["cpu_us_per_req"]
                                                  / median["h1"]["cpu_us_per_req"], 3)},
                         indent=1))
    finally:
        gw.terminate()
        nginx.terminate()
        gw.wait()
        nginx.wait()


if __name__ == "__main__":
    main()
