#!/usr/bin/env python3
"""The training run of the profile-guided release build (scripts/build-release.sh).

An instrumented gateway (built with `-Cprofile-generate`) serves a mix of the traffic a
gateway carries, for a few seconds each, and writes its profile when it exits: plain
proxying, the benchmark's plugin scenario (limit-count + prometheus), the plugins nearly
every APISIX route carries (proxy-rewrite, cors, request-id, ip-restriction), key-auth and
jwt-auth, 256 KiB answers and uploads, TLS with keep-alive and with a handshake per request,
HTTP/2, the Admin API (writes, reads, lists) and a metrics scrape. The profile decides which
code is laid out hot, what is inlined and which branch falls through; paths it never sees
are compiled as cold, still correctly, so the mix is what a deployment serves rather than the
benchmark alone.

It drives the gateway with the helpers the benchmarks share (benches/e2e/harness.py): the
nginx upstream on 127.0.0.1:1980, the gateway's configuration and the certificate. The caller
sets LLVM_PROFILE_FILE; this script only drives the traffic and stops the gateway with
SIGTERM, so that it exits on its own and writes the profile.

Usage: scripts/release/pgo_train.py --binary PATH [--seconds 3]
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import types
import urllib.request

# The gateway, upstream and load helpers the benchmarks use too (benches/e2e/harness.py), not
# the benchmark itself.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../benches/e2e"))
import harness  # noqa: E402

KEY = "benchmark-admin-key"
CONSUMERS = 200


def wrk(scenario, seconds, connections=16):
    args = types.SimpleNamespace(threads=2, connections=connections, duration=seconds)
    text = harness.run_wrk(harness.FERRISIX_TLS_PORT if scenario in harness.TLS_SCENARIOS
                         else harness.FERRISIX_PORT, args, None, scenario)
    r = harness.parse_wrk(text)
    print(f"pgo training: {scenario}: {r['requests']} requests, {r['non2xx']} not 2xx",
          file=sys.stderr)
    # A scenario answered with errors would train the error path instead of the one named.
    if r["non2xx"] * 2 > r["requests"]:
        raise SystemExit(f"pgo training: {scenario} was mostly answered with errors")
    return r


def admin_get(admin, path):
    req = urllib.request.Request(f"{admin}/apisix/admin/{path}", headers={"X-API-KEY": KEY})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--seconds", type=int, default=3)
    args = ap.parse_args()
    if "LLVM_PROFILE_FILE" not in os.environ:
        print("pgo training: LLVM_PROFILE_FILE is not set (scripts/build-release.sh sets it)",
              file=sys.stderr)
    harness.ensure_tools()
    h2 = True
    try:
        harness.ensure_h2load()
    except (subprocess.CalledProcessError, OSError) as e:
        h2 = False
        print(f"pgo training: no h2load ({e}); HTTP/2 is left out of the profile", file=sys.stderr)

    work = tempfile.mkdtemp(prefix="ferrisix-pgo-")
    admin = f"http://127.0.0.1:{harness.FERRISIX_ADMIN}"
    upstream = harness.start_upstream(work, None)
    fx = None
    try:
        crt, key = harness.make_certificate(work)
        fx = harness.start_ferrisix(work, None, args.binary)
        harness.put_ssl(admin, KEY, crt, key)
        harness.put_body_route(admin, KEY)
        harness.put_consumers(admin, KEY, CONSUMERS)
        mix = [
            ("s1", {}),
            ("s2", harness.S2_PLUGINS),
            ("route", harness.ROUTE_PLUGINS),
            ("key-auth", {"key-auth": {}}),
            ("jwt", {"jwt-auth": {}}),
            ("big", {}),
            ("upload", {}),
            ("tls", {}),
            ("tls-hs", {}),
        ]
        for scenario, plugins in mix:
            harness.put_route(admin, KEY, plugins)
            # Snapshots publish within milliseconds; the first requests may still see the last.
            wrk(scenario, args.seconds)
        if h2:
            harness.put_route(admin, KEY, {})
            h2args = types.SimpleNamespace(duration=args.seconds)
            r = harness.parse_h2load(harness.run_h2load(harness.FERRISIX_TLS_PORT, h2args, None))
            print(f"pgo training: h2: {r['requests']} requests", file=sys.stderr)
        # The Admin API and a scrape: lists, reads, the metrics text.
        for _ in range(20):
            admin_get(admin, "routes")
            admin_get(admin, "consumers?page=1&page_size=10")
            admin_get(admin, "routes/1")
        with urllib.request.urlopen("http://127.0.0.1:9091/apisix/prometheus/metrics", timeout=10) as r:
            r.read()
    finally:
        if fx is not None:
            fx.send_signal(signal.SIGTERM)
            try:
                code = fx.wait(timeout=60)
            except subprocess.TimeoutExpired:
                fx.kill()
                raise SystemExit("pgo training: the gateway did not exit within 60 s of SIGTERM, "
                                 "so it wrote no profile")
            if code != 0:
                raise SystemExit(f"pgo training: the gateway exited with {code}; see {work}/ferrisix.log")
        upstream.terminate()
        upstream.wait()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
