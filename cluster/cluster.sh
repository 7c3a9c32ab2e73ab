#!/usr/bin/env bash
# The local control plane: real etcd, kube-apiserver, kube-controller-manager and kube-scheduler
# built from Go modules (build.sh), started by `kwokctl --runtime binary` on 127.0.0.1, with one
# fake KWOK node so pods are scheduled, become Running, and are really deleted, plus (node.sh) one
# real kubelet node with containerd, tainted so that only pods tolerating it run there.
#
#   cluster.sh up       start (building on first use); a no-op when already up
#   cluster.sh down     stop and delete it, freeing its ports
#   cluster.sh status   exit 0 when it answers /readyz
#   cluster.sh audit-log  print the path of the API server's audit log (see audit-policy.yaml)
#   cluster.sh upgrade-control-plane   with KUBERNETES_VERSION=vX.Y.Z (one of versions.env's
#                       COMPAT_VERSIONS): restart the running control plane on that release's build,
#                       one component at a time, on the same etcd data (see upgrade_control_plane)
#
# State lives in $CLUSTER_DIR (default: <repo>/.cluster); the admin kubeconfig is
# $CLUSTER_DIR/kubeconfig. Several clusters can run side by side with different CLUSTER_DIRs; the
# machine has one real node, taken by the first of them (REAL_NODE=0 opts out, see node.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
# shellcheck source=versions.env
source "$here/versions.env"

dir=${CLUSTER_DIR:-$repo/.cluster}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
kubeconfig="$dir/kubeconfig"
# One kwok cluster name per state folder, so clones and helpers never collide.
name="kopf-$(printf '%s' "$dir" | sha256sum | cut -c1-8)"
export KWOK_WORKDIR="$dir/kwok" KWOK_KUBE_VERSION="$KUBERNETES_VERSION"

log() { echo "[cluster $(date +%T)] $*" >&2; }
kc() { kubectl --kubeconfig "$kubeconfig" "$@"; }
ready() { [ -s "$kubeconfig" ] && [ "$(kc get --raw /readyz --request-timeout=3s 2>/dev/null)" = "ok" ]; }

wait_until() { # wait_until SECONDS DESCRIPTION COMMAND...
  local deadline=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then log "timed out waiting for $what"; return 1; fi
    sleep 0.2
  done
}

node_ready() { kc get nodes -o jsonpath='{.items[*].status.conditions[?(@.type=="Ready")].status}' | grep -q True; }

# kwokctl's configuration for this cluster: KWOK's controller manages only nodes annotated as fake
# (by default it takes every node, the real kubelet's too); the API server reaches kubelets by
# address with the admin client certificate; its serving certificate also covers the `kubernetes`
# Service address, which the real node's pods reach through a DNAT to the API server (node.sh).
write_kwok_config() {
  local pki="$KWOK_WORKDIR/clusters/$name/pki"
  cat > "$dir/kwok.yaml" <<EOF
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  kubeApiserverCertSANs: ["10.0.0.1"]
componentsPatches:
  - name: kwok-controller
    extraArgs:
      - {key: manage-all-nodes, value: "false", override: true}
      - {key: manage-nodes-with-annotation-selector, value: kwok.x-k8s.io/node=fake}
  - name: kube-apiserver
    extraArgs:
      - {key: kubelet-preferred-address-types, value: "InternalIP,Hostname"}
      - {key: kubelet-client-certificate, value: "$pki/admin.crt"}
      - {key: kubelet-client-key, value: "$pki/admin.key"}
EOF
}

real_node_wanted() { case "${REAL_NODE:-auto}" in 0|no|false|off) return 1 ;; esac; [ "$(id -u)" = 0 ]; }

up() {
  local started=$SECONDS bin
  # A busy API server may miss one 3 s probe: keep probing for 4 s before treating the cluster as stopped.
  if [ -s "$kubeconfig" ] && wait_until 4 "/readyz" ready 2>/dev/null && node_ready; then
    # The real node may be missing (crashed, or taken by another cluster that has since gone).
    if real_node_wanted && ! "$here/node.sh" status 2>/dev/null; then "$here/node.sh" up; fi
    log "already up, checked in $((SECONDS - started))s ($kubeconfig)"; return 0
  fi
  bin=$("$here/build.sh")
  local flags=(--name "$name" --runtime binary --kubeconfig "$kubeconfig"
    --etcd-binary "$bin/etcd" --kube-apiserver-binary "$bin/kube-apiserver"
    --kube-controller-manager-binary "$bin/kube-controller-manager"
    --kube-scheduler-binary "$bin/kube-scheduler" --kwok-controller-binary "$bin/kwok"
    --kube-audit-policy "$here/audit-policy.yaml" --disable-qps-limits --wait 120s)
  # Server-side sharded list/watch (alpha from 1.36, unknown before: an API server refuses a gate it
  # does not know) filters the operator's hash shards (docs/sharding.md). KUBE_FEATURE_GATES replaces
  # the default, e.g. "ShardedListAndWatch=false" for a cluster as managed ones run (the shards then
  # filter in the process), or "" for none.
  local minor=${KUBERNETES_VERSION#v1.} gates=""
  [ "${minor%%.*}" -ge 36 ] && gates="ShardedListAndWatch=true"
  gates=${KUBE_FEATURE_GATES-$gates}
  if [ -n "$gates" ]; then flags+=(--kube-feature-gates "$gates"); fi
  write_kwok_config
  # A real node left from a crashed run of this cluster goes first (its pods, mounts, cgroups).
  "$here/node.sh" down
  if [ -d "$KWOK_WORKDIR/clusters/$name" ]; then
    # Left over from a stopped or crashed run (a reboot, a killed session). `kwokctl start` does not
    # reliably revive processes that were killed, and a scratch cluster's state is not worth keeping.
    log "discarding the stopped cluster $name"
    "$bin/kwokctl" delete cluster --name "$name" >&2 || rm -rf "$KWOK_WORKDIR/clusters/$name"
  fi
  # The real node's containerd starts while the control plane does.
  local prepare=""
  if real_node_wanted; then "$here/node.sh" prepare & prepare=$!; fi
  log "creating cluster $name (Kubernetes $KUBERNETES_VERSION, feature gates: ${gates:-none})"
  # kwokctl picks free ports when it creates a cluster, but binds them only when the components
  # start: two clusters created at once pick the same ports. One creation at a time per machine.
  exec 8>"${TMPDIR:-/tmp}/kopf-operators-cluster-create.lock"
  flock 8
  "$bin/kwokctl" --config "$dir/kwok.yaml" create cluster "${flags[@]}" >&2 8>&-  # its processes must not hold the lock
  flock -u 8
  "$bin/kwokctl" get kubeconfig --name "$name" > "$kubeconfig.tmp" && mv "$kubeconfig.tmp" "$kubeconfig"
  wait_until 60 "/readyz" ready
  if ! kc get node kwok-node-0 >/dev/null 2>&1; then
    kc apply -f "$here/node.yaml" >/dev/null
  fi
  wait_until 60 "a Ready node" node_ready
  wait_until 60 "the default ServiceAccount" kc -n default get serviceaccount default
  log "control plane ready in $((SECONDS - started))s"
  if [ -n "$prepare" ]; then
    wait "$prepare" || { log "the real node's preparation failed (see above)"; return 1; }
    "$here/node.sh" up
  fi
  log "ready in $((SECONDS - started))s; export KUBECONFIG=$kubeconfig"
}

down() {
  local bin
  bin=$("$here/build.sh")
  # The real node first, while the API server can still tell its kubelet to stop the pods.
  "$here/node.sh" down
  if [ -d "$KWOK_WORKDIR/clusters/$name" ]; then
    "$bin/kwokctl" delete cluster --name "$name" >&2
  fi
  rm -f "$kubeconfig"
  log "down"
}

# --- an upgrade in place, as a cluster administrator does it ------------------------------------------

# A process that has exited is gone, even while it waits to be reaped (kwokctl's processes are
# orphans: init reaps them, in its own time).
running() { local state; state=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${state:0:1}" != Z ]; }

# The running cluster's folder under kwokctl's workdir: pids, logs, the per-cluster binary links.
cluster_home() { echo "$KWOK_WORKDIR/clusters/$name"; }

# How long a component may drain after SIGTERM before it is killed: kubeadm's grace for its control
# plane's static pods. The API server stops listening at once but holds its open watches up to 60 s.
STOP_GRACE_SECONDS=30
CONTROL_PLANE=(etcd kube-apiserver kube-controller-manager kube-scheduler)

# save_command_lines: each control-plane component's command line, read from its process before the
# first one stops. kube-controller-manager and kube-scheduler exit when they cannot renew their leader
# Lease (the API server restarting): a kubelet would start their static pods again; here kwokctl does
# not, so they are started again (on the new binary) at their own step, from the saved command line.
save_command_lines() {
  local home component pid
  home=$(cluster_home)
  mkdir -p "$home/upgrade"
  for component in "${CONTROL_PLANE[@]}"; do
    pid=$(cat "$home/pids/$component.pid")
    running "$pid" || { log "$component is not running (pid $pid): start from a healthy cluster"; return 1; }
    cp "/proc/$pid/cmdline" "$home/upgrade/$component.cmdline"
  done
}

# restart_component COMPONENT BINARY: stop the component if it runs (SIGTERM, then SIGKILL after
# STOP_GRACE_SECONDS, as the kubelet replaces a static pod), point the cluster's link to BINARY, and
# start it again with exactly the arguments it ran with, in the same working folder, appending to the
# same log; kwokctl's pid file then names the new process, so `kwokctl delete cluster` (cluster.sh
# down) stops it as before. Prints the seconds from the stop (or from now, when it had exited) to the
# new process's start.
restart_component() {
  local component=$1 binary=$2 home pidfile pid args=()
  home=$(cluster_home); pidfile="$home/pids/$component.pid"
  pid=$(cat "$pidfile")
  mapfile -d '' -t args < "$home/upgrade/$component.cmdline"
  [ "${args[0]}" = "$home/bin/$component" ] || { log "$component ran ${args[0]}, not $home/bin/$component"; return 1; }
  local stopped=$EPOCHREALTIME
  if running "$pid"; then
    kill -TERM "$pid"
    local deadline=$((SECONDS + STOP_GRACE_SECONDS))
    while running "$pid" && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
    kill -KILL "$pid" 2>/dev/null || true
    while running "$pid"; do sleep 0.05; done
  else
    log "$component had exited (its log: $home/logs/$component.log)"
  fi
  ln -sfn "$binary" "$home/bin/$component"
  # exec all the way down: the pid file names the component itself, and nothing holds this
  # function's stdout (the caller reads it to its end).
  (cd "$home" && exec setsid "${args[@]}" >>"$home/logs/$component.log" 2>&1 </dev/null 8>&-) &
  printf %s $! > "$pidfile"  # no newline: kwokctl parses the whole file as the number
  python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$stopped" "$EPOCHREALTIME"
}

api_version() { kc version -o json --request-timeout=3s 2>/dev/null | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -1; }
etcd_ready() { [ "$(kc get --raw /readyz/etcd --request-timeout=3s 2>/dev/null)" = "ok" ]; }
api_at() { [ "$(api_version)" = "$1" ] && ready; }
lease_holder() { kc -n kube-system get lease "$1" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null; }
lease_taken() { local now; now=$(lease_holder "$1"); [ -n "$now" ] && [ "$now" != "$2" ]; }

# Upgrade the running control plane to $KUBERNETES_VERSION (its build from build.sh's cache, built if
# missing), in the order of Kubernetes' version skew policy: etcd (when the release pins another etcd),
# then kube-apiserver, then kube-controller-manager and kube-scheduler. Each is stopped and started
# again before the next; each is waited for (etcd: the API server's etcd check; the API server: /readyz
# and its new version; the others: their leader Lease taken by the new process). The fake node's KWOK
# controller and the real node stay as they are (node.sh upgrade does the kubelet). One log line per
# component with how long it was down.
upgrade_control_plane() {
  ready || { log "the cluster in $dir is not up"; return 1; }
  local bin home running_etcd seconds from
  # The version skew policy: one minor at a time, never down.
  from=$(api_version)
  case $(( $(echo "${KUBERNETES_VERSION#v}" | cut -d. -f2) - $(echo "${from#v}" | cut -d. -f2) )) in
    0|1) ;;
    *) log "the cluster runs $from: upgrade one minor at a time, never down (not to $KUBERNETES_VERSION)"; return 1 ;;
  esac
  bin=$("$here/build.sh")
  home=$(cluster_home)
  save_command_lines
  running_etcd=$(readlink "$home/bin/etcd")
  if [ "$running_etcd" != "$bin/etcd" ] && ! cmp -s "$running_etcd" "$bin/etcd"; then
    seconds=$(restart_component etcd "$bin/etcd")
    wait_until 120 "the API server to reach etcd $ETCD_VERSION" etcd_ready
    log "etcd: $ETCD_VERSION on the same data (stopped to started: ${seconds}s)"
  else
    log "etcd: $ETCD_VERSION already"
  fi
  seconds=$(restart_component kube-apiserver "$bin/kube-apiserver")
  wait_until 180 "kube-apiserver $KUBERNETES_VERSION to be ready" api_at "$KUBERNETES_VERSION"
  log "kube-apiserver: $KUBERNETES_VERSION ready (stopped to started: ${seconds}s)"
  local component holder
  for component in kube-controller-manager kube-scheduler; do
    holder=$(lease_holder "$component")
    seconds=$(restart_component "$component" "$bin/$component")
    wait_until 120 "$component $KUBERNETES_VERSION to take its leader Lease" lease_taken "$component" "$holder"
    log "$component: $KUBERNETES_VERSION leading (stopped to started: ${seconds}s)"
  done
  log "control plane upgraded to $KUBERNETES_VERSION"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) ready ;;
  audit-log) echo "$KWOK_WORKDIR/clusters/$name/logs/audit.log" ;;
  upgrade-control-plane) upgrade_control_plane ;;
  *) echo "usage: $0 up|down|status|audit-log|upgrade-control-plane" >&2; exit 2 ;;
esac
