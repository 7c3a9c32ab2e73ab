#!/usr/bin/env bash
# `make uninstall`: remove the CRDs, and with them every custom resource. Nothing of ours holds a
# deletion except a ChaosAgent's finalizer (its revert needs the operator: `make undeploy` deletes
# the agents first). A CRD still deleting after UNINSTALL_TIMEOUT (120s) is reported with what holds it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
crds="$(dirname "$here")/manifests/crds"
KUBECONFIG=$("$here/target-kubeconfig.sh")
export KUBECONFIG
if ! kubectl delete --ignore-not-found --timeout="${UNINSTALL_TIMEOUT:-120s}" -f "$crds"; then
  echo "[uninstall] the CRDs are still deleting; custom resources that hold them (finalizers):" >&2
  kubectl get chaosagents.blackadder.io -o custom-columns=NAME:.metadata.name,FINALIZERS:.metadata.finalizers >&2 || true
  kubectl get tenantchaosagents.blackadder.io -A \
    -o custom-columns=NAMESPACE:.metadata.namespace,NAME:.metadata.name,FINALIZERS:.metadata.finalizers >&2 || true
  echo "[uninstall] see docs/deploy.md, \"When the operator is down\", for the way out" >&2
  exit 1
fi
