#!/usr/bin/env bash
# The two-region demo, in one command on a fresh machine:
#
#   e2e/demo.sh                   live view until Ctrl-C
#   DEMO_ONESHOT=1 e2e/demo.sh    render the view 3 times, clean up, exit 0
#
# It installs etcd if missing (Debian's; needs root), builds the replicator
# (cargo build --release, wherever cargo puts it), starts regions a and b
# with the e2e harness, e2e/mesh.sh (one etcd and two replicators each, on
# loopback), writes sample endpoints and shows, every second, per region:
# the leader, its replication to the other region (metrics), each origin's
# copy as the region's consumers see it (`aether-replicator endpoints`: synced,
# staleness in seconds) and the newest keys. It prints an `etcdctl put` to
# paste, to see a key typed by hand arrive in the other region, and the
# `kill` that stops a region's replicators, to watch the failover.
#
# Ctrl-C (or TERM, HUP, or the end of the pipe it writes to) stops every
# process it started (mesh.sh down, by pid), removes its state dir
# and exits 0, under `| tee` too (`aether-e2e demo-test` checks it).
# Environment: DEMO_ONESHOT=1 (see above), DEMO_TTL (mirror lease TTL in
# seconds, default 6), DEMO_BIN (an aether-replicator to run instead of
# building one; CI passes its debug build).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
readonly SCRIPT_DIR REPO
# shellcheck source=e2e/lib.sh
. "$SCRIPT_DIR/lib.sh"
readonly MR="$SCRIPT_DIR/mesh.sh"
MR_SHOWN=$MR
[[ $PWD == "$REPO" ]] && MR_SHOWN=e2e/mesh.sh
readonly MR_SHOWN KEY_ROOT=/aether/v1/regions/ ONESHOT=${DEMO_ONESHOT:-0} TTL=${DEMO_TTL:-6}
export ETCDCTL_API=3
say() { echo "== $*"; }

# ---------------------------------------------------------------- cleanup

STATE='' TTY=0 CLEANED=0
[[ -t 1 ]] && TTY=1
# relay: stdin to stderr, write errors ignored. Ctrl-C under `demo.sh | tee`
# ends tee too, and a write to its pipe must not end the cleanup halfway.
# shellcheck disable=SC2317 # invoked by the traps
relay() {
  local line
  while IFS= read -r line; do printf '%s\n' "$line" >&2 2>/dev/null || true; done
}
# shellcheck disable=SC2317 # invoked by the traps
cleanup() {
  ((CLEANED)) && return 0
  CLEANED=1
  set +e
  # Ignored by `down` too (ignored signals are inherited): a second Ctrl-C
  # or a closed pipe must not stop it before every process is stopped.
  trap '' INT TERM HUP PIPE
  ((TTY)) && printf '\033[?25h' 2>/dev/null
  [[ -n $STATE ]] || return 0
  { echo; say "stopping the demo"; "$MR" down --state "$STATE" 2>&1; } | relay
}
# shellcheck disable=SC2317 # invoked by the traps
on_signal() { cleanup; exit 0; }
# PIPE: the reader went away without a signal to this shell (tee killed).
trap on_signal INT TERM HUP PIPE
trap cleanup EXIT

# ---------------------------------------------------------------- setup

need_etcd
command -v cargo >/dev/null || { echo "cargo is needed to build the replicator (https://rustup.rs)" >&2; exit 1; }
# Without DEMO_BIN, `up` builds the replicator (cargo build --release).
BIN_ARGS=()
if [[ -n ${DEMO_BIN:-} ]]; then
  [[ -x $DEMO_BIN ]] || { echo "DEMO_BIN is not an executable: $DEMO_BIN" >&2; exit 1; }
  BIN_ARGS=(--bin "$DEMO_BIN")
fi

STATE=$(mktemp -d "${TMPDIR:-/tmp}/aether-demo.XXXXXX")
say "building and starting regions a and b"
"$MR" up --state "$STATE" --regions 2 --ttl "$TTL" "${BIN_ARGS[@]}"
# shellcheck source=/dev/null
source "$STATE/env"
getv() { printf '%s' "${!1-}"; }
ectl() {
  local r=$1
  shift
  timeout 10 etcdctl --endpoints="$(getv "ETCD_URL_$r")" --dial-timeout=2s --command-timeout=3s "$@" </dev/null
}

say "writing sample endpoints"
# Region a runs checkout, cart and payments; b runs search, inventory and its
# own checkout.
while read -r r cluster svc proto ip zone port; do
  ectl "$r" put "${KEY_ROOT}$r/clusters/$cluster/services/$svc/protocols/$proto/endpoints/$ip" \
    "$(printf '{"clusterName":"%s","region":"%s","zone":"%s","port":%s}' "$cluster" "$r" "$zone" "$port")" >/dev/null
done <<'EOF'
a prod-a1 checkout http 10.1.0.11 a-1 8080
a prod-a1 checkout http 10.1.0.12 a-2 8080
a prod-a1 checkout grpc 10.1.0.11 a-1 9090
a prod-a1 cart http 10.1.1.21 a-1 8081
a prod-a1 payments grpc 10.1.2.31 a-3 7443
b prod-b1 search http 10.2.0.11 b-1 8080
b prod-b1 search http 10.2.0.12 b-2 8080
b prod-b1 inventory grpc 10.2.1.21 b-1 9090
b prod-b1 checkout http 10.2.2.31 b-1 8080
EOF

# ---------------------------------------------------------------- view

say "live view (state: $STATE)"
((TTY)) && printf '\033[?25l\033[2J'
FRAMES=()
[[ $ONESHOT == 1 ]] && FRAMES=(--frames 3)
# The view (aether-e2e demo-view) ends at Ctrl-C, or quietly with exit 0
# when the reader of its output goes away; the traps above clean up.
"$MR" demo-view --state "$STATE" --mesh-cmd "$MR_SHOWN" "${FRAMES[@]}"
exit 0
