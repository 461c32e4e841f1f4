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
  wasm-noop    s1's route with a proxy-wasm plugin that does nothing (tests/wasm/src/noop.ts,
               AssemblyScript built by tests/wasm/build.sh): what a wasm plugin costs a request
  wasm-header  s1's route with a proxy-wasm plugin that adds a request header
               (tests/wasm/src/rewrite.ts with one `req_headers` entry)
  ext-pre-req  s1's route with ext-plugin-pre-req: a round trip per request to the test runner
               (tests/e2e/ext_plugin_runner.py, a6pluginprotos from PyPI) that answers
               "no action", started by config.yaml's `ext-plugin.cmd`
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
                            [--scenarios s1,s2,s1c,route,tls,tls-hs,h2,key-auth,jwt,http-logger,big,upload,
                            wasm-noop,wasm-header,ext-pre-req] [--json out.json] [--markdown out.md]
                            [--baseline BINARY] [--pin auto|split|none]
                            [--apisix URL --apisix-admin URL --apisix-key KEY]
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (  # noqa: E402  (benches/e2e/harness.py: what the benchmarks share)
    ROOT, CLK_TCK, FERRISIX_PORT, FERRISIX_ADMIN, NGINX_PROXY_PORT, FERRISIX_TLS_PORT,
    NGINX_TLS_PORT, TLS_SCENARIOS, BODY_PATHS, BASELINE_PORT, BASELINE_ADMIN, FLOOR_PORT,
    S2_PLUGINS, AUTH_SCENARIOS, put_consumers, ROUTE_PLUGINS, ensure_tools, ensure_h2load,
    make_certificate, put_ssl, nginx_bin, wait_port, cpu_ticks, rss_kib, children,
    taskset_prefix, nginx_main, start_upstream, nginx_s1_http, floor_command, start_ferrisix,
    put_body_route, put_route, parse_wrk, run_wrk, run_h2load, parse_h2load,
)


# The custom-plugin scenarios (issue 43): each against s1, the plugin's own cost per request.
CUSTOM_PLUGINS = {
    "wasm-noop": {"wasm-noop": {"conf": "-"}},
    "wasm-header": {"wasm-header": {"conf": {"req_headers": [{"name": "x-wasm", "value": "1"}]}}},
    "ext-pre-req": {"ext-plugin-pre-req": {"conf": [{"name": "mode", "value": "continue"}]}},
}
SCENARIO_PLUGINS = {"s2": S2_PLUGINS, "route": ROUTE_PLUGINS, **CUSTOM_PLUGINS}


def custom_plugins_config(scenarios):
    """config.yaml's `wasm.plugins` and `ext-plugin.cmd` for the custom-plugin scenarios asked
    for (nothing otherwise): the modules built from source, the runner started by the gateway."""
    asked = [s for s in scenarios if s in CUSTOM_PLUGINS]
    if not asked:
        return ""
    out = ""
    if any(s.startswith("wasm-") for s in asked):
        wasm = os.path.join(ROOT, "tests", "wasm")
        if not os.path.exists(os.path.join(wasm, "node_modules", ".bin", "asc")):
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=wasm, check=True,
                           stdout=subprocess.DEVNULL)
        subprocess.run(["bash", os.path.join(wasm, "build.sh")], check=True,
                       stderr=subprocess.DEVNULL)
        out += "wasm:\n  plugins:\n"
        for name, file in (("wasm-noop", "noop"), ("wasm-header", "rewrite")):
            out += (f"    - name: {name}\n      priority: 7999\n"
                    f"      file: {os.path.join(wasm, 'build', file + '.wasm')}\n")
    if "ext-pre-req" in asked:
        runner = os.path.join(ROOT, "tests", "e2e", "ext_plugin_runner.py")
        out += f"ext-plugin:\n  cmd: [\"python3\", \"{runner}\"]\n"
    return out

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


def drop_page_cache(path):
    """Asks the kernel to drop `path`'s clean pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


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


def start_floor(cores, binary):
    """examples/hyper_floor.rs on the proxies' cores."""
    p = subprocess.Popen(taskset_prefix(cores) + floor_command(binary))
    wait_port(FLOOR_PORT)
    return p


S1C_CHECKS = {"active": {"http_path": "/hello", "healthy": {"interval": 1},
                         "unhealthy": {"interval": 1}}}


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
        custom = custom_plugins_config(args.scenarios.split(","))
        fx = start_ferrisix(work, cores["proxy"], args.binary, http2=args.http2 == "on",
                            extra_config=custom)
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
                                http2=args.http2 == "on", extra_config=custom)
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
    for name in CUSTOM_PLUGINS:
        c = res.get(name, {}).get("ferrisix")
        if s1 and c:
            lines.append(f"{name} / s1 CPU per request (ferrisix): {c['cpu_us_per_req'] / s1['cpu_us_per_req']:.2f}× "
                         f"(+{c['cpu_us_per_req'] - s1['cpu_us_per_req']:.1f} µs)")
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
