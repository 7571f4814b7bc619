#!/usr/bin/env bash
# Counts the crates the client (aether-etcd) pulls into a user's build:
# normal dependencies only (not build scripts or dev-dependencies), each
# crate version once, the client itself excluded. With `--check`, fails unless the
# client's README states the same numbers, so the published figure stays true.
#   e2e/client-deps.sh                # prints: default, no-tls, webpki roots
#   e2e/client-deps.sh --check
#   e2e/client-deps.sh --etcd-client  # etcd-client 0.21's, counted the same way in a scratch
#                                     # project (needs the registry or its cache; not in CI)
set -euo pipefail
cd "$(dirname "$0")/.."

count() {
  cargo tree -p aether-etcd -e normal --prefix none "$@" |
    sed 's/ (\*)$//' | awk '{print $1, $2}' | sort -u | grep -cv '^aether-etcd '
}
if [[ "${1:-}" == "--etcd-client" ]]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  cargo new -q --vcs none "$scratch/count" --name etcd-client-count
  sed -i '/^\[dependencies\]$/,$d' "$scratch/count/Cargo.toml"
  count_etcd_client() {
    printf '[dependencies]\netcd-client = { version = "=0.21.1"%s }\n' "$1" >>"$scratch/count/Cargo.toml"
    cargo tree --manifest-path "$scratch/count/Cargo.toml" -e normal --prefix none |
      sed 's/ (\*)$//' | awk '{print $1, $2}' | sort -u | grep -cvE '^(etcd-client|etcd-client-count) '
    sed -i '/^\[dependencies\]$/,$d' "$scratch/count/Cargo.toml"
  }
  echo "etcd-client 0.21.1: no TLS $(count_etcd_client ', default-features = false') crates; tls $(count_etcd_client ', features = ["tls"]') crates"
  exit 0
fi
default=$(count)
no_tls=$(count --no-default-features)
# Mozilla's roots compiled in instead of the system's.
webpki=$(count --no-default-features --features tls-ring,tls-webpki-roots)
if [[ "${1:-}" != "--check" ]]; then
  echo "default features: $default crates; no default features (no TLS): $no_tls crates; tls-ring with tls-webpki-roots: $webpki crates"
  exit 0
fi
want="**$default crates** with the default features"
want_no_tls="**$no_tls** with \`default-features = false\`"
want_webpki="$webpki with \`tls-ring\` and \`tls-webpki-roots\`"
for w in "$want" "$want_no_tls" "$want_webpki"; do
  if ! grep -qF -- "$w" crates/aether-etcd/README.md; then
    echo "crates/aether-etcd/README.md does not say \"$w\" (measured: default $default, no TLS $no_tls, webpki roots $webpki); update its dependency line" >&2
    exit 1
  fi
done
echo "client dependencies: $default (default), $no_tls (no TLS), $webpki (webpki roots): crates/aether-etcd/README.md agrees"
