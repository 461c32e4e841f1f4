#!/usr/bin/env python3
"""Loads the Admin API bodies of APISIX's own documentation into ferrisix.

APISIX's documentation (`docs/en/latest/**/*.md` of an APISIX checkout) shows its plugins and
resources as curl commands against the Admin API. This check finds every such command that
writes (PUT, POST, PATCH; DELETE too, so a page's sequence stays what it shows), and replays
each page's commands in order against a fresh ferrisix node (embedded store, every plugin built
in enabled, the stream proxy on). A body whose plugins are all built into ferrisix must be
accepted (2xx); a body naming a plugin ferrisix does not build is sent too, and its refusal is
counted apart. The report names every refused body with page, line, status and message.

APISIX's documentation is not part of this repository: point `--apisix` at a checkout (or at
its `docs/en/latest`), e.g. `git clone --depth 1 https://github.com/apache/apisix`.

Usage: scripts/check/apisix-doc-routes.py --apisix DIR [--binary target/debug/ferrisix]
                                          [--plugins a,b,...] [--json out.json] [-v]
  --plugins   only the bodies that use at least one of these plugins must load (and are
              reported); the default is every body
Exit status: 0 when every body that should load did, 1 otherwise, 2 on a usage error.
"""

import argparse
import glob
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ADMIN_KEY = "doc-routes-admin-key"
WRITES = {"PUT", "POST", "PATCH", "DELETE"}


def code_blocks(text):
    """(first line number, body) of each fenced block of a markdown page."""
    blocks, inside, start, lines = [], None, 0, []
    for n, line in enumerate(text.split("\n"), 1):
        fence = re.match(r"^\s*(```+|~~~+)", line)
        if fence and inside is None:
            inside, start, lines = fence.group(1), n + 1, []
        elif fence and line.strip().startswith(inside):
            blocks.append((start, "\n".join(lines)))
            inside = None
        elif inside is not None:
            lines.append(line)
    return blocks


def commands(block):
    """The block's shell commands as (offset in lines, text, end in the block): split at
    newlines outside quotes and not escaped by a trailing backslash."""
    out, cur, quote, line, first = [], [], None, 0, 0
    i = 0
    while i < len(block):
        c = block[i]
        if quote:
            if c == quote:
                quote = None
            elif c == "\\" and quote == '"' and i + 1 < len(block):
                cur.append(c)
                i += 1
                c = block[i]
            cur.append(c)
        elif c in "'\"":
            quote = c
            cur.append(c)
        elif c == "\\" and block[i + 1:i + 2] == "\n":
            cur.append(" ")
            i += 1
            line += 1
        elif c == "\n":
            out.append((first, "".join(cur), i))
            cur, first = [], line + 1
        else:
            cur.append(c)
        if c == "\n":
            line += 1
        i += 1
    out.append((first, "".join(cur), len(block)))
    return out


def admin_calls(page_text):
    """Every curl command of the page that reaches the Admin API: (line, method, admin path,
    body text or None, the page's text shown after it: the rest of its block and the next
    block, where pages show the answer)."""
    calls = []
    blocks = code_blocks(page_text)
    for b, (start, block) in enumerate(blocks):
        following = blocks[b + 1][1] if b + 1 < len(blocks) else ""
        for offset, cmd, end in commands(block):
            if "curl" not in cmd or "/apisix/admin/" not in cmd:
                continue
            cmd = cmd[cmd.index("curl"):]
            try:
                argv = shlex.split(cmd, comments=False)
            except ValueError:
                continue
            method, url, body, headers = None, None, None, {}
            i = 1
            while i < len(argv):
                a = argv[i]
                if a in ("-X", "--request") and i + 1 < len(argv):
                    method = argv[i + 1].upper()
                    i += 1
                elif a.startswith("-X") and len(a) > 2:
                    method = a[2:].upper()
                elif a in ("-d", "--data", "--data-raw", "--data-binary") and i + 1 < len(argv):
                    body = argv[i + 1]
                    i += 1
                elif a.startswith("-d") and len(a) > 2:
                    body = a[2:]
                elif a.startswith(("--data=", "--data-raw=", "--data-binary=")):
                    body = a.split("=", 1)[1]
                elif a in ("-H", "--header") and i + 1 < len(argv):
                    name, _, value = argv[i + 1].partition(":")
                    if name.strip().lower() not in ("x-api-key", "content-type"):
                        headers[name.strip()] = value.strip()
                    i += 1
                elif a in ("-o", "-w", "-u", "--cert", "--key", "--cacert"):
                    i += 1
                elif "/apisix/admin/" in a and url is None:
                    url = a
                elif a in ("|", "&&", ";"):
                    break
                i += 1
            if url is None:
                continue
            if method is None:
                method = "POST" if body is not None else "GET"
            path = url[url.index("/apisix/admin/") + len("/apisix/admin/"):]
            path = path.split("?")[0].rstrip("/")
            # A body the shell completes (`'"$(cat cert.pem)"'`, `'"${key}"'`) is not what
            # the page's reader sends: marked, so that its refusal is not counted.
            expands = "'\"$" in cmd or "$(" in cmd
            calls.append((start + offset, method, path, body, headers, expands,
                          block[end:] + "\n" + following))
    return calls


# Refusals that APISIX gives the same body, with where its source says so.
APISIX_REFUSES = [
    ("admin-api.md", "duplicate key of plugin key-auth found with consumer: jack",
     "apisix/consumer.lua check_duplicate_key: the credential repeats the key its own consumer's "
     "plugin holds, which the page set up before"),
    ("admin-api.md", "failed to validate item 3: matches none of the enum values",
     "the page's methods include \" PATCH\" (with a space), which is not in the route schema's "
     "method enum"),
    ("tutorials/keycloak-oidc.md",
     'property \\"session.secret\\" is required when \\"bearer_only\\" is false',
     "apisix/plugins/openid-connect.lua check_schema: the tutorial predates that check"),
]


def why_refused(rel, method, path, body_text, expands, answer, shown):
    """Why a refusal is what APISIX does too, or None when it is not explained."""
    for page, text, reason in APISIX_REFUSES:
        if rel == page and text in answer:
            return "apisix refuses it too: " + reason
    try:
        msg = json.loads(answer).get("error_msg")
    except (ValueError, AttributeError):
        msg = None
    if msg and msg in shown.replace('\\"', '"') or (msg and json.dumps(msg) in shown):
        return "refused as the page shows"
    # A placeholder fails the resource's own checks; a plugin's check failing is the plugin's,
    # unless the refusal quotes the placeholder itself (`<your ID>`, `${your_sni_name}`).
    quoted = re.findall(r'"(<[^"<>]+>|\$\{[^"{}]+\})"', body_text)
    if ((expands or quoted) and "of plugin" not in answer) or any(q in answer for q in quoted):
        return "placeholder in the page"
    if re.search(r"failed to fetch \w+ info by \w+ id", answer) or (
            method == "PATCH" and "Key not found" in answer):
        return "needs a resource another page creates"
    return None


def plugins_of(path, body):
    """The plugin names a call configures."""
    names = set()
    if path.startswith("plugin_metadata/"):
        names.add(path.split("/")[1])
    if isinstance(body, dict):
        names.update((body.get("plugins") or {}).keys() if isinstance(body.get("plugins"), dict) else ())
    return names


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def built_plugins(binary):
    """The plugins the binary builds in, from `ferrisix -V`."""
    out = subprocess.run([binary, "-V"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if line.lower().startswith("plugins"):
            return [p.strip() for p in line.split(":", 1)[1].replace(",", " ").split() if p.strip()]
    raise SystemExit(f"no plugin list in `{binary} -V`:\n{out}")


class Node:
    """A ferrisix node on random ports, every built plugin enabled, stream on."""

    def __init__(self, binary, http_plugins, stream_plugins, standalone=False):
        self.work = tempfile.mkdtemp(prefix="ferrisix-doc-routes-")
        self.port, self.admin, self.stream = free_port(), free_port(), free_port()
        conf = os.path.join(self.work, "config.yaml")
        with open(conf, "w") as f:
            f.write(f"""apisix:
  node_listen: [{{ip: 127.0.0.1, port: {self.port}}}]
  enable_control: false
  proxy_mode: http&stream
  stream_proxy:
    tcp: ["127.0.0.1:{self.stream}"]
deployment:
  role: traditional
  role_traditional:
    config_provider: {"yaml" if standalone else "embedded"}
  admin:
    admin_listen: {{ip: 127.0.0.1, port: {self.admin}}}
    admin_key:
      - name: admin
        key: {ADMIN_KEY}
        role: admin
plugin_attr:
  prometheus:
    enable_export_server: false
plugins: {json.dumps(http_plugins)}
stream_plugins: {json.dumps(stream_plugins)}
ferrisix:
  data_dir: {self.work}/data
""")
        self.log = open(os.path.join(self.work, "ferrisix.log"), "w")
        self.proc = subprocess.Popen([binary, "-c", conf], cwd=self.work,
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.admin), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise SystemExit("ferrisix did not start:\n"
                                     + open(os.path.join(self.work, "ferrisix.log")).read())
                time.sleep(0.05)

    def call(self, method, path, body, headers):
        data = body.encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.admin}/apisix/admin/{path}",
                                     data=data, method=method,
                                     headers={**headers, "X-API-KEY": ADMIN_KEY,
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def stop(self):
        # Nothing of the node is kept: no graceful stop to wait for.
        self.proc.kill()
        self.proc.wait()
        self.log.close()
        shutil.rmtree(self.work, ignore_errors=True)


def main():
    sys.stdout.reconfigure(line_buffering=True)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--apisix", required=True, help="an APISIX checkout, or its docs/en/latest")
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "debug", "ferrisix"))
    ap.add_argument("--plugins", default="")
    ap.add_argument("--json")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    docs = args.apisix
    if os.path.isdir(os.path.join(docs, "docs", "en", "latest")):
        docs = os.path.join(docs, "docs", "en", "latest")
    pages = sorted(glob.glob(os.path.join(docs, "**", "*.md"), recursive=True))
    if not pages:
        print(f"no markdown pages under {docs}", file=sys.stderr)
        return 2
    built = set(built_plugins(args.binary))
    focus = {p for p in args.plugins.split(",") if p}
    # APISIX's stream plugins that ferrisix has (docs/stream.md); a node refuses to start on
    # one it does not know, so a stale list fails loudly.
    stream_plugins = ["ip-restriction", "limit-conn", "mqtt-proxy", "prometheus", "syslog",
                      "traffic-split"]
    report = {"bodies": 0, "loaded": 0, "refused": [], "explained": {}, "not_json": [],
              "unbuilt": {}, "pages": 0}
    for page in pages:
        rel = os.path.relpath(page, docs)
        calls = [c for c in admin_calls(open(page, encoding="utf-8").read()) if c[1] in WRITES]
        if any(c[2] == "configs" for c in calls):
            # APISIX's API-driven standalone mode: `configs` is its only resource there.
            calls = [c for c in calls if c[2] == "configs"]
        if not calls:
            continue
        report["pages"] += 1
        standalone = any(c[2] == "configs" for c in calls)
        node = Node(args.binary, sorted(built), stream_plugins, standalone)
        try:
            for line, method, path, text, headers, expands, shown in calls:
                body = None
                if text is not None:
                    try:
                        body = json.loads(text)
                    except ValueError:
                        report["not_json"].append(f"{rel}:{line}")
                        continue
                names = plugins_of(path, body)
                status, answer = node.call(method, path, text, headers)
                if method == "DELETE":
                    continue
                known = set(stream_plugins) if path.startswith("stream_routes") else built
                unbuilt = sorted(names - known)
                if unbuilt:
                    for p in unbuilt:
                        report["unbuilt"].setdefault(p, 0)
                        report["unbuilt"][p] += 1
                    continue
                if focus and not names & focus:
                    continue
                report["bodies"] += 1
                if 200 <= status < 300:
                    report["loaded"] += 1
                    if args.verbose:
                        print(f"ok   {rel}:{line} {method} {path} {sorted(names)}")
                    continue
                why = why_refused(rel, method, path, text or "", expands, answer, shown)
                if why:
                    report["explained"].setdefault(why.split(":")[0], []).append(
                        f"{rel}:{line} {status} {answer.strip()[:200]}")
                    if args.verbose:
                        print(f"--   {rel}:{line} {method} {path} -> {status}: {why}")
                else:
                    report["refused"].append({"at": f"{rel}:{line}", "method": method,
                                              "path": path, "plugins": sorted(names),
                                              "status": status, "answer": answer.strip()[:300]})
                    print(f"FAIL {rel}:{line} {method} {path} {sorted(names)} -> {status} "
                          f"{answer.strip()[:300]}")
        finally:
            node.stop()
    print(f"{report['pages']} pages with Admin API writes; {report['bodies']} bodies that use "
          f"only built plugins{' and one of ' + args.plugins if focus else ''}: "
          f"{report['loaded']} loaded, "
          f"{sum(len(v) for v in report['explained'].values())} refused as APISIX refuses them "
          f"({', '.join(f'{k}: {len(v)}' for k, v in sorted(report['explained'].items()))}), "
          f"{len(report['refused'])} refused otherwise; "
          f"{len(report['not_json'])} bodies not JSON (placeholders in the page); bodies with "
          f"plugins not built: {json.dumps(report['unbuilt'], sort_keys=True)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if not report["refused"] else 1


if __name__ == "__main__":
    sys.exit(main())
