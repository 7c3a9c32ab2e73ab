#!/usr/bin/env bash
# Build the operator image from the Dockerfile without Docker or a registry (podman + runc).
#   image.sh build [IMAGE]    build IMAGE (default localhost/kopf-operators:<chart appVersion>); prints it
#   image.sh base             only make the local base image (debootstrap), print its name
#   image.sh archive IMAGE F  write IMAGE as an OCI archive to F (for `ctr images import`)
# ARCH=arm64 (default: amd64) builds for linux/ARCH: its own debootstrap base, every RUN step under
# Debian's qemu-user-static through the kernel's binfmt_misc (registered here when missing).
# VERSION: the image's org.opencontainers.image.version label (default: the chart's appVersion).
#
# No registry is reachable, so the Dockerfile's pinned python base cannot be pulled: the base is a
# Debian bookworm root filesystem with Python 3.11 made by debootstrap from the mirror apt uses,
# imported once as localhost/kopf-operators-base (BASE_IMAGE build argument). podman keeps every
# layer, so a rebuild with nothing changed takes seconds. Elsewhere `docker build .` is unchanged.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
"$here/host-deps.sh" image

ARCH=${ARCH:-amd64}
host_arch=$(dpkg --print-architecture)
suffix=""; [ "$ARCH" = "$host_arch" ] || suffix="-$ARCH"
BASE=${BASE_IMAGE:-localhost/kopf-operators-base:bookworm-py311$suffix}
log() { echo "[image $(date +%T)] $*" >&2; }
# cgroupfs and a file event log: no systemd here. runc: crun refuses the hybrid cgroup layout.
# Ulimits: the machine's hard limits are below podman's defaults and raising them is not allowed.
pod() { podman --cgroup-manager=cgroupfs --events-backend=file --runtime=runc "$@"; }
ulimits=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)

mirror() {
  if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
  local m
  m=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$m" ] || m=$(awk '$1 == "deb" && $3 ~ /^bookworm$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  echo "${m:-http://deb.debian.org/debian}"
}

# Another architecture's programs run here through qemu-user-static, registered with binfmt_misc's F flag
# (the interpreter is opened once, so it works inside containers and chroots too).
emulation() {
  [ "$ARCH" = "$host_arch" ] && return
  local qarch
  case "$ARCH" in arm64) qarch=aarch64 ;; *) echo "[image] no emulation set up for $ARCH" >&2; return 1 ;; esac
  "$here/host-deps.sh" emulation
  local misc=/proc/sys/fs/binfmt_misc
  if [ ! -e "$misc/register" ]; then
    mount -t binfmt_misc binfmt_misc "$misc" || { echo "[image] cannot mount $misc" >&2; return 1; }
  fi
  if [ ! -e "$misc/qemu-$qarch" ]; then
    grep -v '^#' "/usr/lib/binfmt.d/qemu-$qarch.conf" > "$misc/register" \
      || { echo "[image] cannot register qemu-$qarch with binfmt_misc" >&2; return 1; }
  fi
  grep -q '^flags: .*F' "$misc/qemu-$qarch" \
    || { echo "[image] qemu-$qarch is registered without the F flag: containers cannot use it" >&2; return 1; }
}

base() {
  emulation
  if pod image exists "$BASE"; then echo "$BASE"; return; fi
  local cache_root=${KOPF_OPERATORS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kopf-operators}
  mkdir -p "$cache_root"
  exec 8>"$cache_root/base-image$suffix.lock"; flock 8
  if pod image exists "$BASE"; then echo "$BASE"; return; fi
  local root="$cache_root/base-rootfs$suffix" started=$SECONDS
  rm -rf "$root"
  log "debootstrap bookworm $ARCH (python3, venv, ca-certificates) from $(mirror)"
  debootstrap --arch="$ARCH" --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" "$(mirror)" >&2
  # As in the official python image: `python` is on PATH; no package caches in the image.
  ln -sf /usr/bin/python3 "$root/usr/local/bin/python"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*.log
  tar --numeric-owner -C "$root" -c . | pod import --arch "$ARCH" --change 'CMD ["python3"]' \
    --change 'ENV LANG=C.UTF-8' - "$BASE" >&2
  rm -rf "$root"
  log "base image $BASE made in $((SECONDS - started))s"
  echo "$BASE"
}

build() {
  local app_version
  app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$repo/charts/kopf-operators/Chart.yaml")
  local image=${1:-localhost/kopf-operators:$app_version}
  local started=$SECONDS
  base >/dev/null
  # pip in the build stage must trust the certificate that TLS to the package index goes through:
  # the host's CA bundle, mounted read-only for the build only (it is not in any layer).
  local ca=/etc/ssl/certs/ca-certificates.crt
  # --network=host: RUN steps use the host network (no bridge, no NAT, no forwarding needed).
  pod build "${ulimits[@]}" --network=host --layers --pull=never --platform "linux/$ARCH" \
    --build-arg "BASE_IMAGE=$BASE" --build-arg "VERSION=${VERSION:-$app_version}" \
    --build-arg PIP_CERT=/run/host-ca.crt -v "$ca:/run/host-ca.crt:ro" \
    -t "$image" -f "$repo/Dockerfile" "$repo" >&2
  # A build stopped by a signal can still exit 0 without tagging anything: trust the image, not the code.
  pod image exists "$image" || { log "no $image after the build: it was interrupted or failed"; exit 1; }
  log "built $image in $((SECONDS - started))s"
  echo "$image"
}

archive() { # IMAGE FILE
  rm -f "$2"
  pod save --format oci-archive -o "$2" "$1" >&2
}

case "${1:-}" in
  build) build "${2:-}" ;;
  base) base ;;
  archive) archive "$2" "$3" ;;
  *) echo "usage: $0 build [IMAGE] | base | archive IMAGE FILE" >&2; exit 2 ;;
esac
