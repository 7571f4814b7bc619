#!/usr/bin/env bash
# Counts the crates the client (aether-etcd) pulls into a user's build:
# normal dependencies only (not build scripts or dev-dependencies), each
# crate version once, the client itself excluded. With `--check`, fails unless the
# README states the same numbers, so the published figure stays true.
#   e2e/client-deps.sh            # prints: default, no-tls
#   e2e/client-deps.sh --check
set -euo pipefail
cd "$(dirname "$0")/.."

count() {
  cargo tree -p aether-etcd -e normal --prefix none "$@" |
    sed 's/ (\*)$//' | awk '{print $1, $2}' | sort -u | grep -cv '^aether-etcd '
}
default=$(count)
no_tls=$(count --no-default-features)
if [[ "${1:-}" != "--check" ]]; then
  echo "default features: $default crates; no default features (no TLS): $no_tls crates"
  exit 0
fi
want="**$default crates** with the default features"
want_no_tls="**$no_tls** with \`default-features = false\`"
for w in "$want" "$want_no_tls"; do
  if ! grep -qF -- "$w" README.md; then
    echo "README.md does not say \"$w\" (measured: default $default, no TLS $no_tls); update the client section" >&2
    exit 1
  fi
done
echo "client dependencies: $default (default), $no_tls (no TLS): README agrees"
