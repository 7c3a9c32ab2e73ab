# syntax=docker/dockerfile:1
# Multi-stage: build a wheel and its dependencies in a virtualenv, copy only the venv and the
# operator files into a slim runtime that runs as a non-root user on a read-only root filesystem.
# BASE_IMAGE: the official pinned image by default; cluster/image.sh (no registry) passes a local
# Debian bookworm + Python 3.11 image made with debootstrap.
ARG BASE_IMAGE=python:3.11.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
# Optional CA bundle for pip (e.g. a TLS-inspecting proxy): cluster/image.sh mounts the host's bundle
# for the build only and points PIP_CERT at it; unset, pip uses its own.
ARG PIP_CERT
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only the locked versions, each file checked against the lock's hashes (requirements.lock: `make lock`);
# the package's wheel is built without build isolation by the locked setuptools in a venv of its own,
# then installed without dependencies, so nothing unpinned reaches the image.
COPY requirements.lock requirements-build.lock ./
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-compile --require-hashes --no-deps -r requirements.lock \
 && python -m venv /opt/build \
 && /opt/build/bin/pip install --require-hashes --no-deps -r requirements-build.lock
COPY pyproject.toml README.md LICENSE ./
COPY kopf_operators/ kopf_operators/
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation -w /tmp/wheel . \
 && /opt/venv/bin/pip install --no-compile --no-deps /tmp/wheel/*.whl \
 && /opt/venv/bin/pip check \
 && /opt/venv/bin/python -c "import kopf, kubernetes, pykube, lorem, munch, kopf_operators.core.conventions"
# The image's SBOM (CycloneDX): every Python distribution in the shipped venv, with versions and licences,
# read from the venv itself by cyclonedx-bom (the build venv's; not shipped). The release attests it.
RUN /opt/build/bin/cyclonedx-py environment --pyproject pyproject.toml --mc-type application \
      --output-reproducible --of JSON -o /opt/sbom.cdx.json /opt/venv/bin/python

FROM ${BASE_IMAGE} AS runtime
# VERSION: the release's version (release/release.sh passes the one in pyproject.toml).
ARG VERSION=unreleased
LABEL org.opencontainers.image.title="kopf-operators" \
      org.opencontainers.image.description="Four Kubernetes operators in one Kopf process: immortal containers, Copyrator, Blackadder, re-roller." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# Not "operator": Debian's base-passwd already has that group (gid 37), so groupadd would exit 9.
RUN groupadd --system --gid 10001 kopf \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin kopf
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY operators/ operators/
COPY LICENSE /usr/share/doc/kopf-operators/LICENSE
COPY --from=build /opt/sbom.cdx.json /usr/share/doc/kopf-operators/sbom.cdx.json
USER 10001:10001
EXPOSE 8080 9090
# A shell form on purpose: the glob must expand (an exec-form CMD would pass "operators/*.py" literally).
# The Helm chart and manifests/ override the arguments to pick operators and namespaces.
CMD ["sh", "-c", "exec kopf-operators run --all-namespaces --liveness=http://0.0.0.0:8080/healthz operators/*.py"]
