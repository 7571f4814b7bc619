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
