#!/usr/bin/env bash
# Build the release pipeline's tools from Go modules into the shared cache (as build.sh does):
#   registry  CNCF Distribution, the OCI registry the release is pushed to (on 127.0.0.1 only)
#   cosign    signs and verifies the image and the chart
# Prints the folder holding the binaries. Rebuilds only when versions.env changes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=cache.sh
source "$here/cache.sh"

key="release_distribution-${DISTRIBUTION_VERSION}_cosign-${COSIGN_VERSION}"
bin="$cache_root/$key/bin"
binaries=(registry cosign)
have_all() { for b in "${binaries[@]}"; do [ -x "$bin/$b" ] || return 1; done; }
cached_or_lock release-tools "$key" "$bin"
mkdir -p "$bin"

if [ ! -x "$bin/registry" ]; then
  log "distribution $DISTRIBUTION_VERSION: building the registry"
  GOBIN="$bin" go install -trimpath -ldflags "-s -w -X github.com/distribution/distribution/v3/version.version=$DISTRIBUTION_VERSION" \
    "github.com/distribution/distribution/v3/cmd/registry@$DISTRIBUTION_VERSION" >&2
fi
if [ ! -x "$bin/cosign" ]; then
  log "cosign $COSIGN_VERSION: building"
  GOBIN="$bin" go install -trimpath -ldflags "-s -w -X sigs.k8s.io/release-utils/version.gitVersion=$COSIGN_VERSION" \
    "github.com/sigstore/cosign/v2/cmd/cosign@$COSIGN_VERSION" >&2
fi
have_all
log "built in $(( $(date +%s) - start ))s into $bin"
echo "$bin"
