#!/usr/bin/env python3
"""Writes a linker symbol order from a merged PGO profile: every function the training ran,
the most run first.

lld lays `.text` out in input order, so the 4 MiB of code the training ran sat among 6 MiB it
never ran, and the kernel maps a whole 64 KiB window around each page a process touches: the
code a gateway runs ended up resident across ~6 MiB of text. Handed to lld as
`--symbol-ordering-file`, this order puts the code that runs together (the hottest first, so the
request path shares as few pages and TLB entries as it can) and leaves the never-run code in one
block that is never mapped.

Usage: pgo-order.py LLVM_PROFDATA PROFILE OUT
"""

import re
import subprocess
import sys


def run_counts(profdata, profile):
    """{symbol: total block count} for every function in the profile."""
    text = subprocess.run(
        [profdata, "show", "--all-functions", "--counts", profile],
        check=True, capture_output=True, text=True,
    ).stdout
    counts = {}
    name = None
    for line in text.splitlines():
        # A function's entry: two spaces, its name, a colon. Local functions are named
        # `<module>;<symbol>`; the linker knows them by the symbol.
        if line.startswith("  ") and not line.startswith("   ") and line.endswith(":"):
            name = line.strip()[:-1].rsplit(";", 1)[-1]
        elif name is not None and line.strip().startswith("Block counts:"):
            total = sum(int(n) for n in re.findall(r"\d+", line.split(":", 1)[1]))
            counts[name] = max(counts.get(name, 0), total)
            name = None
    return counts


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    profdata, profile, out = sys.argv[1:]
    counts = run_counts(profdata, profile)
    ran = sorted((n for n, c in counts.items() if c > 0), key=lambda n: (-counts[n], n))
    if not ran:
        sys.exit(f"pgo-order: no function ran in {profile}")
    with open(out, "w") as f:
        f.write("".join(n + "\n" for n in ran))
    print(f"pgo-order: {len(ran)} of {len(counts)} profiled functions ran; order in {out}")


if __name__ == "__main__":
    main()
