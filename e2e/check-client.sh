#!/usr/bin/env bash
# The client crate (crates/aether-etcd) as a user gets it, and the declared
# MSRVs: its dependency count as its README states it, a package that holds
# only what builds and documents it, the MSRV check, and its TLS feature
# sets. test-all.sh runs it before the suites; it fails on the first error.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=e2e/lib.sh
. e2e/lib.sh

stage "the client's dependency count, as crates/aether-etcd/README.md states it"
bash e2e/client-deps.sh --check

stage "the client's package holds only what builds and documents it"
package_list=$(cargo package -p aether-etcd --list --allow-dirty)
if ! grep -qx 'src/lib.rs' <<<"$package_list"; then
  echo "FAIL: cargo package -p aether-etcd --list did not list src/lib.rs" >&2
  exit 1
fi
stray=$(grep -vE '^(Cargo\.(toml|toml\.orig|lock)|LICENSE|README\.md|build\.rs|\.cargo_vcs_info\.json|proto/.*\.proto|proto/(LICENSE|README\.md)|src/.*\.rs|examples/.*\.rs)$' <<<"$package_list" || true)
if [[ -n "$stray" ]]; then
  echo "FAIL: stray files in the aether-etcd package:" >&2
  echo "$stray" >&2
  exit 1
fi

# The declared MSRV, checked with that toolchain: what a user builds, the
# libraries and the binaries. Not the tests, benches and their dev-deps:
# those are ours, built on the current toolchain. Its own artefacts sit
# beside the others in target/ (another compiler, other hashes), so it
# rebuilds nothing else.
msrv=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml)
client_msrv=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' crates/aether-etcd/Cargo.toml)
if [[ -z $msrv || -z $client_msrv ]]; then
  echo "FAIL: no rust-version = \"...\" line in Cargo.toml or crates/aether-etcd/Cargo.toml" >&2
  exit 1
fi
stage "MSRV: cargo +$msrv check"
need_toolchain "$msrv"
cargo "+$msrv" check --locked --workspace --lib --bins
# The client's own rust-version, if it claims an older one than the crate
# that depends on it.
if [[ $client_msrv != "$msrv" ]]; then
  stage "MSRV of aether-etcd: cargo +$client_msrv check"
  need_toolchain "$client_msrv"
  cargo "+$client_msrv" check --locked -p aether-etcd --lib
fi

stage "the client crate alone, with each TLS provider and with none; the engine without the app"
# Without TLS, then with aws-lc and Mozilla's roots compiled in (an
# https:// endpoint without a CA builds on any host); the endpoint unit
# test says which error each feature set gives. One build per feature set:
# each recompiles the TLS stack, the costliest part of this stage.
cargo check -p aether-etcd --no-default-features
cargo test -p aether-etcd --lib --no-default-features --features tls-aws-lc,tls-webpki-roots https_needs
cargo check -p aether-etcd
cargo check --lib --no-default-features
