#!/usr/bin/env bash
# `make undeploy`: uninstall the Helm release, but first let the running operator revert and release
# every ChaosAgent: an agent's finalizer needs the operator (it undoes the agent's chaos), so an agent
# left behind would hold its own deletion, and `make uninstall` (the CRDs), for ever.
# CopyratorRules and ImmortalContainers stay: deleting them later needs no operator (no finalizer).
# docs/deploy.md, "Uninstalling" and "When the operator is down".
# Env: RELEASE, DEPLOY_NAMESPACE, UNDEPLOY_TIMEOUT (how long the agents may take to be reverted; 120s).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
release=${RELEASE:-kopf-operators}
ns=${DEPLOY_NAMESPACE:-kopf-operators}
timeout=${UNDEPLOY_TIMEOUT:-120s}
helm=$("$here/helm.sh")
KUBECONFIG=$("$here/target-kubeconfig.sh")
export KUBECONFIG

if kubectl get crd chaosagents.blackadder.io >/dev/null 2>&1; then
  agents=$(kubectl get chaosagents.blackadder.io -o name)
  if [ -n "$agents" ]; then
    echo "[undeploy] deleting $(wc -l <<<"$agents") ChaosAgent(s) first: the operator reverts their changes" >&2
    if ! kubectl delete chaosagents.blackadder.io --all --wait --timeout="$timeout" >&2; then
      echo "[undeploy] ChaosAgents still wait for the operator to revert them (is it running?):" >&2
      kubectl get chaosagents.blackadder.io >&2 || true
      echo "[undeploy] the release is left installed; see docs/deploy.md, \"When the operator is down\"" >&2
      exit 1
    fi
  fi
fi
# TenantChaosAgents (chaos for tenants) hold a finalizer too: their ledger lives in this namespace.
if kubectl get crd tenantchaosagents.blackadder.io >/dev/null 2>&1 &&
   [ -n "$(kubectl get tenantchaosagents.blackadder.io -A -o name)" ]; then
  echo "[undeploy] deleting the TenantChaosAgents first: the operator deletes their ledgers" >&2
  if ! kubectl delete tenantchaosagents.blackadder.io --all -A --wait --timeout="$timeout" >&2; then
    kubectl get tenantchaosagents.blackadder.io -A >&2 || true
    echo "[undeploy] the release is left installed; see docs/blackadder.md, \"Chaos for tenants\"" >&2
    exit 1
  fi
fi
"$helm" uninstall "$release" --namespace "$ns" --wait --timeout 120s
