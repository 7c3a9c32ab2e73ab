#!/usr/bin/env bash
# Tools of the chart's monitoring tests (tests/e2e/test_chart.py), from the Go module proxy, cached
# outside the work tree like cluster/build.sh's binaries:
#   crds/      the ServiceMonitor, PodMonitor and PrometheusRule CRDs of prometheus-operator
#              (its module's example/prometheus-operator-crd/; no controller is installed)
#   promtool   Prometheus' rule checker (`promtool check rules`)
#   prometheus the server itself (Blackadder's prometheus steady-state checks query a real one, on 127.0.0.1)
# Prints the folder holding both. Rebuilds only when versions.env changes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=cache.sh
source "$here/cache.sh"

key="monitoring_prometheus-operator-${PROMETHEUS_OPERATOR_VERSION}_prometheus-${PROMETHEUS_VERSION}"
out="$cache_root/$key"
crds=(servicemonitors podmonitors prometheusrules)

have_all() {
  [ -x "$out/promtool" ] || return 1
  [ -x "$out/prometheus" ] || return 1
  for c in "${crds[@]}"; do [ -f "$out/crds/monitoring.coreos.com_$c.yaml" ] || return 1; done
}
cached_or_lock monitoring "$key" "$out"

mkdir -p "$out/crds"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

log "prometheus-operator $PROMETHEUS_OPERATOR_VERSION: CRDs"
dir=$(cd "$work" && go mod download -json "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" \
  | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
for c in "${crds[@]}"; do
  cp "$dir/example/prometheus-operator-crd/monitoring.coreos.com_$c.yaml" "$out/crds/"
done
chmod -R u+w "$out/crds"

if [ ! -x "$out/promtool" ]; then
  # Prometheus' go.mod has no replace directives: `go install` works. The module's v0.3XX.Y is Prometheus 3.XX.Y.
  release=$(echo "$PROMETHEUS_VERSION" | sed -E 's/^v0\.3([0-9]+)\.([0-9]+)$/3.\1.\2/')
  log "promtool $release: building (several minutes on a cold module cache)"
  GOBIN="$work/bin" go install -trimpath \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$release" \
    "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION" >&2
  mv "$work/bin/promtool" "$out/promtool"
fi
if [ ! -x "$out/prometheus" ]; then
  release=$(echo "$PROMETHEUS_VERSION" | sed -E 's/^v0\.3([0-9]+)\.([0-9]+)$/3.\1.\2/')
  log "prometheus $release: building (several minutes on a cold module cache)"
  # remove_all_sd: no service discovery plugins and so no cloud SDKs to compile (the tests scrape a static target).
  GOBIN="$work/bin" go install -trimpath -tags remove_all_sd \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$release" \
    "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION" >&2
  mv "$work/bin/prometheus" "$out/prometheus"
fi
log "ready in $(( $(date +%s) - start ))s: $out"
echo "$out"
