#!/usr/bin/env python3
"""proxy-cache against nginx's proxy_cache (issue 40): one gateway and one nginx, one worker
each, in front of the same upstream (harness.py's nginx on 127.0.0.1:1980 answering
"1234567890"), measured in interleaved rounds with wrk; each row is the median of the rounds.

Rows:
- hit, memory and disk: ferrisix's proxy-cache (`cache_strategy` memory, and disk) on a key
  stored before the run, against nginx's `proxy_cache` on a disk zone (what APISIX configures
  for its disk strategy): CPU per request, req/s and p99 of the hits;
- miss, memory and disk: every request on a new key (a wrk script numbers the paths), so each
  one looks up, goes upstream and stores; nginx's proxy_cache miss beside them;
- s1: the same gateway's route without plugins, the base a miss is compared with.

CPU is the processes' utime + stime from /proc over the wrk window divided by the requests
served (nginx: master and worker). Every target's answers are checked before the rounds (a
hit says HIT, a miss MISS).

Usage: python3 benches/e2e/cache.py --binary target/release/ferrisix [--nginx /usr/sbin/nginx]
       [--rounds 3] [--duration 5] [--connections 16] [--threads 2] [--markdown FILE]

It uses harness.py's fixed upstream port 1980 and proxy ports of its own; take the lock the
other benchmarks take when several run on one machine (flock /tmp/conformance.lock ...).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

# The helpers the benchmarks share (harness.py beside this file).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (  # noqa: E402
    CLK_TCK, UPSTREAM_PORT, admin_put, children, cpu_ticks, free_port, nginx_main, parse_wrk,
    start_upstream, stop_all, wait_port,
)

ADMIN_KEY = "cache-bench-admin-key"

# wrk: a new path per request, numbered per thread so threads never share one.
MISS_SCRIPT = """
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
function init(args)
  n = 0
end
function request()
  n = n + 1
  return wrk.format("GET", "%s" .. tid .. "-" .. n)
end
"""


def start_ferrisix(work, binary):
    port, admin = free_port(), free_port()
    disk = os.path.join(work, "ferrisix-cache")
    conf = os.path.join(work, "config.yaml")
    with open(conf, "w") as f:
        f.write(f"""
apisix:
  node_listen:
    - ip: 127.0.0.1
      port: {port}
  enable_control: false
  proxy_cache:
    cache_ttl: 300s
    zones:
      # The miss rows write a file per request: 10m of keys (about 80,000 files) bounds them.
      - name: disk_cache_one
        memory_size: 10m
        disk_size: 100m
        disk_path: {disk}
        cache_levels: "1:2"
      - name: memory_cache
        memory_size: 50m
deployment:
  role: traditional
  role_traditional:
    config_provider: embedded
  admin:
    admin_listen: {{ip: 127.0.0.1, port: {admin}}}
    admin_key:
      - name: admin
        key: {ADMIN_KEY}
        role: admin
nginx_config:
  worker_processes: 1
  http:
    access_log: {work}/ferrisix-access.log
ferrisix:
  data_dir: {work}/data
""")
    p = subprocess.Popen([os.path.abspath(binary), "-c", conf], cwd=work,
                         stdout=subprocess.DEVNULL,
                         stderr=open(os.path.join(work, "ferrisix.log"), "w"))
    wait_port(port)
    wait_port(admin)
    api = f"http://127.0.0.1:{admin}"
    upstream = {"type": "roundrobin", "nodes": {f"127.0.0.1:{UPSTREAM_PORT}": 1}}
    routes = {
        "s1": ("/hello", None),
        "mem": ("/mem/*", {"cache_strategy": "memory", "cache_zone": "memory_cache"}),
        "disk": ("/disk/*", {"cache_strategy": "disk", "cache_zone": "disk_cache_one"}),
    }
    for rid, (uri, cache) in routes.items():
        doc = {"uri": uri, "upstream": upstream}
        if cache:
            doc["plugins"] = {"proxy-cache": cache}
        admin_put(api, ADMIN_KEY, f"routes/{rid}", doc)
    time.sleep(0.5)
    return p, port


def start_nginx(work, nginx):
    """nginx's proxy_cache as APISIX's disk strategy configures it (one worker)."""
    port = free_port()
    conf = os.path.join(work, "nginx-cache.conf")
    cache_dir = os.path.join(work, "nginx-cache")
    os.makedirs(cache_dir, exist_ok=True)
    with open(conf, "w") as f:
        f.write(nginx_main(work, "cache-proxy", "worker_connections 4096;") + f"""http {{
  access_log {work}/nginx-access.log combined buffer=64k flush=1s;
  proxy_cache_path {cache_dir} levels=1:2 keys_zone=disk_cache_one:10m inactive=1d max_size=100m use_temp_path=off;
  upstream backend {{
    server 127.0.0.1:{UPSTREAM_PORT};
    keepalive 320;
  }}
  server {{
    listen 127.0.0.1:{port} reuseport;
    location / {{
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $http_host;
      proxy_cache disk_cache_one;
      proxy_cache_valid any 300s;
      proxy_cache_min_uses 1;
      proxy_cache_methods GET HEAD POST;
      proxy_cache_lock_timeout 5s;
      proxy_cache_use_stale off;
      proxy_cache_key $host$request_uri;
      add_header Apisix-Cache-Status $upstream_cache_status;
      proxy_pass http://backend;
    }}
  }}
}}
""")
    p = subprocess.Popen([nginx, "-c", conf, "-p", work], stderr=subprocess.DEVNULL)
    wait_port(port)
    return p, port


def cache_status(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        r.read()
        return r.status, r.headers.get("Apisix-Cache-Status")


def check(port, hit_path, miss_prefix):
    """The hit path answers HIT once stored, a new path MISS."""
    cache_status(port, hit_path)
    status, hit = cache_status(port, hit_path)
    status2, miss = cache_status(port, f"{miss_prefix}check-{time.time_ns()}")
    if (status, hit, status2, miss) != (200, "HIT", 200, "MISS"):
        raise SystemExit(f"port {port}: {hit_path} answered {status} {hit}, "
                         f"a new key {status2} {miss}")


def measure(port, pids, path, args, script=None):
    cmd = ["wrk", "-t", str(args.threads), "-c", str(args.connections), "-d",
           f"{args.duration}s", "--latency"]
    if script:
        cmd += ["-s", script]
    cmd.append(f"http://127.0.0.1:{port}{path}")
    before = cpu_ticks(pids)
    r = parse_wrk(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    after = cpu_ticks(pids)
    n = max(r["requests"], 1)
    r["user_us"] = (after[0] - before[0]) / CLK_TCK * 1e6 / n
    r["sys_us"] = (after[1] - before[1]) / CLK_TCK * 1e6 / n
    r["cpu_us"] = r["user_us"] + r["sys_us"]
    return r


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", required=True, help="the ferrisix binary measured")
    ap.add_argument("--nginx", default=shutil.which("nginx") or "/usr/sbin/nginx")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--markdown", help="also write the table to this file")
    ap.add_argument("--json")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="ferrisix-cache-bench-")
    procs = []
    try:
        procs.append(start_upstream(work, None))
        gw, gw_port = start_ferrisix(work, args.binary)
        procs.append(gw)
        ngx, ngx_port = start_nginx(work, args.nginx)
        procs.append(ngx)
        gw_pids = [gw.pid]
        ngx_pids = [ngx.pid] + children(ngx.pid)
        check(gw_port, "/mem/hit", "/mem/")
        check(gw_port, "/disk/hit", "/disk/")
        check(ngx_port, "/hit", "/")
        scripts = {}
        for name, prefix in (("mem", "/mem/m"), ("disk", "/disk/m"), ("nginx", "/m")):
            path = os.path.join(work, f"miss-{name}.lua")
            with open(path, "w") as f:
                f.write(MISS_SCRIPT % prefix)
            scripts[name] = path
        # (row, port, pids, path, wrk script)
        targets = [
            ("nginx proxy_cache, hit", ngx_port, ngx_pids, "/hit", None),
            ("ferrisix memory, hit", gw_port, gw_pids, "/mem/hit", None),
            ("ferrisix disk, hit", gw_port, gw_pids, "/disk/hit", None),
            ("nginx proxy_cache, miss", ngx_port, ngx_pids, "/", scripts["nginx"]),
            ("ferrisix memory, miss", gw_port, gw_pids, "/", scripts["mem"]),
            ("ferrisix disk, miss", gw_port, gw_pids, "/", scripts["disk"]),
            ("ferrisix s1 (no plugins)", gw_port, gw_pids, "/hello", None),
        ]
        results = {t[0]: [] for t in targets}
        for rnd in range(args.rounds):
            for name, port, pids, path, script in targets:
                r = measure(port, pids, path, args, script)
                if r["non2xx"] or r["socket_errors"]:
                    print(f"warning: {name} round {rnd + 1}: {r['non2xx']} non-2xx, "
                          f"socket errors {r['socket_errors']}", file=sys.stderr)
                results[name].append(r)
                print(f"round {rnd + 1} {name}: {r['rps']:.0f} req/s, {r['cpu_us']:.2f} us/req, "
                      f"p99 {r['p99_ms']} ms", file=sys.stderr)
    finally:
        stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)

    rows = {}
    for name, rs in results.items():
        rows[name] = {k: med([r[k] for r in rs])
                      for k in ("rps", "p99_ms", "cpu_us", "user_us", "sys_us")}
    base = {"hit": rows["nginx proxy_cache, hit"]["cpu_us"],
            "miss": rows["nginx proxy_cache, miss"]["cpu_us"]}
    s1 = rows["ferrisix s1 (no plugins)"]["cpu_us"]
    lines = ["| target | req/s | p99 ms | CPU µs/req (user / sys) | CPU vs nginx | CPU vs s1 |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in rows.items():
        kind = "hit" if name.endswith("hit") else "miss" if name.endswith("miss") else None
        vs_nginx = f"{r['cpu_us'] / base[kind]:.2f}×" if kind else ""
        vs_s1 = f"{r['cpu_us'] / s1:.2f}×" if name.startswith("ferrisix") else ""
        lines.append(f"| {name} | {r['rps']:,.0f} | {r['p99_ms']} | {r['cpu_us']:.2f} "
                     f"({r['user_us']:.2f} / {r['sys_us']:.2f}) | {vs_nginx} | {vs_s1} |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "rounds": results}, f, indent=1)


if __name__ == "__main__":
    main()
