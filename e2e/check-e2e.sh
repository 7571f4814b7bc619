#!/usr/bin/env bash
# The end-to-end stages of e2e/test-all.sh, run after the suites: the
# demo's Ctrl-C test, a 3-region mesh (quiet, verify, alerts) with the
# fuzz targets' build and run beside its quiet phase, and a 5-region
# burst. Every stage runs the Rust test kit's `aether-e2e` on the debug
# builds the suites made. Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=e2e/lib.sh
. e2e/lib.sh

# The demo and the multi-region harness run the debug builds the suites
# made (debug assertions on, and no release build for CI to wait for);
# the figures in BENCHMARKS.md come from release builds.
cargo build --workspace --bins --examples
debug=${CARGO_TARGET_DIR:-target}/debug
[[ $debug == /* ]] || debug=$PWD/$debug
e2e_bin=$debug/aether-e2e

stage "the demo: demo.sh | tee, Ctrl-C, nothing left running"
"$e2e_bin" demo-test --runs 1 --bin "$debug/aether-replicator"

# The harness must not leave anything behind, whether verify passed or not:
# every process it starts names its state dir on its command line.
leftovers() {
  if pgrep -f "$state" >/dev/null; then
    echo "FAIL: processes left behind by the e2e harness:" >&2
    pgrep -af "$state" >&2
    return 1
  fi
}
# One mesh of 3 regions with jittered links (5 ms + 0..20 ms each way, every
# link through its own proxy) and first a quiet phase: 180 s of churn in
# which no alert may fire (before verify, whose faults legitimately raise
# alerts with 1h windows). It covers everything the 2-region run that used
# to precede it checked (verify and alerts run the same steps on a, b and
# c), so that run was dropped; direct links are covered by the demo and the
# burst below.
stage "multi-region e2e, 3 regions"
state=$(mktemp -d)
fuzz_log=$(mktemp)
fuzz_pid=
trap '"$e2e_bin" down --state "$state" >/dev/null 2>&1 || true; leftovers || true
  [[ -z $fuzz_pid ]] || kill -- "-$fuzz_pid" 2>/dev/null || true' EXIT
"$e2e_bin" up --state "$state" --regions 3 --prometheus --link-delay 5 --link-jitter 20 \
  --bin "$debug/aether-replicator"
# Every fuzz target built (instrumented, on stable: no cargo-fuzz needed)
# and run for a few seconds on its corpus (fuzz/README.md), beside the
# quiet phase: the mesh then idles at a quarter of one core for three
# minutes, and the build takes about as long. At nice 19 it yields the
# CPU to the mesh, whose alerts must stay quiet all the same. Its own
# session, so that a failed run stops its cargo and rustc too.
setsid nice -n 19 bash fuzz/smoke.sh >"$fuzz_log" 2>&1 &
fuzz_pid=$!
"$e2e_bin" quiet --state "$state"
stage "fuzz targets build and run (begun beside the quiet phase)"
if ! wait "$fuzz_pid"; then
  cat "$fuzz_log" >&2
  exit 1
fi
fuzz_pid=
grep '^fuzz ' "$fuzz_log"
rm -f "$fuzz_log"
"$e2e_bin" verify --state "$state"
"$e2e_bin" alerts --state "$state"
"$e2e_bin" down --state "$state"
trap - EXIT
leftovers
# Many regions under load (docs/scale.md): five regions, one burst round in
# every region at once; fails if a peer never holds a region's burst.
stage "multi-region burst, 5 regions"
state=$(mktemp -d)
trap '"$e2e_bin" down --state "$state" >/dev/null 2>&1 || true; leftovers || true' EXIT
"$e2e_bin" up --state "$state" --regions 5 --bin "$debug/aether-replicator"
"$e2e_bin" burst --state "$state" --rounds 1 --loadgen "$debug/examples/loadgen"
"$e2e_bin" down --state "$state"
trap - EXIT
leftovers
