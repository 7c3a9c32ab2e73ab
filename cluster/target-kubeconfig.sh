#!/usr/bin/env bash
# Print the kubeconfig that `make install/run/deploy` should use: the user's ($KUBECONFIG or
# ~/.kube/config) when its current context answers, else the local control plane's, started
# on demand. Progress goes to stderr; only the path goes to stdout.
#
# Another cluster than the local one is named (context and server) and confirmed on the terminal
# before anything acts on it: `make run` runs chaos, and a production context may be the current one.
# CONFIRM_CLUSTER=no skips the question (scripts, CI); without a terminal to ask, it refuses.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
local_config="${CLUSTER_DIR:-$(dirname "$here")/.cluster}/kubeconfig"
user_config=${KUBECONFIG:-$HOME/.kube/config}

confirm() {  # $1: kubeconfig, $2: context
  local server answer
  server=$(kubectl --kubeconfig "$1" config view --minify -o jsonpath='{.clusters[0].cluster.server}')
  echo "[target] $1: context '$2', server $server (not the local control plane)" >&2
  case "${CONFIRM_CLUSTER:-ask}" in no|0|false) return 0 ;; esac
  if ! { : >/dev/tty; } 2>/dev/null; then
    echo "[target] refusing: no terminal to confirm this cluster; set CONFIRM_CLUSTER=no to act on it," >&2
    echo "[target] or unset KUBECONFIG / select no context to use the local control plane" >&2
    return 1
  fi
  read -r -p "[target] act on context '$2'? [y/N] " answer </dev/tty 2>/dev/tty
  case "$answer" in y|Y|yes|YES) return 0 ;; esac
  echo "[target] not confirmed: nothing done" >&2
  return 1
}

if [ -n "${KUBECONFIG:-}" ] || [ -s "$user_config" ]; then
  if kubectl --kubeconfig "$user_config" version --request-timeout=3s >/dev/null 2>&1; then
    context=$(kubectl --kubeconfig "$user_config" config current-context 2>/dev/null || echo "?")
    if [ "$(readlink -f "$user_config")" != "$(readlink -f "$local_config")" ]; then
      confirm "$user_config" "$context"
    fi
    echo "[target] using $user_config ($context)" >&2
    echo "$user_config"; exit 0
  fi
  echo "[target] $user_config does not answer; using the local control plane" >&2
fi
"$here/cluster.sh" up
echo "$local_config"
