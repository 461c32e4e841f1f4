#!/usr/bin/env bash
# Builds the container image here, with no registry access, and runs the seeds' walkthrough
# against it: a PUT to the Admin API in the container (201), a GET through its data port to an
# upstream on the host (200), then a restart of the container with its data volume (the
# route is still served).
#
# The image is docker/Containerfile.local: FROM scratch, the binary built on this machine
# (FERRISIX_BIN, default target/release/ferrisix) and the shared libraries it links, copied
# from the host. The engine is podman (Debian's package). On machines like this one (a VM
# whose root lacks CAP_SYS_RESOURCE, cgroups v1 and v2 both mounted) podman's default runtime
# crun fails: it cannot raise RLIMIT_NOFILE/NPROC to podman's defaults ("setrlimit
# RLIMIT_NOFILE: Operation not permitted") and refuses the hybrid cgroup layout ("cgroups in
# hybrid mode not supported"); the script then runs with runc and the limits at or below the
# caller's own, and says so. The container uses the host's network (ports chosen free here).
#
#   scripts/check/image-test.sh            build, run, check; exit 0 on success
#   IMAGE_KEEP=1 scripts/check/image-test.sh   leave the image and the volume
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
bin=${FERRISIX_BIN:-$root/target/release/ferrisix}
image=localhost/ferrisix:local
name=ferrisix-image-test-$$
volume=ferrisix-image-test-$$
command -v podman >/dev/null || { echo "podman is not installed (apt-get install podman)"; exit 1; }
[ -x "$bin" ] || { echo "$bin is not built (cargo build --release --bin ferrisix)"; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
data=$(free_port); admin=$(free_port); control=$(free_port); metrics=$(free_port); up=$(free_port)
key=$(tr -dc A-Za-z </dev/urandom 2>/dev/null | head -c 32 || true)

# 1. The root filesystem: the binary, the libraries it links, the configs, the data dir.
rootfs=docker/rootfs
rm -rf "$rootfs"; mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/ferrisix" "$rootfs/var/lib/ferrisix" "$rootfs/tmp"
cp "$bin" "$rootfs/usr/local/bin/ferrisix"
for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
  mkdir -p "$rootfs$(dirname "$lib")"; cp -L "$lib" "$rootfs$lib"
done
cp docker/config.yaml docker/config-embedded.yaml "$rootfs/etc/ferrisix/"
chmod 1777 "$rootfs/tmp"
echo "image contents: $(du -sh "$rootfs" | cut -f1) ($(ldd "$bin" | grep -c '/') shared libraries from the host)"

# 2. The image.
started=$(date +%s)
podman build -q -f docker/Containerfile.local -t "$image" docker >/dev/null
echo "built $image in $(( $(date +%s) - started )) s: $(podman image inspect "$image" --format '{{.Size}}') bytes"

# 3. The engine: podman's default runtime, else runc within our own limits.
run_opts=()
if ! out=$(podman run --rm --network host "$image" --version 2>&1); then
  echo "podman run with its default runtime failed: $(tail -1 <<<"$out")"
  # nofile as high as this shell may go; nproc counts uid 65532's processes only.
  nofile=$(ulimit -Hn); nproc=4096
  [ "$nofile" -gt 65536 ] && nofile=65536
  run_opts=(--runtime runc --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
  if ! out=$(podman "${run_opts[@]:0:2}" run --rm --network host "${run_opts[@]:2}" "$image" --version 2>&1); then
    echo "runc with nofile=$nofile nproc=$nproc failed too: $(tail -1 <<<"$out")"
    run_opts=(--runtime runc --ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
    out=$(podman "${run_opts[@]:0:2}" run --rm --network host "${run_opts[@]:2}" "$image" --version 2>&1) \
      || { echo "no way to run a container here: $(tail -1 <<<"$out")"; exit 1; }
  fi
  echo "running with: ${run_opts[*]}"
fi
echo "in the container: $(head -2 <<<"$out" | tr '\n' ' ')"
podman_run() { if [ ${#run_opts[@]} -gt 0 ]; then podman "${run_opts[@]:0:2}" run "${run_opts[@]:2}" "$@"; else podman run "$@"; fi; }

up_pid=""
cleanup() {
  podman rm -f "$name" >/dev/null 2>&1 || true
  [ -n "$up_pid" ] && kill "$up_pid" 2>/dev/null || true
  if [ "${IMAGE_KEEP:-0}" != 1 ]; then podman volume rm -f "$volume" >/dev/null 2>&1 || true; fi
  rm -rf "$root/$rootfs"
}
trap cleanup EXIT
# The upstream: any server answering 200 will do, so the check needs no other build.
python3 -c '
import http.server, sys
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "3"); self.end_headers(); self.wfile.write(b"ok\n")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ok).serve_forever()' "$up" &
up_pid=$!
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$up") 2>/dev/null && break; sleep 0.1; done


start_container() {
  podman_run -d --name "$name" --network host -v "$volume:/var/lib/ferrisix" \
    -e FERRISIX_ADMIN_KEY="$key" -e FERRISIX_DATA_PORT="$data" -e FERRISIX_ADMIN_PORT="$admin" \
    -e FERRISIX_CONTROL_PORT="$control" -e FERRISIX_METRICS_PORT="$metrics" \
    "$image" -c /etc/ferrisix/config-embedded.yaml >/dev/null
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$data") 2>/dev/null && (exec 3<>"/dev/tcp/127.0.0.1/$admin") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "the container did not listen:"; podman logs "$name" | tail -20; exit 1
}

# 4. The walkthrough.
start_container
put=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$admin/apisix/admin/routes/1" -H "X-API-KEY: $key" -X PUT \
  -d "{\"uri\": \"/hello\", \"upstream\": {\"type\": \"roundrobin\", \"nodes\": {\"127.0.0.1:$up\": 1}}}")
get=""
for _ in $(seq 50); do get=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$data/hello"); [ "$get" = 200 ] && break; sleep 0.1; done
echo "walkthrough against the container: PUT $put, GET $get"
podman stop -t 10 "$name" >/dev/null; podman rm "$name" >/dev/null
start_container
again=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$data/hello")
echo "after a container restart on the same volume: GET $again"
podman logs "$name" 2>&1 | grep -m1 "serving" || true
if [ "$put" = 201 ] && [ "$get" = 200 ] && [ "$again" = 200 ]; then echo "image test: PASS"; else echo "image test: FAIL"; podman logs "$name" | tail -20; exit 1; fi
