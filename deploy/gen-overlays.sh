#!/usr/bin/env bash
# Writes one kustomize overlay of deploy/kubernetes/base per region for a mesh of N regions: in DIR/region-R,
# config.toml (R's etcd and one [peers.P] table per other region P), kustomization.yaml, the namespace
# aether-R, one patch per peer that mounts its Secrets at /etc/aether/peers/P/, and under secrets/ the files
# the Secrets are generated from: EXAMPLE PLACEHOLDERS, never real keys, to be replaced. And values.yaml,
# the same region for the Helm chart deploy/helm/aether-replicator: a mesh of N regions is N `helm install`s.
#
#   deploy/gen-overlays.sh --out DIR [--force] [--etcd-url URL] [--image NAME:TAG] REGION REGION...
#   deploy/gen-overlays.sh --check --out DIR [...] REGION...   exit 1 if DIR differs from what it would write
#
#   --out DIR       where to write region-R/ for every region R (created if missing)
#   --force         replace the region-*/ directories in a DIR that already has some; refused if DIR holds
#                   anything else, or a file under */secrets/ that is not a placeholder (a real key)
#   --etcd-url URL  each region's etcd client URL, with {region} standing for the region
#                   (default https://etcd.region-{region}.example.net:2379)
#   --image NAME:TAG  the image (default registry.example.com/aether/aether-replicator:0.1.0)
#   --base PATH     the overlays' base, as kustomize takes it: a directory relative to DIR/region-R, or a
#                   remote base (default: this checkout's deploy/kubernetes/base, relative to DIR/region-R)
#
# Region names: the binary's rule (a key segment: not empty, no '/') and, because they name Kubernetes
# objects (namespace aether-R, volume peer-R, Secrets aether-replicator-peer-R-*), a DNS-1123 label of at most
# 56 characters. At least two, none twice. Bad input: a one-line error and exit 2, nothing written.
#
# The checked-in examples are this script's output; tests/deploy.rs proves it. Regenerate them with
#   deploy/gen-overlays.sh --force --out deploy/kubernetes/examples/two-region a b
#   deploy/gen-overlays.sh --force --out deploy/kubernetes/examples/three-region a b c
set -euo pipefail

readonly DEFAULT_ETCD_URL='https://etcd.region-{region}.example.net:2379'
readonly DEFAULT_IMAGE='registry.example.com/aether/aether-replicator:0.1.0'
# namespace aether-R and volume peer-R are DNS-1123 labels (63 characters at most).
readonly MAX_REGION_LEN=56

die() {
  echo "error: $*" >&2
  exit 2
}

usage() {
  awk '/^#   deploy/ { on = 1 } /^# Region names/ { exit } on { sub(/^# ?/, ""); print }' "$0"
}

out='' base='' force=0 check=0 etcd_url=$DEFAULT_ETCD_URL image=$DEFAULT_IMAGE
# Options that change the output are recorded in the files' headers, so a re-run can repeat them.
opts=''
regions=()
while (($#)); do
  case $1 in
  --out)
    (($# >= 2)) || die "--out needs a directory"
    out=$2
    shift 2
    ;;
  --out=*)
    out=${1#--out=}
    shift
    ;;
  --force)
    force=1
    shift
    ;;
  --check)
    check=1
    shift
    ;;
  --etcd-url | --image | --base)
    (($# >= 2)) || die "$1 needs a value"
    set -- "$1=$2" "${@:3}"
    ;;
  --etcd-url=*)
    etcd_url=${1#--etcd-url=}
    opts+=" --etcd-url '$etcd_url'"
    shift
    ;;
  --image=*)
    image=${1#--image=}
    opts+=" --image $image"
    shift
    ;;
  --base=*)
    base=${1#--base=}
    opts+=" --base '$base'"
    shift
    ;;
  -h | --help)
    usage
    exit 0
    ;;
  --)
    shift
    regions+=("$@")
    break
    ;;
  -*) die "unknown option $1 (see $0 --help)" ;;
  *)
    regions+=("$1")
    shift
    ;;
  esac
done

[[ -n $out ]] || die "--out DIR is required (see $0 --help)"
case $etcd_url in
*'{region}'*) ;;
*) die "--etcd-url '$etcd_url': must contain {region}" ;;
esac
# It goes into a TOML string and a YAML comment as it is.
[[ $etcd_url =~ ^[A-Za-z][A-Za-z0-9+.-]*://[^[:space:]\"\\]+$ ]] ||
  die "--etcd-url '$etcd_url': must be a URL (scheme://...) without spaces, quotes or backslashes"
[[ $image =~ ^[a-z0-9][a-z0-9._/:-]*:([A-Za-z0-9_][A-Za-z0-9_.-]*)$ && ${BASH_REMATCH[1]} != */* ]] ||
  die "--image '$image': must be NAME:TAG"
[[ -z $base || $base =~ ^[^[:space:]]+$ ]] || die "--base '$base': must not contain spaces"
image_name=${image%:*}
image_tag=${image##*:}

((${#regions[@]} >= 2)) || die "at least two regions are needed, got ${#regions[@]}${regions[*]:+ (${regions[*]})}"
declare -A seen=()
for r in "${regions[@]}"; do
  # The binary's rule for a region (src/schema.rs validate_segment), in its words.
  [[ -n $r ]] || die "region \"\": must not be empty"
  [[ $r != */* ]] || die "region \"$r\": must not contain '/'"
  if ! [[ $r =~ ^[a-z0-9]([a-z0-9-]*[a-z0-9])?$ ]] || ((${#r} > MAX_REGION_LEN)); then
    die "region \"$r\": must be lowercase letters, digits and '-', start and end with a letter or digit, and be at most $MAX_REGION_LEN characters (it names the namespace aether-$r and the volume peer-$r)"
  fi
  [[ -z ${seen[$r]:-} ]] || die "region \"$r\" is given twice"
  seen[$r]=1
done

if [[ -z $base ]]; then
  # kustomize resolves the base from the overlay's own directory, wherever DIR is.
  base=$(realpath -m --relative-to="$out/region-x" "$(dirname "$(realpath "$0")")/kubernetes/base")
fi
readonly base
# The chart, as helm takes it from DIR/region-R.
chart=$(realpath -m --relative-to="$out/region-x" "$(dirname "$(realpath "$0")")/helm/aether-replicator")
readonly chart
readonly generator="deploy/gen-overlays.sh${opts} ${regions[*]}"
all=$(
  IFS=,
  echo "${regions[*]}"
)
readonly all=${all//,/, }

url_of() {
  echo "${etcd_url//\{region\}/$1}"
}

etcd_table() { # DIR NAME
  cat <<EOF
ca = "$1/ca.crt"
cert = "$1/tls.crt"
key = "$1/tls.key"
EOF
}

placeholders() { # DIR WHOSE
  mkdir -p "$1"
  echo "# EXAMPLE PLACEHOLDER, not a certificate: replace with the PEM CA bundle of $2." >"$1/ca.crt"
  echo "# EXAMPLE PLACEHOLDER, not a certificate: replace with the PEM client certificate for $2." >"$1/tls.crt"
  echo "# EXAMPLE PLACEHOLDER, not a key: replace with the PEM private key of tls.crt for $2." >"$1/tls.key"
  echo "EXAMPLE-PLACEHOLDER-replace-with-the-etcd-password" >"$1/password"
}

secret_commands() { # REGION SECRET-PREFIX SECRETS-DIR: as comments, the commands creating one etcd's Secrets
  local d=secrets/$3
  echo "#   kubectl -n aether-$1 create secret generic $2-tls --from-file=$d/ca.crt --from-file=$d/tls.crt --from-file=$d/tls.key"
  echo "#   kubectl -n aether-$1 create secret generic $2-auth --from-file=$d/password"
}

overlay() { # DIR REGION
  local dir=$1 r=$2 p
  local peers=()
  for p in "${regions[@]}"; do
    [[ $p == "$r" ]] || peers+=("$p")
  done
  mkdir -p "$dir"

  {
    cat <<EOF
# aether-replicator, region $r of the regions $all. Written by
#   $generator
# Keys are the long flag names in snake_case; flags and AETHER_REPLICATOR_* variables override them. The
# Deployment adds --metrics-addr=\$(POD_IP):9464 and the replica id (the pod name). Secrets come from the
# mounted files only.
region = "$r"
lease_ttl = "30s"
log_format = "json"

# Region $r's own etcd.
[local]
endpoints = ["$(url_of "$r")"]
$(etcd_table /etc/aether/local)
username = "aether-replicator"
password_file = "/etc/aether/local/password"
EOF
    for p in "${peers[@]}"; do
      cat <<EOF

# Region $p's etcd: region $r's subtree is mirrored there, under a lease only region $r keeps alive.
[peers.$p]
endpoints = ["$(url_of "$p")"]
$(etcd_table "/etc/aether/peers/$p")
username = "aether-replicator-$r"
password_file = "/etc/aether/peers/$p/password"
EOF
    done
  } >"$dir/config.toml"

  {
    cat <<EOF
# Region $r of the regions $all: apply with \`kubectl apply -k\` in region $r's cluster. Written by
#   $generator
# The Secrets below are generated from EXAMPLE PLACEHOLDER files (secrets/): replace their contents with the
# real PEM files and passwords, or delete the secretGenerator and create Secrets of the same names yourself
# (for example with cert-manager, whose Secrets carry ca.crt, tls.crt and tls.key).
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: aether-$r
resources:
  - namespace.yaml
  - $base
labels:
  # The ServiceMonitor turns this pod label into the \`region\` target label.
  - pairs:
      aether-replicator/region: $r
    includeSelectors: false
    includeTemplates: true
images:
  - name: aether-replicator
    newName: $image_name
    newTag: "$image_tag"
configMapGenerator:
  - name: aether-replicator-config
    files:
      - config.toml
secretGenerator:
  # This region's etcd: TLS client certificate and CA, and the etcd user's password.
  - name: aether-replicator-local-etcd-tls
    files:
      - secrets/local-etcd/ca.crt
      - secrets/local-etcd/tls.crt
      - secrets/local-etcd/tls.key
  - name: aether-replicator-local-etcd-auth
    files:
      - secrets/local-etcd/password
EOF
    for p in "${peers[@]}"; do
      cat <<EOF
  # Region $p's etcd, as region $p issued them to region $r's replicator.
  - name: aether-replicator-peer-$p-tls
    files:
      - secrets/peer-$p/ca.crt
      - secrets/peer-$p/tls.crt
      - secrets/peer-$p/tls.key
  - name: aether-replicator-peer-$p-auth
    files:
      - secrets/peer-$p/password
EOF
    done
    echo "patches:"
    for p in "${peers[@]}"; do
      cat <<EOF
  # Mount peer $p's Secrets where config.toml's [peers.$p] expects them.
  - path: peer-$p.yaml
EOF
    done
  } >"$dir/kustomization.yaml"

  cat >"$dir/namespace.yaml" <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: aether-$r
EOF

  for p in "${peers[@]}"; do
    cat >"$dir/peer-$p.yaml" <<EOF
apiVersion: apps/v1
kind: Deployment
metadata:
  name: aether-replicator
spec:
  template:
    spec:
      containers:
        - name: replicator
          volumeMounts:
            - name: peer-$p
              mountPath: /etc/aether/peers/$p
              readOnly: true
      volumes:
        - name: peer-$p
          projected:
            defaultMode: 0440
            sources:
              - secret:
                  name: aether-replicator-peer-$p-tls
                  items:
                    - { key: ca.crt, path: ca.crt }
                    - { key: tls.crt, path: tls.crt }
                    - { key: tls.key, path: tls.key }
              - secret:
                  name: aether-replicator-peer-$p-auth
                  items:
                    - { key: password, path: password }
EOF
  done

  {
    cat <<EOF
# Helm values of region $r of the regions $all. Written by
#   $generator
# In region $r's cluster, create the Secrets named below from the files under secrets/ (EXAMPLE
# PLACEHOLDERS: replace them with the real PEM files and passwords first), then install from this directory:
#   kubectl create namespace aether-$r
EOF
    secret_commands "$r" aether-replicator-local-etcd local-etcd
    for p in "${peers[@]}"; do
      secret_commands "$r" "aether-replicator-peer-$p" "peer-$p"
    done
    cat <<EOF
#   helm install aether-replicator $chart --namespace aether-$r -f values.yaml
# The chart's README lists the other values (settings, resources, monitoring).
region: $r
image:
  repository: $image_name
  tag: "$image_tag"
# Region $r's own etcd.
local:
  endpoints: ["$(url_of "$r")"]
  tlsSecret: aether-replicator-local-etcd-tls
  username: aether-replicator
  passwordSecret: aether-replicator-local-etcd-auth
peers:
EOF
    for p in "${peers[@]}"; do
      cat <<EOF
  # Region $p's etcd: region $r's subtree is mirrored there, under a lease only region $r keeps alive.
  $p:
    endpoints: ["$(url_of "$p")"]
    tlsSecret: aether-replicator-peer-$p-tls
    username: aether-replicator-$r
    passwordSecret: aether-replicator-peer-$p-auth
EOF
    done
  } >"$dir/values.yaml"

  placeholders "$dir/secrets/local-etcd" "region $r's etcd"
  for p in "${peers[@]}"; do
    placeholders "$dir/secrets/peer-$p" "region $p's etcd (as issued to region $r)"
  done
}

staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
for r in "${regions[@]}"; do
  overlay "$staging/region-$r" "$r"
done

if ((check)); then
  if ! diff -ru "$out" "$staging" >&2; then
    echo "error: $out is not what \`$generator\` writes: regenerate it with --force" >&2
    exit 1
  fi
  exit 0
fi

if [[ -e $out ]]; then
  [[ -d $out ]] || die "--out $out: not a directory"
  shopt -s nullglob dotglob
  entries=("$out"/*)
  if ((${#entries[@]})); then
    ((force)) || die "--out $out is not empty: pass --force to replace the region-*/ directories in it"
    for e in "${entries[@]}"; do
      [[ -d $e && $(basename "$e") == region-* ]] ||
        die "--out $out holds $(basename "$e"), which this script does not write: not replacing anything"
    done
    # A file under secrets/ that is not a placeholder is a real key or password: never overwrite one.
    real=$(find "$out" -path '*/secrets/*' -type f -exec grep -L 'EXAMPLE.PLACEHOLDER' {} + | head -n 1)
    [[ -z $real ]] || die "$real is not an EXAMPLE PLACEHOLDER (a real key?): not replacing anything"
    rm -rf "${entries[@]}"
  fi
  shopt -u nullglob dotglob
fi
mkdir -p "$out"
cp -R "$staging"/. "$out"/
echo "wrote ${#regions[@]} overlays to $out: ${regions[*]/#/region-}"
