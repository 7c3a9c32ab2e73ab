#!/usr/bin/env bash
# The release's OCI registry on 127.0.0.1 (CNCF Distribution, built by cluster/release-tools.sh): images,
# their signatures and SBOM attestations, and the Helm chart are pushed to it by release/release.sh.
#   registry.sh up       start it (no-op when it answers); prints its address HOST:PORT
#   registry.sh down     stop it (its storage stays in $RELEASE_DIR/registry)
#   registry.sh status   exit 0 when it answers
# Env: REGISTRY (default 127.0.0.1:5000; only a 127.0.0.1 address), RELEASE_DIR (default <repo>/.release).
# Plain HTTP on the loopback only: nothing leaves the machine; clients are told (--plain-http,
# --allow-http-registry, the node's containerd hosts.toml).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
registry=${REGISTRY:-127.0.0.1:5000}
dir=${RELEASE_DIR:-$repo/.release}
log() { echo "[registry $(date +%T)] $*" >&2; }
case "$registry" in 127.0.0.1:[0-9]*) ;; *) log "REGISTRY=$registry: only 127.0.0.1:PORT is served here"; exit 2 ;; esac

answers() { curl -fsS -o /dev/null "http://$registry/v2/" 2>/dev/null; }

up() {
  if answers; then echo "$registry"; return; fi
  local bin
  bin=$("$repo/cluster/release-tools.sh")
  mkdir -p "$dir/registry"
  cat > "$dir/registry.yaml" <<YAML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $dir/registry
  delete:
    enabled: true
http:
  addr: $registry
YAML
  # No tracing exporter: nothing is sent anywhere. Every inherited descriptor above 2 is closed first: a
  # caller's lock (flock /work/image.lock make release) must not stay held by the long-lived registry.
  (
    for fd in /proc/$BASHPID/fd/*; do
      fd=${fd##*/}
      if [ "$fd" -gt 2 ]; then eval "exec $fd>&-"; fi
    done
    OTEL_TRACES_EXPORTER=none exec setsid "$bin/registry" serve "$dir/registry.yaml" >"$dir/registry.log" 2>&1 </dev/null
  ) &
  echo $! > "$dir/registry.pid"
  for _ in $(seq 1 100); do
    if answers; then log "serving $registry (storage $dir/registry, log $dir/registry.log)"; echo "$registry"; return; fi
    if ! kill -0 "$(cat "$dir/registry.pid")" 2>/dev/null; then
      log "the registry exited; its log:"; cat "$dir/registry.log" >&2; exit 1
    fi
    sleep 0.1
  done
  log "the registry does not answer on $registry after 10 s; its log:"; cat "$dir/registry.log" >&2; exit 1
}

down() {
  [ -f "$dir/registry.pid" ] || return 0
  local pid
  pid=$(cat "$dir/registry.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then log "registry $pid did not stop"; exit 1; fi
  fi
  rm -f "$dir/registry.pid"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) answers ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
