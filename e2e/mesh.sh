#!/usr/bin/env bash
# The multi-region e2e harness: builds `aether-e2e` (the test kit's binary,
# crates/test-kit/src/bin/aether-e2e; cargo returns at once when it is up
# to date) and runs it with these arguments, e.g.
#
#   e2e/mesh.sh up --state DIR --regions 3 --prometheus
#   e2e/mesh.sh verify --state DIR
#   e2e/mesh.sh down --state DIR
#
# `e2e/mesh.sh help` lists the subcommands, `e2e/mesh.sh help up` the options.
#
# AETHER_E2E_BIN: an aether-e2e to run instead of building one (CI's
# debug build).
set -euo pipefail
[[ -z ${AETHER_E2E_BIN:-} ]] || exec "$AETHER_E2E_BIN" "$@"
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cargo build --quiet --release --manifest-path "$repo/Cargo.toml" -p aether-test-kit --bin aether-e2e
target=${CARGO_TARGET_DIR:-$repo/target}
[[ $target == /* ]] || target=$PWD/$target  # as cargo reads it
exec "$target/release/aether-e2e" "$@"
