# Shared by the e2e scripts (sourced, not run).

# apt_install TOOL SERVICE PACKAGE...: installs Debian's PACKAGEs for the
# missing TOOL, as root (elsewhere fails with the command to run), then stops
# the system SERVICE a package may start: the scripts never use it.
# APT_OPTS (e.g. --no-install-recommends) goes to apt-get install.
apt_install() {
  local tool=$1 service=$2
  shift 2
  local pkgs="$*"
  echo "== installing $tool (Debian ${pkgs// /, })"
  if [ "$(id -u)" -ne 0 ]; then
    echo "$tool is missing and this is not root: run apt-get update && apt-get install -y $pkgs" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086 # APT_OPTS is a list of options
  apt-get install -y -qq ${APT_OPTS:-} "$@" >/dev/null
  command -v systemctl >/dev/null && systemctl stop "$service" 2>/dev/null || true
}

# need_etcd: installs Debian's etcd when etcd or etcdctl is missing (see
# apt_install); the system etcd the package may start on 2379 is stopped, as
# the scripts never use it.
need_etcd() {
  if ! command -v etcd >/dev/null || ! command -v etcdctl >/dev/null; then
    apt_install etcd etcd etcd-server etcd-client
  fi
}

# need_promtool: installs Debian's prometheus for promtool when missing (the
# suite's metrics test and e2e/check-deploy.sh run it). The package may start
# a system Prometheus on :9090; nothing here uses it.
need_promtool() {
  if ! command -v promtool >/dev/null; then
    APT_OPTS=--no-install-recommends apt_install promtool prometheus prometheus
  fi
}

# FAKETIME_LIB: Debian's libfaketime, which the suite preloads into a
# replicator to step its wall clock (tests/ops.rs).
FAKETIME_LIB=/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1

# need_faketime: installs Debian's libfaketime when it is missing.
need_faketime() {
  if [ ! -e "${AETHER_FAKETIME_LIB:-$FAKETIME_LIB}" ]; then
    apt_install libfaketime - libfaketime
  fi
}

# need_commands CMD...: installs the Debian packages of the same names for
# the CMDs that are missing, as root (elsewhere fails with the command to run).
need_commands() {
  local missing=() c
  for c in "$@"; do
    command -v "$c" >/dev/null || missing+=("$c")
  done
  ((${#missing[@]})) || return 0
  echo "== installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "${missing[*]} missing and this is not root: run apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
}

# need_toolchain VERSION: installs Rust VERSION with rustup (minimal profile)
# unless it is there; fails with the command to run if it cannot.
need_toolchain() {
  local v=$1
  if command -v rustup >/dev/null && rustup run "$v" rustc --version >/dev/null 2>&1; then
    return 0
  fi
  command -v rustup >/dev/null || {
    echo "Rust $v is missing and there is no rustup to install it: rustup toolchain install $v --profile minimal" >&2
    exit 1
  }
  echo "== installing Rust $v"
  rustup toolchain install "$v" --profile minimal >&2 || {
    echo "could not install Rust $v (is rustup's dist server reachable?): rustup toolchain install $v --profile minimal" >&2
    exit 1
  }
}

# metric TEXT SELECTOR: the value of the first sample in the metrics page TEXT
# named as SELECTOR (`name{label="v",...}`) with at least its labels.
metric() {
  awk -v sel="$2" '
    function labels(series, out,   body, n, i, parts) {
      delete out
      if (!index(series, "{")) return
      body = substr(series, index(series, "{") + 1)
      sub(/}$/, "", body)
      n = split(body, parts, /",/)
      for (i = 1; i <= n; i++) { sub(/"$/, "", parts[i]); if (parts[i] != "") out[parts[i] "\""] = 1 }
    }
    BEGIN { name = sel; sub(/\{.*/, "", name); labels(sel, want) }
    /^#/ { next }
    {
      n = $1; sub(/\{.*/, "", n)
      if (n != name) next
      labels($1, have)
      for (w in want) if (!(w in have)) next
      print $2; exit
    }' <<<"$1"
}

# stage TEXT: a stage's header, with how far into the run it starts
# (TEST_ALL_START, set by test-all.sh; else this script's start), so that
# a slow stage shows in any log.
STAGE_START=${TEST_ALL_START:-$(date +%s)}
stage() {
  local t=$(($(date +%s) - STAGE_START))
  printf '== [%dm%02ds] %s\n' $((t / 60)) $((t % 60)) "$*"
}
