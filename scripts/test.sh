#!/usr/bin/env bash
# The test command of the README: every unit and end-to-end test of the workspace.
# End-to-end tests start their own upstreams, gateway processes, etcd, Redis and Prometheus on
# random 127.0.0.1 ports (installing Debian's packages when missing).
set -euo pipefail
cd "$(dirname "$0")/.."

# etcd-client's build script compiles etcd's .proto files: it needs protoc and the well-known
# .proto files, which a fresh machine does not have.
if ! command -v protoc >/dev/null 2>&1 || [ ! -d /usr/include/google/protobuf ]; then
  echo "installing protobuf-compiler and libprotobuf-dev (needed to build etcd-client)" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo -n"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq protobuf-compiler libprotobuf-dev >/dev/null
fi

cargo test --workspace --locked "$@"
