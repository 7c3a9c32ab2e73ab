#!/usr/bin/env bash
# Print the path of the pinned helm (versions.env), building only helm on first use: `make deploy`,
# `make undeploy` and `make manifests` need nothing else of the control plane's build. A full
# cluster/build.sh already holds one; it is used as it is.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=cache.sh
source "$here/cache.sh"

full="$cache_root/k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}/bin/helm"
if [ -x "$full" ]; then echo "$full"; exit 0; fi
bin="$cache_root/helm-${HELM_VERSION}/bin"
have_all() { [ -x "$bin/helm" ]; }
cached_or_lock helm "helm-${HELM_VERSION}" "$bin/helm"
mkdir -p "$bin"
log "helm $HELM_VERSION: building (only helm)"
GOBIN="$bin" go install -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
  "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
log "helm built in $(( $(date +%s) - start )) s"
echo "$bin/helm"
