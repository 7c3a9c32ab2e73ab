#!/usr/bin/env bash
# `make deploy`: install the Helm chart into the target cluster (cluster/target-kubeconfig.sh).
#   On the local cluster with its real node: the image (IMAGE, default localhost/kopf-operators:<appVersion>,
#   as `make image` builds it) is copied from podman into the node's containerd, and the release runs
#   there (cluster/real-node-values.yaml: pullPolicy Never, toleration, nodeSelector).
#   Anywhere else: as before, IMAGE=repo:tag sets the image, which the cluster pulls.
# Env: RELEASE, DEPLOY_NAMESPACE, IMAGE, HELM_ARGS (extra arguments for helm).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
release=${RELEASE:-kopf-operators}
ns=${DEPLOY_NAMESPACE:-kopf-operators}
chart="$repo/charts/kopf-operators"
helm=$("$here/helm.sh")
kubeconfig=$("$here/target-kubeconfig.sh")
export KUBECONFIG=$kubeconfig
local_kubeconfig="${CLUSTER_DIR:-$repo/.cluster}/kubeconfig"
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$chart/Chart.yaml")
# shellcheck disable=SC2206
extra=(${HELM_ARGS:-})
image=${IMAGE:-}

# The namespace enforces the restricted Pod Security Standard, as manifests/namespace.yaml does.
kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl label --overwrite namespace "$ns" pod-security.kubernetes.io/enforce=restricted \
  pod-security.kubernetes.io/warn=restricted pod-security.kubernetes.io/audit=restricted >/dev/null

sets=()
if [ "$(readlink -f "$kubeconfig")" = "$(readlink -f "$local_kubeconfig")" ] && "$here/node.sh" status; then
  image=${image:-localhost/kopf-operators:$app_version}
  if ! podman --cgroup-manager=cgroupfs --events-backend=file image exists "$image"; then
    echo "[deploy] no local image $image: run \`make image\` first (or pass IMAGE=)" >&2; exit 1
  fi
  "$here/node.sh" load "$image"
  extra=(-f "$here/real-node-values.yaml" "${extra[@]}")
  echo "[deploy] local cluster: $image on the real node" >&2
fi
if [ -n "$image" ]; then
  sets+=(--set "image.repository=${image%:*}" --set "image.tag=${image##*:}")
fi
exec "$helm" upgrade --install "$release" "$chart" --namespace "$ns" \
  "${extra[@]}" "${sets[@]}"
