#!/usr/bin/env python3
"""User-space instructions per proxied request, counted by valgrind's callgrind.

bench.py's CPU time per request is the truth, but on a 2-core machine it cannot resolve a
step below ~3-5%: nginx's own figure moves 15-30% from round to round. An instruction count
moves 0.1-0.2% between runs of one build, so a request-path step of 1% shows. It counts user
space only (the kernel's share, about 70% of the CPU per request, is not in it) and
instructions are not cycles (a cache miss costs no instruction): it tells whether a step
removes work, the harness whether that work mattered.

Each round starts the gateway under callgrind (1 worker, the embedded store, the access log
on as in bench.py), PUTs bench.py's route (s1: no plugins; s2: limit-count + prometheus),
warms up with wrk for 3 s, zeroes the counters, runs `wrk -t 1 -c 16` for --seconds, dumps
the counters and divides by wrk's request count. With --baseline, the two binaries alternate
in every round. With --nginx, nginx's proxy_pass (one process, bench.py's s1 configuration)
is counted the same way, for the ratio. The upstream is bench.py's nginx on 127.0.0.1:1980.
Under callgrind a gateway serves ~3,500 requests/s, so 5 s is ~17,000 requests.

Usage: benches/e2e/instructions.py --binary target/release/ferrisix [--baseline OTHER]
                                   [--nginx] [--rounds 3] [--seconds 5] [--scenario s1|s2]
                                   [--browser]   (a browser's request headers, not only Host)
                                   [--atomics]    (also locked read-modify-writes per request)
                                   [--keep DIR]   (keep the callgrind files for callgrind_annotate)
                                   [--floor target/release/examples/hyper_floor]
                                        (also count examples/hyper_floor.rs: hyper's two codecs
                                         and nothing else, the floor under any hyper proxy)
"""

import argparse
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

NGINX_PORT = 9081
S2_PLUGINS = {
    "limit-count": {"count": 2000000000000, "time_window": 60, "rejected_code": 503,
                    "key": "remote_addr"},
    "prometheus": {},
}


def callgrind(out, per_instruction=False):
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
            "--separate-threads=yes", f"--dump-instr={'yes' if per_instruction else 'no'}"]


# --atomics: locked read-modify-writes (`lock`-prefixed instructions, and `xchg` with memory,
# which locks implicitly). callgrind counts each as one instruction; on the CPU each is a
# full barrier of ~20 cycles, so a step that trades them for plain loads shows nothing in
# the instruction count. They are counted from callgrind's per-instruction costs (every
# object's self cost by address) matched against each object's disassembly (objdump).
LOCKED = re.compile(r"^\s*([0-9a-f]+):\s+(?:lock\s|xchg\s+\S*\()")


def locked_addresses(path, cache):
    """The addresses of `path`'s locked instructions, as callgrind names them (the
    object's own virtual addresses)."""
    if path not in cache:
        text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path],
                              capture_output=True, text=True).stdout
        cache[path] = {int(m.group(1), 16) for m in map(LOCKED.match, text.splitlines()) if m}
    return cache[path]


def locked_executed(dump, cache):
    """Locked instructions executed in one callgrind dump made with --dump-instr=yes."""
    names, obj, last, skip = {}, None, 0, False
    per_object = {}
    with open(dump) as f:
        for line in f:
            c = line[:1]
            if c.isdigit() or c in "+-*":
                t = line.split()
                tok = t[0]
                if tok == "*":
                    addr = last
                elif tok[0] in "+-":
                    addr = last + int(tok, 0)
                else:
                    addr = int(tok, 0)
                last = addr
                if skip:  # the inclusive cost of the call on the line before
                    skip = False
                elif len(t) >= 3 and obj:
                    per_object.setdefault(obj, {})
                    per_object[obj][addr] = per_object[obj].get(addr, 0) + int(t[2])
            elif line.startswith(("ob=", "cob=")):
                m = re.match(r"c?ob=\((\d+)\)\s*(.*)", line.rstrip("\n"))
                if m.group(2):
                    names[m.group(1)] = m.group(2)
                if line.startswith("ob="):
                    obj = names.get(m.group(1))
            elif line.startswith("calls="):
                skip = True
    total = 0
    for path, costs in per_object.items():
        if os.path.exists(path):
            locked = locked_addresses(path, cache)
            total += sum(v for a, v in costs.items() if a in locked)
    return total


# --browser: the request headers a browser sends with a page's API call (wrk's own request
# has only Host). Each client header costs in every step that copies or looks at headers
# (the parse, the access log's captures, the upstream copy, the encode), so this is the
# count to read for a step on that path.
BROWSER_HEADERS = [
    "Connection: keep-alive",
    "User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/131.0.0.0 Safari/537.36",
    "Accept: application/json, text/plain, */*",
    "Accept-Encoding: gzip, deflate, br, zstd",
    "Accept-Language: en-GB,en;q=0.9",
    "Referer: https://shop.example.com/cart",
    "Cookie: session=8f14e45fceea167a5a36dedd4bea2543; theme=dark",
    "Sec-Fetch-Mode: cors",
    "X-Request-Id: 5d2c6b1e-8a4f-4f0e-9c3a-1b2d3e4f5a6b",
]


def wrk(port, seconds, headers=()):
    args = ["wrk", "-t", "1", "-c", "16", "-d", f"{seconds}s"]
    for h in headers:
        args += ["-H", h]
    return subprocess.run(args + [f"http://127.0.0.1:{port}/hello"],
                          capture_output=True, text=True).stdout


def start_gateway(work, binary, scenario, per_instruction=False):
    """bench.py's ferrisix, launched under callgrind."""
    out = os.path.join(work, "callgrind.out")
    # Under callgrind the gateway starts many times slower, more so beside a build.
    proc = harness.start_ferrisix(work, None, binary, wrapper=callgrind(out, per_instruction),
                                  wait=120)
    plugins = S2_PLUGINS if scenario == "s2" else {}
    for _ in range(60):
        try:
            harness.put_route(f"http://127.0.0.1:{harness.FERRISIX_ADMIN}", "benchmark-admin-key",
                            plugins)
            break
        except OSError:
            time.sleep(0.5)
    return proc, harness.FERRISIX_PORT, out


def start_nginx(work, per_instruction=False):
    """bench.py's nginx proxy_pass for s1, as one process (no master) so that callgrind
    follows it."""
    conf = os.path.join(work, "proxy.conf")
    with open(conf, "w") as f:
        f.write(f"""
master_process off;
daemon off;
pid {work}/proxy.pid;
error_log {work}/proxy-error.log;
events {{ worker_connections 10620; }}
http {{
{harness.nginx_s1_http(work, NGINX_PORT)}
}}
""")
    out = os.path.join(work, "callgrind.out")
    proc = subprocess.Popen(callgrind(out, per_instruction) + [harness.nginx_bin(), "-c", conf, "-p", work],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    harness.wait_port(NGINX_PORT, timeout=60)
    return proc, NGINX_PORT, out


def start_floor(work, binary, per_instruction=False):
    """examples/hyper_floor.rs under callgrind, to the same upstream."""
    out = os.path.join(work, "callgrind.out")
    proc = subprocess.Popen(callgrind(out, per_instruction) + harness.floor_command(binary),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    harness.wait_port(harness.FLOOR_PORT, timeout=60)
    return proc, harness.FLOOR_PORT, out


def count(work, start, seconds, headers=(), objects=None):
    """Starts a target, loads it, and gives (requests, instructions of all its threads,
    locked instructions among them when `objects` (an objdump cache) is given)."""
    proc, port, out = start()
    try:
        wrk(port, 3, headers)
        subprocess.run(["callgrind_control", "-z", str(proc.pid)], capture_output=True,
                       check=True)
        text = wrk(port, seconds, headers)
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], capture_output=True,
                       check=True)
    finally:
        proc.terminate()
        proc.wait()
    m = re.search(r"(\d+) requests in", text)
    if not m:
        raise RuntimeError(f"no wrk result: {text}")
    bad = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", text)
    if bad:
        raise RuntimeError(f"{bad.group(1)} answers were not 2xx")
    total = locked = 0
    # The zeroing dump and the final one at exit are separate files: only the `-d` dump
    # (part 1) counts, one file per thread.
    for path in glob.glob(out + ".1-*"):
        with open(path) as f:
            s = re.search(r"^summary:\s*(\d+)", f.read(), re.M)
        if s:
            total += int(s.group(1))
            if objects is not None:
                locked += locked_executed(path, objects)
    if not total:
        raise RuntimeError(f"no callgrind dump in {work}")
    return int(m.group(1)), total, locked


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(harness.ROOT, "target", "release", "ferrisix"))
    ap.add_argument("--baseline")
    ap.add_argument("--nginx", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--scenario", choices=["s1", "s2"], default="s1")
    ap.add_argument("--browser", action="store_true",
                    help="send a browser's request headers (BROWSER_HEADERS), not only Host")
    ap.add_argument("--atomics", action="store_true",
                    help="also count locked read-modify-writes per request (objdump needed)")
    ap.add_argument("--keep")
    ap.add_argument("--floor", help="examples/hyper_floor.rs built, counted as a third target")
    args = ap.parse_args()
    headers = BROWSER_HEADERS if args.browser else []
    for tool in ("valgrind", "callgrind_control", "wrk") + (("objdump",) if args.atomics else ()):
        if not shutil.which(tool):
            sys.exit(f"{tool} is needed (Debian: valgrind, wrk, binutils)")
    targets = [("ferrisix", args.binary)]
    if args.baseline:
        targets.append(("baseline", args.baseline))
    if args.nginx:
        targets.append(("nginx", None))
    if args.floor:
        targets.append(("hyper-floor", args.floor))
    work = args.keep or tempfile.mkdtemp(prefix="ferrisix-instructions-")
    os.makedirs(work, exist_ok=True)
    upstream = harness.start_upstream(work, None)
    per_request = {name: [] for name, _ in targets}
    locked_per_request = {name: [] for name, _ in targets}
    objects = {} if args.atomics else None
    try:
        for r in range(args.rounds):
            for name, binary in targets:
                w = os.path.join(work, f"round{r}-{name}")
                os.makedirs(w, exist_ok=True)
                if name == "hyper-floor":
                    start = lambda w=w, b=binary: start_floor(w, b, args.atomics)  # noqa: E731
                elif binary:
                    start = lambda w=w, b=binary: start_gateway(  # noqa: E731
                        w, b, args.scenario, args.atomics)
                else:
                    start = lambda w=w: start_nginx(w, args.atomics)  # noqa: E731
                n, total, locked = count(w, start, args.seconds, headers, objects)
                per_request[name].append(total / n)
                locked_per_request[name].append(locked / n)
                also = f", {locked / n:.1f} locked" if args.atomics else ""
                print(f"round {r} {name}: {n} requests, {total / n:,.0f} instructions each{also}",
                      file=sys.stderr, flush=True)
    finally:
        upstream.terminate()
        upstream.wait()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    first = statistics.median(per_request["ferrisix"])
    client = ", browser headers" if args.browser else ""
    locked_head = " locked RMW per request |" if args.atomics else ""
    print(f"| target | instructions per request ({args.scenario}{client}, median of {args.rounds}) "
          f"| runs | vs ferrisix |{locked_head}")
    print("|---|---:|---|---:|" + ("---:|" if args.atomics else ""))
    for name, _ in targets:
        med = statistics.median(per_request[name])
        runs = ", ".join(f"{v:,.0f}" for v in per_request[name])
        locked = f" {statistics.median(locked_per_request[name]):.1f} |" if args.atomics else ""
        print(f"| {name} | {med:,.0f} | {runs} | {med / first:.3f}× |{locked}")


if __name__ == "__main__":
    main()
