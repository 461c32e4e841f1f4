#!/usr/bin/env python3
"""The linker symbol order of the release build (scripts/build-release.sh): the functions an idle
gateway runs, first.

Why: the kernel maps a file-backed page into a process together with the cached pages of the
64 KiB around it (fault-around), and a cold start reads the binary in 8 MiB blocks, so every
64 KiB window of `.text` that start-up touches once stays resident. With lld's own layout the
~2.8 MB of code a gateway runs from start to idle (config parse, store open, runtime, rustls
config, listeners, the Admin API's first writes) touched windows across all 11 MB of `.text`:
5.3-6.4 MiB of it resident at idle. Laid out first, in one block, it is ~3.4 MiB.

How: the built binary runs under valgrind's callgrind through what bench.py's idle measure
does (start, PUT the certificate and s1's route, idle), then stops with SIGTERM; every function
of the binary that ran is written out, mangled, one per line, for lld's
`--symbol-ordering-file`. callgrind sees what a compiler profile cannot: glibc's and mimalloc's
C code, std's precompiled code, and the symbols the optimised binary really has after
inlining. valgrind is installed from Debian when missing.

Usage: scripts/release/startup_order.py --binary PATH --out FILE
"""

import argparse
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# The gateway, upstream and load helpers the benchmarks use too (benches/e2e/harness.py), not
# the benchmark itself.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../benches/e2e"))
import harness  # noqa: E402

KEY = "benchmark-admin-key"
# How long the gateway idles after the PUTs, so the order holds what idle time runs too (timers,
# the log flush, the boot's threads ending); longer than bench.py's 3 s, as callgrind runs the
# gateway ~50x slower.
IDLE_S = 5


SPEC = re.compile(r"^(c?)(ob|fn)=\((\d+)\)(?: (.*))?$")


def functions_run(files, binary):
    """The binary's functions with a cost of their own, in the order the files name them.

    callgrind's compressed format names an object or function once, as `(id) name`, wherever it
    first appears, as the caller (`fn=`) or the callee (`cfn=`); later lines give the id alone.
    A function ran when a `fn=` line opens its costs under an `ob=` of the binary."""
    ran, seen = [], set()
    for path in files:
        objects, functions, current = {}, {}, None
        with open(path, errors="replace") as f:
            for line in f:
                m = SPEC.match(line.rstrip("\n"))
                if not m:
                    continue
                callee, kind, ident, name = m.groups()
                table = objects if kind == "ob" else functions
                if name:
                    table[ident] = name
                if callee:
                    continue
                if kind == "ob":
                    current = objects.get(ident)
                elif current is not None and os.path.realpath(current) == binary:
                    sym = functions.get(ident)
                    # `'2` marks a recursion level, `0x…` an address without a symbol.
                    if sym and "'" not in sym and not sym.startswith("0x") and sym not in seen:
                        seen.add(sym)
                        ran.append(sym)
    return ran


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    binary = os.path.realpath(args.binary)
    harness.ensure_package("valgrind", "valgrind")
    work = tempfile.mkdtemp(prefix="ferrisix-order-")
    out = os.path.join(work, "callgrind")
    os.makedirs(out)
    wrapper = ["valgrind", "--tool=callgrind", "--demangle=no", "--dump-instr=no",
               "--separate-threads=yes", f"--callgrind-out-file={out}/cg.out"]
    crt, key = harness.make_certificate(work)
    admin = f"http://127.0.0.1:{harness.FERRISIX_ADMIN}"
    fx = harness.start_ferrisix(work, None, binary, wrapper=wrapper)
    try:
        harness.put_ssl(admin, KEY, crt, key)
        harness.put_route(admin, KEY, {})
        time.sleep(IDLE_S)
    finally:
        fx.send_signal(signal.SIGTERM)
        try:
            fx.wait(timeout=120)
        except subprocess.TimeoutExpired:
            fx.kill()
            raise SystemExit("startup order: the gateway did not exit within 120 s of SIGTERM")
    ran = functions_run(sorted(glob.glob(out + "/cg.out*")), binary)
    if len(ran) < 100:
        raise SystemExit(f"startup order: only {len(ran)} functions of {binary} ran; see {work}")
    with open(args.out, "w") as f:
        f.write("".join(s + "\n" for s in ran))
    print(f"startup order: {len(ran)} functions ran from start to idle; order in {args.out}",
          file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
