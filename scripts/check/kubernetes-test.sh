#!/usr/bin/env bash
# Checks the Kubernetes manifests of deploy/kubernetes/ without a cluster:
# 1. every object against Kubernetes' own OpenAPI schemas, strictly (unknown fields refused),
#    with kubernetes-validate (PyPI; scripts/test.sh installs it);
# 2. the config.yaml each ConfigMap carries, as ferrisix reads it (`ferrisix -t`), with the
#    environment the Deployment gives it.
# Usage: scripts/check/kubernetes-test.sh [path/to/ferrisix]  (default target/debug/ferrisix)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-${FERRISIX_BIN:-target/debug/ferrisix}}"
k8s_version="1.30.0"

kubernetes-validate --strict --quiet -k "$k8s_version" deploy/kubernetes/*.yaml

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp" deploy/kubernetes/*.yaml <<'PY'
import sys, yaml
out = sys.argv[1]
n = 0
for path in sys.argv[2:]:
    for doc in yaml.safe_load_all(open(path)):
        if doc and doc.get("kind") == "ConfigMap" and "config.yaml" in doc.get("data", {}):
            name = doc["metadata"]["name"]
            with open(f"{out}/{name}.yaml", "w") as f:
                f.write(doc["data"]["config.yaml"])
            n += 1
if n == 0:
    sys.exit("no ConfigMap with a config.yaml found")
PY
for conf in "$tmp"/*.yaml; do
  FERRISIX_ADMIN_KEY=0123456789abcdef0123456789abcdef "$bin" -t -c "$conf" >/dev/null
  echo "kubernetes-test: $(basename "$conf"): ferrisix accepts it"
done
echo "kubernetes-test: manifests valid for Kubernetes $k8s_version"
