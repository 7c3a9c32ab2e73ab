#!/usr/bin/env bash
# `make release`: build, sign and publish the release of the version in pyproject.toml to an OCI registry.
#   1. images for linux/amd64 and linux/arm64 (cluster/image.sh; arm64 under qemu-user-static), each
#      smoke-started (the arm64 one under emulation), under one manifest list REGISTRY/kopf-operators:VERSION
#   2. an SBOM per image (CycloneDX, made inside the image build by cyclonedx-bom from the shipped venv)
#   3. cosign: the manifest list and each image signed, each SBOM attested (signed) to its image
#   4. the chart, naming the image by REGISTRY/kopf-operators:VERSION@DIGEST, pushed with Helm's OCI
#      support to oci://REGISTRY/charts and signed with cosign
#   5. the tree records the release (RELEASE_WRITE_TREE=1, the default): the kustomization's and
#      Artifact Hub's image by version and digest, the signKey annotation, release/cosign.pub
# Env: REGISTRY (default 127.0.0.1:5000, started here by release/registry.sh when it is a local address),
#      PLATFORMS (default "amd64 arm64"), RELEASE_DIR (default <repo>/.release: the registry, the SBOMs),
#      COSIGN_KEY_DIR (default ~/.cache/kopf-operators/release-key: the signing key, made on first use),
#      COSIGN_PASSWORD (the key's password; empty here), RELEASE_WRITE_TREE (1: write the tree; 0: not),
#      RELEASE_REQUIRE_COMPAT (1, the default: refuse unless `make compat` passed on this commit; 0: a rehearsal).
# Prints the released references on stdout (image=..., chart=...); everything else goes to stderr.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
py=${PYTHON:-$repo/.venv/bin/python}
registry=${REGISTRY:-127.0.0.1:5000}
platforms=${PLATFORMS:-amd64 arm64}
out=${RELEASE_DIR:-$repo/.release}
key_dir=${COSIGN_KEY_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kopf-operators/release-key}
write_tree=${RELEASE_WRITE_TREE:-1}
export COSIGN_PASSWORD=${COSIGN_PASSWORD:-}
# cosign looks up Sigstore's public trust root (TUF, on the internet) even to sign or verify with a key and
# no transparency log. A mirror on the loopback with no cached root makes it skip that at once, so nothing
# leaves the machine (it only warns); a pipeline that uses Sigstore's public services sets its own TUF_MIRROR.
export TUF_MIRROR=${TUF_MIRROR:-http://127.0.0.1:9}
log() { echo "[release $(date +%T)] $*" >&2; }
pod() { podman --cgroup-manager=cgroupfs --events-backend=file --runtime=runc "$@"; }

version=$("$py" -m release.version show)
"$py" -m release.version check >&2 || { log "the version strings disagree (above): make version VERSION=$version"; exit 1; }
# Every supported Kubernetes minor passed `make compat` on this commit (docs/releasing.md).
if [ "${RELEASE_REQUIRE_COMPAT:-1}" = 1 ]; then
  "$py" -m release.compat check || { log "refusing to publish: run make compat on this commit first (above)"; exit 1; }
else
  log "RELEASE_REQUIRE_COMPAT=0: publishing without the compatibility check (a rehearsal, not a release)"
fi
tools=$(cluster/release-tools.sh)
cosign=$tools/cosign
image_repo=$registry/kopf-operators
chart_repo=$registry/charts
RELEASE_DIR=$out REGISTRY=$registry release/registry.sh up >/dev/null
mkdir -p "$out/sbom"
started=$SECONDS

# The signing key: cosign's own format (an encrypted private key and its public half), made once per machine.
if [ ! -s "$key_dir/cosign.key" ]; then
  mkdir -p "$key_dir"; chmod 700 "$key_dir"
  log "no signing key in $key_dir: making one (cosign generate-key-pair)"
  (cd "$key_dir" && "$cosign" generate-key-pair >&2)
fi
key=$key_dir/cosign.key pub=$key_dir/cosign.pub
# Local plain-HTTP registry; no transparency log (it would be the public Rekor): see README, "Releases".
sign_flags=(--key "$key" --tlog-upload=false --allow-http-registry --yes)

# 1-2. One image per platform, smoke-started, its SBOM copied out.
list=localhost/kopf-operators-release:$version
if pod manifest exists "$list" 2>/dev/null; then pod manifest rm "$list" >&2; fi
pod manifest create "$list" >&2
for arch in $platforms; do
  image=localhost/kopf-operators:$version-$arch
  log "building $image (linux/$arch)"
  ARCH=$arch VERSION=$version cluster/image.sh build "$image" >/dev/null
  # The machine's hard limits are below podman's defaults (as in cluster/image.sh).
  machine=$(pod run --rm --network=none --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
    --platform "linux/$arch" "$image" python -c '
import glob, platform, runpy
import kopf, kopf_operators
for path in sorted(glob.glob("operators/*.py")):
    runpy.run_path(path)  # registers its handlers, as `kopf run` does
print(platform.machine())')
  log "$image started: python on $machine imports Kopf, the package and every operator file"
  cid=$(pod create --platform "linux/$arch" "$image")
  pod cp "$cid:/usr/share/doc/kopf-operators/sbom.cdx.json" "$out/sbom/kopf-operators-$version-$arch.cdx.json"
  pod rm "$cid" >/dev/null
  pod manifest add "$list" "containers-storage:$image" >&2
done

# Push the list and every image (by digest), then read the index back: its digest and each platform's.
log "pushing $image_repo:$version"
pod manifest push --all --format oci --tls-verify=false --digestfile "$out/index.digest" \
  "$list" "docker://$image_repo:$version" >&2
digest=$(cat "$out/index.digest")
index=$(curl -fsS -H "Accept: application/vnd.oci.image.index.v1+json" "http://$registry/v2/kopf-operators/manifests/$digest")
ref=$image_repo:$version@$digest
log "released $ref"

# 3. Signatures: the index and (recursively) every image in it; each SBOM attested to its own image.
"$cosign" sign "${sign_flags[@]}" --recursive "$image_repo@$digest" >&2
for arch in $platforms; do
  arch_digest=$(echo "$index" | "$py" -c 'import json, sys
(d,) = [m["digest"] for m in json.load(sys.stdin)["manifests"] if m["platform"]["architecture"] == sys.argv[1]]
print(d)' "$arch")
  "$cosign" attest "${sign_flags[@]}" --type cyclonedx \
    --predicate "$out/sbom/kopf-operators-$version-$arch.cdx.json" "$image_repo@$arch_digest" >&2
  log "signed linux/$arch $arch_digest and attested its SBOM"
done

# The public key, published beside the release (a blob of the registry), for Artifact Hub's signKey.
pub_digest=sha256:$(sha256sum "$pub" | cut -d' ' -f1)
upload=$(curl -fsS -X POST -D - -o /dev/null "http://$registry/v2/kopf-operators-signkey/blobs/uploads/" \
  | sed -n 's/^[Ll]ocation: *\(.*\)\r$/\1/p')
[ -n "$upload" ] || { log "the registry gave no upload location for the public key"; exit 1; }
case "$upload" in http*) ;; *) upload=http://$registry$upload ;; esac
case "$upload" in *\?*) sep='&' ;; *) sep='?' ;; esac
curl -fsS -X PUT -H "Content-Type: application/octet-stream" --data-binary "@$pub" \
  "$upload${sep}digest=$pub_digest" -o /dev/null
key_url=http://$registry/v2/kopf-operators-signkey/blobs/$pub_digest

# 4. The chart, from a copy of the tree that names the released image; pushed and signed.
helm="$(cluster/build.sh)/helm"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tree"
cp -a release pyproject.toml CHANGELOG.md README.md charts manifests "$stage/tree/"
(cd "$stage/tree" && "$py" -m release.version image "$ref" && "$py" -m release.version signkey "$key_url" "$pub" \
  && "$py" -m release.version check >&2)
cp "$pub" "$stage/tree/release/cosign.pub"
values=$stage/tree/charts/kopf-operators/values.yaml
"$py" - "$values" "$image_repo" "$version@$digest" <<'PY'
import re, sys
path, repository, tag = sys.argv[1:]
text = open(path).read()
new, n = re.subn(r"^(image:\n  repository: ).*\n  tag: .*$", rf'\g<1>{repository}\n  tag: "{tag}"', text, flags=re.M)
if n != 1:
    sys.exit(f"{path}: no image.repository/image.tag lines to set")
open(path, "w").write(new)
PY
"$helm" lint "$stage/tree/charts/kopf-operators" >&2
"$helm" package "$stage/tree/charts/kopf-operators" --destination "$out" >&2
chart_tgz=$out/kopf-operators-$version.tgz
# Not `| tee /dev/stderr`: when stderr is a file, tee reopens it truncated and the log so far is lost.
pushed=$("$helm" push "$chart_tgz" "oci://$chart_repo" --plain-http 2>&1) || { echo "$pushed" >&2; log "helm push failed"; exit 1; }
echo "$pushed" >&2
chart_digest=$(echo "$pushed" | sed -n 's/^Digest: *//p')
[ -n "$chart_digest" ] || { log "helm push printed no digest"; exit 1; }
"$cosign" sign "${sign_flags[@]}" "$chart_repo/kopf-operators@$chart_digest" >&2
log "chart oci://$chart_repo/kopf-operators --version $version ($chart_digest) pushed and signed"

# 5. The tree records what was released.
if [ "$write_tree" = 1 ]; then
  cp "$stage/tree/manifests/kustomization.yaml" manifests/kustomization.yaml
  cp "$stage/tree/charts/kopf-operators/Chart.yaml" charts/kopf-operators/Chart.yaml
  cp "$pub" release/cosign.pub
  log "wrote the release into the tree: manifests/kustomization.yaml, Chart.yaml's annotations, release/cosign.pub"
fi
log "done in $((SECONDS - started))s"
echo "image=$ref"
echo "chart=oci://$chart_repo/kopf-operators"
echo "chart_digest=$chart_digest"
echo "version=$version"
echo "public_key=$pub"
