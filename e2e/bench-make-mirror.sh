#!/usr/bin/env bash
# Side by side on one host: `etcdctl make-mirror` and `aether-replicator`
# doing the same work on fresh etcd pairs, in one run.
#
#   e2e/bench-make-mirror.sh [--keys N] [--burst N] [--writers N] [--rss-keys N] [--rss-only]
#                            [--wan RTTS] [--wan-window S] [--wan-only] [--rss-rtt MS]
#
# 1. Base sync: N keys (100-byte values) at the source, an empty peer;
#    time from starting the mirror to the peer holding all N.
# 2. Live burst: a synced, idle mirror; BURST single-put revisions from
#    WRITERS concurrent writers at the source; time from the last write
#    returning to the peer holding everything.
#    For both steps, the CPU-seconds (utime + stime, /proc/PID/stat) the
#    mirror process spent, and the two etcds', scaled to 100k keys synced
#    and to 100k live events: what a pod is sized by.
# 3. With --rss-keys N (e.g. 1000000): the replicator's peak RSS (VmHWM)
#    during a base sync of N keys.
# 4. With --wan "0,20,100,250": for each round trip (ms), a delay proxy
#    (`aether-e2e link-proxy`, the e2e harness's) between the mirror and
#    the peer, and the base sync of N keys through it by both tools, over
#    a fixed window of --wan-window seconds (default 10; make-mirror
#    cannot finish at 100 ms): keys on the peer at the end of the window
#    (or at completion) per second.
#    --rss-rtt MS runs the RSS sync of step 3 through such a proxy too.
# Prints both figures and their ratio. Loopback only; every process it
# starts is stopped by pid.
set -euo pipefail
cd "$(dirname "$0")/.."

KEYS=20000 BURST=20000 WRITERS=64 RSS_KEYS=0 RSS_ONLY=0 WAN="" WAN_WINDOW=10 WAN_ONLY=0 RSS_RTT=0
while [ $# -gt 0 ]; do
  case "$1" in
    --keys) KEYS=$2; shift 2 ;;
    --burst) BURST=$2; shift 2 ;;
    --writers) WRITERS=$2; shift 2 ;;
    --rss-keys) RSS_KEYS=$2; shift 2 ;;
    --rss-only) RSS_ONLY=1; shift ;;
    --wan) WAN=$2; shift 2 ;;
    --wan-window) WAN_WINDOW=$2; shift 2 ;;
    --wan-only) WAN_ONLY=1; shift ;;
    --rss-rtt) RSS_RTT=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

command -v etcd >/dev/null && command -v etcdctl >/dev/null || {
  echo "etcd not found: apt-get update && apt-get install -y etcd-server etcd-client" >&2; exit 1; }
cargo build --release --quiet --bin aether-replicator --example loadgen
cargo build --release --quiet -p aether-test-kit --bin aether-e2e
BIN=${CARGO_TARGET_DIR:-target}/release/aether-replicator
LOAD=${CARGO_TARGET_DIR:-target}/release/examples/loadgen
E2E=${CARGO_TARGET_DIR:-target}/release/aether-e2e
PREFIX=/aether/v1/regions/a/

STATE=$(mktemp -d "${TMPDIR:-/tmp}/aether-bench.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$STATE"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# start_etcd NAME: starts a fresh member, sets URL and EPID.
start_etcd() {
  local name=$1 cp pp dir
  cp=$(free_port); pp=$(free_port)
  dir="$STATE/$name"; mkdir -p "$dir"
  etcd --name "$name" --data-dir "$dir/data" \
    --listen-client-urls "http://127.0.0.1:$cp" --advertise-client-urls "http://127.0.0.1:$cp" \
    --listen-peer-urls "http://127.0.0.1:$pp" --initial-advertise-peer-urls "http://127.0.0.1:$pp" \
    --initial-cluster "$name=http://127.0.0.1:$pp" \
    --logger=zap --log-outputs=stderr --log-level=error 2>"$dir/etcd.log" &
  EPID=$!; PIDS+=("$EPID")
  URL="http://127.0.0.1:$cp"
  for _ in $(seq 100); do
    ETCDCTL_API=3 etcdctl --endpoints="$URL" endpoint health >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "etcd $name did not start; log:" >&2; tail -20 "$dir/etcd.log" >&2; exit 1
}

stop_pid() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# start_mirror TOOL SRC DST: sets MPID.
start_mirror() {
  local tool=$1 src=$2 dst=$3
  if [ "$tool" = make-mirror ]; then
    ETCDCTL_API=3 etcdctl --endpoints="$src" make-mirror --prefix="$PREFIX" "$dst" >"$STATE/mm.log" 2>&1 &
  else
    AETHER_REPLICATOR_LOG_LEVEL=warn "$BIN" --region a --local-etcd "$src" --peer-etcd "b=$dst" \
      --metrics-addr "127.0.0.1:$(free_port)" >"$STATE/ar.log" 2>&1 &
  fi
  MPID=$!; PIDS+=("$MPID")
}

now_ms() { date +%s%3N; }

# cpu_ticks PID: utime + stime of a live PID in clock ticks.
cpu_ticks() {
  local st
  st=$(cat "/proc/$1/stat")
  st=${st##*) }
  awk '{ print $12 + $13 }' <<<"$st"
}
HZ=$(getconf CLK_TCK)

# per_100k TICKS N: TICKS as CPU-seconds per 100k of N.
per_100k() { python3 -c "print(round($1 / $HZ * 100000 / max($2, 1), 2))"; }

# start_proxy UPSTREAM_URL ONE_WAY_MS: sets PROXY_URL (and PPID_ for stop_pid).
start_proxy() {
  local up_port=${1##*:} port
  port=$(free_port)
  "$E2E" link-proxy "$port" "$up_port" "$2" >"$STATE/proxy-$port.log" 2>&1 &
  PXPID=$!; PIDS+=("$PXPID")
  for _ in $(seq 50); do grep -q ready "$STATE/proxy-$port.log" 2>/dev/null && break; sleep 0.1; done
  PROXY_URL="http://127.0.0.1:$port"
}

# count_keys URL: keys under $PREFIX (loadgen's wait reports the count it
# timed out with).
count_keys() {
  { "$LOAD" wait "$1" "$PREFIX" 999999999 0 2>&1 || true; } | sed -n 's/.*with \(-\{0,1\}[0-9]*\) of.*/\1/p'
}

declare -A BASE LIVE CPU_BASE CPU_LIVE ECPU_BASE ECPU_LIVE
tools=(make-mirror aether-replicator)
[ "$RSS_ONLY" = 1 ] && tools=()
[ "$WAN_ONLY" = 1 ] && tools=()
for tool in "${tools[@]}"; do
  start_etcd "src-$tool-base"; SRC=$URL; S1=$EPID
  start_etcd "dst-$tool-base"; DST=$URL; D1=$EPID
  "$LOAD" fill "$SRC" "$PREFIX" "$KEYS"
  e0=$(( $(cpu_ticks "$S1") + $(cpu_ticks "$D1") ))
  t0=$(now_ms)
  start_mirror "$tool" "$SRC" "$DST"
  t1=$("$LOAD" wait "$DST" "$PREFIX" "$KEYS" 600)
  BASE[$tool]=$(( KEYS * 1000 / (t1 - t0 > 0 ? t1 - t0 : 1) ))
  # Since the mirror started: it did nothing but this sync. The etcds'
  # figure includes the fill, so it is read before and after below.
  CPU_BASE[$tool]=$(per_100k "$(cpu_ticks "$MPID")" "$KEYS")
  echo "base sync  $tool: $KEYS keys in $((t1 - t0)) ms = ${BASE[$tool]} keys/s; ${CPU_BASE[$tool]} CPU-s per 100k keys"
  ECPU_BASE[$tool]=$(per_100k $(( $(cpu_ticks "$S1") + $(cpu_ticks "$D1") - e0 )) "$KEYS")
  stop_pid "$MPID"; stop_pid "$S1"; stop_pid "$D1"

  start_etcd "src-$tool-live"; SRC=$URL; S2=$EPID
  start_etcd "dst-$tool-live"; DST=$URL; D2=$EPID
  start_mirror "$tool" "$SRC" "$DST"
  # Synced and live: one probe key makes it across.
  ETCDCTL_API=3 etcdctl --endpoints="$SRC" put "${PREFIX}probe" x >/dev/null
  "$LOAD" wait "$DST" "$PREFIX" 1 60 >/dev/null
  c0=$(cpu_ticks "$MPID")
  e0=$(( $(cpu_ticks "$S2") + $(cpu_ticks "$D2") ))
  start=$(now_ms)
  t_end=$("$LOAD" burst "$SRC" "$PREFIX" "$BURST" "$WRITERS")
  t_conv=$("$LOAD" wait "$DST" "$PREFIX" $((BURST + 1)) 600)
  CPU_LIVE[$tool]=$(per_100k $(( $(cpu_ticks "$MPID") - c0 )) "$BURST")
  # The etcds' figure includes the burst's own writes at the source.
  ECPU_LIVE[$tool]=$(per_100k $(( $(cpu_ticks "$S2") + $(cpu_ticks "$D2") - e0 )) "$BURST")
  rate=$(( BURST * 1000 / (t_end - start > 0 ? t_end - start : 1) ))
  LIVE[$tool]=$(( t_conv - t_end ))
  echo "live burst $tool: $BURST revisions at ~$rate rev/s; peer complete $(( t_conv - t_end )) ms after the last write; ${CPU_LIVE[$tool]} CPU-s per 100k events"
  stop_pid "$MPID"; stop_pid "$S2"; stop_pid "$D2"
done

if [ "$RSS_ONLY" = 0 ] && [ "$WAN_ONLY" = 0 ]; then
echo
printf '%-28s %16s %20s %8s\n' "" "make-mirror" "aether-replicator" "ratio"
printf '%-28s %16s %20s %7sx\n' "base sync (keys/s)" "${BASE[make-mirror]}" "${BASE[aether-replicator]}" \
  "$(python3 -c "print(round(${BASE[aether-replicator]}/max(${BASE[make-mirror]},1),1))")"
printf '%-28s %16s %20s %7sx\n' "burst: done after last (ms)" "${LIVE[make-mirror]}" "${LIVE[aether-replicator]}" \
  "$(python3 -c "print(round(max(${LIVE[make-mirror]},1)/max(${LIVE[aether-replicator]},1),1))")"
# CPU ratios: make-mirror's over ours, so > 1 means we spend less.
printf '%-28s %16s %20s %7sx\n' "CPU-s per 100k keys synced" "${CPU_BASE[make-mirror]}" "${CPU_BASE[aether-replicator]}" \
  "$(python3 -c "print(round(${CPU_BASE[make-mirror]}/max(${CPU_BASE[aether-replicator]},0.01),1))")"
printf '%-28s %16s %20s %7sx\n' "CPU-s per 100k live events" "${CPU_LIVE[make-mirror]}" "${CPU_LIVE[aether-replicator]}" \
  "$(python3 -c "print(round(${CPU_LIVE[make-mirror]}/max(${CPU_LIVE[aether-replicator]},0.01),1))")"
printf '%-28s %16s %20s\n' "  both etcds, per 100k synced" "${ECPU_BASE[make-mirror]}" "${ECPU_BASE[aether-replicator]}"
printf '%-28s %16s %20s\n' "  both etcds, per 100k live" "${ECPU_LIVE[make-mirror]}" "${ECPU_LIVE[aether-replicator]}"
echo "REPORT cpu keys=$KEYS burst=$BURST mm_sync_cpu_s_per_100k=${CPU_BASE[make-mirror]} ar_sync_cpu_s_per_100k=${CPU_BASE[aether-replicator]} mm_live_cpu_s_per_100k=${CPU_LIVE[make-mirror]} ar_live_cpu_s_per_100k=${CPU_LIVE[aether-replicator]} mm_sync_keys_per_s=${BASE[make-mirror]} ar_sync_keys_per_s=${BASE[aether-replicator]} etcd_sync_cpu_s_per_100k_mm=${ECPU_BASE[make-mirror]} etcd_sync_cpu_s_per_100k_ar=${ECPU_BASE[aether-replicator]} etcd_live_cpu_s_per_100k_mm=${ECPU_LIVE[make-mirror]} etcd_live_cpu_s_per_100k_ar=${ECPU_LIVE[aether-replicator]}"
fi

if [ "$RSS_KEYS" -gt 0 ]; then
  start_etcd src-rss; SRC=$URL
  start_etcd dst-rss; DST=$URL
  "$LOAD" fill "$SRC" "$PREFIX" "$RSS_KEYS"
  t0=$(now_ms)
  RSS_DST=$DST
  if [ "$RSS_RTT" -gt 0 ]; then start_proxy "$DST" "$(python3 -c "print($RSS_RTT/2)")"; RSS_DST=$PROXY_URL; fi
  start_mirror aether-replicator "$SRC" "$RSS_DST"
  peak=0
  until "$LOAD" wait "$DST" "$PREFIX" "$RSS_KEYS" 0 >/dev/null 2>&1; do
    hwm=$(awk '/VmHWM/ {print $2}' "/proc/$MPID/status" 2>/dev/null || echo 0)
    [ "${hwm:-0}" -gt "$peak" ] && peak=$hwm
    [ $(( $(now_ms) - t0 )) -gt 600000 ] && { echo "RSS sync timed out" >&2; exit 1; }
    sleep 0.2
  done
  t1=$(now_ms)
  hwm=$(awk '/VmHWM/ {print $2}' "/proc/$MPID/status")
  [ "$hwm" -gt "$peak" ] && peak=$hwm
  echo
  echo "rss: base sync of $RSS_KEYS keys at ${RSS_RTT} ms RTT in $((t1 - t0)) ms ($(( RSS_KEYS * 1000 / (t1 - t0) )) keys/s); replicator peak RSS $((peak / 1024)) MiB"
fi

if [ -n "$WAN" ]; then
  echo
  printf '%-8s %22s %22s %8s\n' "rtt" "make-mirror (keys/s)" "aether (keys/s)" "ratio"
  for rtt in ${WAN//,/ }; do
    declare -A W
    for tool in make-mirror aether-replicator; do
      start_etcd "src-$tool-wan$rtt"; SRC=$URL; S3=$EPID
      start_etcd "dst-$tool-wan$rtt"; DST=$URL; D3=$EPID
      "$LOAD" fill "$SRC" "$PREFIX" "$KEYS"
      start_proxy "$DST" "$(python3 -c "print($rtt/2)")"
      t0=$(now_ms)
      start_mirror "$tool" "$SRC" "$PROXY_URL"
      if t1=$("$LOAD" wait "$DST" "$PREFIX" "$KEYS" "$WAN_WINDOW" 2>/dev/null); then
        got=$KEYS
      else
        t1=$(now_ms); got=$(count_keys "$DST")
      fi
      W[$tool]=$(( got * 1000 / (t1 - t0 > 0 ? t1 - t0 : 1) ))
      echo "wan $rtt ms $tool: $got of $KEYS keys in $((t1 - t0)) ms = ${W[$tool]} keys/s" >&2
      stop_pid "$MPID"; stop_pid "$PXPID"; stop_pid "$S3"; stop_pid "$D3"
    done
    printf '%-8s %22s %22s %7sx\n' "$rtt ms" "${W[make-mirror]}" "${W[aether-replicator]}" \
      "$(python3 -c "print(round(${W[aether-replicator]}/max(${W[make-mirror]},1),1))")"
    echo "REPORT make_mirror_wan rtt_ms=$rtt make_mirror_keys_per_s=${W[make-mirror]} aether_keys_per_s=${W[aether-replicator]}"
  done
fi
