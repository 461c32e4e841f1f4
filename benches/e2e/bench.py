#!/usr/bin/env python3
"""End-to-end benchmark in the shape of APISIX's benchmark/run.sh.

An nginx upstream (1 worker) answers on 127.0.0.1:1980; ferrisix (1 worker) and a baseline
nginx proxy_pass (1 worker, upstream keepalive, buffered access log) each proxy /hello to it.
`wrk -c 16 -d 5` loads each target in turn, interleaved over rounds, for each scenario:
  s1  route /hello, no plugins
  s2  route /hello with limit-count (count 2e12, window 60, 503, key remote_addr) + prometheus
  route  a realistic route /hello: proxy-rewrite headers + cors + request-id + ip-restriction
         (wrk sends an Origin), compared with s1 by CPU per request
  tls     s1 over TLS 1.3 with keep-alive (one ECDSA P-256 certificate, the same file for both)
  tls-hs  s1 over TLS with a new connection (a full handshake) per request: handshakes/s
  h2      s1 over TLS h2, 16 streams on one connection (h2load from Debian's nghttp2-client)
  s1c s1 with a `checks` block on the upstream (active probes of /hello every second); with
      --baseline the baseline gateway serves s1 without checks, measured interleaved (A/B)
  key-auth  s1's route with key-auth, 10,000 key-auth consumers in the store
  jwt       s1's route with jwt-auth, an HS256 token of one consumer
  big     s1 with a 256 KiB answer (a static file of the upstream): what a step costs the
          bodies a request-path change may copy
  upload  s1 with a 256 KiB POST body (the upstream discards it)
  http-logger  s1's route with http-logger (the default entry, batch_max_size 1000) posting to
         an in-bench HTTP sink that counts the entries: CPU per request against s1, and the
         sink's count checked against wrk's in every round (wrk does not count the answers
         still in flight on its connections at its deadline: those are logged too, so the
         sink may hold up to --connections more, never fewer)
For every run it reads req/s and latency from wrk and the proxy's CPU time (user+sys of all its
processes, from /proc) and reports medians and ratios against nginx as a markdown table and JSON,
with how busy the proxy was (its CPU time over the run's).

Placement (--pin): with 4 CPUs or more the upstream, the proxy and wrk each get cores of their
own; on fewer they share them, as APISIX's benchmark does. `--pin split` puts the proxy alone
on the last core and the upstream and wrk on the others: on a 2-core machine the proxy's core
is then the bottleneck (req/s follows CPU per request), and wrk's threads no longer wait
behind a busy proxy on a shared core for the scheduler's next tick, which is most of what a
shared run's p99 measures (README, "The p99 on a shared machine").

With --baseline BINARY a second ferrisix (another build, e.g. the commit before a change)
runs beside the first on ports 9082/9182 and is measured interleaved with it in the same
rounds of the plain scenarios (s1, s2): the A/B figures come from one run.

It measures the profile-guided release build (scripts/build-release.sh, built first unless
--no-build); --plain measures the plain `cargo build --release` instead.

Usage: benches/e2e/bench.py [--rounds 3] [--duration 5] [--connections 16] [--threads 2]
                            [--scenarios s1,s2,s1c,route,tls,tls-hs,h2,key-auth,jwt,http-logger,big,upload] [--json out.json] [--markdown out.md]
                            [--baseline BINARY] [--pin auto|split|none]
                            [--apisix URL --apisix-admin URL --apisix-key KEY]
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLK_TCK = os.sysconf("SC_CLK_TCK")

UPSTREAM_PORT = 1980
FERRISIX_PORT = 9080
FERRISIX_ADMIN = 9180
NGINX_PROXY_PORT = 9081
FERRISIX_TLS_PORT = 9443
NGINX_TLS_PORT = 9444
TLS_SCENARIOS = ("tls", "tls-hs", "h2")
# The large-body scenarios: their path on every target (the gateways' route lists both).
BODY_PATHS = {"big": "/big", "upload": "/upload"}
BODY_BYTES = 256 * 1024
BASELINE_PORT = 9082
BASELINE_ADMIN = 9182
# --floor: examples/hyper_floor.rs, the least a proxy on hyper's two codecs does per request.
FLOOR_PORT = 9083

S2_PLUGINS = {
    "limit-count": {
        "count": 2000000000000,
        "time_window": 60,
        "rejected_code": 503,
        "key": "remote_addr",
    },
    "prometheus": {},
}

# The auth scenarios (issue 12): s1's route with key-auth, 10,000 consumers in the store, each
# request authenticating as one of them; and with jwt-auth (HS256), one consumer's token.
AUTH_SCENARIOS = ("key-auth", "jwt")
AUTH_CONSUMERS = 10000
JWT_SECRET = "benchmark-jwt-secret"


def hs256_token(key, secret):
    import base64, hashlib, hmac
    b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps({"key": key, "exp": 4102444800}).encode())
    sig = hmac.new(secret.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(sig)}"


def scenario_headers(scenario):
    if scenario == "key-auth":
        return ["-H", f"apikey: bench-key-{AUTH_CONSUMERS // 2}"]
    if scenario == "jwt":
        return ["-H", f"Authorization: Bearer {hs256_token('bench-jwt', JWT_SECRET)}"]
    return []


def admin_put(admin, key, path, doc):
    """PUTs `doc` (JSON) to the Admin API's `path` (e.g. `routes/1`)."""
    req = urllib.request.Request(f"{admin}/apisix/admin/{path}", data=json.dumps(doc).encode(),
                                 method="PUT", headers={"X-API-KEY": key})
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()


def put_consumers(admin, key, count=AUTH_CONSUMERS):
    """`count` key-auth consumers, always with the one whose key the key-auth load sends, and
    one jwt-auth consumer (written once per gateway)."""
    def put(name, plugins):
        admin_put(admin, key, f"consumers/{name}", {"username": name, "plugins": plugins})
    for i in sorted(set(range(count)) | {AUTH_CONSUMERS // 2}):
        put(f"bench{i}", {"key-auth": {"key": f"bench-key-{i}"}})
    put("benchjwt", {"jwt-auth": {"key": "bench-jwt", "secret": JWT_SECRET}})


# The plugins nearly every APISIX route carries (issue 13's realistic route).
ROUTE_PLUGINS = {
    "proxy-rewrite": {"headers": {"set": {"X-Api-Version": "v2", "X-Client-Addr": "$remote_addr"},
                                  "remove": ["X-Debug"]}},
    "cors": {"allow_origins": "http://app.example,http://admin.example"},
    "request-id": {},
    "ip-restriction": {"whitelist": ["127.0.0.0/8", "10.0.0.0/8", "::1"]},
}
SCENARIO_PLUGINS = {"s2": S2_PLUGINS, "route": ROUTE_PLUGINS}

# The http-logger scenario (issue 14): every request's default entry, in batches of 1000, to a
# sink in this process. `inactive_timeout` stays APISIX's 5 s: a round waits for the last batch.
LOG_SINK_INACTIVE_S = 5


class LogSink:
    """An HTTP log sink counting the entries of every POSTed batch (a JSON array or one
    object), on a free port of 127.0.0.1."""

    def __init__(self):
        self.count = 0
        self.batches = 0
        self.bad = 0
        self.last_change = time.monotonic()
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    v = json.loads(body)
                    n = len(v) if isinstance(v, list) else 1
                except ValueError:
                    n = 0
                with sink.lock:
                    sink.count += n
                    sink.batches += 1
                    sink.bad += n == 0
                    sink.last_change = time.monotonic()
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def settle(self, quiet_s=LOG_SINK_INACTIVE_S + 1.5, limit_s=30):
        """Waits until no batch came for `quiet_s` (the processors flushed) and answers the count."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            with self.lock:
                idle = time.monotonic() - self.last_change
            if idle >= quiet_s:
                break
            time.sleep(0.2)
        with self.lock:
            return self.count

    def reset(self):
        with self.lock:
            self.count = self.batches = self.bad = 0


def http_logger_plugins(sink_port):
    return {"http-logger": {"uri": f"http://127.0.0.1:{sink_port}/log", "batch_max_size": 1000,
                            "inactive_timeout": LOG_SINK_INACTIVE_S}}


def ensure_tools():
    missing = [t for t in ("nginx", "wrk") if shutil.which(t) is None and not os.path.exists("/usr/sbin/" + t)]
    if missing:
        print(f"installing {' '.join(missing)} from Debian", file=sys.stderr)
        subprocess.run(["apt-get", "update", "-qq"], check=False)
        subprocess.run(["apt-get", "install", "-y", "-qq"] + missing, check=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def ensure_package(command, package):
    """Installs Debian's `package` when `command` is not on the PATH."""
    if shutil.which(command) is None:
        print(f"installing {package} ({command}) from Debian", file=sys.stderr)
        subprocess.run(["apt-get", "update", "-qq"], check=False)
        subprocess.run(["apt-get", "install", "-y", "-qq", package], check=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def ensure_h2load():
    ensure_package("h2load", "nghttp2-client")


def make_certificate(work):
    """One ECDSA P-256 certificate for bench.local, served by both proxies."""
    crt, key = os.path.join(work, "bench.crt"), os.path.join(work, "bench.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-nodes", "-days", "30", "-subj", "/CN=bench.local", "-addext",
                    "subjectAltName=DNS:bench.local", "-keyout", key, "-out", crt],
                   check=True, capture_output=True)
    return crt, key


def put_ssl(admin, key, crt_path, key_path):
    admin_put(admin, key, "ssls/1", {"sni": "bench.local", "cert": open(crt_path).read(),
                                     "key": open(key_path).read()})


def nginx_bin():
    return shutil.which("nginx") or "/usr/sbin/nginx"


def wait_port(port, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port}")


def cpu_ticks(pids):
    """(user, system) clock ticks of the processes, all their threads."""
    user = system = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            # utime, stime are fields 14 and 15 (1-based) of the full line.
            user += int(fields[11])
            system += int(fields[12])
        except FileNotFoundError:
            pass
    return user, system


def drop_page_cache(path):
    """Asks the kernel to drop `path`'s clean pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def children(pid):
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def taskset_prefix(cores):
    if cores is None or shutil.which("taskset") is None:
        return []
    return ["taskset", "-c", cores]


def nginx_main(work, name, events):
    """The top of an nginx.conf for one worker in the foreground, its pid and error log in
    `work` under `name` (scale.py's upstream uses it too)."""
    return f"""
worker_processes 1;
daemon off;
pid {work}/{name}.pid;
error_log {work}/{name}-error.log;
events {{ {events} }}
"""


def start_upstream(work, cores):
    conf = os.path.join(work, "upstream.conf")
    # The large-body scenarios' file, readable by nginx's unprivileged worker.
    os.chmod(work, 0o755)
    with open(os.path.join(work, "big"), "wb") as f:
        f.write(os.urandom(BODY_BYTES))
    os.chmod(os.path.join(work, "big"), 0o644)
    with open(conf, "w") as f:
        f.write(nginx_main(work, "upstream", "worker_connections 10620; accept_mutex off;") + f"""http {{
  access_log off;
  server {{
    listen 127.0.0.1:{UPSTREAM_PORT} reuseport;
    client_max_body_size 10m;
    client_body_buffer_size 1m;
    location / {{ return 200 "1234567890"; }}
    location = /big {{ alias {work}/big; }}
  }}
}}
""")
    p = subprocess.Popen(taskset_prefix(cores) + [nginx_bin(), "-c", conf, "-p", work],
                         stderr=subprocess.DEVNULL)
    wait_port(UPSTREAM_PORT)
    return p


def nginx_s1_http(work, port):
    """The plain part of nginx's proxy_pass baseline, inside `http {}`: the buffered access
    log, the upstream with keep-alive, and the s1 server on `port` (instructions.py counts
    the same configuration)."""
    return f"""  access_log {work}/proxy-access.log combined buffer=64k flush=1s;
  upstream backend {{
    server 127.0.0.1:{UPSTREAM_PORT};
    keepalive 320;
  }}
  server {{
    listen 127.0.0.1:{port} reuseport;
    # The upload scenario's 256 KiB bodies stay in memory, as ferrisix keeps them.
    client_body_buffer_size 1m;
    location / {{
      # The big scenario's answers pass through memory, not a temporary file.
      proxy_max_temp_file_size 0;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $http_host;
      proxy_set_header X-Real-IP $remote_addr;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_pass http://backend;
    }}
  }}"""


def start_nginx_proxy(work, cores, crt, key):
    conf = os.path.join(work, "proxy.conf")
    with open(conf, "w") as f:
        f.write(nginx_main(work, "proxy", "worker_connections 10620;") + f"""http {{
{nginx_s1_http(work, NGINX_PROXY_PORT)}
  server {{
    # `listen ... http2` works on every nginx (`http2 on;` needs 1.25.1+).
    listen 127.0.0.1:{NGINX_TLS_PORT} ssl http2 reuseport;
    ssl_certificate {crt};
    ssl_certificate_key {key};
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache shared:SSL:20m;
    ssl_session_tickets off;
    # nginx closes an h2 connection after keepalive_requests (1000) requests, which ends
    # h2load's single connection; ferrisix sets no such limit.
    keepalive_requests 1000000;
    location / {{
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $http_host;
      proxy_set_header X-Real-IP $remote_addr;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
      proxy_pass http://backend;
    }}
  }}
}}
""")
    p = subprocess.Popen(taskset_prefix(cores) + [nginx_bin(), "-c", conf, "-p", work],
                         stderr=subprocess.DEVNULL)
    wait_port(NGINX_PROXY_PORT)
    return p


def floor_command(binary):
    """examples/hyper_floor.rs's command line: FLOOR_PORT to the benchmark's upstream."""
    return [binary, f"127.0.0.1:{FLOOR_PORT}", f"127.0.0.1:{UPSTREAM_PORT}"]


def start_floor(cores, binary):
    """examples/hyper_floor.rs on the proxies' cores."""
    p = subprocess.Popen(taskset_prefix(cores) + floor_command(binary))
    wait_port(FLOOR_PORT)
    return p


def start_ferrisix(work, cores, binary, baseline=False, http2=True, wrapper=()):
    """With `baseline`: the A/B's second gateway, on its own ports, without TLS, control API or
    metrics export (they would clash with the first's). `http2` is `apisix.enable_http2`;
    `wrapper` runs the binary under a tool (startup_order.py's callgrind)."""
    port, admin = (BASELINE_PORT, BASELINE_ADMIN) if baseline else (FERRISIX_PORT, FERRISIX_ADMIN)
    if baseline:
        work = os.path.join(work, "baseline")
        os.makedirs(work, exist_ok=True)
        ssl = ("  enable_control: false\nplugin_attr:\n  prometheus:\n"
               "    export_addr: {ip: 127.0.0.1, port: 9093}")
    else:
        ssl = f"""  ssl:
    listen:
      - ip: 127.0.0.1
        port: {FERRISIX_TLS_PORT}
    # wrk and h2load connect to an address and send no SNI.
    fallback_sni: bench.local"""
    conf = os.path.join(work, "config.yaml")
    with open(conf, "w") as f:
        f.write(f"""
apisix:
  enable_http2: {"true" if http2 else "false"}
  node_listen:
    - ip: 127.0.0.1
      port: {port}
{ssl}
deployment:
  role: traditional
  role_traditional:
    config_provider: embedded
  admin:
    admin_listen: {{ip: 127.0.0.1, port: {admin}}}
    admin_key:
      - name: admin
        key: benchmark-admin-key
        role: admin
nginx_config:
  worker_processes: 1
  http:
    access_log: {work}/ferrisix-access.log
ferrisix:
  data_dir: {work}/data
""")
    p = subprocess.Popen(taskset_prefix(cores) + list(wrapper) + [binary, "-c", conf], cwd=work,
                         stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "ferrisix.log"), "w"))
    wait_port(port)
    wait_port(admin)
    return p


S1C_CHECKS = {"active": {"http_path": "/hello", "healthy": {"interval": 1},
                         "unhealthy": {"interval": 1}}}


def put_body_route(admin, key):
    """Route 2: the large-body scenarios' paths, no plugins (s1's route stays APISIX's)."""
    admin_put(admin, key, "routes/2", {
        "uris": list(BODY_PATHS.values()),
        "upstream": {"type": "roundrobin", "nodes": {f"127.0.0.1:{UPSTREAM_PORT}": 1}},
    })


def put_route(admin, key, plugins, checks=None):
    upstream = {"type": "roundrobin", "nodes": {f"127.0.0.1:{UPSTREAM_PORT}": 1}}
    if checks:
        upstream["checks"] = checks
    admin_put(admin, key, "routes/1", {"uri": "/hello", "plugins": plugins, "upstream": upstream})


def parse_wrk(text):
    def dur(v):
        m = re.match(r"([\d.]+)(us|ms|s|m)", v)
        if not m:
            return None  # wrk prints `-nan` and the like when a run has no sample
        n, unit = float(m.group(1)), m.group(2)
        # Rounded to the microsecond, so 827us is 0.827 ms rather than 0.8270000000000001.
        return round(n * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit], 3)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
    total = int(re.search(r"(\d+) requests in", text).group(1))
    lat = re.search(r"Latency\s+(\S+)\s+(\S+)\s+(\S+)", text)
    p99 = re.search(r"99%\s+(\S+)", text)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    errors = re.search(r"Socket errors: (.*)", text)
    return {
        "rps": rps,
        "requests": total,
        "mean_ms": dur(lat.group(1)),
        "p99_ms": dur(p99.group(1)) if p99 else None,
        "non2xx": int(non2xx.group(1)) if non2xx else 0,
        "socket_errors": errors.group(1) if errors else "",
    }


def run_wrk(port, args, cores, scenario="s1"):
    scheme = "https" if scenario in TLS_SCENARIOS else "http"
    extra = ["-H", "Connection: close"] if scenario == "tls-hs" else scenario_headers(scenario)
    if scenario == "route":
        extra = ["-H", "Origin: http://app.example"]
    if scenario == "upload":
        script = os.path.join(tempfile.gettempdir(), f"ferrisix-bench-upload-{os.getpid()}.lua")
        with open(script, "w") as f:
            f.write(f'wrk.method = "POST"\nwrk.body = string.rep("x", {BODY_BYTES})\n'
                    'wrk.headers["Content-Type"] = "application/octet-stream"\n')
        extra = extra + ["-s", script]
    path = BODY_PATHS.get(scenario, "/hello")
    cmd = taskset_prefix(cores) + ["wrk", "-t", str(args.threads), "-c", str(args.connections),
                                   "-d", f"{args.duration}s", "--latency"] + extra + \
        [f"{scheme}://127.0.0.1:{port}{path}"]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def run_h2load(port, args, cores):
    cmd = taskset_prefix(cores) + ["h2load", "-c", "1", "-m", "16", "-t", "1", "-D", str(args.duration),
                                   f"https://127.0.0.1:{port}/hello"]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def parse_h2load(text):
    rps = float(re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", text).group(1))
    m = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded", text)
    mean = re.search(r"time for request:\s+\S+\s+\S+\s+(\S+)", text)
    def ms(v):
        n, unit = re.match(r"([\d.]+)(us|ms|s)", v).groups()
        return round(float(n) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit], 3)
    done, ok = int(m.group(1)), int(m.group(2))
    return {"rps": rps, "requests": done, "mean_ms": ms(mean.group(1)) if mean else None,
            "p99_ms": None, "non2xx": done - ok, "socket_errors": ""}


def measure(name, port, pids, args, cores, scenario="s1"):
    before = cpu_ticks(pids)
    if scenario == "h2":
        r = parse_h2load(run_h2load(port, args, cores))
    else:
        r = parse_wrk(run_wrk(port, args, cores, scenario))
    after = cpu_ticks(pids)
    user_s = (after[0] - before[0]) / CLK_TCK
    system_s = (after[1] - before[1]) / CLK_TCK
    cpu_s = user_s + system_s
    n = max(r["requests"], 1)
    r["cpu_s"] = cpu_s
    # How busy the proxy was: near 100% it is the bottleneck, and its queue is the p99.
    r["busy_pct"] = cpu_s * 100 / max(args.duration, 1)
    r["cpu_us_per_req"] = cpu_s * 1e6 / n
    # The split: both proxies make the same system calls, so the kernel's share moves with
    # the machine, and a request-path step shows in user space.
    r["user_us_per_req"] = user_s * 1e6 / n
    r["sys_us_per_req"] = system_s * 1e6 / n
    r["target"] = name
    return r


def pin_plan(pin, ncpu):
    """(the cores of each process, how the report names the placement) for --pin."""
    if pin == "split" and ncpu >= 2:
        # The proxy measured alone on the last core; the load (wrk and the upstream) on the
        # rest. On a small machine this keeps the load generator's threads from queueing
        # behind a busy proxy on a shared core, which is most of a shared run's p99.
        rest = "0" if ncpu == 2 else f"0-{ncpu - 2}"
        return {"upstream": rest, "proxy": str(ncpu - 1), "wrk": rest}, "split"
    if pin in ("auto", "split") and ncpu >= 4:
        return {"upstream": "0", "proxy": "1", "wrk": "2,3"}, "separate"
    return {"upstream": None, "proxy": None, "wrk": None}, None


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--scenarios", default="s1,s2")
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    ap.add_argument("--binary", help="the gateway measured (default: the profile-guided release "
                    "build, target/pgo/ferrisix; with --plain, target/release/ferrisix)")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--plain", action="store_true",
                    help="build and measure the plain release build instead of the profile-guided "
                         "one (scripts/build-release.sh, ~12 minutes on 2 cores)")
    ap.add_argument("--http2", choices=["on", "off"], default="on",
                    help="apisix.enable_http2 for the gateways (APISIX's default: on; off serves "
                         "HTTP/1 alone, without the protocol detection)")
    ap.add_argument("--pin", choices=["auto", "split", "none"], default="auto",
                    help="auto: the upstream, the proxy and wrk on cores of their own with 4 CPUs "
                         "or more, else unpinned; split: the proxy alone on the last core, the "
                         "upstream and wrk on the others (2 CPUs or more); none: unpinned")
    ap.add_argument("--baseline", help="a second ferrisix binary measured interleaved with the first (A/B)")
    ap.add_argument("--floor", help="examples/hyper_floor.rs built (target/release/examples/"
                    "hyper_floor), measured in s1 next to nginx: what hyper's two codecs cost alone")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    ap.add_argument("--apisix", help="data URL of a running APISIX to add as a third target")
    ap.add_argument("--apisix-admin", help="its Admin API URL")
    ap.add_argument("--apisix-key", help="its admin key")
    args = ap.parse_args()

    ensure_tools()
    if "h2" in args.scenarios.split(","):
        ensure_h2load()
    if args.binary is None:
        args.binary = os.path.join(target, "release" if args.plain else "pgo", "ferrisix")
    if not args.no_build:
        # The shipped binary is the profile-guided build: what a benchmarker should measure.
        build = ("cargo build --release --locked --bin ferrisix"
                 if args.plain else "scripts/build-release.sh")
        subprocess.run(["bash", "-c", build], cwd=ROOT, check=True)

    ncpu = os.cpu_count() or 1
    cores, placement = pin_plan(args.pin, ncpu)

    work = tempfile.mkdtemp(prefix="ferrisix-bench-")
    procs = []
    try:
        procs.append(start_upstream(work, cores["upstream"]))
        crt, key = make_certificate(work)
        ngx = start_nginx_proxy(work, cores["proxy"], crt, key)
        procs.append(ngx)
        # A cold start: what of the binary is resident otherwise depends on how its pages came
        # into the page cache (a freshly linked file read 1.5 MiB less than a copied one).
        drop_page_cache(args.binary)
        fx = start_ferrisix(work, cores["proxy"], args.binary, http2=args.http2 == "on")
        procs.append(fx)
        time.sleep(0.5)
        ngx_pids = [ngx.pid] + children(ngx.pid)
        admin = f"http://127.0.0.1:{FERRISIX_ADMIN}"
        put_ssl(admin, "benchmark-admin-key", crt, key)
        # Idle with one route (issue 16's measure): s1's route and the certificate in place, and
        # 3 s for the boot's threads to end (they hold what the boot freed until 1 s idle).
        put_route(admin, "benchmark-admin-key", {})
        time.sleep(3)
        idle_rss = rss_kib(fx.pid)
        plain_targets = [("nginx", NGINX_PROXY_PORT, ngx_pids), ("ferrisix", FERRISIX_PORT, [fx.pid])]
        admins = [admin]
        if args.baseline:
            fb = start_ferrisix(work, cores["proxy"], args.baseline, baseline=True,
                                http2=args.http2 == "on")
            procs.append(fb)
            plain_targets.append(("ferrisix-baseline", BASELINE_PORT, [fb.pid]))
            admins.append(f"http://127.0.0.1:{BASELINE_ADMIN}")
        if args.floor:
            fl = start_floor(cores["proxy"], args.floor)
            procs.append(fl)
            plain_targets.append(("hyper-floor", FLOOR_PORT, [fl.pid]))
        tls_targets = [("nginx", NGINX_TLS_PORT, ngx_pids), ("ferrisix", FERRISIX_TLS_PORT, [fx.pid])]

        results = {}
        consumers_written = set()
        log_sink = LogSink() if "http-logger" in args.scenarios.split(",") else None
        for scenario in args.scenarios.split(","):
            tls = scenario in TLS_SCENARIOS
            targets = tls_targets if tls else plain_targets
            plugins = SCENARIO_PLUGINS.get(scenario, {})
            if scenario == "http-logger":
                plugins = http_logger_plugins(log_sink.port)
            checks = S1C_CHECKS if scenario == "s1c" else None
            if scenario == "key-auth":
                plugins = {"key-auth": {}}
            elif scenario == "jwt":
                plugins = {"jwt-auth": {}}
            for a in (admins if not tls else [admin]):
                if scenario in AUTH_SCENARIOS and a not in consumers_written:
                    put_consumers(a, "benchmark-admin-key")
                    consumers_written.add(a)
                # s1c with --baseline: the baseline serves plain s1, so the cost of the checks
                # is one interleaved A/B (same binary twice: --baseline target/release/ferrisix).
                own_checks = checks if a == admin else None
                put_route(a, "benchmark-admin-key", plugins, own_checks)
                if scenario in BODY_PATHS:
                    put_body_route(a, "benchmark-admin-key")
            if args.apisix and args.apisix_admin and args.apisix_key:
                put_route(args.apisix_admin, args.apisix_key, plugins, checks)
            time.sleep(1 if scenario in ("s1",) + TLS_SCENARIOS else 3)
            # Warm-up: connections and pools, not measured.
            for _, port, _ in targets:
                scheme = "https" if tls else "http"
                subprocess.run(["wrk", "-t", "1", "-c", "4", "-d", "1s", f"{scheme}://127.0.0.1:{port}/hello"],
                               capture_output=True)
            runs = {name: [] for name, _, _ in targets}
            if args.apisix:
                runs["apisix"] = []
            for rnd in range(args.rounds):
                order = targets if rnd % 2 == 0 else list(reversed(targets))
                for name, port, pids in order:
                    if name == "hyper-floor" and scenario != "s1":
                        continue  # the floor serves s1's request alone
                    if (scenario in SCENARIO_PLUGINS or scenario in ("s1c", "http-logger")
                            or scenario in AUTH_SCENARIOS) and name == "nginx":
                        continue  # nginx has no equivalent of the plugins; these compare with s1
                    if scenario == "http-logger":
                        log_sink.settle()  # the warm-up's or the last round's entries
                        log_sink.reset()
                    r = measure(name, port, pids, args, cores["wrk"], scenario)
                    if scenario == "http-logger":
                        r["logged"] = log_sink.settle()
                        r["log_batches"] = log_sink.batches
                        extra = r["logged"] - r["requests"]
                        # wrk's count leaves out the answers in flight at its deadline.
                        r["logged_ok"] = 0 <= extra <= args.connections and log_sink.bad == 0
                        print(f"http-logger round {rnd + 1} {name}: the sink got {r['logged']} entries "
                              f"in {r['log_batches']} batches for wrk's {r['requests']} requests "
                              f"({'ok' if r['logged_ok'] else 'MISMATCH'})", file=sys.stderr)
                    runs[name].append(r)
                    print(f"{scenario} round {rnd + 1} {name}: {r['rps']:.0f} req/s, "
                          f"{r['cpu_us_per_req']:.1f} us CPU/req, mean {r['mean_ms'] or 0:.3f} ms, "
                          f"p99 {r['p99_ms']} ms, non-2xx {r['non2xx']}", file=sys.stderr)
                    time.sleep(1)
            results[scenario] = {
                name: {
                    "rps": med([r["rps"] for r in rs]),
                    "mean_ms": med([r["mean_ms"] for r in rs]),
                    "p99_ms": med([r["p99_ms"] for r in rs]),
                    "cpu_us_per_req": med([r["cpu_us_per_req"] for r in rs]),
                    "user_us_per_req": med([r["user_us_per_req"] for r in rs]),
                    "sys_us_per_req": med([r["sys_us_per_req"] for r in rs]),
                    "busy_pct": med([r["busy_pct"] for r in rs]),
                    "non2xx": sum(r["non2xx"] for r in rs),
                    **({"logged_ok": all(r["logged_ok"] for r in rs)} if scenario == "http-logger" else {}),
                    "runs": rs,
                }
                for name, rs in runs.items() if rs
            }
        report = {
            "machine": {"cpus": ncpu, "placement": placement, "uname": " ".join(os.uname())},
            "settings": {"rounds": args.rounds, "duration_s": args.duration,
                         "connections": args.connections, "wrk_threads": args.threads},
            "ferrisix_idle_rss_kib": idle_rss,
            "results": results,
        }
        md = render_markdown(report)
        print(md)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=2)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(md)
    finally:
        for p in procs:
            try:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=10)
            except Exception:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)


def render_markdown(report):
    res = report["results"]
    lines = [
        f"Machine: {report['machine']['cpus']} CPUs, "
        + {"separate": "processes pinned to separate cores",
           "split": "the proxies pinned to a core of their own, the upstream and wrk to the others"}
        .get(report["machine"]["placement"], "unpinned: upstream, proxy and wrk share the cores"),
        f"wrk -t {report['settings']['wrk_threads']} -c {report['settings']['connections']} "
        f"-d {report['settings']['duration_s']}s, medians of {report['settings']['rounds']} rounds; "
        f"ferrisix idle RSS (one route, TLS certificate, 3 s idle) "
        f"{report['ferrisix_idle_rss_kib'] / 1024:.1f} MiB",
        "",
        "| scenario | target | req/s | mean ms | p99 ms | CPU µs/req | user / sys µs | busy | req/s vs nginx "
        "| CPU vs nginx |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    s1_nginx = res.get("s1", {}).get("nginx")
    for scenario, targets in res.items():
        # The body scenarios against nginx with the same body; the others against s1's.
        base = targets.get("nginx") if scenario in BODY_PATHS else s1_nginx
        for name, r in targets.items():
            rps_ratio = f"{r['rps'] / base['rps']:.2f}×" if base else "-"
            cpu_ratio = f"{r['cpu_us_per_req'] / base['cpu_us_per_req']:.2f}×" if base else "-"
            p99 = f"{r['p99_ms']:.2f}" if r["p99_ms"] is not None else "-"
            lines.append(f"| {scenario} | {name} | {r['rps']:.0f} | {r['mean_ms']:.3f} | {p99} | "
                         f"{r['cpu_us_per_req']:.1f} | {r['user_us_per_req']:.1f} / "
                         f"{r['sys_us_per_req']:.1f} | {r['busy_pct']:.0f}% | {rps_ratio} | {cpu_ratio} |")
    s1 = res.get("s1", {}).get("ferrisix")
    s2 = res.get("s2", {}).get("ferrisix")
    s1c = res.get("s1c", {}).get("ferrisix")
    if s1 and s1c:
        lines.append(f"s1 with checks / s1 CPU per request (ferrisix): "
                     f"{s1c['cpu_us_per_req'] / s1['cpu_us_per_req']:.3f}×")
    if s1 and s2:
        lines.append("")
        lines.append(f"s2 / s1 CPU per request (ferrisix): {s2['cpu_us_per_req'] / s1['cpu_us_per_req']:.2f}×")
    route = res.get("route", {}).get("ferrisix")
    if s1 and route:
        lines.append(f"route / s1 CPU per request (ferrisix): {route['cpu_us_per_req'] / s1['cpu_us_per_req']:.2f}× "
                     f"(+{route['cpu_us_per_req'] - s1['cpu_us_per_req']:.1f} µs)")
    hl = res.get("http-logger", {}).get("ferrisix")
    if hl:
        if s1:
            lines.append(f"http-logger / s1 CPU per request (ferrisix): {hl['cpu_us_per_req'] / s1['cpu_us_per_req']:.2f}× "
                         f"(+{hl['cpu_us_per_req'] - s1['cpu_us_per_req']:.1f} µs)")
        counts = ", ".join(f"{r['logged']}/{r['requests']}" for r in hl["runs"])
        lines.append(f"http-logger entries at the sink / wrk's requests per round: {counts} "
                     f"({'every request logged once' if hl['logged_ok'] else 'MISMATCH'})")
    for scenario, targets in res.items():
        a, b = targets.get("ferrisix"), targets.get("ferrisix-baseline")
        if a and b:
            lines.append(f"{scenario} A/B CPU per request: {a['cpu_us_per_req']:.2f} vs baseline "
                         f"{b['cpu_us_per_req']:.2f} µs ({(a['cpu_us_per_req'] / b['cpu_us_per_req'] - 1) * 100:+.1f}%); "
                         f"user {a['user_us_per_req']:.2f} vs {b['user_us_per_req']:.2f} µs "
                         f"({(a['user_us_per_req'] / b['user_us_per_req'] - 1) * 100:+.1f}%)")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
