#!/usr/bin/env bash
# Print the kubeconfig that `make install/run/deploy` should use: the user's ($KUBECONFIG or
# ~/.kube/config) when its current context answers, else the local control plane's, started
# on demand. Progress goes to stderr; only the path goes to stdout.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
user_config=${KUBECONFIG:-$HOME/.kube/config}
if [ -n "${KUBECONFIG:-}" ] || [ -s "$user_config" ]; then
  if kubectl --kubeconfig "$user_config" version --request-timeout=3s >/dev/null 2>&1; then
    echo "[target] using $user_config ($(kubectl --kubeconfig "$user_config" config current-context 2>/dev/null))" >&2
    echo "$user_config"; exit 0
  fi
  echo "[target] $user_config does not answer; using the local control plane" >&2
fi
"$here/cluster.sh" up
echo "${CLUSTER_DIR:-$(dirname "$here")/.cluster}/kubeconfig"
