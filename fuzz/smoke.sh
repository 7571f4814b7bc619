#!/usr/bin/env bash
# CI's check of the fuzz targets: builds every target in Cargo.toml with
# libFuzzer's coverage instrumentation, on stable Rust and without
# cargo-fuzz, then runs each for a few seconds on a scratch directory, its
# corpus and its dictionary. Fails if a target does not build, or if a
# corpus input or anything the short run finds makes it fail; the input is
# then in fuzz/artifacts/<target>/.
#
# The build is unoptimised (dev profile: about half the build time of
# `cargo fuzz build`'s release build), so it finds little in a few seconds:
# fuzz for real with cargo-fuzz (README.md).
#
# FUZZ_SECONDS (default 5): how long each target runs; 0 runs each corpus
# input once and stops.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${FUZZ_SECONDS:-5}

if ! command -v c++ >/dev/null; then
  echo "fuzz/smoke.sh: libfuzzer-sys compiles libFuzzer with c++, which is missing: apt-get install -y g++" >&2
  exit 1
fi
# peer_spec goes through clap, which reads these.
while read -r v; do unset "$v"; done < <(compgen -e | grep '^AETHER_REPLICATOR_' || true)

# What `cargo fuzz build --sanitizer none` passes (cargo-fuzz 0.13.2), less
# the release profile. With --target, RUSTFLAGS reach only the target's
# crates, not the build scripts and proc macros, which are not linked
# against libFuzzer.
host=$(rustc -vV | sed -n 's/^host: //p')
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module \
-Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
-Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares \
-Cllvm-args=-sanitizer-coverage-stack-depth \
-Cllvm-args=-simplifycfg-branch-fold-threshold=0"
# Line tables only: file:line in a panic's backtrace, at a fraction of
# the link time of full debug info.
CARGO_PROFILE_DEV_DEBUG=line-tables-only \
  cargo build --locked --bins --target "$host" --target-dir target/smoke
bin=target/smoke/$host/debug

targets=$(awk '/^\[\[bin\]\]/ { b = 1; next } b && /^name = / { gsub(/"/, "", $3); print $3; b = 0 }' Cargo.toml)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
if ((seconds == 0)); then
  how=(-runs=0)
else
  how=(-max_total_time="$seconds")
fi
for t in $targets; do
  mkdir -p "$scratch/$t" "artifacts/$t"
  dict=()
  [[ -f dicts/$t.dict ]] && dict=(-dict="dicts/$t.dict")
  # New inputs go to the scratch directory (the first), not the corpus.
  if ! "$bin/$t" "$scratch/$t" "corpus/$t" "${dict[@]}" "${how[@]}" \
    -timeout=30 -artifact_prefix="artifacts/$t/" >"$scratch/$t.log" 2>&1; then
    tail -n 40 "$scratch/$t.log" >&2
    echo "FAIL: fuzz target $t: the input is in fuzz/artifacts/$t/ (fuzz/README.md: reproduce a crash)" >&2
    exit 1
  fi
  echo "fuzz $t: $(grep -E '^#[0-9]+[[:space:]]+DONE' "$scratch/$t.log" | tail -n 1)"
done
