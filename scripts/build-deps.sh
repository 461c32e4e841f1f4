#!/usr/bin/env bash
# Installs what building ferrisix needs beyond the Rust toolchain, when it is missing:
# etcd-client's build script compiles etcd's .proto files with protoc and the well-known
# .proto files (Debian's protobuf-compiler and libprotobuf-dev). Sourced by the other scripts.
if ! command -v protoc >/dev/null 2>&1 || [ ! -d /usr/include/google/protobuf ]; then
  echo "installing protobuf-compiler and libprotobuf-dev (needed to build etcd-client)" >&2
  _sudo=""; [ "$(id -u)" -eq 0 ] || _sudo="sudo -n"
  $_sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $_sudo apt-get install -y -qq protobuf-compiler libprotobuf-dev >/dev/null
fi
