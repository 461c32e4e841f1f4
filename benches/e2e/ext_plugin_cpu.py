#!/usr/bin/env python3
"""CPU per request of an ext-plugin-pre-req round trip: ferrisix's CPU time (user+sys from
/proc) over a run of keep-alive requests to a route with `ext-plugin-pre-req` (the e2e tests'
Python runner answering each call with an empty rewrite), against the same route without
plugins, in one run. The runner's own CPU is reported apart (it is Python: it dominates).

Usage: benches/e2e/ext_plugin_cpu.py [--bin target/debug/ferrisix] [--requests 3000]
"""

import argparse
import http.client
import http.server
import json
import os
import socketserver
import subprocess
import sys
import tempfile
import threading
import time

# The helpers the benchmarks share (harness.py beside this file).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import CLK_TCK, ROOT, free_port, wait_port  # noqa: E402

RUNNER = os.path.join(ROOT, "tests", "e2e", "ext_plugin_runner.py")


def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / CLK_TCK


def children(pid):
    """The processes `pid` started, from any of its threads (the runner's supervisor is one)."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return out


class Hello(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"hello")

    def log_message(self, *args):
        pass


def drive(port, path, n):
    c = http.client.HTTPConnection("127.0.0.1", port)
    for _ in range(n):
        c.request("GET", path)
        r = c.getresponse()
        r.read()
        if r.status != 200:
            raise SystemExit(f"{path}: status {r.status}")
    c.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "debug", "ferrisix"))
    ap.add_argument("--requests", type=int, default=3000)
    args = ap.parse_args()

    up = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Hello)
    up.daemon_threads = True
    threading.Thread(target=up.serve_forever, daemon=True).start()
    node = f"127.0.0.1:{up.server_address[1]}"

    with tempfile.TemporaryDirectory() as work:
        port = free_port()
        routes = {"routes": [
            {"id": "plain", "uri": "/plain", "upstream": {"nodes": {node: 1}}},
            {"id": "pre", "uri": "/pre", "upstream": {"nodes": {node: 1}},
             "plugins": {"ext-plugin-pre-req": {"conf": [{"name": "mode", "value": "rewrite"}]}}},
        ]}
        with open(os.path.join(work, "apisix.yaml"), "w") as f:
            f.write(json.dumps(routes) + "\n#END\n")
        with open(os.path.join(work, "config.yaml"), "w") as f:
            f.write(f"""apisix:
  node_listen:
    - ip: 127.0.0.1
      port: {port}
  enable_admin: false
  enable_control: false
  ssl:
    enable: false
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
ext-plugin:
  cmd: ["python3", "{RUNNER}"]
""")
        gw = subprocess.Popen([args.bin, "-c", os.path.join(work, "config.yaml")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "RUST_LOG": "error"})
        try:
            wait_port(port)
            deadline = time.time() + 20
            while True:
                try:
                    drive(port, "/pre", 1)
                    break
                except (SystemExit, OSError):
                    if time.time() > deadline:
                        raise
                    time.sleep(0.2)
            runner = children(gw.pid)
            out = {}
            for path in ["/plain", "/pre", "/plain", "/pre"]:
                drive(port, path, 200)  # warm up
                g0 = cpu(gw.pid)
                r0 = sum(cpu(p) for p in runner)
                t0 = time.time()
                drive(port, path, args.requests)
                wall = time.time() - t0
                g = (cpu(gw.pid) - g0) / args.requests * 1e6
                r = (sum(cpu(p) for p in runner) - r0) / args.requests * 1e6
                out.setdefault(path, []).append((g, r, args.requests / wall))
            build = "debug" if "/debug/" in args.bin else "release"
            print(f"ferrisix {build} build, one worker, {args.requests} keep-alive requests per run")
            for path, runs in out.items():
                for g, r, rps in runs:
                    print(f"{path:7} gateway {g:7.1f} us CPU/request   runner {r:7.1f} us   {rps:7.0f} req/s")
        finally:
            gw.terminate()
            gw.wait(timeout=10)
            up.shutdown()


if __name__ == "__main__":
    main()
