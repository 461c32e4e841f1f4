#!/usr/bin/env bash
# Cross-builds the workspace for aarch64-unknown-linux-gnu and runs its tests (and, with
# --bench, each criterion bench once in quick mode) under qemu-aarch64, on an x86_64 Debian 12
# machine. Figures under emulation say nothing about arm64 speed; real numbers come from the
# arm64 CI runner (.github/workflows/bench.yml).
#
# Why this way: rustup here has no aarch64 standard library and cannot fetch one, and a std from
# another rustc is refused. Debian's rustc-web ships a matching aarch64 std as the multiarch
# package libstd-rust-web-dev:arm64, so the cross build uses /usr/bin/cargo and /usr/bin/rustc
# (Debian's), leaving rustup's toolchain the default everywhere else.
#
# Usage: scripts/check/arm64-test.sh [--bench] [--no-install] [cargo test args...]
set -euo pipefail

TARGET=aarch64-unknown-linux-gnu
PACKAGES=(rustc-web cargo-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu
          libc6-dev-arm64-cross qemu-user)
BENCH=0
INSTALL=1
ARGS=()
for a in "$@"; do
  case "$a" in
    --bench) BENCH=1 ;;
    --no-install) INSTALL=0 ;;
    *) ARGS+=("$a") ;;
  esac
done

cd "$(dirname "$0")/../.."
# The programs the tests run (etcd, redis, nginx, protoc for the generated-code check...): the
# list scripts/test.sh installs.
read -ra TEST_PACKAGES <<<"$(sed -n 's/^packages="\(.*\)"$/\1/p' scripts/test.sh)"
PACKAGES+=("${TEST_PACKAGES[@]}")
say() { printf '[arm64] %s\n' "$*" >&2; }

installed() { [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]; }
missing=()
for p in "${PACKAGES[@]}"; do installed "$p" || missing+=("$p"); done
if ! dpkg --print-foreign-architectures | grep -qx arm64 || [ ${#missing[@]} -gt 0 ]; then
  [ "$INSTALL" = 1 ] || { say "missing: ${missing[*]} (run without --no-install)"; exit 1; }
  dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64
  apt-get update -qq
  [ ${#missing[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's compiler first, only inside this script.
export PATH="/usr/bin:$PATH" RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc
unset RUSTUP_TOOLCHAIN
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=qemu-aarch64
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
# The multiarch libc6:arm64 matches Debian's aarch64 loader; pointing qemu at the cross
# toolchain's sysroot instead (-L /usr/aarch64-linux-gnu) mixes the two and hangs threads.
export QEMU_LD_PREFIX=/
export CARGO_TARGET_DIR="${ARM64_TARGET_DIR:-$PWD/target/aarch64}"

# Tests that start the gateway binary need the kernel to run aarch64 executables via qemu.
if [ -d /proc/sys/fs/binfmt_misc ] && [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
  mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || true
  if [ -w /proc/sys/fs/binfmt_misc/register ]; then
    printf '%s' ':qemu-aarch64:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:/usr/bin/qemu-aarch64:F' \
      > /proc/sys/fs/binfmt_misc/register 2>/dev/null || say "could not register binfmt for qemu-aarch64; tests that spawn the binary may fail"
  fi
fi

say "building and testing for $TARGET with $(/usr/bin/rustc --version)"
/usr/bin/cargo test --target "$TARGET" --workspace "${ARGS[@]}"

if [ "$BENCH" = 1 ]; then
  say "running benches once (quick mode)"
  /usr/bin/cargo bench --target "$TARGET" --workspace -- --quick --noplot
fi
