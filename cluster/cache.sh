# shellcheck shell=bash
# Sourced (after `set -euo pipefail` and `here=`) by build.sh and monitoring.sh: the pinned versions,
# Go's build settings and the shared cache outside the work tree, one build at a time per cache key.
# shellcheck source=versions.env
source "$here/versions.env"

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
cache_root=${KOPF_OPERATORS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kopf-operators}

# cached_or_lock TAG KEY OUT: when the caller's `have_all` holds, print OUT and exit 0. Otherwise take
# KEY's lock on fd 9 (held until the script exits): later callers wait for the first build, then find
# it done and exit the same way. Sets `start` and makes `log` print "[TAG time] ..." on stderr.
cached_or_lock() {
  local key=$2 out=$3
  log_tag=$1
  if have_all; then echo "$out"; exit 0; fi
  mkdir -p "$cache_root"
  exec 9>"$cache_root/$key.lock"
  if ! flock -n 9; then
    echo "[$log_tag] another build of $key is running; waiting for it" >&2
    flock 9
  fi
  if have_all; then echo "$out"; exit 0; fi
  start=$(date +%s)
}

log() { echo "[$log_tag $(date +%T)] $*" >&2; }
