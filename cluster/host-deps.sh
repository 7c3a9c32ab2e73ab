#!/usr/bin/env bash
# Install the Debian packages the real node and the image build need, once (a no-op when present):
#   podman + buildah (build the image without Docker), runc (crun refuses hybrid cgroups),
#   containerd (Debian's 1.6.20: the node's CRI runtime), containernetworking-plugins (bridge,
#   host-local, loopback), debootstrap (the local base image), iptables (keep pod traffic local),
#   qemu-user-static (another architecture's image: cluster/image.sh with ARCH=arm64).
# Each step lists everything it uses: the node needs podman too (it packs the pod-sandbox image).
# A failure stops the caller with apt's own message: nothing here is allowed to fail quietly.
# Usage: host-deps.sh image|node|emulation
set -euo pipefail
case "${1:-}" in
  image) pkgs=(podman buildah runc debootstrap uidmap fuse-overlayfs) ;;
  node) pkgs=(containerd runc containernetworking-plugins iptables conntrack podman) ;;
  emulation) pkgs=(qemu-user-static) ;;
  *) echo "usage: $0 image|node|emulation" >&2; exit 2 ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "[deps] missing Debian packages: ${missing[*]} (run as root, or apt-get install them)" >&2; exit 1
fi
echo "[deps] installing ${missing[*]}" >&2
# Never start services from package scripts: the node runs its own containerd under the cluster folder.
export DEBIAN_FRONTEND=noninteractive
policy=/usr/sbin/policy-rc.d own_policy=no
if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; own_policy=yes; fi
trap '[ "$own_policy" = yes ] && rm -f "$policy"' EXIT
if ! apt-get update -qq >&2; then
  echo "[deps] apt-get update failed (see above): cannot install ${missing[*]}" >&2; exit 1
fi
if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; then
  echo "[deps] apt-get install failed (see above) for: ${missing[*]}" >&2; exit 1
fi
for p in "${missing[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' \
    || { echo "[deps] $p is still not installed after apt-get install" >&2; exit 1; }
done
