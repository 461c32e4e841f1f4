#!/usr/bin/env python3
"""What a full listing of a big etcd prefix costs, read two ways (see docs/stores.md, "Reading a
big configuration in pages"):

  linear   pages of --limit keys, each from the key after the last one to the end of the prefix
           (etcd walks its index over the whole rest of the prefix for each: the cost grows with
           the square of the prefix); only the first --linear-pages pages are timed, with the
           time of a one-key read from the start of the prefix
  sized    each read over a key range sized from the span of keys the previous reads needed
           (what ferrisix's etcd store does): every key, the reads, the wall time, and the
           reads slower than 0.2 s

Both pin the first read's revision. The client is etcd's JSON gateway, so the times include
this script's own base64 and JSON decoding (most of the sized pass at a million routes).

Usage: benches/e2e/etcd_ranges.py --routes 1000000 [--limit 1000] [--linear-pages 20]
       benches/e2e/etcd_ranges.py --endpoint 127.0.0.1:PORT   (an etcd already loaded)
"""

import argparse
import base64
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scale  # noqa: E402

DIR, END = b"/apisix/", b"/apisix0"
WIDTH = 64  # bytes of a key past the directory that a position tells apart


def read(client, key, end, limit, revision=0):
    req = {"key": base64.b64encode(key).decode(), "range_end": base64.b64encode(end).decode(),
           "limit": limit}
    if revision:
        req["revision"] = revision
    started = time.time()
    status, data = client.request("POST", "/v3/kv/range", json.dumps(req))
    if status != 200:
        raise RuntimeError(f"range: {status} {data[:200]!r}")
    return json.loads(data), time.time() - started


def position(key):
    rest = key[len(DIR):][:WIDTH]
    return int.from_bytes(rest + b"\0" * (WIDTH - len(rest)), "big")


def linear(client, limit, pages):
    _, one = read(client, DIR, END, 1)
    start, revision, times = DIR, 0, []
    for _ in range(pages):
        r, took = read(client, start, END, limit, revision)
        times.append(took)
        revision = revision or int(r["header"]["revision"])
        kvs = r.get("kvs", [])
        if not kvs or not r.get("more"):
            break
        start = base64.b64decode(kvs[-1]["key"]) + b"\0"
    return {"one_key_read_s": round(one, 3), "pages": len(times),
            "mean_page_s": round(sum(times) / len(times), 3)}


def sized(client, limit):
    top = (1 << (8 * WIDTH)) - 1
    start, step, revision = DIR, 1 << (8 * (WIDTH - 4)), 0
    reads = keys = 0
    slow = []
    started = time.time()
    while True:
        to = position(start) + step
        until = END if to > top else DIR + to.to_bytes(WIDTH, "big").rstrip(b"\0")
        if until >= END or until <= start:
            until = END
        r, took = read(client, start, until, limit, revision)
        if took > 0.2:
            slow.append(round(took, 2))
        revision = revision or int(r["header"]["revision"])
        reads += 1
        kvs = r.get("kvs", [])
        keys += len(kvs)
        if kvs and r.get("more"):
            last = base64.b64decode(kvs[-1]["key"])
            step = max(position(last) - position(start), 1)
            start = last + b"\0"
            continue
        factor = 16 if not kvs else max(1, min(16, limit // len(kvs)))
        step = min(step << (factor.bit_length() - 1), top)
        if until == END:
            break
        start = until
    return {"keys": keys, "reads": reads, "wall_s": round(time.time() - started, 1),
            "reads_over_0_2_s": slow}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--routes", type=int, default=0, help="load this many routes into a new etcd")
    ap.add_argument("--endpoint", help="host:port of an etcd already loaded")
    ap.add_argument("--limit", type=int, default=1000)
    ap.add_argument("--linear-pages", type=int, default=20)
    args = ap.parse_args()
    work = etcd = None
    try:
        if args.endpoint:
            port = int(args.endpoint.rsplit(":", 1)[1])
        else:
            work = tempfile.mkdtemp(prefix="ferrisix-etcd-ranges-")
            etcd, port = scale.start_etcd(work)
            started = time.time()
            rate = scale.load_etcd(port, args.routes, 9)
            print(f"loaded {args.routes} routes at {rate:.0f}/s in {time.time() - started:.0f} s",
                  file=sys.stderr)
        client = scale.Client(port)
        out = {"linear": linear(client, args.limit, args.linear_pages),
               "sized": sized(client, args.limit), "limit": args.limit}
        print(json.dumps(out))
    finally:
        if etcd:
            etcd.terminate()
            etcd.wait()
        if work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
