#!/usr/bin/env python3
"""Tries to make a ferrisix node on etcd stop following changes (the symptom seen once in a
conformance run under heavy load: every later route answered 404).

Starts its own etcd and a ferrisix node (FERRISIX_BIN, default target/debug/ferrisix) on
random loopback ports, with a short watch_timeout, and for --seconds does what a conformance
run does, a case at a time: PUT a route, wait until the data plane serves it, DELETE it, wait
until it answers 404. Meanwhile, by turns: etcd compacts its history to the current revision;
etcd is frozen (SIGSTOP) past the watch timeout and thawed, so the watch is declared broken
and restarted; etcd is restarted; the node's control thread is starved by the load the
caller adds (e.g. wrk on the same machine). A route not served (or not gone) within
--limit seconds is a failure; the run ends with the counts and the node's log lines about
etcd. Not part of CI (it runs for minutes).
"""

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, limit=30):
    deadline = time.time() + limit
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def request(port, method, path, body=None, headers=None, timeout=5):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body, headers or {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--limit", type=float, default=5.0)
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    binary = os.environ.get("FERRISIX_BIN", os.path.join(root, "target/debug/ferrisix"))
    work = tempfile.mkdtemp(prefix="ferrisix-etcd-repro.")
    cp, pp = free_port(), free_port()
    data, admin, control, metrics, upstream = (free_port() for _ in range(5))
    etcd_cmd = ["etcd", "--data-dir", f"{work}/etcd", "--listen-client-urls", f"http://127.0.0.1:{cp}",
                "--advertise-client-urls", f"http://127.0.0.1:{cp}", "--listen-peer-urls", f"http://127.0.0.1:{pp}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{pp}", "--initial-cluster", f"default=http://127.0.0.1:{pp}"]
    etcd_log = open(f"{work}/etcd.log", "ab")
    etcd = subprocess.Popen(etcd_cmd, stdout=etcd_log, stderr=etcd_log)
    wait_port(cp)
    key = "repro-admin-key"
    with open(f"{work}/config.yaml", "w") as f:
        f.write(f"""apisix:
  node_listen:
    - ip: 127.0.0.1
      port: {data}
  control:
    ip: 127.0.0.1
    port: {control}
  ssl:
    enable: false
deployment:
  role: traditional
  role_traditional:
    config_provider: etcd
  etcd:
    host:
      - "http://127.0.0.1:{cp}"
    prefix: /apisix
    timeout: 3
    watch_timeout: 4
  admin:
    admin_listen:
      ip: 127.0.0.1
      port: {admin}
    admin_key:
      - name: admin
        key: {key}
        role: admin
plugin_attr:
  prometheus:
    export_addr:
      ip: 127.0.0.1
      port: {metrics}
nginx_config:
  worker_processes: 1
  http:
    access_log: "off"
ferrisix:
  data_dir: {work}/data
""")
    gw_log = open(f"{work}/ferrisix.log", "ab")
    env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "info"))
    gw = subprocess.Popen([binary, "-c", f"{work}/config.yaml"], stdout=gw_log, stderr=gw_log, env=env)
    wait_port(admin)
    wait_port(data)
    hdr = {"X-API-KEY": key, "Content-Type": "application/json"}
    # Any upstream will do: a 502 still proves the route matched; 404 is the symptom.
    route = lambda uri: json.dumps({"uri": uri, "upstream": {"type": "roundrobin", "nodes": {f"127.0.0.1:{upstream}": 1}}})

    def served(uri):
        try:
            return request(data, "GET", uri, timeout=2)[0] != 404
        except OSError:
            return None

    def wait_until(want, uri):
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.limit:
            if served(uri) is want:
                return time.monotonic() - t0
            time.sleep(0.01)
        return None

    def etcd_revision():
        s, body = request(cp, "POST", "/v3/kv/range", json.dumps({"key": "AA=="}))
        return int(json.loads(body)["header"]["revision"])

    stats = {"cases": 0, "put_not_served": 0, "delete_not_gone": 0, "admin_errors": 0,
             "compactions": 0, "freezes": 0, "etcd_restarts": 0}
    worst = 0.0
    started = time.monotonic()
    i = 0
    while time.monotonic() - started < args.seconds:
        i += 1
        uri = f"/case-{i}"
        try:
            status, body = request(admin, "PUT", f"/apisix/admin/routes/r{i}", route(uri), hdr)
        except OSError as e:
            status, body = 0, str(e).encode()
        if status not in (200, 201):
            stats["admin_errors"] += 1
            time.sleep(0.2)
            continue
        stats["cases"] += 1
        took = wait_until(True, uri)
        if took is None:
            stats["put_not_served"] += 1
            print(f"case {i}: PUT not served within {args.limit} s", flush=True)
        else:
            worst = max(worst, took)
        try:
            request(admin, "DELETE", f"/apisix/admin/routes/r{i}", None, hdr)
        except OSError:
            stats["admin_errors"] += 1
        if wait_until(False, uri) is None:
            stats["delete_not_gone"] += 1
            print(f"case {i}: DELETE still served after {args.limit} s", flush=True)
        # The disturbances, by turns.
        if i % 25 == 0:
            try:
                rev = etcd_revision()
                request(cp, "POST", "/v3/kv/compaction", json.dumps({"revision": rev, "physical": True}))
                stats["compactions"] += 1
            except OSError:
                pass
        if i % 60 == 30:
            etcd.send_signal(signal.SIGSTOP)
            time.sleep(6)  # past watch_timeout (4 s)
            etcd.send_signal(signal.SIGCONT)
            stats["freezes"] += 1
        if i % 150 == 100:
            etcd.terminate()
            etcd.wait()
            time.sleep(1)
            etcd = subprocess.Popen(etcd_cmd, stdout=etcd_log, stderr=etcd_log)
            wait_port(cp)
            stats["etcd_restarts"] += 1
    print(json.dumps(dict(stats, slowest_ms=round(worst * 1000, 1),
                          seconds=round(time.monotonic() - started), load=os.getloadavg())), flush=True)
    gw.terminate()
    gw.wait()
    etcd.terminate()
    etcd.wait()
    with open(f"{work}/ferrisix.log", errors="replace") as f:
        lines = [l.rstrip() for l in f if "etcd" in l and ("WARN" in l or "ERROR" in l)]
    print(f"{len(lines)} etcd warnings in the node's log; last ones:")
    for l in lines[-8:]:
        print("  " + l)
    print(f"work dir: {work}")
    failed = stats["put_not_served"] + stats["delete_not_gone"]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
