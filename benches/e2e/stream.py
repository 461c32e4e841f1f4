#!/usr/bin/env python3
"""The L4 stream proxy against nginx 1.22's `stream { proxy_pass }`, one worker each, on the
same upstream (issue 41's acceptance harness).

An nginx upstream (1 worker) answers HTTP on one port (`/hello`: `1234567890`; `/bulk`: a
file of --bulk-mib MiB) and UDP on another (`return "pong"` of the stream module: one answer
per datagram). Two proxies stand in front of it, each with 1 worker:

  nginx     `stream { server { listen ...; proxy_pass <upstream>; } }` for TCP and the same
            with `udp` for UDP (Debian's nginx 1.22 with its stream module, libnginx-mod-stream)
  ferrisix  `proxy_mode: stream`, two `stream_routes` (TCP by server_port, UDP by
            server_port), standalone yaml

Scenarios, each proxy in turn within a round, the order alternating between rounds:

  rr     TCP request/response: wrk, --connections (64) kept-alive connections, GET /hello
         through the L4 relay; the figure is CPU per exchange
  bulk   a bulk transfer: wrk, 4 connections, GET /bulk (the whole file each time); CPU per GB
         relayed (wrk's bytes read)
  conn   new connections per second: wrk with `Connection: close`, --connections (64): every
         exchange a new client connection and a new upstream connection through the proxy
  udp    UDP datagrams per second: --udp-clients client processes, each one socket (one
         session) keeping --udp-window datagrams in flight; CPU per datagram answered

CPU is the proxy's utime + stime (all its processes, from /proc) over the measured window,
divided by the work. Medians over --rounds. Prints a markdown table (and --json).

Build the gateway first (`cargo build --release`, or a debug build for a smoke run: its
figures are not comparable with nginx's).

Usage: benches/e2e/stream.py --binary target/release/ferrisix [--nginx /usr/sbin/nginx]
                             [--rounds 3] [--duration 5] [--connections 64]
                             [--scenarios rr,bulk,conn,udp] [--bulk-mib 64]
                             [--udp-clients 4] [--udp-window 16] [--json out.json]
"""

import argparse
import json
import multiprocessing
import os
import re
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (  # noqa: E402  (benches/e2e/harness.py: what the benchmarks share)
    CLK_TCK, free_port, wait_port, cpu_ticks, children, nginx_main, ensure_tools, stop_all,
)

STREAM_MODULE = "/usr/lib/nginx/modules/ngx_stream_module.so"
SCENARIOS = ("rr", "bulk", "conn", "udp")


def load_stream_module():
    """The `load_module` line Debian's nginx needs for `stream {}` (a dynamic module), after
    installing libnginx-mod-stream when it is missing."""
    if not os.path.exists(STREAM_MODULE):
        print("installing libnginx-mod-stream from Debian", file=sys.stderr)
        subprocess.run(["apt-get", "install", "-y", "-qq", "libnginx-mod-stream"], check=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    return f"load_module {STREAM_MODULE};\n"


def start_nginx(nginx, work, name, body):
    conf = os.path.join(work, f"{name}.conf")
    with open(conf, "w") as f:
        f.write(load_stream_module() + nginx_main(work, name, "worker_connections 20000;") + body)
    p = subprocess.Popen([nginx, "-c", conf, "-p", work], stderr=subprocess.DEVNULL)
    return p


def start_upstream(nginx, work, http_port, udp_port, bulk_mib):
    os.chmod(work, 0o755)
    bulk = os.path.join(work, "bulk")
    with open(bulk, "wb") as f:
        chunk = os.urandom(1 << 20)
        for _ in range(bulk_mib):
            f.write(chunk)
    os.chmod(bulk, 0o644)
    p = start_nginx(nginx, work, "upstream", f"""
http {{
  access_log off;
  server {{
    listen 127.0.0.1:{http_port} reuseport backlog=4096;
    keepalive_requests 1000000;
    location = /hello {{ return 200 "1234567890"; }}
    location = /bulk {{ alias {bulk}; }}
  }}
}}
stream {{
  server {{
    listen 127.0.0.1:{udp_port} udp reuseport;
    return "pong";
  }}
}}
""")
    wait_port(http_port)
    return p


def start_nginx_proxy(nginx, work, tcp_port, udp_port, up_http, up_udp):
    p = start_nginx(nginx, work, "proxy", f"""
stream {{
  server {{
    listen 127.0.0.1:{tcp_port} backlog=4096;
    proxy_pass 127.0.0.1:{up_http};
  }}
  server {{
    listen 127.0.0.1:{udp_port} udp;
    proxy_pass 127.0.0.1:{up_udp};
  }}
}}
""")
    wait_port(tcp_port)
    return p


def start_ferrisix(binary, work, tcp_port, udp_port, up_http, up_udp):
    work = os.path.join(work, "ferrisix")
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "config.yaml"), "w") as f:
        f.write(f"""apisix:
  proxy_mode: stream
  node_listen:
    - ip: 127.0.0.1
      port: {free_port()}
  enable_admin: false
  enable_control: false
  stream_proxy:
    tcp:
      - "127.0.0.1:{tcp_port}"
    udp:
      - "127.0.0.1:{udp_port}"
deployment:
  role: data_plane
  role_data_plane:
    config_provider: yaml
nginx_config:
  worker_processes: 1
plugin_attr:
  prometheus:
    export_addr: {{ip: 127.0.0.1, port: {free_port()}}}
""")
    with open(os.path.join(work, "apisix.yaml"), "w") as f:
        f.write(f"""stream_routes:
  - id: tcp
    server_port: {tcp_port}
    upstream:
      type: roundrobin
      nodes:
        "127.0.0.1:{up_http}": 1
  - id: udp
    server_port: {udp_port}
    upstream:
      scheme: udp
      type: roundrobin
      nodes:
        "127.0.0.1:{up_udp}": 1
#END
""")
    p = subprocess.Popen([os.path.abspath(binary), "-c", os.path.join(work, "config.yaml")],
                         cwd=work, stdout=subprocess.DEVNULL,
                         stderr=open(os.path.join(work, "ferrisix.log"), "w"))
    wait_port(tcp_port)
    return p


def wait_http(port, path="/hello", timeout=20.0):
    """Until a GET through the proxy answers (the stream table follows the first snapshot)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"no HTTP answer through port {port}")


def wrk(port, path, connections, duration, close=False):
    cmd = ["wrk", "-t", "2", "-c", str(connections), "-d", f"{duration}s"]
    if close:
        cmd += ["-H", "Connection: close"]
    out = subprocess.run(cmd + [f"http://127.0.0.1:{port}{path}"],
                         capture_output=True, text=True, check=True).stdout
    total = int(re.search(r"(\d+) requests in", out).group(1))
    m = re.search(r"([\d.]+)([KMG]?B) read", out)
    scale = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}[m.group(2)]
    errors = re.search(r"Socket errors: (.*)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if non2xx:
        raise RuntimeError(f"wrk through port {port}: {non2xx.group(0)}")
    return {"requests": total, "bytes": float(m.group(1)) * scale,
            "errors": errors.group(1) if errors else ""}


def udp_client(port, window, duration, out):
    """One socket (one session through the proxy) keeping `window` datagrams in flight for
    `duration` seconds: puts the number answered."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(("127.0.0.1", port))
    s.settimeout(0.2)
    answered = 0
    in_flight = 0
    deadline = time.time() + duration
    while time.time() < deadline:
        while in_flight < window:
            s.send(b"ping")
            in_flight += 1
        try:
            s.recv(64)
            answered += 1
            in_flight -= 1
        except socket.timeout:
            in_flight = 0  # lost on the way: refill the window
    out.put(answered)


def udp_load(port, clients, window, duration):
    q = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=udp_client, args=(port, window, duration, q))
             for _ in range(clients)]
    for p in procs:
        p.start()
    total = sum(q.get() for _ in procs)
    for p in procs:
        p.join()
    return total


def udp_ready(port, timeout=20.0):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(0.5)
    deadline = time.time() + timeout
    while time.time() < deadline:
        s.sendto(b"ping", ("127.0.0.1", port))
        try:
            if s.recv(64) == b"pong":
                return
        except socket.timeout:
            pass
    raise RuntimeError(f"no UDP answer through port {port}")


def measure(scenario, target, args):
    """Runs `scenario` against `target`: (rate, work units, CPU seconds)."""
    pids = [target["pid"]] + children(target["pid"])
    before = cpu_ticks(pids)
    start = time.time()
    if scenario == "rr":
        r = wrk(target["tcp"], "/hello", args.connections, args.duration)
        units = r["requests"]
    elif scenario == "bulk":
        r = wrk(target["tcp"], "/bulk", 4, args.duration)
        units = r["bytes"] / 1e9
    elif scenario == "conn":
        r = wrk(target["tcp"], "/hello", args.connections, args.duration, close=True)
        units = r["requests"]
    else:
        units = udp_load(target["udp"], args.udp_clients, args.udp_window, args.duration)
    elapsed = time.time() - start
    after = cpu_ticks(pids)
    cpu = (after[0] - before[0] + after[1] - before[1]) / CLK_TCK
    return {"rate": units / elapsed, "units": units, "cpu_s": cpu,
            "cpu_per_unit": cpu / units if units else float("inf")}


UNITS = {
    "rr": ("exchanges/s", "CPU µs / exchange", 1e6),
    "bulk": ("GB/s", "CPU s / GB", 1.0),
    "conn": ("connections/s", "CPU µs / connection", 1e6),
    "udp": ("datagrams/s", "CPU µs / datagram", 1e6),
}


def render(results, args, command):
    label = args.label or "ferrisix"
    lines = [
        "| scenario | target | rate | CPU per unit | CPU vs nginx | rate vs nginx | command |",
        "|---|---|---|---|---|---|---|",
    ]
    for scenario in args.scenarios:
        rate_unit, cpu_unit, scale = UNITS[scenario]
        nginx = results[scenario]["nginx"]
        for name in ("nginx", "ferrisix"):
            r = results[scenario][name]
            shown = label if name == "ferrisix" else "nginx 1.22 `stream`"
            rate = f"{r['rate']:,.3f} {rate_unit}" if scenario == "bulk" \
                else f"{r['rate']:,.0f} {rate_unit}"
            cpu = f"{r['cpu_per_unit'] * scale:,.2f} {cpu_unit.replace('CPU ', '')}"
            lines.append(
                f"| {scenario} | {shown} | {rate} | {cpu} | "
                f"{r['cpu_per_unit'] / nginx['cpu_per_unit']:.2f}× | "
                f"{r['rate'] / nginx['rate']:.2f}× | `{command}` |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", required=True, help="the ferrisix binary to measure")
    ap.add_argument("--nginx", default=shutil.which("nginx") or "/usr/sbin/nginx")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--bulk-mib", type=int, default=64)
    ap.add_argument("--udp-clients", type=int, default=4)
    ap.add_argument("--udp-window", type=int, default=16)
    ap.add_argument("--label", help="the gateway's name in the table (e.g. `ferrisix (debug)`)")
    ap.add_argument("--json")
    args = ap.parse_args()
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    for s in args.scenarios:
        if s not in SCENARIOS:
            ap.error(f"unknown scenario {s}")
    ensure_tools()
    command = "python3 benches/e2e/stream.py " + shlex.join(sys.argv[1:])

    work = tempfile.mkdtemp(prefix="ferrisix-stream-bench-")
    procs = []
    try:
        up_http, up_udp = free_port(), free_port()
        procs.append(start_upstream(args.nginx, work, up_http, up_udp, args.bulk_mib))
        ng = {"tcp": free_port(), "udp": free_port()}
        fx = {"tcp": free_port(), "udp": free_port()}
        p = start_nginx_proxy(args.nginx, work, ng["tcp"], ng["udp"], up_http, up_udp)
        procs.append(p)
        ng["pid"] = p.pid
        p = start_ferrisix(args.binary, work, fx["tcp"], fx["udp"], up_http, up_udp)
        procs.append(p)
        fx["pid"] = p.pid
        targets = {"nginx": ng, "ferrisix": fx}
        for t in targets.values():
            wait_http(t["tcp"])
            udp_ready(t["udp"])
        # Warm both (connections, caches) before the first measured round.
        for t in targets.values():
            wrk(t["tcp"], "/hello", args.connections, 1)

        runs = {s: {n: [] for n in targets} for s in args.scenarios}
        for rnd in range(args.rounds):
            order = ["nginx", "ferrisix"] if rnd % 2 == 0 else ["ferrisix", "nginx"]
            for scenario in args.scenarios:
                for name in order:
                    r = measure(scenario, targets[name], args)
                    runs[scenario][name].append(r)
                    print(f"round {rnd + 1} {scenario} {name}: rate {r['rate']:,.3f}, "
                          f"CPU {r['cpu_s']:.2f} s", file=sys.stderr)

        results = {}
        for scenario, by_target in runs.items():
            results[scenario] = {}
            for name, rs in by_target.items():
                results[scenario][name] = {
                    "rate": statistics.median(r["rate"] for r in rs),
                    "cpu_per_unit": statistics.median(r["cpu_per_unit"] for r in rs),
                    "runs": rs,
                }
        print(render(results, args, command))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"command": command, "results": results}, f, indent=2)
    finally:
        stop_all(procs)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
