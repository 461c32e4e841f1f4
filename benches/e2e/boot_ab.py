#!/usr/bin/env python3
"""Boot A/B on one stored configuration: each binary boots a fresh copy of DATA_DIR in turn,
ROUNDS times, interleaved; prints each boot's `first configuration compiled` fields (the
stages, in microseconds) and the wall time from start to that line, then their medians.

WORKDIR and DATA_DIR come from `scale.py --routes 100000 --keep-work` (the work directory it
names holds `config.yaml`; copy its `data/` aside first, as each boot here replaces it):

  benches/e2e/boot_ab.py WORKDIR DATA_DIR ROUNDS BINARY...
"""
import os, re, shutil, statistics, subprocess, sys, time
if len(sys.argv) < 5:
    sys.exit(__doc__)
work, data, rounds, bins = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
res = {b: [] for b in bins}
for r in range(rounds):
    for b in bins:
        shutil.rmtree(os.path.join(work, "data"), ignore_errors=True)
        shutil.copytree(data, os.path.join(work, "data"))
        log = os.path.join(work, "boot.log")
        t0 = time.time()
        p = subprocess.Popen([b, "-c", os.path.join(work, "config.yaml")], cwd=work,
                             stdout=subprocess.DEVNULL, stderr=open(log, "w"),
                             env=dict(os.environ, RUST_LOG="info"))
        line = None
        while time.time() - t0 < 120:
            txt = open(log, errors="replace").read()
            m = [l for l in txt.splitlines() if "first configuration compiled" in l and "routes=0 " not in l]
            if m:
                line = m[-1]; break
            time.sleep(0.01)
        wall = time.time() - t0
        p.terminate(); p.wait()
        f = {k: int(v) for k, v in re.findall(r"(\w+_us)=(\d+)", line or "")}
        f["wall_ms"] = int(wall * 1000)
        res[b].append(f)
        print(r, os.path.basename(b), f, flush=True)
print("| binary | " + " | ".join(sorted(res[bins[0]][0])) + " |")
for b in bins:
    keys = sorted(res[b][0])
    med = {k: statistics.median(x[k] for x in res[b] if k in x) for k in keys}
    print(f"| {os.path.basename(b)} | " + " | ".join(f"{med[k]/1000:.0f}" if k.endswith('_us') else f"{med[k]:.0f}" for k in keys) + " |")
