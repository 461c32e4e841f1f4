#!/usr/bin/env bash
# The test command of the README: installs the programs the tests run, then formatting and
# lints (so CI enforces them), then every unit and end-to-end test of the workspace.
# End-to-end tests start their own upstreams, gateway processes, etcd, Redis, nginx and
# Prometheus on random 127.0.0.1 ports. The tests install nothing themselves: one that finds a
# program missing fails, naming the package (crates/config/src/test_support/debian.rs lists
# them, and a unit test there checks that the line below names each).
set -euo pipefail
cd "$(dirname "$0")/.."

# prometheus without its recommends, which would pull in (and start) node-exporter;
# libprotobuf-dev: the well-known .proto files etcd's import, for the generated-code check.
packages="etcd-server redis-server redis-tools nginx prometheus wrk protobuf-compiler libprotobuf-dev openssl curl slapd nodejs tar mosquitto mosquitto-clients"
missing=()
for p in $packages; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [ "$status" = "install ok installed" ] || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "test.sh: installing ${missing[*]} (Debian packages the tests run)" >&2
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
    --no-install-recommends "${missing[@]}" >/dev/null
fi

# The official OpenAI Python client, which the AI gateway's end-to-end test drives ferrisix with.
openai_version="3.63.0"
if ! python3 -c "import openai, sys; sys.exit(openai.__version__ != '$openai_version')" 2>/dev/null; then
  echo "test.sh: installing openai==$openai_version (PyPI)" >&2
  pip install -q "openai==$openai_version" 2>/dev/null \
    || pip install -q --break-system-packages "openai==$openai_version"
fi

# Admin API clients from PyPI that tests/e2e/admin_tools.rs drives ferrisix with, and the
# official MCP SDK (which mcp-apisix depends on, unpinned): tests/e2e/plugins_mcp.rs writes its
# stdio MCP server and SSE client with it.
for pkg in mcp-apisix==0.4.0 apisix-python-client==0.1.0 mcp==2.3.0; do
  if ! python3 -c "import importlib.metadata as m, sys; n, v = '$pkg'.split('=='); sys.exit(m.version(n) != v)" 2>/dev/null; then
    echo "test.sh: installing $pkg (PyPI)" >&2
    pip install -q "$pkg" 2>/dev/null || pip install -q --break-system-packages "$pkg"
  fi
done

# aioquic, the QUIC and HTTP/3 client tests/e2e/http3.rs drives ferrisix with (Debian's curl is
# built without HTTP/3).
aioquic_version="1.7.2"
if ! python3 -c "import importlib.metadata as m, sys; sys.exit(m.version('aioquic') != '$aioquic_version')" 2>/dev/null; then
  echo "test.sh: installing aioquic==$aioquic_version (PyPI)" >&2
  pip install -q "aioquic==$aioquic_version" 2>/dev/null \
    || pip install -q --break-system-packages "aioquic==$aioquic_version"
fi

# kubernetes-validate (Kubernetes' OpenAPI schemas, offline), which checks deploy/kubernetes/.
k8s_validate_version="1.37.0"
if ! python3 -c "import importlib.metadata as m, sys; sys.exit(m.version('kubernetes-validate') != '$k8s_validate_version')" 2>/dev/null; then
  echo "test.sh: installing kubernetes-validate==$k8s_validate_version (PyPI)" >&2
  pip install -q "kubernetes-validate==$k8s_validate_version" 2>/dev/null \
    || pip install -q --break-system-packages "kubernetes-validate==$k8s_validate_version"
fi

# The proxy-wasm test modules' toolchain (tests/e2e/wasm.rs builds the modules from source):
# AssemblyScript and its proxy-wasm SDK, pinned in tests/wasm/package-lock.json, from npm.
if ! (cd tests/wasm && npm ls --depth=0 >/dev/null 2>&1); then
  echo "test.sh: installing tests/wasm's AssemblyScript toolchain (npm)" >&2
  (cd tests/wasm && npm ci --no-audit --no-fund --loglevel=error)
fi

# The protocol's published Python definitions, which the external plugin runner of the
# ext-plugin end-to-end tests is written with (tests/e2e/ext_plugin_runner.py).
a6_version="0.2.1"; flatbuffers_version="25.2.10"
if ! python3 -c "import A6.HTTPReqCall.Req, flatbuffers, importlib.metadata as m, sys; sys.exit(m.version('a6pluginprotos') != '$a6_version')" 2>/dev/null; then
  echo "test.sh: installing a6pluginprotos==$a6_version flatbuffers==$flatbuffers_version (PyPI)" >&2
  pip install -q "a6pluginprotos==$a6_version" "flatbuffers==$flatbuffers_version" 2>/dev/null \
    || pip install -q --break-system-packages "a6pluginprotos==$a6_version" "flatbuffers==$flatbuffers_version"
fi

# python-hessian, the Hessian 2 decoder of the Dubbo provider that the http-dubbo and
# dubbo-proxy end-to-end tests run (tests/e2e/dubbo_provider.py).
hessian_version="1.2.0"
if ! python3 -c "import pyhessian.parser, importlib.metadata as m, sys; sys.exit(m.version('python-hessian') != '$hessian_version')" 2>/dev/null; then
  echo "test.sh: installing python-hessian==$hessian_version (PyPI)" >&2
  pip install -q "python-hessian==$hessian_version" 2>/dev/null \
    || pip install -q --break-system-packages "python-hessian==$hessian_version"
fi

# npm's oidc-provider (a certified OpenID provider), which openid-connect's login-flow test runs:
# pinned in tests/oidc/package-lock.json, installed into tests/oidc/node_modules (ignored by git).
oidc_provider_version="9.13.3"
if ! grep -qs "\"version\": \"$oidc_provider_version\"" tests/oidc/node_modules/oidc-provider/package.json; then
  echo "test.sh: installing oidc-provider@$oidc_provider_version (npm)" >&2
  if ! command -v npm >/dev/null; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
      --no-install-recommends npm >/dev/null
  fi
  (cd tests/oidc && npm ci --no-audit --no-fund --silent)
fi

cargo fmt --all -- --check
# cargo fmt follows `mod` items only: the plugin files listed through the `family!` macro are
# reached by no `mod` rustfmt can see, so every source file is checked by name as well.
find crates tests benches examples src -name '*.rs' 2>/dev/null | xargs rustfmt --edition 2021 --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked "$@"
scripts/check/kubernetes-test.sh "${CARGO_TARGET_DIR:-target}/debug/ferrisix"
