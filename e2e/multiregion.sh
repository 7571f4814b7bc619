#!/usr/bin/env bash
# A multi-region aether-replicator deployment of real processes on loopback:
# per region one etcd and two replicator replicas (one leads, one stands by).
#
#   e2e/multiregion.sh up      [--state DIR] [--regions 2..10] [--ttl SECONDS] [--bin PATH] [--prometheus]
#                              [--link-delay MS] [--link-jitter MS] [--replicas 1|2]
#                              [--preload N] [--sync-timeout SECONDS]
#                              [--replicator-arg ARG]... [--etcd-arg ARG]...
#   e2e/multiregion.sh verify  [--state DIR]
#   e2e/multiregion.sh alerts  [--state DIR]
#   e2e/multiregion.sh quiet   [--state DIR] [--seconds N]
#   e2e/multiregion.sh record  [--state DIR] --scenario healthy|link-cut|region-down --out FILE
#   e2e/multiregion.sh down    [--state DIR]
#   e2e/multiregion.sh restart REGION [--state DIR]
#   e2e/multiregion.sh cut     REGION PEER [--state DIR]
#   e2e/multiregion.sh heal    REGION PEER [--state DIR]
#   e2e/multiregion.sh burst   [--state DIR] [--revisions N] [--writers W] [--rounds K]
#
# up       starts everything and returns once every region has exactly one
#          leader whose peers are all synced.
# verify   runs the end-to-end checks (visibility, data path, leader handoff,
#          lease-lapse failover, recovery, peer etcd restart), one line per
#          step, and exits non-zero at the first failure.
# alerts   (needs `up --prometheus`) stops both replicas of region a and
#          asserts through Prometheus's HTTP API that AetherReplicatorNoLeader
#          fires for a and AetherReplicatorOriginCopyLapsed for origin a in
#          every other region, then restarts them and asserts both resolve.
# quiet    (needs `up --prometheus`) N seconds (default 180) of moderate
#          churn in every region (e2e/churn.py: 3 puts or deletes of
#          endpoint keys per second per region), then asserts through
#          Prometheus's HTTP API that no alert was firing at any evaluation
#          of the window (max_over_time of ALERTS) nor is now, and that
#          every target was up throughout. The harness's `for:` is 2s, so
#          this is stricter than production. On failure prints each alert
#          that fired, its labels and when.
# record   (needs `up --prometheus --link-delay MS`, 3 regions) runs a
#          scenario under the same churn and writes FILE, a promtool test:
#          every series the shipped rules read (aether_replicator_* and up),
#          from Prometheus's query_range at a 15 s step over the scenario's
#          window, with the hand-written expectations of
#          deploy/prometheus/recorded/expect/SCENARIO.yml (see
#          deploy/prometheus/README.md). Scenarios (t=0 is the window start):
#            healthy      180 s of churn;
#            link-cut     cut a->b at 60 s, heal it at 480 s, end at 600 s;
#            region-down  stop both replicas of a at 60 s, start them again
#                         at 240 s, end at 360 s.
# down     stops every process the harness started (by pid) and removes the
#          state dir. Idempotent.
# restart  starts again whichever replicas of REGION are not running (after
#          a manual `kill`, as the demo suggests).
# cut      stops the delay proxy of the link REGION->PEER (REGION's replicas
#          to PEER's etcd): the replicas' connections break and new ones are
#          refused. heal starts it again on the same port.
# burst    (the many-regions case) K rounds: every region's etcd takes
#          N single-put revisions from W writers at once (examples/loadgen),
#          then every peer is waited for until it holds all of them; prints
#          one REPORT line per round: how long after the last write returned
#          the last peer held everything, the mirror txns and events per txn
#          of the leaders, and the largest peak RSS (VmHWM) of a replica.
#          Defaults: 5000 revisions, 16 writers, 3 rounds. Also prints
#          per round the CPU-seconds every replica spent (sum, largest) and
#          per 100k applied events, and a STAT line per process (below).
#
# Scale (ten regions at 100k keys each; not in CI, it takes
# minutes and a few GB of disk):
#   e2e/multiregion.sh up --regions 10 --replicas 1 --ttl 30 --preload 100000 --sync-timeout 1800
#   e2e/multiregion.sh burst --revisions 2000 --rounds 3
#   e2e/multiregion.sh down
# With --preload N, `up` writes N endpoint keys (examples/loadgen
# fill-endpoints: registry-shaped keys and ~150-byte JSON values) into every
# region's own subtree before any replicator starts, then starts them all at
# once and prints REPORT sync: the time until every leader reported every
# peer synced, after which every copy's count is checked (N keys of every
# region in every peer) and 20 keys per region are spot-checked in every
# peer (same value, on a live lease). STAT lines give each replica's and
# each etcd's CPU-seconds (utime+stime from /proc/PID/stat) and peak RSS
# (VmHWM) so far.#
# Options:
#   --state DIR     where pids, ports, data dirs and logs live
#                   (default ${TMPDIR:-/tmp}/aether-e2e); `down` removes it.
#   --regions N     2 to 10 (regions a, b, ... j); default 2. up only.
#                   verify and alerts use a, b and c.
#   --replicas N    replicas per region, 1 or 2 (default 2; verify, alerts
#                   and record need 2). up only.
#   --preload N     keys written into every region before the replicators
#                   start (see Scale above); default 0. up only.
#   --sync-timeout S  how long `up` waits for every region to be ready
#                   (default 60). up only.
#   --replicator-arg ARG, --etcd-arg ARG  one more argument (no spaces) for
#                   every replicator / every etcd, e.g.
#                   --replicator-arg --max-concurrent-syncs=9
#                   --etcd-arg --snapshot-count=10000. Repeatable; up only.
#   --ttl SECONDS   mirror lease TTL, at least 4; default 6. The election TTL
#                   is a third of it, at least 2s. up only.
#   --bin PATH      the aether-replicator binary (default
#                   target/release/aether-replicator, brought up to date
#                   with `cargo build --release`). up only; it is
#                   copied into the state dir so every replica runs the same
#                   build and its command line names the state dir.
#   --prometheus    also run a Prometheus server (Debian `prometheus`) on
#                   loopback that scrapes every replica (target label
#                   `region`) with deploy/prometheus/aether-replicator.rules.yml
#                   loaded, `for:` shortened to 2s. up only.
#   --link-delay MS put every link R->P (R's replicas to P's etcd, each
#                   ordered pair) through its own delay proxy
#                   (e2e/delay-proxy.py) adding MS each way. up only.
#   --link-jitter MS  plus a uniform random 0..MS per chunk, order kept
#                   (implies the proxies; delay 0 unless --link-delay).
#   --seconds N     quiet's window; default 180.
#   --scenario S, --out FILE   record's scenario and output file.
#
# $STATE/env is a sourceable file with every port, pid and URL, for example
# ETCD_URL_a, REPLICA_PID_a_1, REPLICA_PORT_a_1 (metrics), LINK_PORT_a_b and
# LINK_PID_a_b (the proxy a's replicas reach b's etcd through), E2E_BIN,
# PROM_URL. $STATE/instances maps every replica's metrics port to its
# region and slot, in start order (record names instances from it).
# Everything listens on 127.0.0.1 only.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
readonly SCRIPT_DIR REPO
# shellcheck source=e2e/lib.sh
. "$SCRIPT_DIR/lib.sh"
readonly KEY_ROOT=/aether/v1/regions/
readonly STATE_KEY_ROOT=/aether/v1/replication/
ELECTION_TTL=2
readonly MARKER=.aether-e2e-state
readonly ALL_REGIONS=(a b c d e f g h i j)
SLOTS=(1 2)

export ETCDCTL_API=3
# Flags of the replicator can come from AETHER_REPLICATOR_* variables; make
# sure none from the caller's environment changes what the harness runs
# (the log filter, AETHER_REPLICATOR_LOG_LEVEL, is kept).
while IFS= read -r _var; do
  [[ $_var == AETHER_REPLICATOR_LOG_LEVEL ]] || unset "$_var"
done < <(compgen -e | grep '^AETHER_REPLICATOR_' || true)
unset _var

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}

die() {
  echo "multiregion: $*" >&2
  exit 1
}

# ---------------------------------------------------------------- utilities

now_ms() {
  local t=${EPOCHREALTIME//[!0-9]/}
  echo $((t / 1000))
}

fmt_ms() {
  printf '%d.%01ds' $(($1 / 1000)) $((($1 % 1000) / 100))
}

# poll SECONDS INTERVAL CMD...: runs CMD every INTERVAL seconds until it
# succeeds; fails once SECONDS have passed without.
poll() {
  local secs=$1 interval=$2 deadline
  shift 2
  deadline=$(($(now_ms) + secs * 1000))
  until "$@"; do
    (($(now_ms) < deadline)) || return 1
    sleep "$interval"
  done
}

# every CMD R...: CMD R succeeds for each R, tried in order up to the first
# that fails, which is then in FAILING.
FAILING=""
every() {
  local cmd=$1 r
  shift
  for r in "$@"; do
    "$cmd" "$r" || {
      FAILING=$r
      return 1
    }
  done
}

getv() {
  printf '%s' "${!1-}"
}

# Every variable set through setv is saved in $STATE/env by save_env.
ENV_VARS=()
setv() {
  printf -v "$1" '%s' "$2"
  local n
  for n in "${ENV_VARS[@]}"; do
    [[ $n == "$1" ]] && return 0
  done
  ENV_VARS+=("$1")
}

save_env() {
  local tmp="$STATE/env.tmp" n
  {
    echo "# aether-replicator e2e state ($(date -u +%FT%TZ)); source this file."
    for n in "${ENV_VARS[@]}"; do
      printf '%s=%q\n' "$n" "${!n}"
    done
  } >"$tmp"
  mv -f "$tmp" "$STATE/env"
}

load_env() {
  [[ -f $STATE/env ]] || return 1
  # shellcheck source=/dev/null
  source "$STATE/env"
  mapfile -t ENV_VARS < <(sed -n 's/^\([A-Za-z_][A-Za-z0-9_]*\)=.*/\1/p' "$STATE/env")
  read -r -a REGIONS <<<"$E2E_REGIONS"
  read -r -a SLOTS <<<"${E2E_SLOTS:-1 2}"
  TTL=$E2E_TTL
  ELECTION_TTL=$E2E_ELECTION_TTL
}

peer_list() {
  peers_of "$1" | paste -sd' ' -
}

peers_of() {
  local r=$1 p
  for p in "${REGIONS[@]}"; do
    [[ $p == "$r" ]] || echo "$p"
  done
}

# alive PID: the process exists and is not a zombie.
alive() {
  local pid=$1 st
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  st=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  st=${st##*) }
  [[ ${st%% *} != Z ]]
}

# ours PID: alive, and its command line names the state dir (so a recycled
# pid is never signalled).
ours() {
  local cmdline
  alive "$1" || return 1
  cmdline=$(tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline") || return 1
  [[ $cmdline == *"$STATE"* ]]
}

record_pid() {
  mkdir -p "$STATE/pids"
  echo "$2" >"$STATE/pids/$1.pid"
}

# stop_pids PID...: SIGTERM, wait up to 5 s, then SIGKILL and wait 2 s more.
stop_pids() {
  local pid deadline
  local -a live=() left=()
  for pid in "$@"; do
    if ours "$pid"; then
      kill -TERM "$pid" 2>/dev/null || true
      live+=("$pid")
    fi
  done
  ((${#live[@]})) || return 0
  deadline=$(($(now_ms) + 5000))
  while :; do
    left=()
    for pid in "${live[@]}"; do
      alive "$pid" && left+=("$pid")
    done
    ((${#left[@]})) || break
    if (($(now_ms) >= deadline)); then
      echo "  SIGKILL after 5s: ${left[*]}" >&2
      for pid in "${left[@]}"; do
        if ours "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
      done
      deadline=$(($(now_ms) + 2000))
      while (($(now_ms) < deadline)); do
        left=()
        for pid in "${live[@]}"; do
          alive "$pid" && left+=("$pid")
        done
        ((${#left[@]})) || break
        sleep 0.1
      done
      break
    fi
    sleep 0.1
  done
  # Reap the ones that are our own children (no-op for the others).
  for pid in "${live[@]}"; do
    alive "$pid" || { wait "$pid"; } 2>/dev/null || true
  done
}

# kill9 PID: SIGKILL one of ours and wait (bounded) until it is gone.
kill9() {
  local pid=$1 deadline
  ours "$pid" || return 0
  kill -KILL "$pid" 2>/dev/null || true
  deadline=$(($(now_ms) + 5000))
  while alive "$pid" && (($(now_ms) < deadline)); do
    sleep 0.05
  done
  alive "$pid" && return 1
  { wait "$pid"; } 2>/dev/null || true
}

# free_ports N: N distinct loopback ports that were free a moment ago. The
# starts below check that the intended process owns the port and retry on
# new ports if not.
free_ports() {
  python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# listens PID PORT: PID owns a socket listening on 127.0.0.1:PORT.
listens() {
  local pid=$1 port=$2 hex inode fd
  printf -v hex '0100007F:%04X' "$port"
  while read -r inode; do
    for fd in "/proc/$pid/fd/"*; do
      [[ $(readlink "$fd" 2>/dev/null) == "socket:[$inode]" ]] && return 0
    done
  done < <(awk -v a="$hex" '$2 == a && $4 == "0A" { print $10 }' /proc/net/tcp 2>/dev/null)
  return 1
}

ectl() {
  local r=$1
  shift
  timeout 15 etcdctl --endpoints="$(getv "ETCD_URL_$r")" --dial-timeout=2s --command-timeout=5s "$@"
}

http_code() {
  curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$1$2" 2>/dev/null || true
}

metrics_of() {
  curl -s --max-time 2 "http://127.0.0.1:$1/metrics" 2>/dev/null || true
}


tail_logs() {
  local f
  for f in "$STATE"/logs/*.log; do
    [[ -e $f ]] || continue
    echo "---- tail -n ${1:-20} $f" >&2
    tail -n "${1:-20}" "$f" >&2 || true
  done
}

# ---------------------------------------------------------------- etcd

assign_etcd_ports() {
  local r=$1 cp pp
  read -r cp pp <<<"$(free_ports 2)"
  setv "ETCD_CLIENT_PORT_$r" "$cp"
  setv "ETCD_PEER_PORT_$r" "$pp"
  setv "ETCD_URL_$r" "http://127.0.0.1:$cp"
}

etcd_start() {
  local r=$1 cp pp log pid
  cp=$(getv "ETCD_CLIENT_PORT_$r")
  pp=$(getv "ETCD_PEER_PORT_$r")
  log="$STATE/logs/etcd-$r.log"
  echo "--- $(date -u +%FT%TZ) start etcd $r client :$cp peer :$pp" >>"$log"
  # shellcheck disable=SC2086 # E2E_ETCD_ARGS: one word per argument
  setsid etcd --name "$r" --data-dir "$STATE/etcd-$r" \
    --listen-client-urls "http://127.0.0.1:$cp" --advertise-client-urls "http://127.0.0.1:$cp" \
    --listen-peer-urls "http://127.0.0.1:$pp" --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
    --initial-cluster "$r=http://127.0.0.1:$pp" --initial-cluster-state new \
    --initial-cluster-token "aether-e2e-$r" \
    --logger=zap --log-outputs=stderr --log-level=error ${E2E_ETCD_ARGS-} \
    </dev/null >>"$log" 2>&1 &
  pid=$!
  disown "$pid"
  setv "ETCD_PID_$r" "$pid"
  record_pid "etcd-$r" "$pid"
}

# etcd_healthy R: R's etcd process owns its client port and answers.
etcd_healthy() {
  local r=$1 pid
  pid=$(getv "ETCD_PID_$r")
  alive "$pid" && listens "$pid" "$(getv "ETCD_CLIENT_PORT_$r")" &&
    ectl "$r" endpoint health >/dev/null 2>&1
}

# wait_etcds FRESH R...: start (FRESH=1: on new ports, retried on new ports
# if a port turns out taken) or restart (FRESH=0: same ports and data) the
# etcds of the regions and wait until they are all healthy.
wait_etcds() {
  local fresh=$1 r deadline all
  shift
  local -A tries=() healthy=()
  for r in "$@"; do
    tries[$r]=1
    healthy[$r]=0
    if ((fresh)); then
      assign_etcd_ports "$r"
      rm -rf "$STATE/etcd-$r"
    fi
    etcd_start "$r"
  done
  deadline=$(($(now_ms) + 45000))
  while :; do
    all=1
    for r in "$@"; do
      ((healthy[$r])) && continue
      if etcd_healthy "$r"; then
        healthy[$r]=1
        echo "  etcd $r: $(getv "ETCD_URL_$r") (pid $(getv "ETCD_PID_$r"))"
        continue
      fi
      all=0
      if ! alive "$(getv "ETCD_PID_$r")"; then
        if ((tries[$r] >= 5)); then
          echo "etcd $r did not start after ${tries[$r]} attempts" >&2
          return 1
        fi
        tries[$r]=$((tries[$r] + 1))
        echo "  etcd $r exited (port taken?); starting it again (attempt ${tries[$r]})" >&2
        if ((fresh)); then
          assign_etcd_ports "$r"
          rm -rf "$STATE/etcd-$r"
        else
          sleep 1
        fi
        etcd_start "$r"
      fi
    done
    ((all)) && return 0
    if (($(now_ms) >= deadline)); then
      echo "etcd did not become healthy within 45s" >&2
      return 1
    fi
    sleep 0.2
  done
}

# ---------------------------------------------------------------- links

# peer_url R P: where R's replicas reach P's etcd: the link's delay proxy if
# there is one, else P's etcd itself.
peer_url() {
  local port
  port=$(getv "LINK_PORT_$1_$2")
  if [[ -n $port ]]; then
    echo "http://127.0.0.1:$port"
  else
    getv "ETCD_URL_$2"
  fi
}

link_start() { # R P: the proxy of R->P on LINK_PORT_R_P, to P's etcd
  local r=$1 p=$2 port log pid
  port=$(getv "LINK_PORT_${r}_$p")
  log="$STATE/logs/link-$r-$p.log"
  echo "--- $(date -u +%FT%TZ) start link $r->$p :$port -> :$(getv "ETCD_CLIENT_PORT_$p") (${E2E_LINK_DELAY}ms + 0..${E2E_LINK_JITTER}ms)" >>"$log"
  setsid python3 "$STATE/bin/delay-proxy.py" "$port" "$(getv "ETCD_CLIENT_PORT_$p")" \
    "$E2E_LINK_DELAY" "$E2E_LINK_JITTER" </dev/null >>"$log" 2>&1 &
  pid=$!
  disown "$pid"
  setv "LINK_PID_${r}_$p" "$pid"
  record_pid "link-$r-$p" "$pid"
}

# wait_link FRESH R P: start R->P's proxy (FRESH=1: on a new port) and wait
# until it listens; one that exited (port taken) is started again, on a new
# port if FRESH, else on the same port after a second.
wait_link() {
  local fresh=$1 r=$2 p=$3 pid deadline attempt=1
  ((fresh)) && setv "LINK_PORT_${r}_$p" "$(free_ports 1)"
  link_start "$r" "$p"
  deadline=$(($(now_ms) + 10000))
  while :; do
    pid=$(getv "LINK_PID_${r}_$p")
    if alive "$pid" && listens "$pid" "$(getv "LINK_PORT_${r}_$p")"; then
      save_env
      return 0
    fi
    if ! alive "$pid"; then
      ((attempt++ < 5)) || {
        echo "link $r->$p did not start after 5 attempts" >&2
        return 1
      }
      echo "  link $r->$p exited (port taken?); starting it again (attempt $attempt)" >&2
      if ((fresh)); then setv "LINK_PORT_${r}_$p" "$(free_ports 1)"; else sleep 1; fi
      link_start "$r" "$p"
      deadline=$(($(now_ms) + 10000))
    elif (($(now_ms) >= deadline)); then
      echo "link $r->$p did not listen within 10s" >&2
      return 1
    fi
    sleep 0.1
  done
}

start_links() {
  local r p
  for r in "${REGIONS[@]}"; do
    for p in $(peers_of "$r"); do
      wait_link 1 "$r" "$p" || return 1
    done
  done
  echo "  links: every R->P through its own proxy, ${E2E_LINK_DELAY}ms + 0..${E2E_LINK_JITTER}ms each way ($(for r in "${REGIONS[@]}"; do for p in $(peers_of "$r"); do printf '%s->%s :%s ' "$r" "$p" "$(getv "LINK_PORT_${r}_$p")"; done; done | sed 's/ $//'))"
}

# link_args R P: both regions exist and R->P has a proxy.
link_args() {
  local r=$1 p=$2
  [[ -n $r && -n $p && $r != "$p" ]] || die "cut/heal need two different regions: REGION PEER"
  [[ " ${REGIONS[*]} " == *" $r "* && " ${REGIONS[*]} " == *" $p "* ]] ||
    die "no link $r->$p (regions: ${REGIONS[*]})"
  [[ -n $(getv "LINK_PORT_${r}_$p") ]] ||
    die "$STATE has no link proxies: run up with --link-delay MS"
}

link_cut() { # R P
  local pid
  pid=$(getv "LINK_PID_$1_$2")
  if ours "$pid"; then
    stop_pids "$pid"
    alive "$pid" && return 1
  fi
  rm -f "$STATE/pids/link-$1-$2.pid"
  echo "cut $1->$2 (proxy :$(getv "LINK_PORT_$1_$2"), pid $pid stopped)"
}

link_heal() { # R P
  if ours "$(getv "LINK_PID_$1_$2")"; then
    echo "link $1->$2 is not cut (proxy pid $(getv "LINK_PID_$1_$2"))"
    return 0
  fi
  wait_link 0 "$1" "$2" || return 1
  echo "healed $1->$2 (proxy :$(getv "LINK_PORT_$1_$2"), pid $(getv "LINK_PID_$1_$2"))"
}

cmd_cut() {
  if [[ ! -e $STATE/$MARKER ]] || ! load_env; then
    die "$STATE is not up"
  fi
  link_args "$1" "$2"
  link_cut "$1" "$2" || die "the proxy of $1->$2 did not stop"
}

cmd_heal() {
  if [[ ! -e $STATE/$MARKER ]] || ! load_env; then
    die "$STATE is not up"
  fi
  link_args "$1" "$2"
  link_heal "$1" "$2" || die "the proxy of $1->$2 did not start again"
}

# ---------------------------------------------------------------- replicas

replica_start() {
  local r=$1 s=$2 port log pid p
  local -a args
  port=$(free_ports 1)
  setv "REPLICA_PORT_${r}_$s" "$port"
  args=(--region "$r" --local-etcd "$(getv "ETCD_URL_$r")")
  for p in $(peers_of "$r"); do
    args+=(--peer-etcd "$p=$(peer_url "$r" "$p")")
  done
  echo "$port $r $s" >>"$STATE/instances"
  args+=(--lease-ttl "${TTL}s" --election-ttl "${ELECTION_TTL}s" --metrics-addr "127.0.0.1:$port")
  # shellcheck disable=SC2206 # split on purpose: one word per argument
  args+=(${E2E_REPLICATOR_ARGS-})
  log="$STATE/logs/replica-$r-$s.log"
  echo "--- $(date -u +%FT%TZ) start replica $r/$s metrics :$port" >>"$log"
  AETHER_E2E_STATE="$STATE" NO_COLOR=1 setsid "$E2E_BIN" "${args[@]}" </dev/null >>"$log" 2>&1 &
  pid=$!
  disown "$pid"
  setv "REPLICA_PID_${r}_$s" "$pid"
  record_pid "replica-$r-$s" "$pid"
}

# start_replicas R/S...: start the replicas and wait until each owns its
# metrics port; one that exited (port taken) is started again on a new port.
start_replicas() {
  local rs r s pid deadline tries
  for rs in "$@"; do
    replica_start "${rs%/*}" "${rs#*/}"
  done
  for rs in "$@"; do
    r=${rs%/*}
    s=${rs#*/}
    tries=1
    deadline=$(($(now_ms) + 15000))
    while :; do
      pid=$(getv "REPLICA_PID_${r}_$s")
      if alive "$pid" && listens "$pid" "$(getv "REPLICA_PORT_${r}_$s")" &&
        [[ $(http_code "$(getv "REPLICA_PORT_${r}_$s")" /healthz) == 200 ]]; then
        echo "  replica $r/$s: pid $pid, metrics http://127.0.0.1:$(getv "REPLICA_PORT_${r}_$s")/metrics"
        break
      fi
      if ! alive "$pid"; then
        if ((tries >= 5)); then
          echo "replica $r/$s did not start after $tries attempts" >&2
          return 1
        fi
        tries=$((tries + 1))
        echo "  replica $r/$s exited (port taken?); starting it again (attempt $tries)" >&2
        replica_start "$r" "$s"
        deadline=$(($(now_ms) + 15000))
      elif (($(now_ms) >= deadline)); then
        echo "replica $r/$s did not serve /healthz within 15s" >&2
        return 1
      fi
      sleep 0.1
    done
  done
  save_env
  if [[ -n $(getv PROM_PORT) ]]; then write_prom_targets; fi
}

# region_ready R: exactly one of R's replicas leads, the leader reports
# peer_synced 1 for every peer, and both answer /readyz 200. Sets
# LEADER_SLOT, or NOT_READY to the reason.
LEADER_SLOT=""
NOT_READY=""
region_ready() {
  local r=$1 s port m lm="" leaders=0 p code
  LEADER_SLOT=""
  NOT_READY=""
  for s in "${SLOTS[@]}"; do
    port=$(getv "REPLICA_PORT_${r}_$s")
    m=$(metrics_of "$port")
    if [[ $(metric "$m" aether_replicator_is_leader) == 1 ]]; then
      leaders=$((leaders + 1))
      LEADER_SLOT=$s
      lm=$m
    fi
    code=$(http_code "$port" /readyz)
    if [[ $code != 200 ]]; then
      NOT_READY="$r/$s /readyz $code"
    fi
  done
  if ((leaders != 1)); then
    NOT_READY="$r has $leaders leaders"
    LEADER_SLOT=""
    return 1
  fi
  [[ -z $NOT_READY ]] || return 1
  for p in $(peers_of "$r"); do
    if [[ $(metric "$lm" "aether_replicator_peer_synced{peer=\"$p\"}") != 1 ]]; then
      NOT_READY="leader $r/$LEADER_SLOT: peer_synced{peer=\"$p\"} != 1"
      return 1
    fi
  done
}

# wait_ready SECONDS R...: until every region is ready; prints the leaders.
wait_ready() {
  local secs=$1
  shift
  poll "$secs" 0.2 every region_ready "$@" || {
    echo "not ready after ${secs}s: $NOT_READY" >&2
    return 1
  }
}

leader_slot() {
  local r=$1 s
  for s in "${SLOTS[@]}"; do
    if [[ $(metric "$(metrics_of "$(getv "REPLICA_PORT_${r}_$s")")" aether_replicator_is_leader) == 1 ]]; then
      echo "$s"
      return 0
    fi
  done
  return 1
}

# ---------------------------------------------------------------- prometheus

# The scrape targets, one group per region with the `region` target label the
# rules group by (the ServiceMonitor of deploy/kubernetes sets the same).
# Rewritten whenever replicas start, since a started replica gets a new port;
# Prometheus re-reads the file on change.
write_prom_targets() {
  local r s sep="" tsep
  {
    echo "["
    for r in "${REGIONS[@]}"; do
      printf '%s  {"labels": {"region": "%s"}, "targets": [' "$sep" "$r"
      tsep=""
      for s in "${SLOTS[@]}"; do
        printf '%s"127.0.0.1:%s"' "$tsep" "$(getv "REPLICA_PORT_${r}_$s")"
        tsep=", "
      done
      printf ']}'
      sep=$',\n'
    done
    printf '\n]\n'
  } >"$STATE/prometheus/targets.json.tmp"
  mv -f "$STATE/prometheus/targets.json.tmp" "$STATE/prometheus/targets.json"
}

prom_start() {
  local dir="$STATE/prometheus" port pid log deadline tries=1
  command -v prometheus >/dev/null ||
    die "--prometheus: prometheus is not installed (apt-get install -y prometheus)"
  mkdir -p "$dir/data"
  # The shipped rules, with every `for:` shortened so that the alerts step
  # takes seconds, not minutes. Expressions and thresholds are unchanged.
  sed -E 's/^( *)for: .*/\1for: 2s/' "$REPO/deploy/prometheus/aether-replicator.rules.yml" >"$dir/rules.yml"
  # e2e only: 1 s scrapes and evaluations (production: 15-30 s).
  cat >"$dir/prometheus.yml" <<'YAML'
global:
  scrape_interval: 1s
  scrape_timeout: 900ms
  evaluation_interval: 1s
rule_files:
  - rules.yml
scrape_configs:
  - job_name: aether-replicator
    # As the ServiceMonitor: the series' own `region` wins over the target's (same value), not renamed
    # to exported_region.
    honor_labels: true
    file_sd_configs:
      - files: [targets.json]
        refresh_interval: 2s
YAML
  write_prom_targets
  log="$STATE/logs/prometheus.log"
  while :; do
    port=$(free_ports 1)
    echo "--- $(date -u +%FT%TZ) start prometheus :$port" >>"$log"
    setsid prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
      --storage.tsdb.retention.time=2h --web.listen-address="127.0.0.1:$port" --log.level=warn \
      </dev/null >>"$log" 2>&1 &
    pid=$!
    disown "$pid"
    setv PROM_PID "$pid"
    setv PROM_PORT "$port"
    setv PROM_URL "http://127.0.0.1:$port"
    record_pid prometheus "$pid"
    save_env
    deadline=$(($(now_ms) + 20000))
    while alive "$pid" && (($(now_ms) < deadline)); do
      if listens "$pid" "$port" && [[ $(http_code "$port" /-/ready) == 200 ]]; then
        echo "  prometheus: $PROM_URL (pid $pid), rules $dir/rules.yml"
        return 0
      fi
      sleep 0.2
    done
    alive "$pid" && {
      echo "prometheus did not become ready within 20s" >&2
      return 1
    }
    ((tries++ < 5)) || {
      echo "prometheus did not start after 5 attempts" >&2
      return 1
    }
    echo "  prometheus exited (port taken?); starting it again (attempt $tries)" >&2
  done
}

# prom_get PATH: Prometheus's HTTP API answer (empty if unreachable).
prom_get() {
  curl -s --max-time 2 "$PROM_URL$1" 2>/dev/null || true
}

# prom_alerts: one line per active alert, "<state> <alertname> region=<r> origin=<o> peer=<p>".
prom_alerts() {
  prom_get /api/v1/alerts | python3 -c '
import json, sys
try:
    alerts = json.load(sys.stdin)["data"]["alerts"]
except Exception:
    sys.exit(1)
for a in alerts:
    l = a["labels"]
    print(a["state"], l["alertname"], " ".join(f"{k}={l[k]}" for k in ("region", "origin", "peer") if k in l))'
}

# prom_count QUERY: how many series QUERY returns now (0 if Prometheus fails).
prom_count() {
  curl -s --max-time 2 -G "$PROM_URL/api/v1/query" --data-urlencode "query=$1" 2>/dev/null | python3 -c '
import json, sys
try:
    print(len(json.load(sys.stdin)["data"]["result"]))
except Exception:
    print(0)'
}

# prom_targets_up: "<up> <total>" of the active scrape targets.
prom_targets_up() {
  prom_get /api/v1/targets | python3 -c '
import json, sys
try:
    t = json.load(sys.stdin)["data"]["activeTargets"]
except Exception:
    print("0 ?"); sys.exit(0)
print(sum(1 for x in t if x["health"] == "up"), len(t))'
}

# ---------------------------------------------------------------- state dir

resolve_state() {
  [[ -n $STATE ]] || die "--state must not be empty"
  case $STATE in
  /*) ;;
  *) STATE="$PWD/$STATE" ;;
  esac
  while [[ $STATE == */ && $STATE != / ]]; do STATE=${STATE%/}; done
  [[ $STATE != / ]] || die "--state / is not allowed"
}

# Every pid the harness recorded, plus any etcd or replica whose command
# line names this state dir (in case one was started but not recorded).
harness_pids() {
  local f pid exe
  local -A seen=()
  local -a argv
  for f in "$STATE"/pids/*.pid; do
    [[ -e $f ]] || continue
    pid=$(<"$f")
    [[ -n ${seen[$pid]-} ]] || {
      seen[$pid]=1
      echo "$pid"
    }
  done
  for f in /proc/[0-9]*/cmdline; do
    pid=${f#/proc/}
    pid=${pid%/cmdline}
    [[ -n ${seen[$pid]-} ]] && continue
    mapfile -d '' -t argv 2>/dev/null <"$f" || continue
    ((${#argv[@]})) || continue
    exe=${argv[0]}
    if [[ $exe == "$STATE/bin/aether-replicator" ]] ||
      [[ ${exe##*/} == python3* && ${argv[1]-} == "$STATE/bin/"*.py ]] ||
      [[ ${exe##*/} == etcd && " ${argv[*]} " == *" --data-dir $STATE/"* ]] ||
      [[ ${exe##*/} == prometheus && " ${argv[*]} " == *" --storage.tsdb.path=$STATE/"* ]]; then
      seen[$pid]=1
      echo "$pid"
    fi
  done
}

live_harness_pids() {
  local pid
  while IFS= read -r pid; do
    if ours "$pid"; then echo "$pid"; fi
  done < <(harness_pids)
}

stop_all() {
  local pid
  local -a reps=() etcds=()
  while IFS= read -r pid; do
    [[ -n $pid ]] || continue
    if [[ $(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" || true) == "$STATE/bin/aether-replicator"* ]]; then
      reps+=("$pid")
    else
      etcds+=("$pid")
    fi
  done < <(harness_pids)
  # Replicators first, so they do not spend their shutdown on a dead etcd.
  ((${#reps[@]} == 0)) || stop_pids "${reps[@]}"
  ((${#etcds[@]} == 0)) || stop_pids "${etcds[@]}"
}

# ---------------------------------------------------------------- up

cmd_up() {
  local t0 c r s bin t_sync
  local -a rs=()
  t0=$(now_ms)
  for c in etcd etcdctl python3 curl setsid timeout; do
    command -v "$c" >/dev/null || die "$c is not installed"
  done
  [[ $NREGIONS =~ ^([2-9]|10)$ ]] || die "--regions must be 2 to 10"
  [[ $NREPLICAS =~ ^[12]$ ]] || die "--replicas must be 1 or 2"
  [[ $PRELOAD =~ ^[0-9]+$ ]] || die "--preload $PRELOAD: not a whole number of keys"
  [[ $SYNC_TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "--sync-timeout $SYNC_TIMEOUT: not a whole number of seconds"
  [[ -z $LINK_DELAY || $LINK_DELAY =~ ^[0-9]+$ ]] || die "--link-delay $LINK_DELAY: not a whole number of ms"
  [[ -z $LINK_JITTER || $LINK_JITTER =~ ^[0-9]+$ ]] || die "--link-jitter $LINK_JITTER: not a whole number of ms"
  [[ $TTL =~ ^[0-9]+$ ]] || die "--ttl $TTL: not a whole number of seconds"
  # A third of the lease TTL, as the replicator's own default suggests: a
  # longer lease TTL is asked for when the machine is loaded (scale runs),
  # and an election lease of 2s would lapse there first.
  ((TTL / 3 > ELECTION_TTL)) && ELECTION_TTL=$((TTL / 3))
  SLOTS=("${SLOTS[@]:0:NREPLICAS}")
  ((TTL >= 2 * ELECTION_TTL)) ||
    die "--ttl must be at least twice the election TTL (${ELECTION_TTL}s)"

  bin=${BIN_ARG:-$REPO/target/release/aether-replicator}
  if [[ -n $BIN_ARG ]]; then
    [[ -x $bin ]] || die "--bin $BIN_ARG: not an executable"
  else
    # Always, not only when missing: a binary left from an older checkout
    # would run the e2e against old code (cargo returns at once when it is
    # up to date).
    echo "== building $bin (cargo build --release)"
    (cd "$REPO" && cargo build --release) || die "cargo build --release failed"
  fi

  if [[ -d $STATE ]]; then
    if [[ -e $STATE/$MARKER ]]; then
      [[ -z $(live_harness_pids) ]] ||
        die "$STATE is already up: run '$0 down --state $STATE' first"
      rm -rf "${STATE:?}"/*
    elif [[ -n $(ls -A "$STATE") ]]; then
      die "$STATE exists and is not an e2e state dir; choose another --state"
    fi
  fi
  mkdir -p "$STATE/logs" "$STATE/pids" "$STATE/bin"
  : >"$STATE/$MARKER"

  cp -f "$bin" "$STATE/bin/aether-replicator"
  cp -f "$SCRIPT_DIR/delay-proxy.py" "$SCRIPT_DIR/churn.py" "$STATE/bin/"

  REGIONS=("${ALL_REGIONS[@]:0:NREGIONS}")
  setv E2E_STATE "$STATE"
  setv E2E_REGIONS "${REGIONS[*]}"
  setv E2E_TTL "$TTL"
  setv E2E_ELECTION_TTL "$ELECTION_TTL"
  setv E2E_SLOTS "${SLOTS[*]}"
  setv E2E_REPLICATOR_ARGS "${REPLICATOR_ARGS[*]}"
  setv E2E_ETCD_ARGS "${ETCD_ARGS[*]}"
  setv E2E_BIN "$STATE/bin/aether-replicator"
  setv E2E_LINK_DELAY "${LINK_DELAY:-0}"
  setv E2E_LINK_JITTER "${LINK_JITTER:-0}"
  save_env

  echo "== up: ${#REGIONS[@]} regions (${REGIONS[*]}), lease TTL ${TTL}s, state $STATE"
  if ! wait_etcds 1 "${REGIONS[@]}"; then
    save_env
    up_failed
  fi
  save_env
  if [[ -n $LINK_DELAY || -n $LINK_JITTER ]]; then
    start_links || up_failed
  fi
  if ((PRELOAD)); then
    preload || up_failed
  fi
  for r in "${REGIONS[@]}"; do
    for s in "${SLOTS[@]}"; do rs+=("$r/$s"); done
  done
  t_sync=$(now_ms)
  start_replicas "${rs[@]}" || up_failed
  if ! wait_ready "$SYNC_TIMEOUT" "${REGIONS[@]}"; then
    up_failed
  fi
  t_sync=$(($(now_ms) - t_sync))
  for r in "${REGIONS[@]}"; do
    region_ready "$r" || true
    echo "  region $r: leader $r/$LEADER_SLOT, peers synced: $(peer_list "$r")"
  done
  if ((PRELOAD)); then
    check_preload "$t_sync" || up_failed
  fi
  if ((WITH_PROM)); then
    prom_start || up_failed
  fi
  echo "== up in $(fmt_ms $(($(now_ms) - t0))); env: $STATE/env"
}

loadgen_bin() {
  local load=${CARGO_TARGET_DIR:-$REPO/target}/release/examples/loadgen
  # Always built (cargo returns at once when it is up to date): a stale
  # loadgen may lack a command this script uses.
  (cd "$REPO" && cargo build --release --quiet --example loadgen) >&2 || return 1
  echo "$load"
}

# preload: PRELOAD endpoint keys into every region's own subtree, all
# regions at once, before any replicator runs.
preload() {
  local load r t0
  local -a pids=()
  load=$(loadgen_bin) || return 1
  t0=$(now_ms)
  for r in "${REGIONS[@]}"; do
    "$load" fill-endpoints "$(getv "ETCD_URL_$r")" "$(prefix_of "$r")" "$PRELOAD" &
    pids+=($!)
  done
  for r in "${pids[@]}"; do
    wait "$r" || {
      echo "preload failed" >&2
      return 1
    }
  done
  echo "  preloaded $PRELOAD keys into each of ${#REGIONS[@]} regions in $(fmt_ms $(($(now_ms) - t0)))"
}

# check_preload SYNC_MS: every peer holds all PRELOAD keys of every other
# region (counted by etcd), 20 of them per region hold the source's value
# on a live lease in every peer; then REPORT sync and the STAT lines.
check_preload() {
  local load r p t_check peers
  local -a urls
  load=$(loadgen_bin) || return 1
  t_check=$(now_ms)
  for r in "${REGIONS[@]}"; do
    urls=()
    for p in $(peers_of "$r"); do
      "$load" wait "$(getv "ETCD_URL_$p")" "$(prefix_of "$r")" "$PRELOAD" 0 >/dev/null ||
        {
          echo "check: $p does not hold all $PRELOAD keys of $r" >&2
          return 1
        }
      urls+=("$(getv "ETCD_URL_$p")")
    done
    "$load" spot "$(getv "ETCD_URL_$r")" "$(prefix_of "$r")" "$PRELOAD" 20 "${urls[@]}" >/dev/null || {
      echo "check: $r's copies fail the spot check" >&2
      return 1
    }
  done
  peers=$((${#REGIONS[@]} - 1))
  echo "  checked: every peer holds all $PRELOAD keys of every region; 20 keys per region spot-checked in all $peers peers (value, live lease) in $(fmt_ms $(($(now_ms) - t_check)))"
  echo "REPORT sync regions=${#REGIONS[@]} streams=$((${#REGIONS[@]} * peers)) keys_per_region=$PRELOAD mirrored_writes=$((PRELOAD * ${#REGIONS[@]} * peers)) synced_ms=$1 $(stat_totals)"
  print_stats
}

# cpu_ticks PID: utime + stime of PID in clock ticks (0 if gone).
cpu_ticks() {
  local st
  st=$(cat "/proc/$1/stat" 2>/dev/null) || {
    echo 0
    return 0
  }
  st=${st##*) }
  # After the command name: state is field 3, utime 14 and stime 15.
  awk '{ print $12 + $13 }' <<<"$st"
}

hwm_kib() {
  awk '/^VmHWM:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0
}

# stat_totals: replica and etcd CPU-seconds and peak RSS, summed and maxed.
stat_totals() {
  local r s pid hz
  hz=$(getconf CLK_TCK)
  for r in "${REGIONS[@]}"; do
    for s in "${SLOTS[@]}"; do
      pid=$(getv "REPLICA_PID_${r}_$s")
      echo "rep $(cpu_ticks "$pid") $(hwm_kib "$pid")"
    done
    pid=$(getv "ETCD_PID_$r")
    echo "etcd $(cpu_ticks "$pid") $(hwm_kib "$pid")"
  done | awk -v hz="$hz" '
    { c[$1] += $2; if ($2 > cm[$1]) cm[$1] = $2; if ($3 > hm[$1]) hm[$1] = $3 }
    END { printf "replica_cpu_s_sum=%.1f replica_cpu_s_max=%.1f replica_peak_rss_mib_max=%.1f etcd_cpu_s_sum=%.1f etcd_peak_rss_mib_max=%.0f",
      c["rep"] / hz, cm["rep"] / hz, hm["rep"] / 1024, c["etcd"] / hz, hm["etcd"] / 1024 }'
}

# print_stats: one STAT line per replica and per etcd (CPU-seconds since
# it started, peak RSS).
print_stats() {
  local r s pid hz
  hz=$(getconf CLK_TCK)
  for r in "${REGIONS[@]}"; do
    for s in "${SLOTS[@]}"; do
      pid=$(getv "REPLICA_PID_${r}_$s")
      awk -v n="replica-$r-$s" -v t="$(cpu_ticks "$pid")" -v h="$(hwm_kib "$pid")" -v hz="$hz" \
        'BEGIN { printf "STAT %s cpu_s=%.1f peak_rss_mib=%.1f\n", n, t / hz, h / 1024 }'
    done
    pid=$(getv "ETCD_PID_$r")
    awk -v n="etcd-$r" -v t="$(cpu_ticks "$pid")" -v h="$(hwm_kib "$pid")" -v hz="$hz" \
      'BEGIN { printf "STAT %s cpu_s=%.1f peak_rss_mib=%.1f\n", n, t / hz, h / 1024 }'
  done
}

# replicas_cpu_ticks: every replica's CPU ticks, one line each.
replicas_cpu_ticks() {
  local r s
  for r in "${REGIONS[@]}"; do
    for s in "${SLOTS[@]}"; do
      cpu_ticks "$(getv "REPLICA_PID_${r}_$s")"
    done
  done
}

up_failed() {
  tail_logs 20
  echo "multiregion: up failed; stopping what was started (logs kept in $STATE/logs; '$0 down --state $STATE' removes them)" >&2
  stop_all
  exit 1
}

# ---------------------------------------------------------------- verify

VERIFY_T0=0
STEP_T0=0

ok() {
  printf 'ok   %s: %s\n' "$1" "$2"
}

# A background sampler of key counts (see step_peer_restart); stopped by pid.
SAMPLER_PID=""
stop_sampler() {
  if [[ -n $SAMPLER_PID ]]; then
    kill "$SAMPLER_PID" 2>/dev/null || true
    { wait "$SAMPLER_PID"; } 2>/dev/null || true
    SAMPLER_PID=""
  fi
}

fail() {
  stop_sampler
  printf 'FAIL %s: %s\n' "$1" "$2"
  tail_logs 8
  echo "logs: $STATE/logs (etcd-<region>.log, replica-<region>-<n>.log); state: $STATE/env" >&2
  exit 1
}

step_start() {
  STEP_T0=$(now_ms)
}

step_time() {
  fmt_ms $(($(now_ms) - STEP_T0))
}

prefix_of() {
  echo "$KEY_ROOT$1/"
}

# endpoint_key R SVC IP
endpoint_key() {
  echo "${KEY_ROOT}$1/clusters/c1/services/$2/protocols/http/endpoints/$3"
}

endpoint_value() { # R ZONE PORT [EXTRA]
  printf '{"clusterName":"c1","region":"%s","zone":"%s","port":%s%s}' "$1" "$2" "$3" "${4:-}"
}

put() { # STEP R KEY VALUE
  ectl "$2" put "$3" "$4" >/dev/null || fail "$1" "put $3 in $2's etcd failed"
}

del() { # STEP R KEY
  ectl "$2" del "$3" >/dev/null || fail "$1" "delete $3 in $2's etcd failed"
}

# dump E R: R's subtree as stored in E's etcd (keys and values, sorted).
dump() {
  ectl "$1" get --prefix "$(prefix_of "$2")"
}

digest() {
  local out
  out=$(dump "$1" "$2") || {
    echo "unreadable"
    return 0
  }
  sha256sum <<<"$out" | cut -c1-16
}

count_keys() { # E R
  local out
  out=$(ectl "$1" get --prefix --keys-only "$(prefix_of "$2")") || {
    echo "?"
    return 0
  }
  awk 'NF { n++ } END { print n + 0 }' <<<"$out"
}

# leased E R: "<keys> <keys without a lease>" of R's subtree in E's etcd.
leased() {
  local out
  out=$(ectl "$1" get --prefix "$(prefix_of "$2")" -w json) || {
    echo "? ?"
    return 0
  }
  python3 -c '
import json, sys
kvs = json.load(sys.stdin).get("kvs") or []
print(len(kvs), sum(1 for kv in kvs if not kv.get("lease")))' <<<"$out"
}

value_in() { # E KEY
  ectl "$1" get "$2" --print-value-only 2>/dev/null || echo "<unreadable>"
}

# mirrored R: every peer holds R's subtree exactly, on a lease. Sets WHY.
WHY=""
mirrored() {
  local r=$1 p src n un
  src=$(digest "$r" "$r")
  for p in $(peers_of "$r"); do
    if [[ $(digest "$p" "$r") != "$src" ]]; then
      WHY="$p's copy of $r differs from the source ($(count_keys "$p" "$r") vs $(count_keys "$r" "$r") keys)"
      return 1
    fi
    read -r n un <<<"$(leased "$p" "$r")"
    if [[ $un != 0 ]]; then
      WHY="$p's copy of $r: $un of $n keys without a lease"
      return 1
    fi
  done
}

wait_mirrored() { # STEP SECONDS R...
  local step=$1 secs=$2
  shift 2
  poll "$secs" 0.1 every mirrored "$@" || fail "$step" "not converged after ${secs}s: $WHY"
}

check_cmd() { # R: run `aether-replicator check` for R against every peer
  local r=$1 p
  local -a args=(check --region "$r" --local-etcd "$(getv "ETCD_URL_$r")")
  for p in $(peers_of "$r"); do
    args+=(--peer-etcd "$p=$(getv "ETCD_URL_$p")")
  done
  timeout 30 "$E2E_BIN" "${args[@]}" 2>&1
}

# wait_check STEP SECONDS R...: poll `check` for each region until all exit 0.
CHECK_OUT=""
check_passes() { # R: check_cmd R exits 0; its output is in CHECK_OUT
  CHECK_OUT=$(check_cmd "$1")
}
wait_check() {
  local step=$1 secs=$2
  shift 2
  poll "$secs" 0.3 every check_passes "$@" || fail "$step" "check --region $FAILING still failing after ${secs}s: $(tr '\n' ' ' <<<"$CHECK_OUT")"
}

step_setup() {
  local r s pid
  for r in "${REGIONS[@]}"; do
    pid=$(getv "ETCD_PID_$r")
    ours "$pid" || fail setup "etcd $r (pid $pid) is not running"
    for s in "${SLOTS[@]}"; do
      pid=$(getv "REPLICA_PID_${r}_$s")
      ours "$pid" || fail setup "replica $r/$s (pid $pid) is not running"
    done
  done
  wait_ready 30 "${REGIONS[@]}" || fail setup "regions not ready: $NOT_READY"
}

step_visibility() {
  local r n s i octet detail="" p cnt un
  step_start
  octet=0
  for r in "${REGIONS[@]}"; do
    octet=$((octet + 1))
    # 20 endpoints in a, 8 in each other region.
    if [[ $r == a ]]; then n=5; else n=2; fi
    for ((s = 0; s < n; s++)); do
      for i in 1 2 3 4; do
        put visibility "$r" "$(endpoint_key "$r" "svc-$s" "10.$octet.$s.$i")" \
          "$(endpoint_value "$r" "$r-$((i % 2 + 1))" 8080)"
      done
    done
  done
  wait_mirrored visibility 20 "${REGIONS[@]}"
  for r in "${REGIONS[@]}"; do
    for p in $(peers_of "$r"); do
      read -r cnt un <<<"$(leased "$p" "$r")"
      ((cnt > 0)) || fail visibility "$p holds no keys of $r"
      detail+="${detail:+, }$r->$p $cnt keys"
    done
  done
  ok visibility "$detail, all on a lease, in $(step_time)"
}

step_data_path() {
  local i p key v want
  step_start
  # Overwrite svc-0's endpoints, delete svc-4's.
  for i in 1 2 3 4; do
    put data-path a "$(endpoint_key a svc-0 "10.1.0.$i")" "$(endpoint_value a a-9 9090 ',"weight":2')"
    del data-path a "$(endpoint_key a svc-4 "10.1.4.$i")"
  done
  wait_mirrored data-path 20 a
  for p in $(peers_of a); do
    for i in 1 2 3 4; do
      key=$(endpoint_key a svc-4 "10.1.4.$i")
      v=$(ectl "$p" get "$key" --keys-only) || fail data-path "reading $p failed"
      [[ -z $v ]] || fail data-path "deleted $key still in $p"
      key=$(endpoint_key a svc-0 "10.1.0.$i")
      want=$(endpoint_value a a-9 9090 ',"weight":2')
      v=$(value_in "$p" "$key")
      [[ $v == "$want" ]] || fail data-path "$key in $p is $v, want $want"
    done
  done
  ok data-path "4 overwritten and 4 deleted in a; copies in $(peer_list a) match a ($(count_keys a a) keys) in $(step_time)"
}

step_handoff() {
  local old standby pid expected key val t_kill t_lead="" t_seen="" p c minc="" all_seen samples=0 deadline
  step_start
  old=$(leader_slot a) || fail handoff "a has no leader"
  if [[ $old == 1 ]]; then standby=2; else standby=1; fi
  pid=$(getv "REPLICA_PID_a_$old")
  expected=$(count_keys a a)
  [[ $expected =~ ^[0-9]+$ ]] || fail handoff "cannot count a's keys"
  key=$(endpoint_key a handoff 10.1.99.1)
  val=$(endpoint_value a a-1 8080 ",\"gen\":$(now_ms)")

  kill9 "$pid" || fail handoff "leader a/$old (pid $pid) survived SIGKILL"
  t_kill=$(now_ms)
  put handoff a "$key" "$val"
  deadline=$((t_kill + 30000))
  while :; do
    all_seen=1
    for p in $(peers_of a); do
      c=$(count_keys "$p" a)
      if [[ $c =~ ^[0-9]+$ ]]; then
        samples=$((samples + 1))
        ((c >= expected)) || fail handoff "$p's copy of a dropped to $c keys (expected >= $expected) $(fmt_ms $(($(now_ms) - t_kill))) after the kill"
        if [[ -z $minc ]] || ((c < minc)); then minc=$c; fi
      fi
      [[ $(value_in "$p" "$key") == "$val" ]] || all_seen=0
    done
    if [[ -z $t_lead ]] && [[ $(metric "$(metrics_of "$(getv "REPLICA_PORT_a_$standby")")" aether_replicator_is_leader) == 1 ]]; then
      t_lead=$(($(now_ms) - t_kill))
    fi
    if ((all_seen)) && [[ -z $t_seen ]]; then
      t_seen=$(($(now_ms) - t_kill))
    fi
    [[ -n $t_lead && -n $t_seen ]] && break
    (($(now_ms) < deadline)) ||
      fail handoff "after 30s: standby a/$standby leader=${t_lead:-no}, fresh write mirrored=${t_seen:-no}"
    sleep 0.1
  done

  # a gets its second replica back.
  start_replicas "a/$old" >/dev/null || fail handoff "could not start a replacement replica a/$old"
  wait_ready 30 a >/dev/null 2>&1 || fail handoff "a not ready after the replacement: $NOT_READY"
  [[ $LEADER_SLOT == "$standby" ]] || fail handoff "a/$LEADER_SLOT leads after the replacement, expected a/$standby"
  ok handoff "killed leader a/$old (pid $pid); a/$standby leads after $(fmt_ms "$t_lead"), fresh write in $(peer_list a) after $(fmt_ms "$t_seen"); copies never below $expected keys (min $minc, $samples samples); replacement a/$old pid $(getv "REPLICA_PID_a_$old")"
}

step_lease_lapse() {
  local r e s k t_kill t_gone="" deadline p all_gone d n
  local -A base=()
  step_start
  # Every other region's subtree, in every etcd: must not change.
  for r in "${REGIONS[@]}"; do
    [[ $r == a ]] && continue
    for e in "${REGIONS[@]}"; do
      base[$e/$r]=$(digest "$e" "$r")
      [[ ${base[$e/$r]} != unreadable ]] || fail lease-lapse "cannot read $r's subtree in $e"
    done
  done
  for s in "${SLOTS[@]}"; do
    kill9 "$(getv "REPLICA_PID_a_$s")" || fail lease-lapse "replica a/$s survived SIGKILL"
  done
  t_kill=$(now_ms)
  deadline=$((t_kill + (TTL + 5) * 1000))
  while :; do
    all_gone=1
    for p in $(peers_of a); do
      n=$(count_keys "$p" a)
      [[ $n == 0 ]] || all_gone=0
    done
    for k in "${!base[@]}"; do
      d=$(digest "${k%/*}" "${k#*/}")
      [[ $d == "${base[$k]}" ]] ||
        fail lease-lapse "${k#*/}'s subtree in ${k%/*}'s etcd changed while a was down ($d != ${base[$k]})"
    done
    if ((all_gone)); then
      t_gone=$(($(now_ms) - t_kill))
      break
    fi
    (($(now_ms) < deadline)) || fail lease-lapse "a's copy still present $((TTL + 5))s after both replicas died: $(for p in $(peers_of a); do printf '%s=%s ' "$p" "$(count_keys "$p" a)"; done)"
    sleep 0.25
  done
  local st
  for p in $(peers_of a); do
    st=$(ectl "$p" get "${STATE_KEY_ROOT}a/state" --keys-only) ||
      fail lease-lapse "cannot read a's state key in $p"
    [[ -z $st ]] || fail lease-lapse "a's state key is still in $p"
  done
  ok lease-lapse "killed both a replicas; a's copy gone from $(peer_list a) after $(fmt_ms "$t_gone") (TTL ${TTL}s), state key gone; other regions' subtrees untouched in every etcd"
}

step_recovery() {
  local -a others=()
  local r
  step_start
  start_replicas a/1 a/2 >/dev/null || fail recovery "could not restart a's replicas"
  wait_check recovery 60 a
  local first
  first=$(paste -sd';' <<<"$CHECK_OUT" | sed 's/;/; /g')
  wait_ready 30 a >/dev/null 2>&1 || fail recovery "a not ready: $NOT_READY"
  for r in "${REGIONS[@]}"; do
    [[ $r == a ]] || others+=("$r")
  done
  wait_check recovery 30 "${others[@]}"
  ok recovery "a's replicas restarted (leader a/$LEADER_SLOT); check --region a exits 0 after $(step_time): $first"
}

# sample_counts OUT SECONDS: every 0.2 s, append "<b's keys in a> <a's keys
# in b>" to OUT ("?" while unreadable), for at most SECONDS.
sample_counts() {
  local out=$1 end
  end=$(($(now_ms) + $2 * 1000))
  while (($(now_ms) < end)); do
    echo "$(count_keys a b) $(count_keys b a)" >>"$out"
    sleep 0.2
  done
}

step_peer_restart() {
  local pid t_down key val bkey bval before samples min_ba note
  local -a regions_to_check=(a)
  step_start
  # Watch b's copy in a while b's etcd is away: informational (b's leader
  # may lose its election session if the restart is slow, and then b's copy
  # can lapse in a; see the notes at the end of the line).
  before=$(count_keys a b)
  samples="$STATE/peer-restart.samples"
  : >"$samples"
  sample_counts "$samples" 120 &
  SAMPLER_PID=$!
  pid=$(getv ETCD_PID_b)
  stop_pids "$pid"
  alive "$pid" && fail peer-restart "b's etcd (pid $pid) did not stop"
  t_down=$(now_ms)
  wait_etcds 0 b >/dev/null || fail peer-restart "b's etcd did not come back on its ports"
  save_env
  t_down=$(($(now_ms) - t_down))
  key=$(endpoint_key a svc-0 10.1.0.99)
  val=$(endpoint_value a a-1 8080 ",\"gen\":$(now_ms)")
  put peer-restart a "$key" "$val"
  # And one in b, which must flow out of the restarted etcd.
  bkey=$(endpoint_key b svc-0 10.2.0.99)
  bval=$(endpoint_value b b-1 8080 ",\"gen\":$(now_ms)")
  put peer-restart b "$bkey" "$bval"
  regions_to_check+=(b)
  [[ " ${REGIONS[*]} " == *" c "* ]] && regions_to_check+=(c)
  wait_check peer-restart 60 "${regions_to_check[@]}"
  [[ $(value_in b "$key") == "$val" ]] || fail peer-restart "new key of a not in b"
  [[ $(value_in a "$bkey") == "$bval" ]] || fail peer-restart "new key of b not in a"
  wait_ready 60 b >/dev/null 2>&1 || fail peer-restart "b's replicators not healthy again: $NOT_READY"
  stop_sampler
  min_ba=$(awk '$1 ~ /^[0-9]+$/ { if (m == "" || $1 < m) m = $1 } END { print m }' "$samples")
  if [[ $min_ba == 0 ]]; then
    note="; NOTE: b's copy in a lapsed (0 of $before keys) during the restart"
  else
    note="; b's copy in a stayed >= ${min_ba:-?} keys (was $before)"
  fi
  ok peer-restart "b's etcd restarted (SIGTERM, pid $pid -> $(getv ETCD_PID_b), back in $(fmt_ms "$t_down")); check ${regions_to_check[*]} exits 0 and b's leader b/$LEADER_SLOT is synced to $(peer_list b) after $(step_time)$note"
}

cmd_verify() {
  if [[ ! -e $STATE/$MARKER ]] || ! load_env; then
    die "$STATE is not up: run '$0 up --state $STATE' first"
  fi
  VERIFY_T0=$(now_ms)
  trap stop_sampler EXIT
  step_setup
  step_visibility
  step_data_path
  step_handoff
  step_lease_lapse
  step_recovery
  step_peer_restart
  echo "== verify: all steps passed in $(fmt_ms $(($(now_ms) - VERIFY_T0))) (${#REGIONS[@]} regions)"
}

# ---------------------------------------------------------------- alerts

# wait_alerts STEP SECONDS WANT DESC: poll Prometheus's alerts until WANT (a
# function of the `prom_alerts` lines on stdin) succeeds.
ALERTS=""
wait_alerts() {
  local step=$1 secs=$2 want=$3 desc=$4 deadline
  deadline=$(($(now_ms) + secs * 1000))
  while :; do
    if ALERTS=$(prom_alerts); then
      "$want" <<<"$ALERTS" && return 0
    else
      ALERTS="<Prometheus unreachable>"
    fi
    (($(now_ms) < deadline)) ||
      fail "$step" "$desc not seen within ${secs}s; active alerts: $(paste -sd';' <<<"$ALERTS")"
    sleep 0.5
  done
}

others_of_a() {
  local r
  for r in "${REGIONS[@]}"; do
    [[ $r == a ]] || echo "$r"
  done
}

# a_down_alerts_fire: NoLeader firing for region a, and OriginCopyLapsed
# firing for origin a in every other region.
a_down_alerts_fire() {
  local lines r
  lines=$(cat)
  grep -qx 'firing AetherReplicatorNoLeader region=a' <<<"$lines" || return 1
  for r in $(others_of_a); do
    grep -qx "firing AetherReplicatorOriginCopyLapsed region=$r origin=a" <<<"$lines" || return 1
  done
}

# a_down_alerts_gone: neither alert is active (firing or pending) any more.
a_down_alerts_gone() {
  ! grep -Eq 'AetherReplicatorNoLeader region=a$|AetherReplicatorOriginCopyLapsed region=[a-z]+ origin=a$'
}

cmd_alerts() {
  local s t0 t_fire t_resolve fired
  if [[ ! -e $STATE/$MARKER ]] || ! load_env; then
    die "$STATE is not up: run '$0 up --prometheus --state $STATE' first"
  fi
  [[ -n $(getv PROM_PORT) ]] || die "$STATE has no Prometheus: run up with --prometheus"
  ours "$PROM_PID" || fail alerts "prometheus (pid $PROM_PID) is not running"
  VERIFY_T0=$(now_ms)
  step_start
  wait_ready 30 "${REGIONS[@]}" || fail alerts "regions not ready: $NOT_READY"
  # Every replica scraped, and neither alert active, before anything is stopped.
  wait_targets_up alerts
  wait_alerts alerts 20 a_down_alerts_gone "a healthy start (no NoLeader for a, no lapse of a)"
  # The lapse alert needs the incoming-side metric from every other region;
  # without it the alert can never fire, so say that instead of timing out.
  for r in $(others_of_a); do
    [[ $(prom_count "aether_replicator_origin_copy_present{origin=\"a\",region=\"$r\"}") -gt 0 ]] ||
      fail alerts "Prometheus has no aether_replicator_origin_copy_present{origin=\"a\"} from region $r: this replicator binary does not export the incoming-side metrics, so AetherReplicatorOriginCopyLapsed cannot fire"
  done

  for s in "${SLOTS[@]}"; do
    stop_pids "$(getv "REPLICA_PID_a_$s")"
  done
  t0=$(now_ms)
  wait_alerts alerts $((TTL + 30)) a_down_alerts_fire \
    "AetherReplicatorNoLeader{region=a} and AetherReplicatorOriginCopyLapsed{origin=a} in $(others_of_a | paste -sd' ' -)"
  t_fire=$(($(now_ms) - t0))
  fired=$(grep '^firing' <<<"$ALERTS" | cut -d' ' -f2- | paste -sd';' - | sed 's/;/; /g')

  t0=$(now_ms)
  start_replicas a/1 a/2 >/dev/null || fail alerts "could not restart a's replicas"
  wait_ready 30 a >/dev/null 2>&1 || fail alerts "a not ready after the restart: $NOT_READY"
  wait_alerts alerts 60 a_down_alerts_gone "resolution of both alerts after the restart"
  t_resolve=$(($(now_ms) - t0))
  ok alerts "stopped both a replicas: firing after $(fmt_ms "$t_fire") (lease TTL ${TTL}s, for: 2s): $fired; restarted: both resolved after $(fmt_ms "$t_resolve")"
}

# ---------------------------------------------------------------- quiet

indent() { # PREFIX: stdin with PREFIX before every line
  local line
  while IFS= read -r line; do printf '%s%s\n' "$1" "$line"; done
}

# wait_targets_up STEP: within 20 s, Prometheus scrapes every replica.
wait_targets_up() {
  local up total deadline want=$((${#REGIONS[@]} * ${#SLOTS[@]}))
  deadline=$(($(now_ms) + 20000))
  while :; do
    read -r up total <<<"$(prom_targets_up)"
    [[ $up == "$total" && $total == "$want" ]] && return 0
    (($(now_ms) < deadline)) || fail "$1" "Prometheus scrapes $up of $total targets (want $want)"
    sleep 0.5
  done
}

# prom_query EXPR [TIME]: one line per series of the instant query's answer,
# "<labels> <value>" (labels sorted, __name__ first); fails if Prometheus
# does not answer.
prom_query() {
  local -a args=(--data-urlencode "query=$1")
  [[ -z ${2:-} ]] || args+=(--data-urlencode "time=$2")
  curl -s --max-time 10 -G "$PROM_URL/api/v1/query" "${args[@]}" 2>/dev/null | python3 -c '
import json, sys
try:
    res = json.load(sys.stdin)["data"]["result"]
except Exception:
    sys.exit(1)
for r in res:
    m = r["metric"]
    name = m.pop("__name__", "")
    print(name + "{" + ", ".join(f"{k}=\"{v}\"" for k, v in sorted(m.items())) + "}", r["value"][1])'
}

# The churn of e2e/churn.py in every region, in the background (recorded
# pid, so `down` stops it too); churn_stop stops it and sets CHURN_COUNTS.
CHURN_PID=""
CHURN_COUNTS=""
churn_start() { # OPS_PER_SECOND_PER_REGION
  local r
  local -a targets=()
  for r in "${REGIONS[@]}"; do targets+=("$r=$(getv "ETCD_URL_$r")"); done
  setsid python3 "$STATE/bin/churn.py" "$STATE" "$1" "${targets[@]}" \
    </dev/null >"$STATE/churn.out" 2>>"$STATE/logs/churn.log" &
  CHURN_PID=$!
  disown "$CHURN_PID"
  record_pid churn "$CHURN_PID"
}

churn_stop() {
  [[ -n $CHURN_PID ]] || return 0
  stop_pids "$CHURN_PID"
  rm -f "$STATE/pids/churn.pid"
  CHURN_PID=""
  CHURN_COUNTS=$(tail -n1 "$STATE/churn.out" 2>/dev/null || true)
}

# churn_ok: the churn is still running.
churn_ok() {
  [[ -n $CHURN_PID ]] && ours "$CHURN_PID"
}

# sleep_until MS: sleeps until now_ms reaches MS, failing STEP (in SLEEP_STEP)
# if the churn dies meanwhile.
SLEEP_STEP=""
sleep_until() {
  local left
  while :; do
    left=$(($1 - $(now_ms)))
    ((left > 0)) || return 0
    churn_ok || fail "$SLEEP_STEP" "the churn (e2e/churn.py) died: $(tail -n3 "$STATE/logs/churn.log" 2>/dev/null | paste -sd' ' -)"
    ((left < 1000)) || left=1000
    sleep "$((left / 1000)).$(printf '%03d' $((left % 1000)))"
  done
}

need_prom() { # COMMAND
  if [[ ! -e $STATE/$MARKER ]] || ! load_env; then
    die "$STATE is not up: run '$0 up --prometheus --state $STATE' first"
  fi
  [[ -n $(getv PROM_PORT) ]] || die "$STATE has no Prometheus: run up with --prometheus"
  ours "$PROM_PID" || fail "$1" "prometheus (pid $PROM_PID) is not running"
}

cmd_quiet() {
  local n t0 t1 secs fired now_firing targets down_targets want links
  need_prom quiet
  if [[ ! $QUIET_SECONDS =~ ^[0-9]+$ ]] || ((QUIET_SECONDS < 10)); then
    die "--seconds must be a whole number, at least 10"
  fi
  trap churn_stop EXIT
  VERIFY_T0=$(now_ms)
  step_start
  wait_ready 30 "${REGIONS[@]}" || fail quiet "regions not ready: $NOT_READY"
  wait_targets_up quiet
  want=$((${#REGIONS[@]} * ${#SLOTS[@]}))
  churn_start 3
  t0=$(now_ms)
  SLEEP_STEP=quiet
  sleep_until $((t0 + QUIET_SECONDS * 1000))
  churn_stop
  t1=$(now_ms)
  [[ $CHURN_COUNTS == *errors=0 ]] || fail quiet "the churn had failures ($CHURN_COUNTS): $(tail -n3 "$STATE/logs/churn.log" | paste -sd' ' -)"
  # The load got through: every copy matches its source again.
  wait_mirrored quiet 30 "${REGIONS[@]}"
  # One more evaluation and scrape past the window's end.
  sleep 2
  secs=$(((t1 - t0 + 999) / 1000))
  n=$(prom_query "count(max_over_time(ALERTS{alertstate=\"firing\"}[${secs}s])) or vector(0)" "$((t1 / 1000)).$((t1 % 1000))") ||
    fail quiet "Prometheus does not answer"
  fired=$(python3 "$SCRIPT_DIR/prom-fixture.py" fired "$PROM_URL" "$((t0 / 1000))" "$((t1 / 1000 + 1))") ||
    fail quiet "Prometheus does not answer"
  now_firing=$(prom_alerts | grep '^firing' || true)
  targets=$(prom_query "min_over_time(up{job=\"aether-replicator\"}[${secs}s])" "$((t1 / 1000)).$((t1 % 1000))") ||
    fail quiet "Prometheus does not answer"
  down_targets=$(awk '$NF != 1' <<<"$targets")
  links="links direct"
  [[ -z $(getv LINK_PORT_a_b) ]] || links="links ${E2E_LINK_DELAY}ms + 0..${E2E_LINK_JITTER}ms jitter each way"
  if [[ ${n##* } != 0 || -n $fired || -n $now_firing ]]; then
    printf 'FAIL quiet: alerts fired during %ss of churn (%s; for: shortened to 2s in this harness, so stricter than production):\n' "$secs" "$links"
    if [[ -n $fired ]]; then indent '  ' <<<"$fired"; fi
    if [[ -n $now_firing ]]; then indent '  now: ' <<<"$now_firing"; fi
    exit 1
  fi
  [[ $(grep -c . <<<"$targets") == "$want" && -z $down_targets ]] ||
    fail quiet "not every target up throughout the window (want $want): $(paste -sd';' <<<"$targets")"
  ok quiet "${secs}s of churn in ${REGIONS[*]} (3 ops/s/region: ${CHURN_COUNTS% errors=0}; $links), copies converged after; no alert firing at any evaluation of the window nor now (every for: shortened to 2s here, so stricter than production), $want/$want targets up throughout"
}

# ---------------------------------------------------------------- record

# record_at STEP MS WHAT CMD...: at MS (now_ms) runs CMD, failing STEP if it
# fails; appends "+<seconds into the window> WHAT" to TIMELINE.
TIMELINE=""
RECORD_T0=0
record_at() {
  local step=$1 at=$2 what=$3 t
  shift 3
  sleep_until "$at"
  t=$(now_ms)
  "$@" >/dev/null || fail "$step" "$what failed"
  TIMELINE+="${TIMELINE:+; }+$(fmt_ms $((t - RECORD_T0))) $what (done at +$(fmt_ms $(($(now_ms) - RECORD_T0))))"
}

stop_region() { # R
  local s
  for s in "${SLOTS[@]}"; do
    stop_pids "$(getv "REPLICA_PID_${1}_$s")"
  done
}

restart_region() { # R
  start_replicas "$1/1" "$1/2" && wait_ready 30 "$1"
}

cmd_record() {
  local expect end rc summary fired
  need_prom record
  case $SCENARIO in
  healthy | link-cut | region-down) ;;
  *) die "--scenario must be healthy, link-cut or region-down" ;;
  esac
  [[ -n $OUT_ARG ]] || die "record needs --out FILE"
  [[ " ${REGIONS[*]} " == *" a b c "* ]] || die "record needs 3 regions (up --regions 3)"
  [[ -n $(getv LINK_PORT_a_b) ]] || die "record needs the link proxies: up --prometheus --regions 3 --link-delay 5 --link-jitter 20"
  expect=$REPO/deploy/prometheus/recorded/expect/$SCENARIO.yml
  [[ -f $expect ]] || die "no expectations for $SCENARIO: $expect"
  trap churn_stop EXIT
  VERIFY_T0=$(now_ms)
  step_start
  wait_ready 30 "${REGIONS[@]}" || fail record "regions not ready: $NOT_READY"
  wait_targets_up record
  churn_start 3
  SLEEP_STEP=record
  # The window starts on a whole second, a few seconds into the churn.
  RECORD_T0=$((($(now_ms) / 1000 + 3) * 1000))
  sleep_until "$RECORD_T0"
  echo "== record $SCENARIO: window from $(date -u -d "@$((RECORD_T0 / 1000))" +%T) UTC"
  case $SCENARIO in
  healthy)
    end=$((RECORD_T0 + 180000))
    ;;
  link-cut)
    record_at record $((RECORD_T0 + 60000)) "cut a->b" link_cut a b
    record_at record $((RECORD_T0 + 480000)) "heal a->b" link_heal a b
    end=$((RECORD_T0 + 600000))
    ;;
  region-down)
    record_at record $((RECORD_T0 + 60000)) "stop a/1 and a/2 (SIGTERM)" stop_region a
    record_at record $((RECORD_T0 + 240000)) "start a/1 and a/2 again" restart_region a
    end=$((RECORD_T0 + 360000))
    ;;
  esac
  sleep_until "$end"
  churn_stop
  # The last scrape and evaluation of the window in.
  sleep 3
  mkdir -p "$(dirname "$OUT_ARG")"
  python3 "$SCRIPT_DIR/prom-fixture.py" fixture "$PROM_URL" "$((RECORD_T0 / 1000))" "$((end / 1000))" \
    "$REPO/deploy/prometheus/aether-replicator.rules.yml" "$STATE/instances" "$expect" "$OUT_ARG" \
    "$(printf '%s\n' \
      "Scenario $SCENARIO, recorded $(date -u -d "@$((RECORD_T0 / 1000))" +%FT%TZ) with e2e/multiregion.sh: ${#REGIONS[@]} regions (${REGIONS[*]})," \
      "two replicas each (instances a1, a2, ...; a1.2 is a1's slot started again), lease TTL ${TTL}s, election TTL ${ELECTION_TTL}s," \
      "links ${E2E_LINK_DELAY}ms + 0..${E2E_LINK_JITTER}ms jitter each way, churn 3 ops/s/region (${CHURN_COUNTS}), 1 s scrapes." \
      "Timeline: ${TIMELINE:-load only}; window $(((end - RECORD_T0) / 1000))s.")" ||
    fail record "writing $OUT_ARG failed"
  # What the harness's Prometheus (for: 2s) saw firing: for comparison only.
  fired=$(python3 "$SCRIPT_DIR/prom-fixture.py" fired "$PROM_URL" "$((RECORD_T0 / 1000))" "$((end / 1000))" || true)
  echo "   firing in the harness's Prometheus (every for: 2s) during the window:"
  if [[ -n $fired ]]; then indent '     ' <<<"$fired"; else echo "     none"; fi
  rc=0
  summary=$(promtool test rules "$OUT_ARG" 2>&1) || rc=$?
  if ((rc == 0)); then
    ok record "$SCENARIO in $(step_time) (${TIMELINE:-load only}); $OUT_ARG passes promtool test rules"
  else
    indent '   ' <<<"$summary"
    printf 'FAIL record: %s written (%s), but promtool test rules fails on it (above)\n' "$OUT_ARG" "$SCENARIO"
    exit 1
  fi
}

# ---------------------------------------------------------------- down

cmd_down() {
  local t0 left
  t0=$(now_ms)
  if [[ ! -d $STATE ]]; then
    echo "== down: nothing at $STATE"
    return 0
  fi
  if [[ ! -e $STATE/$MARKER ]]; then
    if [[ -z $(ls -A "$STATE") ]]; then
      rmdir "$STATE"
      echo "== down: removed empty $STATE"
      return 0
    fi
    die "$STATE is not an e2e state dir; not touching it"
  fi
  stop_all
  left=$(live_harness_pids)
  [[ -z $left ]] || die "processes still running after down: $left"
  rm -rf "${STATE:?}"
  echo "== down: stopped and removed $STATE in $(fmt_ms $(($(now_ms) - t0)))"
}

# ---------------------------------------------------------------- restart

cmd_restart() {
  local r=$1 s
  local -a dead=()
  if [[ ! -e $STATE/$MARKER ]] || ! load_env; then
    die "$STATE is not up"
  fi
  [[ " ${REGIONS[*]} " == *" $r "* ]] || die "no region $r (regions: ${REGIONS[*]})"
  for s in "${SLOTS[@]}"; do
    ours "$(getv "REPLICA_PID_${r}_$s")" || dead+=("$r/$s")
  done
  if ((${#dead[@]} == 0)); then
    echo "both replicas of $r are running"
    return 0
  fi
  start_replicas "${dead[@]}"
}

# ---------------------------------------------------------------- burst

# Metric NAME summed over every replica's series (a standby's counters
# stand still, so differences are the leaders' work).
replicas_sum() { # NAME
  local r s
  for r in "${REGIONS[@]}"; do
    for s in "${SLOTS[@]}"; do
      metrics_of "$(getv "REPLICA_PORT_${r}_$s")"
    done
  done | awk -v n="$1" '$1 ~ "^"n"({|$)" { t += $2 } END { print t + 0 }'
}

# Waits for every pid; a bare `wait` would return 0 whatever they exited with.
wait_all() { # WHAT PID...
  local what=$1 pid
  shift
  for pid in "$@"; do
    wait "$pid" || die "$what"
  done
}

cmd_burst() {
  load_env
  local load=${CARGO_TARGET_DIR:-$REPO/target}/release/examples/loadgen
  if [[ ! -x $load ]]; then
    (cd "$REPO" && cargo build --release --quiet --example loadgen) || die "cargo build --example loadgen failed"
  fi
  local round r p s f pid dir t_end t_last t_max rss rss_max txns0 ev0 txns1 ev1 cpu
  local -a pids cpu0 cpu1
  wait_ready 30 "${REGIONS[@]}" || die "regions not ready: $NOT_READY"
  dir=$STATE/burst
  mkdir -p "$dir"
  for ((round = 0; round < ROUNDS; round++)); do
    txns0=$(replicas_sum aether_replicator_txns_applied_total)
    ev0=$(replicas_sum aether_replicator_events_applied_total)
    mapfile -t cpu0 < <(replicas_cpu_ticks)
    pids=()
    for r in "${REGIONS[@]}"; do
      "$load" burst "$(getv "ETCD_URL_$r")" "${KEY_ROOT}$r/burst$round/" "$REVISIONS" "$WRITERS" >"$dir/end.$r" &
      pids+=($!)
    done
    wait_all "a burst's writes failed (round $round)" "${pids[@]}"
    pids=()
    t_end=0
    for r in "${REGIONS[@]}"; do
      t_last=$(tail -n1 "$dir/end.$r")
      ((t_last > t_end)) && t_end=$t_last
    done
    for r in "${REGIONS[@]}"; do
      for p in "${REGIONS[@]}"; do
        [[ $p == "$r" ]] && continue
        "$load" wait "$(getv "ETCD_URL_$p")" "${KEY_ROOT}$r/burst$round/" "$REVISIONS" 120 >"$dir/at.$r.$p" &
        pids+=($!)
      done
    done
    wait_all "a peer never held a region's burst (round $round)" "${pids[@]}"
    t_max=0
    for f in "$dir"/at.*; do
      t_last=$(tail -n1 "$f")
      ((t_last > t_max)) && t_max=$t_last
    done
    rss_max=0
    for r in "${REGIONS[@]}"; do
      for s in "${SLOTS[@]}"; do
        pid=$(getv "REPLICA_PID_${r}_$s")
        rss=$(awk '/^VmHWM:/ { print $2 }' "/proc/$pid/status" 2>/dev/null || echo 0)
        ((rss > rss_max)) && rss_max=$rss
      done
    done
    txns1=$(replicas_sum aether_replicator_txns_applied_total)
    ev1=$(replicas_sum aether_replicator_events_applied_total)
    mapfile -t cpu1 < <(replicas_cpu_ticks)
    # CPU over the round (bursts, convergence and the checks' polling) per
    # replica; per 100k events applied by all of them.
    cpu=$(for i in "${!cpu1[@]}"; do echo $((cpu1[i] - cpu0[i])); done |
      awk -v hz="$(getconf CLK_TCK)" -v e="$(awk -v a="$ev1" -v b="$ev0" 'BEGIN { print a - b }')" '
        { s += $1; if ($1 > m) m = $1 }
        END { printf "replica_cpu_s_sum=%.2f replica_cpu_s_max=%.2f replica_cpu_s_per_100k_events=%.2f", s / hz, m / hz, (e > 0 ? s / hz * 100000 / e : 0) }')
    echo "REPORT burst regions=${#REGIONS[@]} streams=$((${#REGIONS[@]} * (${#REGIONS[@]} - 1))) round=$round revisions=$REVISIONS writers=$WRITERS converged_after_last_write_ms=$((t_max - t_end)) txns=$(awk -v a="$txns1" -v b="$txns0" 'BEGIN { print a - b }') events_per_txn=$(awk -v t="$txns1" -v t0="$txns0" -v e="$ev1" -v e0="$ev0" 'BEGIN { d = t - t0; r = 0; if (d > 0) r = (e - e0) / d; printf "%.1f", r }') peak_rss_kib_max=$rss_max $cpu"
  done
  echo "REPORT totals $(stat_totals)"
  print_stats
}

# ---------------------------------------------------------------- main

CMD=""
REGION_ARG=""
PEER_ARG=""
LINK_DELAY=""
LINK_JITTER=""
QUIET_SECONDS=180
SCENARIO=""
OUT_ARG=""
STATE="${TMPDIR:-/tmp}/aether-e2e"
NREGIONS=2
TTL=6
BIN_ARG=""
WITH_PROM=0
REVISIONS=5000
WRITERS=16
ROUNDS=3
NREPLICAS=2
PRELOAD=0
SYNC_TIMEOUT=60
REPLICATOR_ARGS=()
ETCD_ARGS=()
REGIONS=()
while (($#)); do
  case $1 in
  up | verify | alerts | quiet | record | down | restart | cut | heal | burst)
    [[ -z $CMD ]] || die "one command at a time"
    CMD=$1
    if [[ $1 == restart ]]; then
      (($# >= 2)) || die "restart needs a region"
      REGION_ARG=$2
      shift
    elif [[ $1 == cut || $1 == heal ]]; then
      (($# >= 3)) || die "$1 needs a region and a peer: $1 REGION PEER"
      REGION_ARG=$2
      PEER_ARG=$3
      shift 2
    fi
    ;;
  --state) (($# >= 2)) || die "--state needs a value"; STATE=$2; shift ;;
  --state=*) STATE=${1#*=} ;;
  --regions) (($# >= 2)) || die "--regions needs a value"; NREGIONS=$2; shift ;;
  --regions=*) NREGIONS=${1#*=} ;;
  --ttl) (($# >= 2)) || die "--ttl needs a value"; TTL=$2; shift ;;
  --ttl=*) TTL=${1#*=} ;;
  --bin) (($# >= 2)) || die "--bin needs a value"; BIN_ARG=$2; shift ;;
  --bin=*) BIN_ARG=${1#*=} ;;
  --prometheus) WITH_PROM=1 ;;
  --link-delay) (($# >= 2)) || die "--link-delay needs a value"; LINK_DELAY=$2; shift ;;
  --link-jitter) (($# >= 2)) || die "--link-jitter needs a value"; LINK_JITTER=$2; shift ;;
  --seconds) (($# >= 2)) || die "--seconds needs a value"; QUIET_SECONDS=$2; shift ;;
  --scenario) (($# >= 2)) || die "--scenario needs a value"; SCENARIO=$2; shift ;;
  --out) (($# >= 2)) || die "--out needs a value"; OUT_ARG=$2; shift ;;
  --revisions) (($# >= 2)) || die "--revisions needs a value"; REVISIONS=$2; shift ;;
  --writers) (($# >= 2)) || die "--writers needs a value"; WRITERS=$2; shift ;;
  --rounds) (($# >= 2)) || die "--rounds needs a value"; ROUNDS=$2; shift ;;
  --replicas) (($# >= 2)) || die "--replicas needs a value"; NREPLICAS=$2; shift ;;
  --preload) (($# >= 2)) || die "--preload needs a value"; PRELOAD=$2; shift ;;
  --sync-timeout) (($# >= 2)) || die "--sync-timeout needs a value"; SYNC_TIMEOUT=$2; shift ;;
  --replicator-arg) (($# >= 2)) || die "--replicator-arg needs a value"; [[ $2 != *[[:space:]]* ]] || die "--replicator-arg $2: no spaces"; REPLICATOR_ARGS+=("$2"); shift ;;
  --etcd-arg) (($# >= 2)) || die "--etcd-arg needs a value"; [[ $2 != *[[:space:]]* ]] || die "--etcd-arg $2: no spaces"; ETCD_ARGS+=("$2"); shift ;;
  -h | --help) usage; exit 0 ;;
  *) usage >&2; exit 2 ;;
  esac
  shift
done
resolve_state
if [[ -n $BIN_ARG && $BIN_ARG != /* ]]; then BIN_ARG="$PWD/$BIN_ARG"; fi
if [[ -n $OUT_ARG && $OUT_ARG != /* ]]; then OUT_ARG="$PWD/$OUT_ARG"; fi
TTL=${TTL%s}

case $CMD in
up) cmd_up ;;
verify) cmd_verify ;;
alerts) cmd_alerts ;;
quiet) cmd_quiet ;;
record) cmd_record ;;
down) cmd_down ;;
restart) cmd_restart "$REGION_ARG" ;;
cut) cmd_cut "$REGION_ARG" "$PEER_ARG" ;;
heal) cmd_heal "$REGION_ARG" "$PEER_ARG" ;;
burst) cmd_burst ;;
*) usage >&2; exit 2 ;;
esac
