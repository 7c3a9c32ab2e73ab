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
	revert-agents \
	peers-test reloader-e2e reloader-bench

help: ## list the verbs
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

$(BIN)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -U pip
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

setup: $(BIN)/.installed ## create .venv with the package and its dev tools

cluster: ## start the local control plane and its real node (built on first use); no-op when up
	@cluster/cluster.sh up

cluster-down: ## stop the local cluster; remove the real node's host state; free its ports
	@cluster/cluster.sh down

image: ## build the operator image with podman, no Docker, no registry (IMAGE=name:tag)
	@cluster/image.sh build $(IMAGE)

# The cluster `install`, `uninstall`, `run` and `deploy` act on: $KUBECONFIG or the current
# context when one answers, else the local control plane (started if needed).
TARGET_KUBECONFIG = $(shell cluster/target-kubeconfig.sh)

install: ## apply the CRDs to the target cluster
	KUBECONFIG=$(TARGET_KUBECONFIG) kubectl apply --server-side -f manifests/crds/
	KUBECONFIG=$(TARGET_KUBECONFIG) kubectl wait --for=condition=Established --timeout=60s -f manifests/crds/

uninstall: ## remove the CRDs (and so every custom resource) from the target cluster
	@cluster/uninstall.sh

run: setup ## install the CRDs and run all four operators against the target cluster
	@export KUBECONFIG=$(TARGET_KUBECONFIG) && \
	kubectl apply --server-side -f manifests/crds/ && \
	kubectl wait --for=condition=Established --timeout=60s -f manifests/crds/ && \
	exec $(BIN)/kopf-operators run $(RUN_ARGS) operators/*.py

unit: setup ## unit tests only (no cluster)
	$(BIN)/pytest tests/unit

test: setup ## everything: set-up, local cluster, lint, unit and end-to-end tests
	$(BIN)/ruff check .
	$(BIN)/mypy
	@cluster/cluster.sh up
	@cluster/monitoring.sh >/dev/null  # tests/e2e/test_chart.py's CRDs and promtool, built once (cached)
	$(BIN)/pytest

# BENCH_ARGS e.g. "--quick", "--only scale peers", "--operators operators/immortal.py" (or OPERATOR_FILES=...).
# The Go peers are built from source by the run itself (testsupport/peer_build.py; see bench/README.md).
bench: setup ## benchmarks (ours, floor, Go peers) on the local cluster -> bench/results.{json,md}
	@cluster/cluster.sh up
	$(BIN)/python -m bench.run $(BENCH_ARGS)

reloader-e2e: setup ## stakater Reloader's own e2e suites against our re-roller (needs Reloader's fetched source; RACE_FREE=1: their prior-value race patched out)
	@cluster/cluster.sh up
	KUBECONFIG=$(LOCAL_KUBECONFIG) $(BIN)/python -m tests.reloader_e2e $(if $(filter 1,$(RACE_FREE)),--race-free) $(SUITES)

reloader-bench: setup ## re-roller vs stakater Reloader (built from source): isolated ConfigMap edit -> rollout
	@cluster/cluster.sh up
	$(BIN)/python -m bench.reloader_bench

peers-test: setup ## tests side by side with Go peers built from source (their sources: docs/blackadder.md)
	@cluster/cluster.sh up
	$(BIN)/pytest -m peers

lint: setup ## ruff, mypy
	$(BIN)/ruff check .
	$(BIN)/mypy

HELM = $(shell cluster/build.sh)/helm
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
	@export KUBECONFIG=$(TARGET_KUBECONFIG) && \
	if kubectl get crd chaosagents.blackadder.io >/dev/null 2>&1; then \
	  kubectl delete chaosagents.blackadder.io --all --wait=true --timeout=$(REVERT_TIMEOUT); \
	else echo "no ChaosAgent CRD: nothing to revert"; fi; \
	if kubectl get crd tenantchaosagents.blackadder.io >/dev/null 2>&1; then \
	  kubectl delete tenantchaosagents.blackadder.io --all -A --wait=true --timeout=$(REVERT_TIMEOUT); fi

undeploy: ## delete the ChaosAgents (the operator reverts them), then uninstall the Helm release (CRDs stay)
	@RELEASE=$(RELEASE) DEPLOY_NAMESPACE=$(DEPLOY_NAMESPACE) cluster/undeploy.sh
