#!/usr/bin/env bash
# The release binary as shipped and benchmarked: a profile-guided (PGO) build of ferrisix.
#
#   1. builds an instrumented binary (-Cprofile-generate) in target/pgo/gen;
#   2. serves scripts/release/pgo_train.py's traffic mix with it (nginx upstream and wrk from
#      Debian, installed when missing) and merges the profile it writes on exit;
#   3. builds the release binary with that profile (-Cprofile-use), glibc linked in (static-pie)
#      with packed relocations, then links it again with the code an idle gateway runs laid
#      out first (scripts/release/startup_order.py), and copies it to OUT.
#
# The profile only steers code layout, inlining and branch order; what the binary does is the
# plain release build's (CI runs the conformance cases against this binary). Measured on the
# 2-core development machine: 27% less user-space CPU per proxied request, 12% less in all.
# Needs rustup's llvm-tools component for llvm-profdata (added when missing).
#
# Usage: scripts/build-release.sh [OUT]   (default target/pgo/ferrisix, under CARGO_TARGET_DIR)
#   FERRISIX_PGO_KEEP=1 keeps the instrumented build (1.5 GB) for a rerun.
#   FERRISIX_STARTUP_ORDER=0 keeps lld's own layout (the order is what gets measured).
#   FERRISIX_RUSTFLAGS is added to both builds.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
PGO=$TARGET_DIR/pgo
OUT=${1:-$PGO/ferrisix}
HOST=$(rustc -vV | sed -n 's/^host: //p')
PROFDATA=$(rustc --print sysroot)/lib/rustlib/$HOST/bin/llvm-profdata
if [ ! -x "$PROFDATA" ]; then
  rustup component add llvm-tools
fi
[ -x "$PROFDATA" ] || { echo "build-release: no llvm-profdata at $PROFDATA" >&2; exit 1; }

rm -rf "$PGO/raw"
mkdir -p "$PGO/raw" "$(dirname "$OUT")"
# `--target` keeps RUSTFLAGS off build scripts and proc macros: only the binary's code is
# instrumented (and later optimised with the profile).
EXTRA=${FERRISIX_RUSTFLAGS:-}
CARGO_TARGET_DIR=$PGO/gen RUSTFLAGS="$EXTRA -Cprofile-generate=$PGO/raw" \
  cargo build --release --locked --target "$HOST" --bin ferrisix
LLVM_PROFILE_FILE="$PGO/raw/train-%p-%m.profraw" \
  python3 scripts/release/pgo_train.py --binary "$PGO/gen/$HOST/release/ferrisix"
"$PROFDATA" merge -o "$PGO/ferrisix.profdata" "$PGO"/raw/train-*.profraw
[ "${FERRISIX_PGO_KEEP:-0}" = 1 ] || rm -rf "$PGO/gen"

# glibc linked in (+crt-static, a static PIE): no shared library to map (1.5 MiB less resident
# at idle, measured) and no glibc version asked of the host. Relative relocations packed
# (DT_RELR): the 632 KiB of `.rela.dyn` start-up read in whole become 8 KiB. Only glibc 2.36 and
# later apply packed relocations in static start-up, so an older build host links them unpacked.
LINK="-Ctarget-feature=+crt-static"
GLIBC=$(getconf GNU_LIBC_VERSION 2>/dev/null | sed -n 's/^glibc //p')
if [ -n "$GLIBC" ] && [ "$(printf '%s\n' 2.36 "$GLIBC" | sort -V | head -1)" = 2.36 ]; then
  LINK="$LINK -Clink-arg=-Wl,-z,pack-relative-relocs"
fi
# Functions the training never ran have no profile: that is expected, not worth a warning each.
export CARGO_TARGET_DIR=$PGO/use
export RUSTFLAGS="$EXTRA $LINK -Cprofile-use=$PGO/ferrisix.profdata -Cllvm-args=-pgo-warn-missing-function=false"
cargo build --release --locked --target "$HOST" --bin ferrisix
BIN=$PGO/use/$HOST/release/ferrisix
# The code an idle gateway runs, laid out first (startup_order.py says why). Only lld takes a
# symbol order: Rust links x86_64 Linux with it; elsewhere the layout stays lld's or ld's own.
# The second link recompiles only the binary's own crate (its LTO step) with the same objects.
if [ "${FERRISIX_STARTUP_ORDER:-1}" = 1 ] && grep -aqF "Linker: LLD" "$BIN"; then
  python3 scripts/release/startup_order.py --binary "$BIN" --out "$PGO/ferrisix.order"
  cargo rustc --release --locked --target "$HOST" --bin ferrisix -- \
    -Clink-arg=-Wl,--symbol-ordering-file="$PGO/ferrisix.order" -Clink-arg=-Wl,--no-warn-symbol-ordering
fi
cp "$BIN" "$OUT"
echo "build-release: $OUT (profile-guided, static, profile $PGO/ferrisix.profdata)"
