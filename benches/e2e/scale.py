#!/usr/bin/env python3
"""Scale benchmark: how ferrisix behaves with N routes, and what one change costs.

For each N it starts an nginx upstream and a ferrisix node (embedded store, or etcd), loads N
routes of a realistic mix (half exact URIs `/r<i>/exact`, half prefixes `/p<i>/*`, a host on
every fifth, methods on every seventh, an inline roundrobin upstream on each), and reports:

  load      Admin PUTs/s with 16 concurrent clients (embedded store; with etcd the routes go
            straight into etcd in APISIX's layout, as an APISIX control plane would write them)
  served    PUT -> served p50/p99: a route's uri is changed through the Admin API and a client
            polls the data port until the new uri answers (50 changes, one at a time)
  compile   the gateway's own figures per applied change (`configuration applied ...`): its
            wall time (`elapsed_us`), and its CPU time (`cpu_us`: the compile runs at nice +10,
            so its wall time stretches whenever other threads keep both cores busy)
  rss       resident memory idle (no routes) and loaded (1 s after the load, and settled 3 s
            after it), and per route
  boot      a restart with the N routes already stored: start to the last route serving, and
            the RSS then (at once, and 3 s later: settled)
  list      `GET /apisix/admin/routes?page=1&page_size=10` p50
  churn     wrk p99 of a routed request idle, and while 50 changes per second land, in
            alternating 5 s windows (--churn-rounds, default 5) after a warm-up window, medians
            and their ratio; also while as many Admin reads (GETs) land, from the same client
            threads: the client's and the Admin API's share with no change applied;
            with etcd also while as many writes land in etcd outside the node's prefix
  delete    then (without --service-fanout or --no-delete) every route DELETEd through the Admin API with
            16 clients: DELETEs/s, and the RSS 3 s after the empty table is served
  fan-out   with --service-fanout M (after the above): M more routes use one service; the
            service's plugins change 5 times, and each change is timed from the PUT to the
            last of those routes answering with it (and its compile), then 100 of the M
            routes, picked at random, must all answer with the last change

Ports are picked at random, so it runs beside other gateways (and the conformance runner).

Usage: benches/e2e/scale.py [--binary target/release/ferrisix] [--routes 1000,10000]
                            [--store embedded|etcd] [--json out.json] [--markdown out.md]
                            [--service-fanout 50000] [--etcd-nice 19] [--no-delete]
"""

import argparse
import base64
import http.client
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import free_port, rss_kib  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ADMIN_KEY = "scale-bench-admin-key"
CLIENTS = 16


def pct(values, p):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


def start_upstream(work):
    port = free_port()
    conf = os.path.join(work, "upstream.conf")
    with open(conf, "w") as f:
        f.write(harness.nginx_main(work, "upstream", "worker_connections 4096;") + f"""http {{
    access_log off;
    server {{
        listen 127.0.0.1:{port} reuseport;
        keepalive_requests 1000000;
        location / {{ return 200 "ok\\n"; }}
    }}
}}
""")
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    p = subprocess.Popen([nginx, "-c", conf, "-p", work], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    harness.wait_port(port, timeout=60.0)
    return p, port


def start_etcd(work, nice=0):
    """`nice`: etcd's CPU priority. On a machine too small to give etcd cores of its own, a
    lower priority is the nearest stand-in (it still shares the cores): see --etcd-nice."""
    client, peer = free_port(), free_port()
    p = subprocess.Popen(
        (["nice", "-n", str(nice)] if nice else []) + ["etcd", "--data-dir", os.path.join(work, "etcd"), "--listen-client-urls",
         f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls",
         f"http://127.0.0.1:{peer}", "--initial-cluster", f"default=http://127.0.0.1:{peer}",
         "--quota-backend-bytes", str(8 * 1024 ** 3)],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "etcd.log"), "w"))
    harness.wait_port(client, timeout=60.0)
    return p, client


class Gateway:
    def __init__(self, work, binary, store, etcd_port=None):
        self.work, self.binary, self.store, self.etcd_port = work, binary, store, etcd_port
        self.data, self.admin = free_port(), free_port()
        self.metrics, self.control = free_port(), free_port()
        self.log_path = os.path.join(work, "ferrisix.log")
        self.proc = None

    def config(self):
        provider = "etcd" if self.store == "etcd" else "embedded"
        etcd = (f"    host:\n      - \"http://127.0.0.1:{self.etcd_port}\"\n"
                if self.store == "etcd" else "")
        return f"""apisix:
  node_listen:
    - ip: 127.0.0.1
      port: {self.data}
  enable_admin: true
  enable_control: false
  ssl:
    enable: false
deployment:
  role: traditional
  role_traditional:
    config_provider: {provider}
  etcd:
{etcd}    prefix: /apisix
    timeout: 30
  admin:
    admin_listen: {{ip: 127.0.0.1, port: {self.admin}}}
    admin_key:
      - name: admin
        key: {ADMIN_KEY}
        role: admin
ferrisix:
  data_dir: {self.work}/data
plugin_attr:
  prometheus:
    export_addr: {{ip: 127.0.0.1, port: {self.metrics}}}
nginx_config:
  worker_processes: 1
  http:
    access_log: off
"""

    def start(self):
        conf = os.path.join(self.work, "config.yaml")
        with open(conf, "w") as f:
            f.write(self.config())
        started = time.time()
        self.proc = subprocess.Popen([self.binary, "-c", conf], cwd=self.work,
                                     stdout=subprocess.DEVNULL,
                                     stderr=open(self.log_path, "a"),
                                     env=dict(os.environ, RUST_LOG="info"))
        harness.wait_port(self.data, timeout=60.0)
        harness.wait_port(self.admin, timeout=60.0)
        return started

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def stage_times_us(self, field):
        """Every `configuration applied` line's `field` (µs) logged so far, where it has one
        (`queued_us`, `applied_us`, `validate_us`...: newer builds)."""
        out = []
        with open(self.log_path, errors="replace") as f:
            for line in f:
                if "configuration applied" not in line:
                    continue
                m = re.search(field + r"[=:]\s*(\d+)", line)
                if m:
                    out.append(int(m.group(1)))
        return out

    def routes_applied(self):
        """The route count of the last `configuration applied` line, if any."""
        found = None
        with open(self.log_path, errors="replace") as f:
            for line in f:
                if "configuration applied" in line:
                    m = re.search(r"routes[=:]\s*(\d+)", line)
                    if m:
                        found = int(m.group(1))
        return found

    def boot_line(self):
        """The fields of the last `first configuration compiled` line (newer builds)."""
        found = {}
        with open(self.log_path, errors="replace") as f:
            for line in f:
                if "first configuration compiled" in line:
                    found = {k: int(v) for k, v in re.findall(r"(\w+_us)=(\d+)", line)}
        return found

    def compile_times_us(self):
        """Every `configuration applied` figure logged so far (µs; ms on older builds)."""
        out = []
        with open(self.log_path, errors="replace") as f:
            for line in f:
                if "configuration applied" not in line:
                    continue
                m = re.search(r"elapsed_us[=:]\s*(\d+)", line)
                if m:
                    out.append(int(m.group(1)))
                    continue
                m = re.search(r"elapsed_ms[=:]\s*(\d+)", line)
                if m:
                    out.append(int(m.group(1)) * 1000)
        return out


def route_body(i, upstream_port, uri=None):
    body = {
        "uri": uri or (f"/r{i}/exact" if i % 2 == 0 else f"/p{i}/*"),
        "upstream": {"type": "roundrobin", "nodes": {f"127.0.0.1:{upstream_port}": 1}},
    }
    if i % 5 == 0:
        body["host"] = f"h{i}.example.com"
    if i % 7 == 0:
        body["methods"] = ["GET", "POST"]
    return body


# The route whose requests the churn windows time; no paced write ever touches it.
PROBED = 1


def probe_path(i):
    return f"/r{i}/exact" if i % 2 == 0 else f"/p{i}/x"


def probe_host(i):
    return f"h{i}.example.com" if i % 5 == 0 else "localhost"


class Client:
    """One keep-alive HTTP/1.1 connection."""

    def __init__(self, port):
        self.port = port
        self.conn = None
        self.last_headers = {}

    def request(self, method, path, body=None, headers=None):
        for attempt in range(3):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                self.conn.request(method, path, body=body, headers=headers or {})
                r = self.conn.getresponse()
                data = r.read()
                self.last_headers = r.headers
                return r.status, data
            except (http.client.HTTPException, OSError):
                if self.conn:
                    self.conn.close()
                self.conn = None
                if attempt == 2:
                    raise
        return None, None


def admin_put(client, i, body):
    status, data = client.request("PUT", f"/apisix/admin/routes/{i}", json.dumps(body),
                                  {"X-API-KEY": ADMIN_KEY, "Content-Type": "application/json"})
    if status not in (200, 201):
        raise RuntimeError(f"PUT routes/{i}: {status} {data[:200]!r}")


def put_all(port, n, put):
    """Calls `put(client, i)` for i in 0..n from 16 clients (each its own keep-alive
    connection to `port`); raises the first failure; returns the calls per second."""
    next_id = [0]
    lock = threading.Lock()
    errors = []

    def worker():
        c = Client(port)
        while True:
            with lock:
                i = next_id[0]
                next_id[0] += 1
            if i >= n:
                return
            try:
                put(c, i)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(str(e))
                return

    started = time.time()
    threads = [threading.Thread(target=worker) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(errors[0])
    return n / (time.time() - started)


def load_admin(gw, n, upstream_port):
    """PUTs n routes with 16 clients; returns PUTs/s."""
    return put_all(gw.admin, n, lambda c, i: admin_put(c, i, route_body(i, upstream_port)))


def admin_delete(client, i):
    status, data = client.request("DELETE", f"/apisix/admin/routes/{i}", None,
                                  {"X-API-KEY": ADMIN_KEY})
    if status != 200:
        raise RuntimeError(f"DELETE routes/{i}: {status} {data[:200]!r}")


def delete_burst(gw, n):
    """DELETEs the n routes with 16 clients, waits for the gateway to serve an empty table,
    and returns the DELETEs/s and the RSS 3 s later (KiB)."""
    rate = put_all(gw.admin, n, admin_delete)
    end = time.time() + 120
    while gw.routes_applied() != 0:
        if time.time() > end:
            raise RuntimeError("the deletions were not applied within 120 s")
        time.sleep(0.05)
    time.sleep(3.0)
    return rate, rss_kib(gw.proc.pid)


def load_etcd(etcd_port, n, upstream_port):
    """Writes n routes straight into etcd (APISIX's layout) with 16 clients; returns puts/s."""

    def put(c, i):
        body = route_body(i, upstream_port)
        body.update({"id": str(i), "create_time": 1700000000, "update_time": 1700000000})
        req = {"key": base64.b64encode(f"/apisix/routes/{i}".encode()).decode(),
               "value": base64.b64encode(json.dumps(body).encode()).decode()}
        status, data = c.request("POST", "/v3/kv/put", json.dumps(req))
        if status != 200:
            raise RuntimeError(f"etcd put: {status} {data!r}")

    return put_all(etcd_port, n, put)


def wait_served(gw, path, host, timeout=600.0):
    c = Client(gw.data)
    end = time.time() + timeout
    while time.time() < end:
        try:
            status, _ = c.request("GET", path, headers={"Host": host})
        except OSError:
            status = None
        if status == 200:
            return time.time()
        time.sleep(0.0005)
    raise RuntimeError(f"{path} (host {host}) not served within {timeout}s")


def put_to_served(gw, n, upstream_port, samples=50, acks=None):
    """PUT -> served per change (ms); with `acks`, also PUT -> answered appended to it (the
    store's commit and publish: the rest is the compile, the swap and the client's poll)."""
    admin = Client(gw.admin)
    data = Client(gw.data)
    out = []
    for s in range(samples):
        i = (s * 7919 + 13) % n
        uri = f"/moved{i}_{s}"
        body = route_body(i, upstream_port, uri=uri)
        started = time.time()
        admin_put(admin, i, body)
        if acks is not None:
            acks.append((time.time() - started) * 1000)
        while True:
            status, _ = data.request("GET", uri, headers={"Host": probe_host(i)})
            if status == 200:
                break
            if time.time() - started > 60:
                raise RuntimeError(f"change of route {i} not served in 60 s")
        out.append((time.time() - started) * 1000)
        # Put it back so the probes of later stages still find it.
        admin_put(admin, i, route_body(i, upstream_port))
    return out


def fan_body(i):
    return {"uri": f"/fan{i}", "service_id": "fan"}


def fan_service(upstream_port, version):
    return {"upstream": {"type": "roundrobin", "nodes": {f"127.0.0.1:{upstream_port}": 1}},
            "plugins": {"response-rewrite": {"headers": {"set": {"X-Fan": str(version)}}}}}


def service_fanout(gw, m, upstream_port, changes=5, checked=100):
    """Loads a service and `m` routes using it, then times `changes` changes of the service
    (PUT -> the last route answering with it, ms) and checks `checked` random routes."""
    admin = Client(gw.admin)
    headers = {"X-API-KEY": ADMIN_KEY, "Content-Type": "application/json"}

    def put_service(version):
        status, data = admin.request("PUT", "/apisix/admin/services/fan",
                                     json.dumps(fan_service(upstream_port, version)), headers)
        if status not in (200, 201):
            raise RuntimeError(f"PUT services/fan: {status} {data[:200]!r}")

    def version_of(c, i):
        status, _ = c.request("GET", f"/fan{i}")
        return c.last_headers.get("X-Fan") if status == 200 else None

    put_service(0)

    def put_route(c, i):
        status, data = c.request("PUT", f"/apisix/admin/routes/fan{i}",
                                 json.dumps(fan_body(i)), headers)
        if status not in (200, 201):
            raise RuntimeError(f"PUT routes/fan{i}: {status} {data[:200]!r}")

    put_all(gw.admin, m, put_route)
    data = Client(gw.data)
    last = m - 1
    end = time.time() + 600
    while version_of(data, last) != "0":
        if time.time() > end:
            raise RuntimeError("the fan-out routes were not served")
        time.sleep(0.01)
    before = len(gw.compile_times_us())
    stage_fields = ("validate_us", "routes_us", "table_us")
    stages_before = {f: len(gw.stage_times_us(f)) for f in stage_fields}
    served = []
    for v in range(1, changes + 1):
        started = time.time()
        put_service(v)
        while version_of(data, last) != str(v):
            if time.time() - started > 120:
                raise RuntimeError(f"service change {v} not served in 120 s")
            time.sleep(0.0005)
        served.append((time.time() - started) * 1000)
    compiles = [c / 1000 for c in gw.compile_times_us()[before:]]
    stages = {f.replace("_us", "_ms"): [round(v / 1000, 1) for v in gw.stage_times_us(f)[b:]]
              for f, b in stages_before.items()}
    wrong = [i for i in random.sample(range(m), min(checked, m))
             if version_of(data, i) != str(changes)]
    if wrong:
        raise RuntimeError(f"routes {wrong[:5]} do not answer with the last service change")
    return {"routes": m, "changes": changes, "checked": min(checked, m),
            "put_to_served_ms": [round(x, 1) for x in served],
            "compile_ms": [round(x, 1) for x in compiles], "compile_stages": stages}


def list_latency(gw, samples=20):
    c = Client(gw.admin)
    out = []
    for _ in range(samples):
        started = time.time()
        status, _ = c.request("GET", "/apisix/admin/routes?page=1&page_size=10",
                              headers={"X-API-KEY": ADMIN_KEY})
        if status != 200:
            raise RuntimeError(f"list: {status}")
        out.append((time.time() - started) * 1000)
    return out


def wrk_p99(gw, path, seconds=5):
    """wrk's p99 (ms) for `path`, which must answer 200 throughout: a window whose route
    went missing would time 404s (no upstream exchange) and look faster than it is."""
    out = subprocess.run(["wrk", "-t", "1", "-c", "16", "-d", f"{seconds}s", "--latency",
                          f"http://127.0.0.1:{gw.data}{path}"], capture_output=True, text=True)
    bad = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", out.stdout)
    if bad:
        raise RuntimeError(f"{path}: {bad.group(1)} answers were not 2xx in a wrk window")
    m = re.search(r"^\s*99%\s+([\d.]+)(us|ms|s)\s*$", out.stdout, re.M)
    if not m:
        return None
    v, unit = float(m.group(1)), m.group(2)
    return v / 1000 if unit == "us" else v * 1000 if unit == "s" else v


def paced_writes(write, n, rate=50, writers=8):
    """Starts `writers` threads that together call `write(writer, i, seq)` `rate` times per
    second on routes other than the probed one (each thread paces its own share, so a slow
    write does not lower the rate); returns a function that stops them and gives the count."""
    stop = threading.Event()
    done = [0] * writers

    def writer(w):
        k = 0
        started = time.time()
        while not stop.is_set():
            seq = k * writers + w
            # Spread over every route but the probed one.
            i = (seq * 104729) % max(1, n - 1)
            write(w, i + 1 if i >= PROBED else i, seq)
            k += 1
            done[w] = k
            delay = started + k * writers / rate - time.time()
            if delay > 0:
                time.sleep(delay)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()

    def finish():
        stop.set()
        for t in threads:
            t.join()
        return sum(done)

    return finish


def churn_window(gw, n, write, seconds=5):
    """wrk p99 of the probed route while `write` lands 50 times per second; and the rate."""
    finish = paced_writes(write, n)
    started = time.time()
    p99 = wrk_p99(gw, probe_path(PROBED), seconds)
    elapsed = time.time() - started
    return p99, finish() / elapsed


def churn_rounds(gw, n, upstream_port, rounds, etcd_port=None):
    """The request p99 idle and under 50 changes/s, in alternating 5 s windows over `rounds`
    rounds, with the medians: on two shared cores one window's p99 moves 2-5x from the next
    (wrk, the upstream and the worker take turns on them), so single windows cannot be
    compared. With etcd a third window writes as often straight into etcd under a prefix the
    node does not watch: etcd's own share of the cost, with no gateway work."""
    admins = [Client(gw.admin) for _ in range(8)]

    def change(w, i, seq):
        admin_put(admins[w], i, route_body(i, upstream_port, uri=f"/churn{i}_{seq}"))

    def read(w, i, seq):
        status, data = admins[w].request("GET", f"/apisix/admin/routes/{i}", None,
                                         {"X-API-KEY": ADMIN_KEY})
        if status != 200:
            raise RuntimeError(f"GET routes/{i}: {status} {data[:200]!r}")

    elsewhere = None
    if etcd_port:
        raw = [Client(etcd_port) for _ in range(8)]

        def elsewhere(w, i, seq):
            body = route_body(i, upstream_port, uri=f"/churn{i}_{seq}")
            req = {"key": base64.b64encode(f"/elsewhere/routes/{i}".encode()).decode(),
                   "value": base64.b64encode(json.dumps(body).encode()).decode()}
            status, data = raw[w].request("POST", "/v3/kv/put", json.dumps(req))
            if status != 200:
                raise RuntimeError(f"etcd put: {status} {data!r}")

    # A window of as many Admin reads (GETs, through the same client threads): the share of
    # the client and of the Admin API's HTTP on the two cores, with no change applied.
    out = {"idle_rounds": [], "under_changes_rounds": [], "changes_per_s_rounds": [],
           "admin_reads_rounds": []}
    if elsewhere:
        out["etcd_alone_rounds"] = []
    # The first window after the load ran 2-3.5 ms p99 where the next idle ones ran 0.4-0.9
    # (six runs of six on 2026-12-03: caches and pages the load left cold): a warm-up
    # window, kept apart, so that it does not count as one of the idle ones.
    out["warmup"] = wrk_p99(gw, probe_path(PROBED))
    for _ in range(rounds):
        out["idle_rounds"].append(wrk_p99(gw, probe_path(PROBED)))
        p99, rate = churn_window(gw, n, change)
        out["under_changes_rounds"].append(p99)
        out["changes_per_s_rounds"].append(round(rate, 1))
        out["admin_reads_rounds"].append(churn_window(gw, n, read)[0])
        if elsewhere:
            out["etcd_alone_rounds"].append(churn_window(gw, n, elsewhere)[0])
    for key in [k for k in out if k.endswith("_rounds")]:
        values = [v for v in out[key] if v is not None]
        out[key[: -len("_rounds")]] = round(statistics.median(values), 3) if values else None
    if out["idle"] and out["under_changes"]:
        out["ratio"] = round(out["under_changes"] / out["idle"], 2)
    return out


def run_one(args, n, work):
    upstream, up_port = start_upstream(work)
    etcd = etcd_port = None
    if args.store == "etcd":
        etcd, etcd_port = start_etcd(work, args.etcd_nice)
    gw = Gateway(work, args.binary, args.store, etcd_port)
    res = {"routes": n, "store": args.store}
    if args.store == "etcd" and args.etcd_nice:
        res["etcd_nice"] = args.etcd_nice
    try:
        gw.start()
        time.sleep(1.0)
        res["rss_idle_kib"] = rss_kib(gw.proc.pid)
        print(f"[{n}] idle RSS {res['rss_idle_kib']} KiB; loading", file=sys.stderr)
        if args.store == "etcd":
            res["load_puts_per_s"] = round(load_etcd(etcd_port, n, up_port), 1)
        else:
            res["load_puts_per_s"] = round(load_admin(gw, n, up_port), 1)
        last = n - 1
        wait_served(gw, probe_path(last), probe_host(last))
        time.sleep(1.0)
        res["rss_loaded_kib"] = rss_kib(gw.proc.pid)
        res["bytes_per_route"] = round(
            (res["rss_loaded_kib"] - res["rss_idle_kib"]) * 1024 / n)
        # And settled, as after the boot: 3 s after the load, past the allocator's purge
        # delay and the follower's settle nudge, what the routes hold rather than what the
        # load's compiles freed a moment ago.
        time.sleep(2.0)
        res["rss_loaded_settled_kib"] = rss_kib(gw.proc.pid)
        res["bytes_per_route_settled"] = round(
            (res["rss_loaded_settled_kib"] - res["rss_idle_kib"]) * 1024 / n)
        print(f"[{n}] loaded at {res['load_puts_per_s']}/s, RSS {res['rss_loaded_kib']} KiB",
              file=sys.stderr)

        before = len(gw.compile_times_us())
        before_stages = {f: len(gw.stage_times_us(f)) for f in ("queued_us", "applied_us", "cpu_us")}
        acks = []
        served = put_to_served(gw, n, up_port, acks=acks)
        compiles = gw.compile_times_us()[before:]
        stages = {"put_answered_ms": acks}
        for f, b in before_stages.items():
            stages[f.replace("_us", "_ms")] = [v / 1000 for v in gw.stage_times_us(f)[b:]]
        res["stages"] = {k: {"p50": round(pct(v, 50), 3), "p99": round(pct(v, 99), 3)}
                         for k, v in stages.items() if v}
        res["put_to_served_ms"] = {"p50": round(pct(served, 50), 2),
                                   "p99": round(pct(served, 99), 2)}
        res["compile_per_change_ms"] = {"p50": round(pct(compiles, 50) / 1000, 3),
                                        "p99": round(pct(compiles, 99) / 1000, 3),
                                        "count": len(compiles)}
        lists = list_latency(gw)
        res["list_10_ms"] = {"p50": round(pct(lists, 50), 2), "p99": round(pct(lists, 99), 2)}
        res["request_p99_ms"] = churn_rounds(gw, n, up_port, args.churn_rounds, etcd_port)
        print(f"[{n}] {json.dumps(res)}", file=sys.stderr)

        # Boot with everything stored: start to the last route serving.
        gw.stop()
        started = gw.start()
        wait_served(gw, probe_path(last), probe_host(last))
        res["boot_s"] = round(time.time() - started, 2)
        res["boot_stages_ms"] = {k.replace("_us", "_ms"): round(v / 1000, 1)
                                 for k, v in gw.boot_line().items()}
        # At once, then settled: a boot's transient memory goes back to the system as the
        # blocking threads that read the store and compiled it end (a second after their
        # last job).
        res["rss_at_serving_kib"] = rss_kib(gw.proc.pid)
        time.sleep(3.0)
        res["rss_after_boot_kib"] = rss_kib(gw.proc.pid)
        if args.service_fanout:
            res["service_fanout"] = service_fanout(gw, args.service_fanout, up_port)
            print(f"[{n}] fan-out {json.dumps(res['service_fanout'])}", file=sys.stderr)
        elif not args.no_delete:
            # Every route deleted in a burst: the memory goes back near idle.
            rate, rss = delete_burst(gw, n)
            res["delete_burst"] = {"deletes_per_s": round(rate, 1), "rss_after_kib": rss}
            print(f"[{n}] deleted at {rate:.1f}/s, RSS {rss} KiB", file=sys.stderr)
    finally:
        gw.stop()
        for p in (upstream, etcd):
            if p and p.poll() is None:
                p.terminate()
                p.wait()
    return res


def alone_windows(r):
    """The control windows' p99s (Admin reads alone; etcd writes alone), for the table."""
    p99 = r["request_p99_ms"]
    out = ""
    if p99.get("admin_reads") is not None:
        out += f"; Admin reads alone {p99['admin_reads']} ms"
    if p99.get("etcd_alone") is not None:
        out += f"; etcd alone {p99['etcd_alone']} ms"
    return out


def compile_cpu(r):
    """The compile's CPU time p50 / p99, where the build logs it."""
    cpu = r["stages"].get("cpu_ms")
    return f"({cpu['p50']} / {cpu['p99']} ms) " if cpu else ""


def markdown(results, note):
    lines = [
        "| routes | store | PUT → served p50 / p99 | compile per change p50 / p99 (CPU time) | RSS idle → loaded 1 s / 3 s after the load (per route) | boot | RSS after boot, 3 s later (per route) | Admin PUTs/s (16 clients) | 10-item list p50 | request p99 idle / under 50 changes/s, medians of alternating windows |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['routes']:,} | {r['store']}"
            + (f" (etcd at nice {r['etcd_nice']})" if r.get("etcd_nice") else "")
            + " "
            f"| {r['put_to_served_ms']['p50']} / {r['put_to_served_ms']['p99']} ms "
            f"| {r['compile_per_change_ms']['p50']} / {r['compile_per_change_ms']['p99']} ms "
            f"{compile_cpu(r)}"
            f"| {r['rss_idle_kib'] / 1024:.0f} → {r['rss_loaded_kib'] / 1024:.0f} / "
            f"{r['rss_loaded_settled_kib'] / 1024:.0f} MiB ({r['bytes_per_route'] / 1024:.1f} / "
            f"{r['bytes_per_route_settled'] / 1024:.1f} KiB) "
            f"| {r['boot_s']} s "
            f"| {r['rss_after_boot_kib'] / 1024:.0f} MiB "
            f"({(r['rss_after_boot_kib'] - r['rss_idle_kib']) / r['routes']:.1f} KiB) "
            f"| {r['load_puts_per_s']} | {r['list_10_ms']['p50']} ms "
            f"| {r['request_p99_ms']['idle']} / {r['request_p99_ms']['under_changes']} ms "
            f"({r['request_p99_ms'].get('ratio')}x{alone_windows(r)}) |")
    for r in results:
        f, d = r.get("service_fanout"), r.get("delete_burst")
        if f:
            lines += ["", (
                f"Service used by {f['routes']:,} routes ({r['routes']:,} others, {r['store']}): "
                f"PUT → served {', '.join(str(x) for x in f['put_to_served_ms'])} ms; "
                f"compile {', '.join(str(x) for x in f['compile_ms'])} ms; "
                f"{f['checked']} random routes checked.")]
        if d:
            lines += ["", (
                f"All {r['routes']:,} routes deleted in a burst ({r['store']}): "
                f"{d['deletes_per_s']} DELETEs/s; RSS 3 s after the empty table serves "
                f"{d['rss_after_kib'] / 1024:.0f} MiB (idle {r['rss_idle_kib'] / 1024:.0f}, "
                f"loaded {r['rss_loaded_kib'] / 1024:.0f}).")]
    if note:
        lines.append("")
        lines.append(note)
    return "\n".join(lines)


def main():
    # A SIGTERM ends the run through the `finally`s, which stop the processes it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "ferrisix"))
    ap.add_argument("--routes", default="1000,10000")
    ap.add_argument("--store", choices=["embedded", "etcd"], default="embedded")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    ap.add_argument("--note", default="")
    ap.add_argument("--churn-rounds", type=int, default=5,
                    help="alternating idle / under-changes windows for the request p99")
    ap.add_argument("--service-fanout", type=int, default=0, metavar="M",
                    help="then time changes of a service that M more routes use")
    ap.add_argument("--etcd-nice", type=int, default=0, metavar="N",
                    help="run etcd at nice N: on 2 shared cores, a stand-in for etcd on cores "
                         "of its own (the issue's measurement wants those); label the run so")
    ap.add_argument("--no-delete", action="store_true",
                    help="skip the closing delete burst (at a million routes it takes longest)")
    ap.add_argument(
        "--keep-work",
        action="store_true",
        help="leave each N's work directory (config, store, logs) for profiling a boot",
    )
    args = ap.parse_args()
    for tool in ("nginx", "wrk") + (("etcd",) if args.store == "etcd" else ()):
        if not (shutil.which(tool) or os.path.exists(f"/usr/sbin/{tool}")):
            sys.exit(f"{tool} is needed")
    results = []
    for n in [int(x) for x in args.routes.split(",")]:
        work = tempfile.mkdtemp(prefix=f"ferrisix-scale-{n}-")
        try:
            started = time.time()
            r = run_one(args, n, work)
            r["bench_wall_s"] = round(time.time() - started, 1)
            results.append(r)
        finally:
            if args.keep_work:
                print(f"work directory kept: {work}", file=sys.stderr)
            else:
                shutil.rmtree(work, ignore_errors=True)
    md = markdown(results, args.note)
    print(md)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(md + "\n")


if __name__ == "__main__":
    main()
