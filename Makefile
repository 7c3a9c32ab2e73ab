# Verbs follow kubebuilder's conventions: cluster, install, run, test, deploy.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
BIN := $(VENV)/bin
CLUSTER_DIR ?= $(CURDIR)/.cluster
export CLUSTER_DIR
LOCAL_KUBECONFIG := $(CLUSTER_DIR)/kubeconfig
# Arguments for `kopf-operators run` (Kopf's `kopf run`, patched) in `make run` (the operator files are always operators/*.py).
RUN_ARGS ?= --all-namespaces --verbose

.PHONY: help setup cluster cluster-down image install uninstall run test unit lint bench manifests deploy undeploy \
	soak revert-agents version version-check lock deps-check release release-e2e registry registry-down \
	peers-test reloader-e2e reloader-bench reference compat compat-upgrade

help: ## list the verbs
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

# Only what the lock names, verified by its hashes (pip's --require-hashes), so every machine and CI gets
# the same versions; the package itself goes in editable without touching the index (no build isolation:
# its build backend is in the lock too).
PIP := $(BIN)/pip --disable-pip-version-check
$(BIN)/.installed: pyproject.toml requirements-dev.lock
	python3 -m venv $(VENV)
	$(PIP) install -q --require-hashes --no-deps -r requirements-dev.lock
	$(PIP) install -q --no-deps --no-build-isolation -e .
	$(PIP) check
	touch $@

setup: $(BIN)/.installed ## create .venv with the package and its dev tools

cluster: ## start the local control plane and its real node (built on first use); no-op when up
	@cluster/cluster.sh up

cluster-down: ## stop the local cluster; remove the real node's host state; free its ports
	@cluster/cluster.sh down

image: ## build the operator image with podman, no Docker, no registry (IMAGE=name:tag)
	@cluster/image.sh build $(IMAGE)

# The cluster `install`, `uninstall`, `run` and `deploy` act on: $KUBECONFIG or the current
# context when one answers, else the local control plane (started if needed). Another cluster than
# the local one is named and confirmed first (CONFIRM_CLUSTER=no skips the question, for scripts).
# A recipe line, not $(shell ...): a refusal must stop the recipe, never leave KUBECONFIG empty.
TARGET = target=$$(cluster/target-kubeconfig.sh) && export KUBECONFIG=$$target

install: ## apply the CRDs to the target cluster
	@$(TARGET) && \
	kubectl apply --server-side -f manifests/crds/ && \
	kubectl wait --for=condition=Established --timeout=60s -f manifests/crds/

uninstall: ## remove the CRDs (and so every custom resource) from the target cluster
	@cluster/uninstall.sh

run: setup ## install the CRDs and run all four operators against the target cluster
	@$(TARGET) && \
	kubectl apply --server-side -f manifests/crds/ && \
	kubectl wait --for=condition=Established --timeout=60s -f manifests/crds/ && \
	exec $(BIN)/kopf-operators run $(RUN_ARGS) operators/*.py

unit: setup ## unit tests only (no cluster)
	$(BIN)/pytest tests/unit

# The suite runs on TEST_WORKERS pytest-xdist workers, each on a local cluster of its own (tests/scheduling.py).
# The monitoring tools (the chart's tests' CRDs, promtool, Prometheus; cached) build beside the tests, at
# low priority: the modules that need them run late and wait for the build; its failure fails the target.
TEST_WORKERS ?= 2
test: setup ## everything: set-up, local cluster, lint, unit and end-to-end tests
	$(BIN)/ruff check .
	$(BIN)/mypy
	@cluster/cluster.sh up
	@mkdir -p $(CLUSTER_DIR); \
	nice -n 10 cluster/monitoring.sh >$(CLUSTER_DIR)/monitoring.log 2>&1 & monitoring=$$!; \
	$(BIN)/pytest -n $(TEST_WORKERS) --durations=10; tests=$$?; \
	if ! wait $$monitoring; then echo "cluster/monitoring.sh failed:" >&2; cat $(CLUSTER_DIR)/monitoring.log >&2; exit 1; fi; \
	exit $$tests

# MINOR=1.35 (or v1.35.4): one supported minor; empty or "all": each of versions.env's COMPAT_VERSIONS.
compat: setup ## the compatibility subset of the e2e tests on each supported Kubernetes minor (own build, own cluster) -> .compat/
	cluster/compat.sh $(MINOR)

# Not in `make test` (CI): the next minor's build, the machine's real node (root) and a cluster of its own.
compat-upgrade: setup ## a live cluster with objects of all four operators upgraded to the next supported minor -> .compat/
	cluster/compat.sh upgrade

# BENCH_ARGS e.g. "--quick", "--only scale peers", "--operators operators/immortal.py" (or OPERATOR_FILES=...).
# The Go peers are built from source by the run itself (testsupport/peer_build.py; see bench/README.md).
bench: setup ## benchmarks (ours, floor, Go peers) on the local cluster -> .bench/results.{json,md}
	@cluster/cluster.sh up
	$(BIN)/python -m bench.run $(BENCH_ARGS)

# BENCH_ARGS e.g. "--quick" (10 minutes), "--minutes 240", "--ic-rate 60 --takeover-minutes 0" (bench/README.md).
soak: setup ## an hour of mixed churn on two replicas, sampled from inside -> .bench/soak.{json,md} (not in CI)
	@cluster/cluster.sh up
	$(BIN)/python -m bench.soak $(BENCH_ARGS)

reloader-e2e: setup ## stakater Reloader's own e2e suites against our re-roller (needs Reloader's fetched source; RACE_FREE=1: their prior-value race patched out)
	@cluster/cluster.sh up
	KUBECONFIG=$(LOCAL_KUBECONFIG) $(BIN)/python -m tests.reloader_e2e $(if $(filter 1,$(RACE_FREE)),--race-free) $(SUITES)

reloader-bench: setup ## re-roller vs stakater Reloader (built from source): isolated ConfigMap edit -> rollout
	@cluster/cluster.sh up
	$(BIN)/python -m bench.reloader_bench

peers-test: setup ## tests side by side with Go peers built from source (their sources: docs/blackadder.md)
	@cluster/cluster.sh up
	$(BIN)/pytest -m peers

reference: setup ## regenerate docs/reference/ from the CRDs, chart values, environment variables and metrics
	$(BIN)/python -m testsupport.reference

lint: setup ## ruff, mypy
	$(BIN)/ruff check .
	$(BIN)/mypy

HELM = $(shell cluster/helm.sh)
KUBE_VERSION = $(shell sed -n "s/^KUBERNETES_VERSION=v//p" cluster/versions.env)
CHART := charts/kopf-operators
RELEASE ?= kopf-operators
DEPLOY_NAMESPACE ?= kopf-operators

manifests: ## regenerate manifests/operator.yaml from the Helm chart (the one source)
	set -o pipefail; $(HELM) template $(RELEASE) $(CHART) --namespace $(DEPLOY_NAMESPACE) --kube-version $(KUBE_VERSION) \
	  --skip-crds | cluster/manifest-header.sh > manifests/operator.yaml.new
	mv manifests/operator.yaml.new manifests/operator.yaml

deploy: ## install the Helm chart into the target cluster (IMAGE=repo:tag; local: the real node, `make image deploy`)
	@RELEASE=$(RELEASE) DEPLOY_NAMESPACE=$(DEPLOY_NAMESPACE) IMAGE=$(IMAGE) cluster/deploy.sh

# Before `make undeploy`/`helm uninstall` (and before `make uninstall`): with the operator still running,
# every ChaosAgent is deleted and first reverts what it changed (revertOnDelete); a revert refused
# REVERT_ATTEMPTS times lets go and keeps its ledger Secret (docs/blackadder.md, "Uninstalling").
REVERT_TIMEOUT ?= 180s
revert-agents: ## delete every ChaosAgent while the operator runs (each reverts first); run before undeploy
	@$(TARGET) && \
	if kubectl get crd chaosagents.blackadder.io >/dev/null 2>&1; then \
	  kubectl delete chaosagents.blackadder.io --all --wait=true --timeout=$(REVERT_TIMEOUT); \
	else echo "no ChaosAgent CRD: nothing to revert"; fi; \
	if kubectl get crd tenantchaosagents.blackadder.io >/dev/null 2>&1; then \
	  kubectl delete tenantchaosagents.blackadder.io --all -A --wait=true --timeout=$(REVERT_TIMEOUT); fi

undeploy: ## delete the ChaosAgents (the operator reverts them), then uninstall the Helm release (CRDs stay)
	@RELEASE=$(RELEASE) DEPLOY_NAMESPACE=$(DEPLOY_NAMESPACE) cluster/undeploy.sh

# One version (pyproject.toml's), written everywhere by release/version.py; tests/unit/test_release.py fails
# when two places disagree.
version: setup ## write VERSION=x.y.z into every place it appears (pyproject, Chart.yaml, manifests, CHANGELOG)
	@[ -n "$(VERSION)" ] || { echo "usage: make version VERSION=x.y.z" >&2; exit 2; }
	$(BIN)/python -m release.version set $(VERSION)
	$(MAKE) manifests
	$(BIN)/python -m release.version check

version-check: setup ## fail unless every version string agrees
	$(BIN)/python -m release.version check

# The lock files (hashes of every file of every pinned version, for every platform: the arm64 image
# installs from the same lock). Re-run after changing a dependency in pyproject.toml; the dev lock takes
# its runtime pins from requirements.lock, so the tests run what the image ships.
UV_COMPILE = $(BIN)/uv pip compile -q --universal --python-version 3.11 --generate-hashes --custom-compile-command "make lock"
lock: setup ## re-resolve requirements.lock, requirements-build.lock and requirements-dev.lock (hashes) from pyproject.toml
	$(UV_COMPILE) pyproject.toml -o requirements.lock
	$(UV_COMPILE) requirements-build.in -c requirements.lock -o requirements-build.lock
	$(UV_COMPILE) pyproject.toml requirements-build.in --extra dev -c requirements.lock -c requirements-build.lock -o requirements-dev.lock

deps-check: setup ## newest allowed dependencies (Kopf up to <2) in a scratch venv + the unit tests of Kopf's internals: is a bump safe?
	@release/deps-check.sh

# The release (release/release.sh): images for linux/amd64 and linux/arm64 under one manifest list, an
# SBOM each, cosign signatures, the chart by Helm's OCI support, pushed to REGISTRY (default: the local
# registry on 127.0.0.1:5000, started here). With VERSION=x.y.z, `make version` first.
REGISTRY ?= 127.0.0.1:5000
export REGISTRY
release: setup ## build, sign and push images (amd64, arm64), SBOMs and the chart to REGISTRY; VERSION=x.y.z sets it first
	@if [ -n "$(VERSION)" ] && [ "$(VERSION)" != "$$($(BIN)/python -m release.version show)" ]; then \
	  $(MAKE) version VERSION=$(VERSION); fi
	release/release.sh

registry: ## start the local release registry on REGISTRY (127.0.0.1 only)
	@release/registry.sh up

registry-down: ## stop the local release registry
	@release/registry.sh down

# Not in `make test` (CI): README, "Releases" says why. Needs the real node (REAL_NODE=1).
release-e2e: setup ## release to the local registry, then verify and install it from there on the real node
	@cluster/cluster.sh up
	$(BIN)/pytest -m release tests/e2e/test_release.py
