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
need_commands python3 curl
command -v cargo >/dev/null || { echo "cargo is needed to build the replicator (https://rustup.rs)" >&2; exit 1; }
if [[ -n ${DEMO_BIN:-} ]]; then
  BIN=$DEMO_BIN
else
  say "building (cargo build --release)"
  # Cargo says where the binary is: CARGO_TARGET_DIR or a .cargo/config may
  # put it anywhere.
  BIN=$(cd "$REPO" && cargo build --release --bin aether-replicator --message-format=json-render-diagnostics |
    python3 -c 'import json, sys
for m in map(json.loads, sys.stdin):
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "aether-replicator" and m.get("executable"):
        print(m["executable"])')
fi
[[ -x $BIN ]] || { echo "no aether-replicator executable (cargo build named none, or DEMO_BIN is wrong): ${BIN:-none}" >&2; exit 1; }

STATE=$(mktemp -d "${TMPDIR:-/tmp}/aether-demo.XXXXXX")
"$MR" up --state "$STATE" --regions 2 --ttl "$TTL" --bin "$BIN"
# shellcheck source=/dev/null
source "$STATE/env"
read -r -a REGIONS <<<"$E2E_REGIONS"
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

render_region() {
  local r=$1 s m leader="" lm="" standby="" p lag ttl synced
  for s in 1 2; do
    m=$(curl -s --max-time 1 "http://127.0.0.1:$(getv "REPLICA_PORT_${r}_$s")/metrics" 2>/dev/null) || m=
    if [[ -z $m ]]; then
      standby+="${standby:+, }$r/$s down"
    elif [[ $(metric "$m" aether_replicator_is_leader) == 1 ]]; then
      leader="$r/$s pid $(getv "REPLICA_PID_${r}_$s")" lm=$m
    else
      standby+="${standby:+, }$r/$s pid $(getv "REPLICA_PID_${r}_$s") standby"
    fi
  done
  printf 'region %s  etcd :%s  leader %s%s\n' "$r" "$(getv "ETCD_CLIENT_PORT_$r")" "${leader:-NONE}" "${standby:+ ($standby)}"
  for p in "${REGIONS[@]}"; do
    [[ $p == "$r" ]] && continue
    [[ -n $lm ]] || { printf '  %s -> %s: not replicating (no leader in %s)\n' "$r" "$p" "$r"; continue; }
    lag=$(metric "$lm" "aether_replicator_lag_revisions{peer=\"$p\"}")
    ttl=$(metric "$lm" "aether_replicator_lease_remaining_seconds{peer=\"$p\"}")
    synced="NOT synced"
    [[ $(metric "$lm" "aether_replicator_peer_synced{peer=\"$p\"}") == 1 ]] && synced=synced
    printf '  %s -> %s: %s, lag %s revisions, peer lease %.1fs left\n' "$r" "$p" "$synced" "${lag:-?}" "${ttl:-0}"
  done
  printf '  as consumers in %s see it (aether-replicator endpoints --region %s):\n' "$r" "$r"
  timeout 5 "$E2E_BIN" endpoints --local-etcd "$(getv "ETCD_URL_$r")" --region "$r" --output json 2>&1 |
    python3 "$SCRIPT_DIR/demo-view.py" "${REGIONS[*]}" 4
  echo
}

render() {
  local r
  # Re-read the state: `mesh.sh restart` changes pids and ports.
  # shellcheck source=/dev/null
  source "$STATE/env"
  printf 'aether-replicator demo: regions %s, mirror lease TTL %ss    %s\n' "${REGIONS[*]}" "$TTL" "$(date +%T)"
  printf '%.0s-' {1..79}
  echo
  for r in "${REGIONS[@]}"; do render_region "$r"; done
  echo "Type a key into region a and see it arrive in b:"
  echo "    etcdctl --endpoints=$(getv ETCD_URL_a) put ${KEY_ROOT}a/clusters/prod-a1/services/hello/protocols/http/endpoints/10.1.9.9 '{\"zone\":\"a-1\",\"port\":8080}'"
  echo "Failover: stop region a's replicators; a's staleness in b grows, and a's"
  echo "endpoints vanish from b once the lease (${TTL}s) runs out:"
  echo "    kill $(getv REPLICA_PID_a_1) $(getv REPLICA_PID_a_2)"
  echo "Bring them back:  $MR_SHOWN restart a --state $STATE"
  echo "(b's: kill $(getv REPLICA_PID_b_1) $(getv REPLICA_PID_b_2))    logs: $STATE/logs"
  if [[ $ONESHOT == 1 ]]; then echo "DEMO_ONESHOT: rendering 3 times"; else echo "Ctrl-C stops the demo."; fi
}

say "live view (state: $STATE)"
((TTY)) && printf '\033[?25l\033[2J'
frames=0
while :; do
  t0=${EPOCHREALTIME//[!0-9]/}
  frame=$(render 2>&1)
  if ((TTY)); then
    # Home, each line cleared to its end, then the rest of the screen.
    printf '\033[H%s\033[K\033[J' "${frame//$'\n'/$'\033[K\n'}"
  else
    printf '%s\n' "$frame"
  fi
  frames=$((frames + 1))
  [[ $ONESHOT == 1 ]] && ((frames >= 3)) && break
  # One frame a second: sleep what rendering left of it.
  spent=$(((${EPOCHREALTIME//[!0-9]/} - t0) / 1000))
  if ((spent < 1000)); then sleep "$(printf '%d.%03d' $(((1000 - spent) / 1000)) $(((1000 - spent) % 1000)))"; fi
done
exit 0
