#!/usr/bin/env bash
# Build the local control plane from Go modules into a cache outside the work tree.
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler  (one pinned release)
#   kwok, kwokctl                                                   (fake nodes, launcher)
#   helm                                                            (chart tests)
#   kubelet (same Kubernetes release), pause                        (the real node, node.sh)
# Prints the folder holding the binaries. Rebuilds only when versions.env changes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=cache.sh
source "$here/cache.sh"

key="k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}"
bin="$cache_root/$key/bin"
binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok kwokctl helm kubelet pause)

have_all() { for b in "${binaries[@]}"; do [ -x "$bin/$b" ] || return 1; done; }
# One build at a time per version set: later callers wait for the first, then find it done.
cached_or_lock build "$key" "$bin"

mkdir -p "$bin"
work="$cache_root/$key/src"

# -ldflags for a Kubernetes binary: stripped, with the version stamp a release build puts in.
k8s_ldflags() {
  local minor ld="-s -w" pkg
  minor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2)
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$ld"
}

# Kubernetes: the root module maps ~30 staging modules to ./staging with replace directives,
# which Go ignores in a dependency. A wrapper module replaces each with its published v0.X.Y.
build_kubernetes() {
  local k8s="$work/kubernetes" staging_version
  [ -x "$bin/kube-apiserver" ] && [ -x "$bin/kube-controller-manager" ] && [ -x "$bin/kube-scheduler" ] && return
  mkdir -p "$k8s"
  staging_version="v0.${KUBERNETES_VERSION#v1.}"
  local gomod
  gomod=$(cd "$k8s" && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  {
    echo "module localcluster/kubernetes"
    echo "go 1.26.0"
    echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
    grep -E '^\s+k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" | awk -v v="$staging_version" '{print "replace " $1 " => " $1 " " v}'
  } > "$k8s/go.mod"
  log "kubernetes $KUBERNETES_VERSION: resolving modules"
  (cd "$k8s" && go get "k8s.io/kubernetes/cmd/kube-apiserver@$KUBERNETES_VERSION" \
      "k8s.io/kubernetes/cmd/kube-controller-manager@$KUBERNETES_VERSION" \
      "k8s.io/kubernetes/cmd/kube-scheduler@$KUBERNETES_VERSION" >&2)
  local ld
  ld=$(k8s_ldflags)
  log "kubernetes $KUBERNETES_VERSION: compiling (the long part of a cold build)"
  (cd "$k8s" && go build -trimpath -ldflags "$ld" -o "$bin/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler >&2)
}

# etcd: server/v3 is the main package; its go.mod replaces sibling modules with ../ paths.
build_etcd() {
  local e="$work/etcd" gomod
  [ -x "$bin/etcd" ] && return
  mkdir -p "$e"
  gomod=$(cd "$e" && go mod download -json "go.etcd.io/etcd/server/v3@$ETCD_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  {
    echo "module localcluster/etcd"
    echo "go 1.26.0"
    echo "require go.etcd.io/etcd/server/v3 $ETCD_VERSION"
    grep -E '^\s+go\.etcd\.io/etcd/[a-z0-9/]+ => \.\./' "$gomod" | awk -v v="$ETCD_VERSION" '{print "replace " $1 " => " $1 " " v}'
  } > "$e/go.mod"
  log "etcd $ETCD_VERSION: building"
  (cd "$e" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2 && go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3 >&2)
}

build_kwok() {
  [ -x "$bin/kwok" ] && [ -x "$bin/kwokctl" ] && return
  log "kwok $KWOK_VERSION: building"
  GOBIN="$bin" go install -trimpath -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" \
    "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwokctl@$KWOK_VERSION" >&2
}

build_helm() {
  [ -x "$bin/helm" ] && return
  cp "$("$here/helm.sh")" "$bin/helm"  # helm.sh builds only helm, for `make deploy` alone
}

# The real node's kubelet: same wrapper module and version stamp as the control plane.
build_kubelet() {
  local k8s="$work/kubernetes" ld
  [ -x "$bin/kubelet" ] && return
  [ -f "$k8s/go.mod" ] || { log "kubelet needs the kubernetes wrapper module"; return 1; }
  ld=$(k8s_ldflags)
  log "kubelet $KUBERNETES_VERSION: building"
  (cd "$k8s" && go get "k8s.io/kubernetes/cmd/kubelet@$KUBERNETES_VERSION" >&2 \
      && go build -trimpath -ldflags "$ld" -o "$bin/" k8s.io/kubernetes/cmd/kubelet >&2)
}

# The pod sandbox's pause process (no registry for registry.k8s.io/pause): a static Go program that
# reaps orphans and exits on SIGINT/SIGTERM, packed into a local image by node.sh.
build_pause() {
  local p="$work/pause"
  [ -x "$bin/pause" ] && return
  mkdir -p "$p"
  printf 'module localcluster/pause\n\ngo 1.26.0\n' > "$p/go.mod"
  cat > "$p/main.go" <<'GO'
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	children := make(chan os.Signal, 16)
	signal.Notify(children, syscall.SIGCHLD)
	go func() {
		for range children {
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}()
	<-stop
	os.Exit(0)
}
GO
  (cd "$p" && go build -trimpath -ldflags "-s -w" -o "$bin/pause" . >&2)
}

build_etcd
build_kwok
build_helm
build_kubernetes
build_kubelet
build_pause
have_all
log "built in $(( $(date +%s) - start ))s into $bin"
echo "$bin"
