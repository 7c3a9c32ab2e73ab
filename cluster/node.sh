#!/usr/bin/env bash
# A real node beside the KWOK node: Debian's containerd 1.6 + runc + CNI bridge, and a kubelet built
# from the control plane's own Kubernetes release (build.sh). Its pods really run: images, probes,
# exec, logs, SIGTERM. It carries the taint kopf-operators.dev/real-node=true:NoSchedule, so only pods
# that tolerate it (the deployed operator) land there; everything else stays on the KWOK node.
#
#   node.sh prepare     claim the machine's real node, start containerd (no control plane needed)
#   node.sh up          prepare if needed, then start the kubelet for $CLUSTER_DIR's cluster (no-op when up)
#   node.sh down        remove every piece of host state, in order (pods, kubelet, containerd,
#                       mounts, network namespaces, cgroups, CNI state, bridge, iptables chains)
#   node.sh status      exit 0 when this cluster's node is Ready
#   node.sh owner       print the cluster folder that owns the machine's real node (if any)
#   node.sh load IMAGE  copy a local podman image into the node's containerd (no registry)
#   node.sh upgrade     with KUBERNETES_VERSION=vX.Y.Z: restart the kubelet on that release's build;
#                       containerd and the pods' containers keep running (see upgrade)
#
# One real node per machine (it owns the CNI bridge, the kubelet's fixed host paths, iptables chains):
# the first cluster to come up takes it; another cluster started meanwhile stays KWOK-only and says
# so. REAL_NODE=0 opts a cluster out; REAL_NODE=1 makes a missing real node an error.
#
# Network: no kube-proxy. Pods get routes to the service range and the node's address only, so any
# other destination is unreachable inside the pod; the host DNATs the `kubernetes` Service
# (10.0.0.1:443) to the API server's local address and port; and a FORWARD chain drops anything from
# or to the pod range that is not pod-to-pod. No masquerading: nothing a pod sends leaves the machine.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
# shellcheck source=versions.env
source "$here/versions.env"

dir=${CLUSTER_DIR:-$repo/.cluster}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
name="kopf-$(printf '%s' "$dir" | sha256sum | cut -c1-8)"
kubeconfig="$dir/kubeconfig"
pki="$dir/kwok/clusters/$name/pki"
nd="$dir/node"
NODE_NAME=kopf-real-node
TAINT_KEY=kopf-operators.dev/real-node
POD_CIDR=10.245.0.0/24
SERVICE_IP=10.0.0.1
BRIDGE=kopfbr0
FWD_CHAIN=KOPF-NODE-FWD
NAT_CHAIN=KOPF-NODE-SVC
PAUSE_IMAGE=localhost/kopf-pause:$KUBERNETES_VERSION
# Host-wide: who owns the real node, and a lock so two clusters never set it up at once.
OWNER=/run/kopf-operators-real-node
LOCK=/run/lock/kopf-operators-real-node.lock

log() { echo "[node $(date +%T)] $*" >&2; }
kc() { kubectl --kubeconfig "$kubeconfig" "$@"; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
ctr_() { ctr --address "$nd/containerd.sock" -n k8s.io "$@"; }

node_ip() {
  local dev ip
  dev=$(ip -4 route show default 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "dev") {print $(i + 1); exit}}')
  ip=$(ip -4 -o addr show ${dev:+dev "$dev"} scope global 2>/dev/null | awk '{sub("/.*", "", $4); print $4; exit}')
  [ -n "$ip" ] || { log "no global IPv4 address for the node"; return 1; }
  echo "$ip"
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# The folder of the cluster whose kubelet is running on this machine, if any.
owner() {
  [ -s "$OWNER" ] || return 0
  local other
  other=$(cat "$OWNER")
  if alive "$other/node/kubelet.pid" || alive "$other/node/containerd.pid"; then echo "$other"; fi
}

node_ready() {
  [ "$(kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

wait_until() { # SECONDS WHAT COMMAND...
  local deadline=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then log "timed out waiting for $what"; return 1; fi
    sleep 0.1
  done
}

api_port() { sed -n 's#.*server: https://[^:]*:\([0-9]*\).*#\1#p' "$kubeconfig" | head -1; }

write_containerd_config() {
  mkdir -p "$nd/containerd" "$nd/cni/net.d" "$nd/cni/ipam" "$nd/logs"
  cat > "$nd/containerd/config.toml" <<EOF
version = 2
root = "$nd/containerd/root"
state = "$nd/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$nd/containerd.sock"
[ttrpc]
  address = "$nd/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$nd/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # No CAP_SYS_RESOURCE here: runc cannot lower the sandbox's oom_score_adj to -998.
  restrict_oom_score_adj = true
  # Pods' network namespaces under the node folder, not /run/netns (tear-down finds them there).
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  enable_selinux = false
  max_container_log_line_size = 16384
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    discard_unpacked_layers = false
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$nd/cni/net.d"
    max_conf_num = 1
  # Registries by host: the release's registry on the loopback (release/registry.sh) speaks plain HTTP.
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$nd/containerd/certs.d"
EOF
  local release_registry=${RELEASE_REGISTRY:-127.0.0.1:5000}
  mkdir -p "$nd/containerd/certs.d/$release_registry"
  cat > "$nd/containerd/certs.d/$release_registry/hosts.toml" <<EOF
server = "http://$release_registry"
[host."http://$release_registry"]
  capabilities = ["pull", "resolve"]
EOF
  # Routes to the service range and the node only: no default route, so a pod cannot even try to
  # reach another address. No ipMasq: pod traffic is never translated to the node's address.
  cat > "$nd/cni/net.d/10-kopf-node.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "kopf-node",
  "plugins": [
    {
      "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {
        "type": "host-local", "dataDir": "$nd/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR"}]],
        "routes": [{"dst": "$SERVICE_IP/32"}, {"dst": "$1/32"}]
      }
    }
  ]
}
EOF
}

firewall_up() { # NODE_IP API_PORT
  firewall_down
  iptables -w -t filter -N "$FWD_CHAIN"
  iptables -w -t filter -A "$FWD_CHAIN" -s "$POD_CIDR" -d "$POD_CIDR" -j ACCEPT
  iptables -w -t filter -A "$FWD_CHAIN" -s "$POD_CIDR" -j DROP
  iptables -w -t filter -A "$FWD_CHAIN" -d "$POD_CIDR" -j DROP
  iptables -w -t filter -I FORWARD 1 -j "$FWD_CHAIN"
  iptables -w -t nat -N "$NAT_CHAIN"
  iptables -w -t nat -A "$NAT_CHAIN" -s "$POD_CIDR" -d "$SERVICE_IP/32" -p tcp --dport 443 \
    -j DNAT --to-destination "$1:$2"
  iptables -w -t nat -I PREROUTING 1 -j "$NAT_CHAIN"
}

firewall_down() {
  command -v iptables >/dev/null || return 0
  local table chain
  while iptables -w -t filter -D FORWARD -j "$FWD_CHAIN" 2>/dev/null; do :; done
  while iptables -w -t nat -D PREROUTING -j "$NAT_CHAIN" 2>/dev/null; do :; done
  for table in filter:$FWD_CHAIN nat:$NAT_CHAIN; do
    iptables -w -t "${table%%:*}" -F "${table#*:}" 2>/dev/null || true
    iptables -w -t "${table%%:*}" -X "${table#*:}" 2>/dev/null || true
  done
  # The kubelet's chains: KUBE-FIREWALL (jumped to from INPUT and OUTPUT) and its canaries.
  for chain in INPUT OUTPUT; do
    while iptables -w -t filter -D "$chain" -j KUBE-FIREWALL 2>/dev/null; do :; done
    while ip6tables -w -t filter -D "$chain" -j KUBE-FIREWALL 2>/dev/null; do :; done
  done
  for table in mangle nat filter; do
    for chain in KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT KUBE-FIREWALL; do
      iptables -w -t "$table" -F "$chain" 2>/dev/null && iptables -w -t "$table" -X "$chain" 2>/dev/null || true
      ip6tables -w -t "$table" -F "$chain" 2>/dev/null && ip6tables -w -t "$table" -X "$chain" 2>/dev/null || true
    done
  done
}

# The kubelet's identity: system:node:NAME in system:nodes, signed by the cluster's CA (the Node
# authorizer and NodeRestriction then apply to it as in any cluster).
kubelet_credentials() {
  local k="$nd/kubelet-client"
  if [ ! -s "$k.crt" ] || ! openssl verify -CAfile "$pki/ca.crt" "$k.crt" >/dev/null 2>&1; then
    openssl req -new -newkey rsa:2048 -nodes -keyout "$k.key" -subj "/O=system:nodes/CN=system:node:$NODE_NAME" \
      -out "$k.csr" 2>/dev/null
    openssl x509 -req -in "$k.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 30 \
      -out "$k.crt" 2>/dev/null
    rm -f "$k.csr"
  fi
  local server
  server=$(sed -n 's#.*server: \(https://.*\)#\1#p' "$kubeconfig" | head -1)
  cat > "$nd/kubelet.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$server", certificate-authority: "$pki/ca.crt"}}]
users: [{name: kubelet, user: {client-certificate: "$k.crt", client-key: "$k.key"}}]
contexts: [{name: kubelet, context: {cluster: local, user: kubelet}}]
current-context: kubelet
EOF
}

write_kubelet_config() { # NODE_IP
  local port health
  port=$(free_port); health=$(free_port)
  cat > "$nd/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine: cgroup v1 (hybrid) without systemd, swap allowed, no CAP_SYS_RESOURCE.
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
enforceNodeAllocatable: []
containerRuntimeEndpoint: unix://$nd/containerd.sock
imageServiceEndpoint: unix://$nd/containerd.sock
address: "$1"
port: $port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $health
# The API server authenticates with the cluster's admin client certificate; anything else is refused.
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$pki/ca.crt"}
authorization: {mode: Webhook}
registerWithTaints:
  - {key: $TAINT_KEY, value: "true", effect: NoSchedule}
# No cluster DNS and no host resolv.conf in pods: they talk to the API server by address only.
resolvConf: ""
# Images are loaded by hand (no registry): never garbage-collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: "1%", imagefs.available: "1%"}
maxPods: 30
volumePluginDir: $nd/volume-plugins
podLogsDir: $nd/pod-logs
staticPodPath: ""
serializeImagePulls: false
nodeStatusUpdateFrequency: 10s
shutdownGracePeriod: 0s
EOF
}

pause_archive() {
  local bin=$1 cache_root archive pod=(podman --cgroup-manager=cgroupfs --events-backend=file)
  cache_root=${KOPF_OPERATORS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kopf-operators}
  archive="$cache_root/pause-$KUBERNETES_VERSION.tar"
  if [ ! -s "$archive" ]; then
    command -v podman >/dev/null || { log "podman is missing (cluster/host-deps.sh node installs it)"; return 1; }
    local t; t=$(mktemp -d)
    cp "$bin/pause" "$t/pause"
    # podman's own messages go to stderr; only its image id (stdout) is dropped.
    if ! tar --numeric-owner --owner=0 --group=0 -C "$t" -c pause \
        | "${pod[@]}" import --change 'ENTRYPOINT ["/pause"]' - "$PAUSE_IMAGE" >/dev/null; then
      log "could not import the pause binary as $PAUSE_IMAGE with podman"; rm -rf "$t"; return 1
    fi
    rm -rf "$t"
    if ! "${pod[@]}" save --format docker-archive -o "$archive.tmp" "$PAUSE_IMAGE" >&2; then
      log "could not save $PAUSE_IMAGE to $archive.tmp with podman"; rm -f "$archive.tmp"; return 1
    fi
    mv "$archive.tmp" "$archive"
  fi
  echo "$archive"
}

# checks() prints nothing and succeeds when this cluster may have the real node; else it says why
# and returns 3 (fine: stay KWOK-only) or 1 (an error).
checks() {
  case "${REAL_NODE:-auto}" in 0|no|false|off) log "REAL_NODE=${REAL_NODE}: no real node"; return 3 ;; esac
  if [ "$(id -u)" != 0 ]; then
    [ "${REAL_NODE:-auto}" = auto ] && { log "not root: no real node (KWOK only)"; return 3; }
    log "the real node needs root"; return 1
  fi
  local other
  other=$(owner)
  if [ -n "$other" ] && [ "$other" != "$dir" ]; then
    if [ "${REAL_NODE:-auto}" = auto ]; then
      log "this machine's real node belongs to $other: this cluster stays KWOK-only"; return 3
    fi
    log "this machine's real node belongs to $other (REAL_NODE=1)"; return 1
  fi
}

# Phase 1, which needs no control plane (cluster.sh runs it while the control plane starts): clear
# leftovers, claim the machine's real node, start containerd, load the sandbox image.
prepare() {
  local started=$SECONDS bin ip rc=0
  checks || { rc=$?; [ $rc = 3 ] && return 0; return $rc; }
  "$here/host-deps.sh" node
  mkdir -p "$(dirname "$LOCK")"
  exec 7>"$LOCK"; flock -w 120 7 || { log "could not take $LOCK"; return 1; }
  checks || { rc=$?; [ $rc = 3 ] && return 0; return $rc; }
  if [ "$(owner)" = "$dir" ] && alive "$nd/containerd.pid"; then return 0; fi
  # Leftovers of a crashed run (this or another cluster folder): clear the host first.
  if [ -s "$OWNER" ]; then CLUSTER_DIR=$(cat "$OWNER") teardown; fi
  teardown
  echo "$dir" > "$OWNER"
  # The bridge plugin turns on IPv4 forwarding (the FORWARD chain confines it): put the value back
  # at tear-down.
  cat /proc/sys/net/ipv4/ip_forward > "$OWNER.ip_forward"
  bin=$("$here/build.sh")
  ip=$(node_ip)
  write_containerd_config "$ip"
  # Bridged pod traffic must traverse iptables (br_netfilter) for the rules of firewall_up.
  sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
  # 7>&-: the daemons must not inherit (and so hold) the machine-wide lock.
  setsid containerd --config "$nd/containerd/config.toml" >"$nd/logs/containerd.log" 2>&1 < /dev/null 7>&- &
  echo $! > "$nd/containerd.pid"
  wait_until 30 "containerd" ctr_ version
  local archive
  archive=$(pause_archive "$bin") || { log "no pod-sandbox (pause) image: the real node cannot run pods"; return 1; }
  ctr_ images import "$archive" >/dev/null || { log "containerd refused the pause image $archive"; return 1; }
  log "containerd ready in $((SECONDS - started))s"
}

# Phase 2, once the control plane answers: the firewall, the kubelet's identity, the kubelet.
up() {
  local started=$SECONDS bin ip port rc=0
  checks || { rc=$?; [ $rc = 3 ] && return 0; return $rc; }
  [ -s "$kubeconfig" ] || { log "the control plane is not up ($kubeconfig)"; return 1; }
  if alive "$nd/kubelet.pid" && alive "$nd/containerd.pid" && [ "$(owner)" = "$dir" ] && node_ready; then
    log "already up"; return 0
  fi
  if alive "$nd/kubelet.pid"; then stop_pid "$nd/kubelet.pid" 15; fi
  prepare
  checks || { rc=$?; [ $rc = 3 ] && return 0; return $rc; }
  mkdir -p "$(dirname "$LOCK")"
  exec 7>"$LOCK"; flock -w 120 7 || { log "could not take $LOCK"; return 1; }
  bin=$("$here/build.sh")
  ip=$(node_ip); port=$(api_port)
  # Before any pod runs: the Service DNAT (the certificate covers 10.0.0.1, see kwok.yaml) and the
  # FORWARD confinement.
  firewall_up "$ip" "$port"
  kubelet_credentials
  write_kubelet_config "$ip"
  # A node object left from an earlier run would keep stale state (taints, addresses): start afresh.
  kc delete node "$NODE_NAME" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  setsid "$bin/kubelet" --config "$nd/kubelet.yaml" --kubeconfig "$nd/kubelet.kubeconfig" \
    --root-dir "$nd/kubelet" --cert-dir "$nd/kubelet/pki" --hostname-override "$NODE_NAME" --node-ip "$ip" \
    --node-labels "$TAINT_KEY=true" --v=1 >"$nd/logs/kubelet.log" 2>&1 < /dev/null 7>&- &
  echo $! > "$nd/kubelet.pid"
  wait_until 60 "the real node to be Ready (log: $nd/logs/kubelet.log)" node_ready
  # A Ready node may still be unable to run pods (no sandbox image, CNI, cgroups): prove it can.
  smoke_pod || return 1
  log "real node $NODE_NAME Ready and running pods in $((SECONDS - started))s (pods: $POD_CIDR, node address $ip)"
}

SMOKE_POD=kopf-real-node-smoke
smoke_running() { [ "$(kc -n kube-system get pod "$SMOKE_POD" -o jsonpath='{.status.phase}')" = Running ]; }

# A pod on the real node must reach Running before the node is reported usable.
smoke_pod() {
  kc -n kube-system delete pod "$SMOKE_POD" --ignore-not-found --grace-period=0 >/dev/null
  kc apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $SMOKE_POD, namespace: kube-system}
spec:
  nodeName: $NODE_NAME
  tolerations: [{key: $TAINT_KEY, operator: Exists, effect: NoSchedule}]
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 0
  containers: [{name: pause, image: $PAUSE_IMAGE, imagePullPolicy: Never}]
EOF
  if ! wait_until 90 "the smoke pod to run on the real node" smoke_running; then
    log "the real node is Ready but cannot run a pod; the smoke pod says:"
    kc -n kube-system describe pod "$SMOKE_POD" | tail -15 >&2 || true
    log "kubelet log: $nd/logs/kubelet.log, containerd log: $nd/logs/containerd.log"
    return 1
  fi
  kc -n kube-system delete pod "$SMOKE_POD" --grace-period=0 --wait=true --timeout=60s >/dev/null
}

# A process that has exited is gone, even while it waits to be reaped (the daemons are orphans: init
# reaps them, in its own time).
running() { local state; state=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${state:0:1}" != Z ]; }

stop_pid() { # PIDFILE SECONDS
  local pid
  [ -s "$1" ] || return 0
  pid=$(cat "$1")
  if running "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + $2))
    while running "$pid" && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    while running "$pid"; do sleep 0.1; done
  fi
  rm -f "$1"
}

# Remove everything the node put on the host, in order. Safe to run twice or on a half-started node.
teardown() {
  local d=${CLUSTER_DIR:-$dir}/node
  [ -d "$d" ] || [ -s "$OWNER" ] || return 0
  nd=$d
  # 1. pods: with the API server and kubelet still up, let the kubelet stop them (CNI DEL included).
  if alive "$nd/kubelet.pid" && [ -s "$kubeconfig" ] && kc get --raw /readyz --request-timeout=3s >/dev/null 2>&1; then
    kc delete pods -A --field-selector "spec.nodeName=$NODE_NAME" --wait=false --grace-period=5 >/dev/null 2>&1 || true
    wait_until 30 "the real node's pods to stop" \
      bash -c "[ -z \"\$(kubectl --kubeconfig '$kubeconfig' get pods -A --field-selector spec.nodeName=$NODE_NAME -o name)\" ]" || true
  fi
  # 2. the kubelet; 3. the containers it left (their shims), then containerd.
  stop_pid "$nd/kubelet.pid" 15
  if alive "$nd/containerd.pid"; then
    local c
    for c in $(ctr_ tasks list -q 2>/dev/null); do ctr_ tasks kill -s KILL "$c" >/dev/null 2>&1 || true; done
    for c in $(ctr_ tasks list -q 2>/dev/null); do ctr_ tasks delete -f "$c" >/dev/null 2>&1 || true; done
  fi
  stop_pid "$nd/containerd.pid" 15
  # Shims outlive containerd by design: end the ones serving this node.
  local pid
  for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $nd/containerd.sock" 2>/dev/null || true); do
    kill -KILL "$pid" 2>/dev/null || true
  done
  # 4. mounts under the node folder (rootfs overlays, shm, secrets/tmpfs volumes, the kubelet's bind
  # mount of its root), deepest first; then the pods' network namespaces.
  local m
  for m in $(awk -v d="$nd" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  for m in $(awk '$2 ~ "^/run/netns/cni-" || $2 ~ "^/var/run/netns/cni-" {print $2}' /proc/self/mounts | sort -ru); do
    umount -l "$m" 2>/dev/null || true; rm -f "$m"
  done
  # 5. cgroups the kubelet and runc made (cgroupfs driver), deepest first, in every hierarchy.
  local h
  for h in /sys/fs/cgroup/*/; do
    [ -d "$h/kubepods" ] || continue
    find "$h/kubepods" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  # 6. CNI: the bridge (veths went with the namespaces), libcni's cache, the IPAM state.
  ip link del "$BRIDGE" 2>/dev/null || true
  rm -rf /var/lib/cni/results/kopf-node-* /var/lib/cni/networks/kopf-node
  for m in /var/lib/cni/results /var/lib/cni/networks /var/lib/cni; do rmdir "$m" 2>/dev/null || true; done
  firewall_down
  if [ -s "$OWNER.ip_forward" ]; then
    cat "$OWNER.ip_forward" > /proc/sys/net/ipv4/ip_forward 2>/dev/null || true
    rm -f "$OWNER.ip_forward"
  fi
  # 7. fixed host paths the kubelet and shims use whatever their root (only one real node per machine).
  rm -rf /var/lib/kubelet/device-plugins /var/lib/kubelet/pod-resources /var/lib/kubelet/plugins \
    /var/lib/kubelet/plugins_registry /var/lib/kubelet/checkpoints
  rmdir /var/lib/kubelet 2>/dev/null || true
  # The kubelet links every container's log into /var/log/containers (a fixed path).
  find /var/log/containers -maxdepth 1 -type l -lname "$nd/*" -delete 2>/dev/null || true
  rmdir /var/log/containers 2>/dev/null || true
  rm -rf /run/containerd/s /run/containerd/runc/k8s.io /run/containerd/io.containerd.runtime.v2.task/k8s.io
  for m in /run/containerd/runc /run/containerd/io.containerd.runtime.v2.task /run/containerd; do
    rmdir "$m" 2>/dev/null || true
  done
  rm -rf "$nd"
  if [ -s "$OWNER" ] && [ "$(cat "$OWNER")" = "$(dirname "$nd")" ]; then rm -f "$OWNER"; fi
}

down() {
  local started=$SECONDS
  if [ ! -d "$nd" ] && { [ ! -s "$OWNER" ] || [ "$(cat "$OWNER")" != "$dir" ]; }; then return 0; fi
  [ "$(id -u)" = 0 ] || { log "not root: nothing to tear down"; return 0; }
  mkdir -p "$(dirname "$LOCK")"
  exec 7>"$LOCK"; flock -w 120 7 || { log "could not take $LOCK"; return 1; }
  local other
  other=$(owner)
  if [ -n "$other" ] && [ "$other" != "$dir" ]; then
    # The machine's node is another cluster's now: leave the host alone, drop only our folder.
    rm -rf "$nd"; return 0
  fi
  kc delete node "$NODE_NAME" --ignore-not-found --wait=false >/dev/null 2>&1 &
  teardown
  wait || true
  log "real node removed in $((SECONDS - started))s"
}

# The name a pod's `image:` resolves to in containerd (docker.io/library/ for a bare name).
normalized() {
  local first=${1%%/*}
  if [[ $1 != */* ]]; then echo "docker.io/library/$1"
  elif [[ $first == *.* || $first == *:* || $first == localhost ]]; then echo "$1"
  else echo "docker.io/$1"; fi
}

load() { # IMAGE: podman image → the node's containerd (k8s.io namespace), under the name pods use
  local image=$1 ref archive id
  [ "$(owner)" = "$dir" ] || { log "this cluster has no real node"; return 1; }
  ref=$(normalized "$image")
  id=$(podman --cgroup-manager=cgroupfs --events-backend=file image inspect --format '{{.Id}}' "$image")
  # containerd's CRI names every image also by its config digest, which is podman's image ID: when
  # that is there, the image is loaded already (perhaps under another tag), and a tag is enough.
  if ctr_ images ls -q | grep -qx "sha256:$id"; then
    log "$image is on the real node already"
  else
    archive=$(mktemp --suffix=.tar)
    podman --cgroup-manager=cgroupfs --events-backend=file save --format docker-archive -o "$archive" "$image" >/dev/null 2>&1
    ctr_ images import "$archive" >/dev/null
    rm -f "$archive"
    log "loaded $image into the real node"
  fi
  ctr_ images ls -q | grep -qx "$ref" || ctr_ images tag --force "sha256:$id" "$ref" >/dev/null
}

kubelet_healthy() {
  local port
  port=$(sed -n 's/^healthzPort: //p' "$nd/kubelet.yaml")
  python3 -c 'import sys, urllib.request; sys.exit(urllib.request.urlopen(sys.argv[1], timeout=2).read() != b"ok")' \
    "http://127.0.0.1:$port/healthz" 2>/dev/null
}
kubelet_version() { kc get node "$NODE_NAME" -o jsonpath='{.status.nodeInfo.kubeletVersion}' 2>/dev/null; }
kubelet_at() { [ "$(kubelet_version)" = "$1" ] && node_ready && kubelet_healthy; }

# The node's part of a cluster upgrade, after the control plane's (cluster.sh upgrade-control-plane;
# a kubelet may be older than the API server, never newer): the kubelet is stopped (SIGTERM; with
# shutdownGracePeriod 0 it leaves the pods alone, as when a node's kubelet package is replaced) and
# started on $KUBERNETES_VERSION's build with the same arguments. containerd, the sandboxes and the
# containers keep running; the new kubelet finds them through the CRI and adopts them. Done when the
# Node reports the new kubeletVersion and Ready and the kubelet's /healthz answers ok. One log line
# with how long that took from the stop.
upgrade() {
  [ "$(owner)" = "$dir" ] && alive "$nd/kubelet.pid" || { log "this cluster's real node is not running"; return 1; }
  local bin pid args=() stopped
  bin=$("$here/build.sh")
  pid=$(cat "$nd/kubelet.pid")
  mapfile -d '' -t args < "/proc/$pid/cmdline"
  [ "${args[0]##*/}" = kubelet ] || { log "pid $pid is not the kubelet: ${args[0]}"; return 1; }
  if cmp -s "${args[0]}" "$bin/kubelet"; then log "the kubelet runs $KUBERNETES_VERSION already"; return 0; fi
  args[0]=$bin/kubelet
  stopped=$EPOCHREALTIME
  stop_pid "$nd/kubelet.pid" 30
  setsid "${args[@]}" >>"$nd/logs/kubelet.log" 2>&1 < /dev/null &
  echo $! > "$nd/kubelet.pid"
  wait_until 120 "the kubelet $KUBERNETES_VERSION to report the node Ready (log: $nd/logs/kubelet.log)" \
    kubelet_at "$KUBERNETES_VERSION"
  log "kubelet upgraded to $KUBERNETES_VERSION: Ready and healthy $(python3 -c \
    "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$stopped" "$EPOCHREALTIME")s after it was stopped"
}

case "${1:-}" in
  prepare) prepare ;;
  up) up ;;
  down) down ;;
  status) [ "$(owner)" = "$dir" ] && node_ready ;;
  owner) owner ;;
  load) load "$2" ;;
  upgrade) upgrade ;;
  *) echo "usage: $0 prepare|up|down|status|owner|load IMAGE|upgrade" >&2; exit 2 ;;
esac
