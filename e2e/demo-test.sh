#!/usr/bin/env bash
# The demo as a person runs it, `e2e/demo.sh | tee FILE` then Ctrl-C; fails
# if anything the demo started is left behind.
#
#   e2e/demo-test.sh [RUNS]     RUNS runs (default 1)
#
# First one DEMO_ONESHOT=1 run, which must render 3 frames, exit 0 and
# leave nothing. Then each run starts the pipeline in a process group of its
# own (setsid), as a shell starts a foreground job; waits (bounded) until
# the demo's view is up, pastes the `etcdctl put` the demo prints and waits
# until that key is listed among region b's newest keys; then sends SIGINT
# to the whole group, as a terminal does on Ctrl-C (tee gets it too, so the
# demo cleans up writing to a pipe nobody reads). It then checks that the
# group ended, that no process the demo started is left (the pids it
# recorded, and any process whose command line names its state dir) and
# that no aether-demo.* state dir is left. Whatever is left is reported,
# stopped (by pid) and removed, and the run fails.
#
# Environment: DEMO_TEST_TIMEOUT, seconds to wait for the view (default
# 120; the release build is made before the clock starts).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${1:-1}
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || {
  echo "usage: e2e/demo-test.sh [RUNS]" >&2
  exit 2
}
TIMEOUT=${DEMO_TEST_TIMEOUT:-120}
# shellcheck source=e2e/lib.sh
. e2e/lib.sh
need_etcd
need_commands python3 curl setsid
env --default-signal=INT true 2>/dev/null || {
  echo "demo-test.sh needs env --default-signal (GNU coreutils 8.31 or later)" >&2
  exit 1
}
# The demo asks cargo where the binary is (CARGO_TARGET_DIR, a target-dir in
# .cargo/config): a path of its own under target/ broke that once.
if grep -n 'target/\(release\|debug\)' e2e/demo.sh; then
  echo "FAIL: e2e/demo.sh assumes where cargo puts the binary; ask cargo (--message-format=json)" >&2
  exit 1
fi
# Built first, so that the bounded waits below measure the demo, not rustc.
cargo build --release --bin aether-replicator

# The demos make their state dirs under TMPDIR: a dir of this test's own, so
# that another demo on the machine is neither checked nor touched.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/aether-demo-test.XXXXXX")
PGID=
# On an early exit: the group gets SIGINT, as in a run, and what it leaves
# is stopped.
finish() {
  [[ -z $PGID ]] || kill -INT -- "-$PGID" 2>/dev/null || true
  [[ -z $PGID ]] || wait_group_gone 30 >/dev/null || true
  leftovers "" >/dev/null || true
  rm -rf "$WORK"
}
trap finish EXIT

# procs_naming DIR: "PID COMMAND LINE" of each process whose command line
# names DIR.
procs_naming() {
  local f
  local -a argv
  for f in /proc/[0-9]*/cmdline; do
    mapfile -d '' -t argv 2>/dev/null <"$f" || continue
    [[ " ${argv[*]} " == *"$1"* ]] && echo "${f//[!0-9]/} ${argv[*]}"
  done
  return 0
}

# leftovers STATE [PID...]: reports each process left of a demo (a PID it
# recorded still naming STATE, or any process naming STATE or a state dir
# under WORK) and each state dir left; stops them (mesh.sh down, then
# SIGKILL by pid) and removes them. Returns 1 if there was anything.
leftovers() {
  local state=$1 d pid line bad=0
  shift
  local -a dirs=() stray=()
  for d in "$WORK"/aether-demo.*; do
    [[ -e $d ]] || continue
    echo "  state dir left: $d"
    [[ $d == "$state" ]] || dirs+=("$d")
    bad=1
  done
  for pid in "$@"; do
    if [[ -n $state && $(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") == *"$state"* ]]; then
      echo "  recorded pid $pid still running"
      bad=1
    fi
  done
  for d in ${state:+"$state"} "${dirs[@]}"; do
    while read -r pid line; do
      echo "  process left: $pid $line"
      stray+=("$pid")
      bad=1
    done < <(procs_naming "$d")
  done
  ((bad)) || return 0
  for d in ${state:+"$state"} "${dirs[@]}"; do
    e2e/mesh.sh down --state "$d" >/dev/null 2>&1 || true
  done
  for pid in "${stray[@]}"; do
    [[ $(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") == *"$WORK"* ]] && kill -KILL "$pid" 2>/dev/null
  done
  rm -rf "$WORK"/aether-demo.*
  return 1
}

# wait_group_gone SECONDS: until no process is left in group PGID.
wait_group_gone() {
  local deadline=$((SECONDS + $1))
  while pgrep -g "$PGID" >/dev/null; do
    if ((SECONDS >= deadline)); then
      echo "  the demo's process group still runs $1 s after SIGINT:"
      ps -o pid=,args= -g "$PGID" | sed 's/^/    /'
      return 1
    fi
    sleep 0.2
  done
}

# until_seen SECONDS WHAT COMMAND...: runs COMMAND until it succeeds; gives
# up after SECONDS, or when the demo's group ended, with the demo's output.
until_seen() {
  local limit=$1 what=$2
  local deadline=$((SECONDS + limit))
  shift 2
  until "$@"; do
    if ((SECONDS >= deadline)) || ! kill -0 "$PGID" 2>/dev/null; then
      echo "  not seen in ${limit}s (or the demo ended): $what; the demo's last output:"
      tail -n 40 "$OUT" | sed 's/^/    /'
      return 1
    fi
    sleep 0.2
  done
}

# in_b_newest IP: a frame lists IP in region b's part.
in_b_newest() {
  awk -v ip="$1:" '/^region / { r = $2 } /^$/ { r = "" } r == "b" && index($0, ip) { f = 1 } END { exit !f }' "$OUT"
}

oneshot() {
  local log=$WORK/oneshot.log rc=0 state frames
  echo "== demo-test: DEMO_ONESHOT=1"
  TMPDIR=$WORK DEMO_ONESHOT=1 timeout 600 e2e/demo.sh >"$log" 2>&1 || rc=$?
  state=$(sed -n 's/^== live view (state: \(.*\))$/\1/p' "$log")
  frames=$(grep -c '^DEMO_ONESHOT: rendering 3 times' "$log" || true)
  if ((rc != 0 || frames != 3)) || ! leftovers "$state"; then
    echo "FAIL: DEMO_ONESHOT=1 exited $rc after $frames frames (or left the above); its output:"
    tail -n 40 "$log" | sed 's/^/    /'
    return 1
  fi
}

# run I: one run, Ctrl-C under a pipe; returns 1 if the run failed.
run() {
  local state put ok=0
  local -a pids=()
  OUT=$WORK/demo-$1.log
  rm -f "$WORK/pgid"
  # The group's first process writes its pid, the group's id (setsid may
  # fork, so $! may not be it). A script's background job starts with
  # SIGINT ignored, and a bash cannot trap a signal ignored at its start:
  # env gives the pipeline the dispositions of a terminal's foreground job.
  # shellcheck disable=SC2016 # expanded by the inner shell
  TMPDIR=$WORK setsid env --default-signal=INT,QUIT,PIPE bash -c 'echo $$ >"$2.tmp" && mv "$2.tmp" "$2"; e2e/demo.sh 2>&1 | tee "$1" >/dev/null' \
    demo "$OUT" "$WORK/pgid" </dev/null &
  local deadline=$((SECONDS + 10))
  until [[ -s $WORK/pgid ]] || ((SECONDS >= deadline)); do sleep 0.05; done
  PGID=$(cat "$WORK/pgid" 2>/dev/null) || {
    echo "  the demo's group did not start in 10 s"
    return 1
  }
  if until_seen "$TIMEOUT" "the live view" grep -q '^Ctrl-C stops the demo' "$OUT"; then
    state=$(sed -n 's/^== live view (state: \(.*\))$/\1/p' "$OUT")
    cat "$state"/pids/*.pid >"$WORK/pids" 2>/dev/null || true
    mapfile -t pids <"$WORK/pids"
    put=$(grep -m1 '^    etcdctl --endpoints=.* put ' "$OUT")
    if timeout 10 bash -c "$put" >/dev/null &&
      until_seen 30 "the pasted key (10.1.9.9) in region b's newest keys" in_b_newest 10.1.9.9; then
      ok=1
    fi
  fi
  # Ctrl-C: SIGINT to every process in the terminal's foreground group.
  kill -INT -- "-$PGID" 2>/dev/null || true
  if ! wait_group_gone 60; then
    ok=0
    pgrep -g "$PGID" | xargs -r kill -KILL 2>/dev/null || true
  fi
  wait "$!" 2>/dev/null || true
  PGID=
  leftovers "${state:-}" "${pids[@]}" || ok=0
  ((ok))
}

oneshot || exit 1
failed=0
for ((i = 1; i <= RUNS; i++)); do
  if run "$i"; then
    echo "== demo-test: run $i of $RUNS: nothing left"
  else
    echo "FAIL: demo-test: run $i of $RUNS (above)"
    failed=$((failed + 1))
  fi
done
echo "== demo-test: $RUNS runs, $failed left something behind or failed"
((failed == 0))
