#!/usr/bin/env python3
"""API-driven standalone at scale: one `PUT /apisix/admin/configs` of N routes.

Starts a ferrisix node in API-driven standalone mode on free ports, then for each N:
builds a document of N routes (half exact URIs `/r<i>/exact`, half prefixes `/p<i>/*`, an
inline roundrobin upstream on each, pointing at a closed port), PUTs it with a digest, and
reports:

  put       the PUT's answer time (the whole document parsed and checked; 202)
  served    PUT sent -> the last route of the document matched on the data port (any answer
            but 404: the upstream is closed on purpose, so a matched route answers 502)
  rss       resident memory before, after the route served, and the peak (VmHWM) so far
  body      the document's size

Usage: benches/e2e/standalone_put.py [--binary target/release/ferrisix] [--routes 10000,100000]
"""

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

KEY = "standalone-put-bench-key"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def http(method, url, body=None, headers=None, timeout=600):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, ConnectionError):
        return None, b""


def document(n, version):
    routes = []
    for i in range(n):
        uri = f"/r{i}/exact" if i % 2 == 0 else f"/p{i}/*"
        routes.append({
            "id": str(i),
            "modifiedIndex": version,
            "uri": uri,
            "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:9": 1}},
        })
    return {"routes": routes, "routes_conf_version": version}


def probe_path(i):
    return f"/r{i}/exact" if i % 2 == 0 else f"/p{i}/x"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default="target/release/ferrisix")
    ap.add_argument("--routes", default="10000")
    args = ap.parse_args()
    data, admin, control = free_port(), free_port(), free_port()
    work = tempfile.mkdtemp(prefix="standalone-put-")
    conf = os.path.join(work, "config.yaml")
    with open(conf, "w") as f:
        f.write(f"""apisix:
  node_listen:
    - ip: 127.0.0.1
      port: {data}
  ssl:
    enable: false
  control:
    ip: 127.0.0.1
    port: {control}
deployment:
  role: traditional
  role_traditional:
    config_provider: yaml
  admin:
    admin_listen:
      ip: 127.0.0.1
      port: {admin}
    admin_key:
      - name: admin
        key: {KEY}
        role: admin
nginx_config:
  http:
    enable_access_log: false
ferrisix:
  data_dir: {work}/data
plugin_attr:
  prometheus:
    export_addr:
      ip: 127.0.0.1
      port: {free_port()}
""")
    proc = subprocess.Popen([args.binary, "-c", conf], stdout=subprocess.DEVNULL,
                            stderr=open(os.path.join(work, "log"), "w"))
    try:
        deadline = time.time() + 60
        while http("GET", f"http://127.0.0.1:{control}/status")[0] != 200:
            if time.time() > deadline or proc.poll() is not None:
                sys.exit(f"ferrisix did not start; log in {work}/log")
            time.sleep(0.1)
        version = int(time.time() * 1000)
        print(f"binary {args.binary}")
        for n in [int(x) for x in args.routes.split(",")]:
            version += 1
            body = json.dumps(document(n, version)).encode()
            before = rss_kib(proc.pid)
            headers = {"X-API-KEY": KEY, "Content-Type": "application/json",
                       "X-Digest": hashlib.sha1(body).hexdigest()}
            t0 = time.monotonic()
            status, answer = http("PUT", f"http://127.0.0.1:{admin}/apisix/admin/configs", body, headers)
            put_s = time.monotonic() - t0
            if status != 202:
                sys.exit(f"PUT of {n} routes: {status} {answer[:300]!r}")
            last = probe_path(n - 1)
            while True:
                s, _ = http("GET", f"http://127.0.0.1:{data}{last}", timeout=30)
                if s is not None and s != 404:
                    break
                if time.monotonic() - t0 > 600:
                    sys.exit(f"{n} routes: the last route never served")
                time.sleep(0.01)
            served_s = time.monotonic() - t0
            after = rss_kib(proc.pid)
            peak = rss_kib(proc.pid, "VmHWM")
            print(f"routes {n}: body {len(body) / 1e6:.1f} MB, put {put_s * 1000:.0f} ms, "
                  f"served {served_s * 1000:.0f} ms, rss before {before / 1024:.0f} MiB, "
                  f"after {after / 1024:.0f} MiB, peak {peak / 1024:.0f} MiB")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
