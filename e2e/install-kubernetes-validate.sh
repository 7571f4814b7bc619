#!/usr/bin/env bash
# Installs PyPI's kubernetes-validate (the Kubernetes OpenAPI schemas of every release, shipped in the
# package, so it validates offline) into a virtualenv of its own, and prints the path of its command.
# Nothing lands on PATH. e2e/check-deploy.sh validates every rendered overlay with it.
#   kv=$(bash e2e/install-kubernetes-validate.sh)
#   "$kv" --strict -k 1.27.0 render.yaml
set -euo pipefail
version=1.37.0
dir=${AETHER_KUBERNETES_VALIDATE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/aether-replicator/kubernetes-validate-$version}
if [ -x "$dir/bin/kubernetes-validate" ] && [ "$("$dir/bin/kubernetes-validate" --version 2>/dev/null)" = "$version" ]; then
  echo "$dir/bin/kubernetes-validate"
  exit 0
fi
command -v python3 >/dev/null || {
  echo "python3 is needed to install kubernetes-validate (apt-get install -y python3 python3-venv)" >&2
  exit 1
}
rm -rf "$dir"
mkdir -p "$(dirname "$dir")"
if ! python3 -m venv "$dir" >&2; then
  # Debian's python3 has venv in a package of its own.
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2
    rm -rf "$dir"
    python3 -m venv "$dir" >&2
  else
    echo "python3 -m venv failed: apt-get install -y python3-venv" >&2
    exit 1
  fi
fi
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check "kubernetes-validate==$version" >&2 || {
  echo "could not install kubernetes-validate==$version from PyPI" >&2
  exit 1
}
[ "$("$dir/bin/kubernetes-validate" --version)" = "$version" ] || {
  echo "installed kubernetes-validate is not $version" >&2
  exit 1
}
echo "$dir/bin/kubernetes-validate"
