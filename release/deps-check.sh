#!/usr/bin/env bash
# `make deps-check`: would the newest versions pyproject.toml allows work? In a scratch venv (the work
# tree's .venv is not touched), resolve the newest allowed versions, with Kopf let up to its next major
# (<2) instead of its exact pin, install them, and run the unit tests: first those that pin Kopf's
# internals (the test files that import kopf's private modules or the patches' door), then the rest.
# Prints what would change against requirements-dev.lock and whether the bump is safe; exit 1 if not.
# A safe bump: `make lock` after raising the pin (and the patches' tested Kopf version) in the code.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
uv=$repo/.venv/bin/uv
log() { echo "[deps-check] $*" >&2; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export UV_PYTHON_DOWNLOADS=never UV_CACHE_DIR=${UV_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kopf-operators/uv}

kopf_pin=$(sed -n 's/^kopf==\([^ ]*\).*/\1/p' requirements.lock)
[ -n "$kopf_pin" ] || { log "no exact kopf pin in requirements.lock"; exit 1; }
echo "kopf>=$kopf_pin,<2" > "$scratch/overrides.txt"
log "resolving the newest allowed versions (Kopf >=$kopf_pin,<2)"
"$uv" pip compile -q --python-version 3.11 --override "$scratch/overrides.txt" \
  pyproject.toml requirements-build.in --extra dev -o "$scratch/newest.txt"
"$uv" venv -q --python "$(command -v python3)" "$scratch/venv"
"$uv" pip install -q --python "$scratch/venv/bin/python" -r "$scratch/newest.txt"
"$uv" pip install -q --python "$scratch/venv/bin/python" --no-deps --no-build-isolation -e .

pins() { sed -n 's/^\([A-Za-z0-9._-]*\)==\([^ ;\\]*\).*/\1 \2/p' "$1" | tr 'A-Z_.' 'a-z--' | sort -u; }
changes=$(join -a2 <(pins requirements-dev.lock) <(pins "$scratch/newest.txt") | awk 'NF==2 {print "  " $1 ": new, " $2} NF==3 && $2 != $3 {print "  " $1 ": " $2 " -> " $3}')
echo "Changes against requirements-dev.lock:"
echo "${changes:-  none: the lock already has the newest allowed versions}"

mapfile -t internals < <(grep -lE '^\s*(from|import) kopf\._|kopf_patches' tests/unit/test_*.py)
[ ${#internals[@]} -gt 0 ] || { log "found no unit test of Kopf's internals"; exit 1; }
status=0
log "unit tests of Kopf's internals: ${internals[*]}"
"$scratch/venv/bin/python" -m pytest -q -p no:cacheprovider "${internals[@]}" || status=1
log "the other unit tests"
others=()
for f in tests/unit/test_*.py; do [[ " ${internals[*]} " == *" $f "* ]] || others+=("$f"); done
"$scratch/venv/bin/python" -m pytest -q -p no:cacheprovider "${others[@]}" || status=1
new_kopf=$(sed -n 's/^kopf==\([^ ]*\).*/\1/p' "$scratch/newest.txt")
if [ "$status" = 0 ]; then
  echo "SAFE: the newest allowed versions (Kopf $new_kopf) pass the unit tests."
  [ "$new_kopf" = "$kopf_pin" ] || echo "To take Kopf $new_kopf: raise its pin in pyproject.toml and the patches' tested version, then make lock."
else
  echo "NOT SAFE: the unit tests fail with the newest allowed versions (Kopf $new_kopf; above). Keep the lock."
fi
exit "$status"
