#!/usr/bin/env bash
# The two-region demo, in one command on a fresh machine:
#
#   e2e/demo.sh                   live view until Ctrl-C
#   DEMO_ONESHOT=1 e2e/demo.sh    render the view 3 times, clean up, exit 0
#
# It installs etcd if missing (Debian etcd-server and etcd-client; needs
# root), builds the replicator (cargo build --release), starts regions a and
# b with e2e/multiregion.sh (one etcd and two replicators each, on loopback),
# writes sample endpoints into each region and then shows, every second, per
# region: its own endpoints, the ones mirrored in from the other region, the
# replication lag and peer lease TTL from the leader's metrics, and which
# replica leads. It prints the `kill` command that stops a region's
# replicators, so the failover can be watched: the dead region's endpoints
# vanish from the other region once the mirror lease runs out.
#
# Ctrl-C (or TERM) stops everything (multiregion.sh down) and exits 0.
#
# Environment: DEMO_ONESHOT=1 (see above), DEMO_TTL (mirror lease TTL in
# seconds, default 6).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
readonly SCRIPT_DIR REPO
# shellcheck source=e2e/lib.sh
. "$SCRIPT_DIR/lib.sh"
readonly MR="$SCRIPT_DIR/multiregion.sh"
MR_SHOWN=$MR
[[ $PWD == "$REPO" ]] && MR_SHOWN=e2e/multiregion.sh
readonly MR_SHOWN
readonly KEY_ROOT=/aether/v1/regions/
readonly ONESHOT=${DEMO_ONESHOT:-0}
readonly TTL=${DEMO_TTL:-6}
export ETCDCTL_API=3

say() {
  echo "== $*"
}

# ---------------------------------------------------------------- setup

need_etcd
need_commands python3 curl
command -v cargo >/dev/null || {
  echo "cargo is needed to build the replicator (https://rustup.rs)" >&2
  exit 1
}
say "building (cargo build --release)"
(cd "$REPO" && cargo build --release)

STATE=$(mktemp -d "${TMPDIR:-/tmp}/aether-demo.XXXXXX")
readonly STATE
TTY=0
[[ -t 1 ]] && TTY=1

CLEANED=0
# shellcheck disable=SC2317 # invoked by the traps
cleanup() {
  ((CLEANED)) && return 0
  CLEANED=1
  trap '' INT TERM
  ((TTY)) && printf '\033[?25h'
  echo
  say "stopping the demo"
  "$MR" down --state "$STATE" || true
}
# shellcheck disable=SC2317 # invoked by the traps
on_signal() {
  cleanup
  exit 0
}
trap on_signal INT TERM
trap cleanup EXIT

"$MR" up --state "$STATE" --regions 2 --ttl "$TTL" --bin "$REPO/target/release/aether-replicator"
# shellcheck source=/dev/null
source "$STATE/env"
read -r -a REGIONS <<<"$E2E_REGIONS"

getv() {
  printf '%s' "${!1-}"
}

ectl() {
  local r=$1
  shift
  timeout 10 etcdctl --endpoints="$(getv "ETCD_URL_$r")" --dial-timeout=2s --command-timeout=3s "$@"
}

# Sample endpoints: region a runs checkout, cart and payments; b runs search,
# inventory and its own checkout.
put_endpoint() { # REGION CLUSTER SERVICE PROTOCOL IP ZONE PORT
  local key="${KEY_ROOT}$1/clusters/$2/services/$3/protocols/$4/endpoints/$5"
  local value
  value=$(printf '{"clusterName":"%s","region":"%s","zone":"%s","port":%s}' "$2" "$1" "$6" "$7")
  ectl "$1" put "$key" "$value" >/dev/null
}
say "writing sample endpoints"
put_endpoint a prod-a1 checkout http 10.1.0.11 a-1 8080
put_endpoint a prod-a1 checkout http 10.1.0.12 a-2 8080
put_endpoint a prod-a1 checkout http 10.1.0.13 a-3 8080
put_endpoint a prod-a1 checkout grpc 10.1.0.11 a-1 9090
put_endpoint a prod-a1 checkout grpc 10.1.0.12 a-2 9090
put_endpoint a prod-a1 cart http 10.1.1.21 a-1 8081
put_endpoint a prod-a1 cart http 10.1.1.22 a-2 8081
put_endpoint a prod-a1 payments grpc 10.1.2.31 a-1 7443
put_endpoint a prod-a1 payments grpc 10.1.2.32 a-3 7443
put_endpoint b prod-b1 search http 10.2.0.11 b-1 8080
put_endpoint b prod-b1 search http 10.2.0.12 b-2 8080
put_endpoint b prod-b1 search http 10.2.0.13 b-2 8080
put_endpoint b prod-b1 inventory grpc 10.2.1.21 b-1 9090
put_endpoint b prod-b1 inventory grpc 10.2.1.22 b-2 9090
put_endpoint b prod-b1 checkout http 10.2.2.31 b-1 8080
put_endpoint b prod-b1 checkout http 10.2.2.32 b-2 8080

# ---------------------------------------------------------------- view

metrics_of() {
  curl -s --max-time 1 "http://127.0.0.1:$1/metrics" 2>/dev/null || true
}

# endpoints E R MAX: "<count>" then up to MAX formatted lines of R's
# endpoints as stored in E's etcd.
endpoints() {
  local e=$1 r=$2 max=$3 out n
  out=$(ectl "$e" get --prefix "${KEY_ROOT}$r/" 2>/dev/null) || {
    echo "?"
    return 0
  }
  if [[ -z $out ]]; then n=0; else n=$(($(wc -l <<<"$out") / 2)); fi
  echo "$n"
  awk -v pre="${KEY_ROOT}$r/" -v max="$max" '
    NR % 2 == 1 { k = substr($0, length(pre) + 1); next }
    {
      n++
      if (n > max) next
      # clusters/<cluster>/services/<svc>/protocols/<proto>/endpoints/<ip>
      split(k, a, "/")
      zone = ""; port = ""
      if (match($0, /"zone":"[^"]*"/)) zone = substr($0, RSTART + 8, RLENGTH - 9)
      if (match($0, /"port":[0-9]+/)) port = substr($0, RSTART + 7, RLENGTH - 7)
      printf "    %-20s %-16s %-9s zone %s\n", a[4] "/" a[6], a[8] ":" port, a[2], zone
    }
    END { if (n > max) printf "    ... and %d more\n", n - max }' <<<"$out"
}

# lease_left E R: seconds left on the lease of R's copy in E's etcd.
lease_left() {
  local json id out
  json=$(ectl "$1" get --prefix "${KEY_ROOT}$2/" --limit 1 -w json 2>/dev/null) || return 0
  id=$(grep -o '"lease":[0-9]*' <<<"$json" | head -n1 | cut -d: -f2) || true
  [[ -n $id && $id != 0 ]] || return 0
  out=$(ectl "$1" lease timetolive "$(printf '%x' "$id")" 2>/dev/null) || return 0
  sed -n 's/.*remaining(\(-\{0,1\}[0-9]*\)s).*/\1s/p' <<<"$out"
}

render_region() {
  local r=$1 s port m pid leader="" lm="" standby="" p lines n left lag ttl synced
  for s in 1 2; do
    port=$(getv "REPLICA_PORT_${r}_$s")
    pid=$(getv "REPLICA_PID_${r}_$s")
    m=$(metrics_of "$port")
    if [[ -z $m ]]; then
      standby+="${standby:+, }$r/$s down"
    elif [[ $(metric "$m" aether_replicator_is_leader) == 1 ]]; then
      leader="$r/$s pid $pid"
      lm=$m
    else
      standby+="${standby:+, }$r/$s pid $pid standby"
    fi
  done
  printf 'region %s  etcd :%s  leader %s%s\n' "$r" "$(getv "ETCD_CLIENT_PORT_$r")" \
    "${leader:-NONE}" "${standby:+ ($standby)}"
  lines=$(endpoints "$r" "$r" 4)
  printf '  own endpoints: %s\n' "$(head -n1 <<<"$lines")"
  tail -n +2 <<<"$lines"
  for p in "${REGIONS[@]}"; do
    [[ $p == "$r" ]] && continue
    lines=$(endpoints "$r" "$p" 3)
    n=$(head -n1 <<<"$lines")
    left=$(lease_left "$r" "$p")
    if [[ $n == 0 ]]; then
      printf '  mirrored in from %s: none (no live lease from %s)\n' "$p" "$p"
    else
      printf '  mirrored in from %s: %s endpoints, lease %s left\n' "$p" "$n" "${left:-?}"
    fi
    tail -n +2 <<<"$lines"
  done
  for p in "${REGIONS[@]}"; do
    [[ $p == "$r" ]] && continue
    if [[ -z $lm ]]; then
      printf '  %s -> %s: not replicating (no leader in %s)\n' "$r" "$p" "$r"
      continue
    fi
    lag=$(metric "$lm" "aether_replicator_lag_revisions{peer=\"$p\"}")
    ttl=$(metric "$lm" "aether_replicator_lease_remaining_seconds{peer=\"$p\"}")
    synced=$(metric "$lm" "aether_replicator_peer_synced{peer=\"$p\"}")
    [[ $synced == 1 ]] && synced=synced || synced="NOT synced"
    printf '  %s -> %s: lag %s revisions, peer lease %.1fs left, %s\n' "$r" "$p" "${lag:-?}" "${ttl:-0}" "$synced"
  done
  echo
}

render() {
  local r
  # Re-read the state: `multiregion.sh restart` changes pids and ports.
  # shellcheck source=/dev/null
  source "$STATE/env"
  printf 'aether-replicator demo: regions %s, mirror lease TTL %ss    %s\n' \
    "${REGIONS[*]}" "$TTL" "$(date +%T)"
  printf '%.0s-' {1..79}
  echo
  for r in "${REGIONS[@]}"; do
    render_region "$r"
  done
  echo "Failover: stop region a's replicators, and watch a's endpoints vanish"
  echo "from b once the lease (${TTL}s) runs out:"
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
  if [[ $ONESHOT == 1 ]] && ((frames >= 3)); then
    break
  fi
  # One frame a second: sleep what rendering left of it.
  spent=$(((${EPOCHREALTIME//[!0-9]/} - t0) / 1000))
  if ((spent < 1000)); then sleep "$(printf '%d.%03d' $(((1000 - spent) / 1000)) $(((1000 - spent) % 1000)))"; fi
done
exit 0
