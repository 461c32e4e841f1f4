#!/usr/bin/env bash
# examples/hyper_floor.rs built as the gateway's release binary is (scripts/build-release.sh):
# profile-guided and static, so that bench.py --floor compares like with like. The profile is
# s1's traffic (wrk on /hello through the floor to bench.py's nginx upstream, 20 s).
#
# Usage: benches/e2e/build_floor.sh   -> target/pgo-floor/hyper_floor (under CARGO_TARGET_DIR)
set -euo pipefail
cd "$(dirname "$0")/../.."
TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
DIR=$TARGET_DIR/pgo-floor
HOST=$(rustc -vV | sed -n 's/^host: //p')
PROFDATA=$(rustc --print sysroot)/lib/rustlib/$HOST/bin/llvm-profdata
[ -x "$PROFDATA" ] || rustup component add llvm-tools
rm -rf "$DIR/raw"
mkdir -p "$DIR/raw"
CARGO_TARGET_DIR=$DIR/gen RUSTFLAGS="-Cprofile-generate=$DIR/raw" \
  cargo build --release --locked --target "$HOST" --example hyper_floor
LLVM_PROFILE_FILE="$DIR/raw/floor-%p-%m.profraw" FLOOR="$DIR/gen/$HOST/release/examples/hyper_floor" \
  python3 - <<'PY'
import os, signal, subprocess, sys, tempfile
sys.path.insert(0, "benches/e2e")
import bench
bench.ensure_tools()
work = tempfile.mkdtemp(prefix="ferrisix-floor-")
upstream = bench.start_upstream(work, None)
floor = bench.start_floor(None, os.environ["FLOOR"])
try:
    subprocess.run(["wrk", "-t", "2", "-c", "16", "-d", "20s",
                    f"http://127.0.0.1:{bench.FLOOR_PORT}/hello"], check=True)
finally:
    floor.send_signal(signal.SIGINT)
    floor.wait(timeout=30)
    upstream.terminate()
    upstream.wait()
PY
"$PROFDATA" merge -o "$DIR/floor.profdata" "$DIR"/raw/floor-*.profraw
rm -rf "$DIR/gen"
CARGO_TARGET_DIR=$DIR/use RUSTFLAGS="-Ctarget-feature=+crt-static -Cprofile-use=$DIR/floor.profdata -Cllvm-args=-pgo-warn-missing-function=false" \
  cargo build --release --locked --target "$HOST" --example hyper_floor
cp "$DIR/use/$HOST/release/examples/hyper_floor" "$DIR/hyper_floor"
echo "build_floor: $DIR/hyper_floor (profile-guided, static)"
