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
RUN python -m venv /opt/venv
COPY pyproject.toml README.md ./
COPY kopf_operators/ kopf_operators/
RUN /opt/venv/bin/pip install --no-compile . \
 && /opt/venv/bin/python -c "import kopf, kubernetes, pykube, lorem, munch, kopf_operators.core.conventions"

FROM ${BASE_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# Not "operator": Debian's base-passwd already has that group (gid 37), so groupadd would exit 9.
RUN groupadd --system --gid 10001 kopf \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin kopf
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY operators/ operators/
USER 10001:10001
EXPOSE 8080 9090
# A shell form on purpose: the glob must expand (an exec-form CMD would pass "operators/*.py" literally).
# The Helm chart and manifests/ override the arguments to pick operators and namespaces.
CMD ["sh", "-c", "exec kopf-operators run --all-namespaces --liveness=http://0.0.0.0:8080/healthz operators/*.py"]
