#!/usr/bin/env python3
"""The pieces the end-to-end benchmarks share, and the release build's training with them: the
fixed ports, the nginx upstream on 127.0.0.1:1980 and its certificate, a ferrisix started with
the benchmark's config.yaml, the Admin API calls that put the scenarios' routes, consumers and
certificate, wrk and h2load runs and their parsing, and process helpers (waiting for a port,
free ports, CPU ticks, RSS).

Imported by bench.py, instructions.py, scale.py, kill.py, health_cpu.py and by
scripts/release/pgo_train.py and startup_order.py: one copy of each helper, so that the
benchmark and the release build's training drive the gateway the same way.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    """A port of 127.0.0.1 that was free when asked (bind to 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def stop_all(procs):
    """SIGTERM to every process started (the last first), then waits; a process still running
    after 10 s is killed."""
    for p in reversed(procs):
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


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


def floor_command(binary):
    """examples/hyper_floor.rs's command line: FLOOR_PORT to the benchmark's upstream."""
    return [binary, f"127.0.0.1:{FLOOR_PORT}", f"127.0.0.1:{UPSTREAM_PORT}"]


def start_ferrisix(work, cores, binary, baseline=False, http2=True, wrapper=(), wait=20.0,
                   extra_config=""):
    """With `baseline`: the A/B's second gateway, on its own ports, without TLS, control API or
    metrics export (they would clash with the first's). `http2` is `apisix.enable_http2`;
    `wrapper` runs the binary under a tool (startup_order.py's callgrind); `extra_config` is
    appended to config.yaml (top-level keys, e.g. bench.py's `wasm` and `ext-plugin`)."""
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
{extra_config}""")
    # It runs in `work`: a path relative to the caller's directory would not resolve there.
    binary = os.path.abspath(binary)
    p = subprocess.Popen(taskset_prefix(cores) + list(wrapper) + [binary, "-c", conf], cwd=work,
                         stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "ferrisix.log"), "w"))
    wait_port(port, timeout=wait)
    wait_port(admin, timeout=wait)
    return p


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
