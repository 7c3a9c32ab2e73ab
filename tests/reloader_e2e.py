"""stakater Reloader's own end-to-end suites, run against our re-roller (issue #13): ``make reloader-e2e``.

    .venv/bin/python -m tests.reloader_e2e [core annotations flags advanced]   # exit 1 on any failure
    .venv/bin/python -m tests.reloader_e2e --against=reloader core             # the same, Reloader itself

What it does, per suite:
1. builds the suite's Ginkgo test binary from Reloader's source (testsupport/peer_build.py: the bare git
   directory left by the search tool's ``fetch github:stakater/Reloader``; the Go module proxy
   refuses Reloader's module, so CI cannot build it and this is a make target, not a pytest test);
2. puts a ``helm`` shim first on PATH: the suite installs Reloader with ``helm upgrade --install``
   (on the local KWOK cluster that pod is only marked Running, nothing executes it), and the shim
   passes the call to the real helm, then (re)starts OUR operator with Reloader's Helm values
   mapped onto our options (``reloader.autoReloadAll`` -> REROLLER_AUTO_RELOAD_ALL, ...); an
   uninstall stops our operator. So whatever rolls the workloads is our operator, configured as
   the suite configured Reloader;
3. runs the binary with ``-ginkgo.label-filter='!argo && !csi && !openshift'`` (the ``argo`` suite:
   ``'!csi && !openshift'``) and reports passed, failed and skipped specs (from Ginkgo's JSON
   report), with each failure's message.

Values with no counterpart are reported, and the specs needing them fail honestly.

Argo Rollouts: before the first suite, the CRDs of argoproj/argo-rollouts are applied from the bare
git directory the search tool's ``fetch github:argoproj/argo-rollouts`` leaves
(``ARGO_ROLLOUTS_GIT_DIR``, its ``manifests/crds/``; data, never committed here); without it the run
stops and says so. No Argo Rollouts controller runs here (as no kubelet runs the KWOK pods): a
stand-in in this harness copies each Rollout's ``spec.replicas`` into its status as ready, which is
what the suites wait for before they edit a ConfigMap. The CSI suite stays out: it needs a CSI driver
and Vault.

``--against=reloader`` runs the suite the same way with Reloader's own binary (built from the same
source, started by the shim with the flags its Helm values mean) in place of our operator: the
reference for which failures are the suite's own (timing races on this machine) and which are ours.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from tests.kube import wait_for
from testsupport import peer_build
from testsupport.launcher import KopfProcess
from testsupport.paths import KUBECONFIG, REPO, helm_binary

SUITES = ("core", "annotations", "flags", "advanced", "argo")
LABEL_FILTER = "!argo && !csi && !openshift"
ARGO_LABEL_FILTER = "!csi && !openshift"
ARGO_ROLLOUTS_GIT_DIR = Path(os.environ.get("ARGO_ROLLOUTS_GIT_DIR", "/work/.mirror/argoproj+argo-rollouts/repo"))
SETTLE_SECONDS = 3.0
# Reloader's Helm values -> our environment (docs/reroller.md, README's table).
VALUE_ENV = {
    "reloader.autoReloadAll": "REROLLER_AUTO_RELOAD_ALL",
    "reloader.reloadOnCreate": "REROLLER_RELOAD_ON_CREATE",
    "reloader.reloadOnDelete": "REROLLER_RELOAD_ON_DELETE",
    "reloader.namespaceSelector": "REROLLER_NAMESPACE_SELECTOR",
    "reloader.ignoreNamespaces": "REROLLER_NAMESPACES_TO_IGNORE",
    "reloader.resourceLabelSelector": "REROLLER_RESOURCE_LABEL_SELECTOR",
    "reloader.reloadStrategy": "REROLLER_RELOAD_STRATEGY",
    "reloader.isArgoRollouts": "REROLLER_ARGO_ROLLOUTS",
    "reloader.enableMetricsByNamespace": "REROLLER_METRICS_BY_NAMESPACE",
}
# Values that change nothing for us (no such component here, or our behaviour already).
NEUTRAL = {"image.repository", "image.tag", "image.pullPolicy", "reloader.enableCSIIntegration"}

SHIM = """#!/bin/sh
# helm shim of tests/reloader_e2e.py: pass the call on, then let the harness (re)start our operator.
"{real}" "$@" || exit $?
case "$1" in upgrade|install|uninstall) ;; *) exit 0 ;; esac
id=$(date +%s%N)
printf '%s\\n' "$@" > "{control}/request-$id.tmp" && mv "{control}/request-$id.tmp" "{control}/request-$id"
i=0
while [ ! -e "{control}/done-$id" ]; do
  i=$((i+1)); [ $i -gt 1200 ] && echo "helm shim: the harness did not answer" >&2 && exit 1
  sleep 0.05
done
exit 0
"""


def helm_values(args: list[str]) -> tuple[str, str, dict[str, str]]:
    """(command, namespace, --set values) of a helm call."""
    command = args[0] if args else ""
    namespace = ""
    values: dict[str, str] = {}
    for i, arg in enumerate(args):
        if arg in ("--namespace", "-n") and i + 1 < len(args):
            namespace = args[i + 1]
        if arg == "--set" and i + 1 < len(args):
            key, _, value = args[i + 1].partition("=")
            values[key] = value
    return command, namespace, values


def operator_options(namespace: str, values: dict[str, str]) -> tuple[dict[str, str], list[str], list[str]]:
    """Our env, our kopf run arguments and the unmapped values, for Reloader's Helm values."""
    env: dict[str, str] = {}
    unmapped: list[str] = []
    ignored_types = [t for key, t in (("reloader.ignoreJobs", "jobs"), ("reloader.ignoreCronJobs", "cronjobs"))
                     if values.get(key) == "true"]
    if ignored_types:
        env["REROLLER_IGNORED_WORKLOAD_TYPES"] = ",".join(ignored_types)
    for key, kind in (("reloader.ignoreSecrets", "secrets"), ("reloader.ignoreConfigMaps", "configmaps")):
        if values.get(key) == "true":
            env["REROLLER_RESOURCES_TO_IGNORE"] = kind
    handled = {"reloader.watchGlobally", "reloader.namespaces", "reloader.ignoreJobs",
               "reloader.ignoreCronJobs", "reloader.ignoreSecrets", "reloader.ignoreConfigMaps", *NEUTRAL}
    for key, value in values.items():
        if key in VALUE_ENV:
            env[VALUE_ENV[key]] = value
        elif key not in handled:
            unmapped.append(f"{key}={value}")
    # watchGlobally=false: Reloader watches its own namespace only, or reloader.namespaces plus its own.
    scope = ["--all-namespaces"]
    if values.get("reloader.watchGlobally") == "false":
        names = [n for n in values.get("reloader.namespaces", "").strip("{}").split(",") if n]
        scope = [f"--namespace={n}" for n in dict.fromkeys([*names, namespace])]
    return env, scope, unmapped


def reloader_flags(namespace: str, values: dict[str, str]) -> list[str]:
    """Reloader's own command-line flags for its Helm values (what its chart does with them)."""
    flags = [f"--reload-strategy={values.get('reloader.reloadStrategy', 'annotations')}"]
    for key, flag in (("reloader.autoReloadAll", "auto-reload-all"), ("reloader.reloadOnCreate", "reload-on-create"),
                      ("reloader.reloadOnDelete", "reload-on-delete")):
        if values.get(key) == "true":
            flags.append(f"--{flag}=true")
    for key, flag in (("reloader.namespaceSelector", "namespace-selector"),
                      ("reloader.ignoreNamespaces", "namespaces-to-ignore"),
                      ("reloader.resourceLabelSelector", "resource-label-selector")):
        if values.get(key):
            flags.append(f"--{flag}={values[key]}")
    for key, kind in (("reloader.ignoreSecrets", "secrets"), ("reloader.ignoreConfigMaps", "configMaps")):
        if values.get(key) == "true":
            flags.append(f"--resources-to-ignore={kind}")
    types = [t for key, t in (("reloader.ignoreJobs", "jobs"), ("reloader.ignoreCronJobs", "cronjobs"))
             if values.get(key) == "true"]
    if types:
        flags.append(f"--ignored-workload-types={','.join(types)}")
    if values.get("reloader.watchGlobally") == "false":
        # Reloader's chart adds its own (release) namespace to reloader.namespaces.
        names = [n for n in values.get("reloader.namespaces", "").strip("{}").split(",") if n]
        flags.append(f"--namespaces={','.join(dict.fromkeys([*names, namespace]))}")
    if values.get("reloader.isArgoRollouts") == "true":
        flags.append("--is-Argo-Rollouts=true")
    return flags


def install_argo_rollouts_crds(git_dir: Path = ARGO_ROLLOUTS_GIT_DIR) -> tuple[str, list[str]]:
    """Apply Argo Rollouts' CRDs from the fetched source (its manifests/crds/): the commit applied and
    the CRDs this created (those already there, say a real Argo Rollouts install, are left as found)."""
    if not (git_dir / "HEAD").exists():
        raise SystemExit(f"no Argo Rollouts source at {git_dir}: fetch github:argoproj/argo-rollouts first "
                         f"(or set ARGO_ROLLOUTS_GIT_DIR); its manifests/crds/ are what the argo specs need")
    commit = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    files = subprocess.run(["git", "--git-dir", str(git_dir), "ls-tree", "--name-only", "HEAD", "manifests/crds/"],
                           capture_output=True, text=True, check=True).stdout.split()
    existing = set(subprocess.run(["kubectl", "get", "crd", "-o", "name"], capture_output=True, text=True,
                                  check=True).stdout.split())
    created: list[str] = []
    for path in files:
        if not path.endswith("-crd.yaml"):
            continue
        text = subprocess.run(["git", "--git-dir", str(git_dir), "show", f"HEAD:{path}"], capture_output=True,
                              text=True, check=True).stdout
        name = f"customresourcedefinition.apiextensions.k8s.io/{yaml.safe_load(text)['metadata']['name']}"
        if name in existing:
            continue
        created.append(name)
        subprocess.run(["kubectl", "apply", "--server-side", "--force-conflicts", "-f", "-"], input=text, text=True,
                       check=True, capture_output=True)
    wait_for(lambda: subprocess.run(["kubectl", "wait", "--for=condition=Established", "--timeout=10s",
                                     "crd/rollouts.argoproj.io"], capture_output=True).returncode == 0,
             timeout=60, interval=1, what="the Rollout CRD established")
    return commit, created


class RolloutStatusStandIn:
    """What the Argo Rollouts controller would report once the pods are up: readyReplicas =
    spec.replicas (no controller and no kubelet run here, as KWOK marks pods Running). Nothing else."""

    def __init__(self) -> None:
        self._stop = False
        self._thread: Any = None

    def start(self) -> None:
        import threading
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import kubernetes
        kubernetes.config.load_kube_config()
        custom = kubernetes.client.CustomObjectsApi()
        while not self._stop:
            try:
                stream = kubernetes.watch.Watch().stream(custom.list_cluster_custom_object, "argoproj.io", "v1alpha1",
                                                         "rollouts", timeout_seconds=30)
                for event in stream:
                    obj = event["object"]
                    if event["type"] == "DELETED" or self._stop:
                        continue
                    replicas = int((obj.get("spec") or {}).get("replicas", 1))
                    status = obj.get("status") or {}
                    if status.get("readyReplicas") == replicas and status.get("replicas") == replicas:
                        continue
                    meta = obj["metadata"]
                    with contextlib.suppress(kubernetes.client.ApiException):  # gone meanwhile
                        custom.patch_namespaced_custom_object_status(
                            "argoproj.io", "v1alpha1", meta["namespace"], "rollouts", meta["name"],
                            {"status": {"replicas": replicas, "readyReplicas": replicas,
                                        "availableReplicas": replicas, "updatedReplicas": replicas}})
            except Exception:  # a watch error: start again
                time.sleep(1)

    def stop(self) -> None:
        self._stop = True


class Harness:
    def __init__(self, workdir: Path, against: str = "ours") -> None:
        self.against = against
        self.workdir = workdir
        self.control = workdir / "control"
        self.control.mkdir(parents=True, exist_ok=True)
        self.reloader: peer_build.PeerProcess | None = None
        self.operator: KopfProcess | None = None
        self.log_path = workdir / "operator.log"
        self.unmapped: set[str] = set()
        self.kubeconfig = Path(os.environ.get("KUBECONFIG", str(KUBECONFIG)))

    def start_reloader(self, flags: list[str]) -> None:
        self.stop_operator()
        self.reloader = peer_build.PeerProcess(peer_build.build("reloader").binary, flags,
                                               {"KUBECONFIG": str(self.kubeconfig)}, peer_build.RELOADER_HEALTH_URL,
                                               self.log_path)
        self.reloader.start()
        time.sleep(3)  # its informers' initial listing (live before they listed)

    def start_operator(self, env: dict[str, str], scope: list[str]) -> None:
        self.stop_operator()
        namespaces = [arg.split("=", 1)[1] for arg in scope if arg.startswith("--namespace=")]
        self.operator = KopfProcess([str(REPO / "operators" / "reroller.py")], self.kubeconfig, self.log_path, env,
                                    namespaces=namespaces, log_env=True)
        self.operator.start(timeout=60)
        # Kopf's liveness answers before its initial listings are in; Reloader's chart waits for its
        # informers' sync. Give ours the same head start before the suite goes on.
        time.sleep(SETTLE_SECONDS)

    def stop_operator(self) -> None:
        """Stop whichever runs: our operator or Reloader."""
        if self.operator is not None:
            self.operator.stop()
            self.operator = None
        if self.reloader is not None:
            self.reloader.stop(timeout=30)
            self.reloader = None

    def serve(self) -> None:
        """Answer the shim's requests (called in a loop while the suite runs)."""
        for request in sorted(self.control.glob("request-*")):
            if request.suffix == ".tmp":
                continue
            args = request.read_text().splitlines()
            command, namespace, values = helm_values(args)
            if command == "uninstall":
                self.stop_operator()
            elif self.against == "reloader":
                self.start_reloader(reloader_flags(namespace, values))
            else:
                env, scope, unmapped = operator_options(namespace, values)
                self.unmapped.update(unmapped)
                self.start_operator(env, scope)
            (self.control / request.name.replace("request-", "done-")).touch()
            request.unlink()

    def shim_dir(self) -> Path:
        bindir = self.workdir / "bin"
        bindir.mkdir(exist_ok=True)
        shim = bindir / "helm"
        shim.write_text(SHIM.format(real=helm_binary(), control=self.control))
        shim.chmod(0o755)
        return bindir


def run_suite(suite: str, workdir: Path, against: str = "ours") -> dict[str, Any]:
    binary, tree, commit = peer_build.build_test("reloader", f"./test/e2e/{suite}/", f"e2e-{suite}")
    harness = Harness(workdir / suite, against)
    report = harness.workdir / "report.json"
    env = {**os.environ, "KUBECONFIG": str(harness.kubeconfig),
           "PATH": f"{harness.shim_dir()}:{Path(shutil.which('kubectl') or 'kubectl').parent}:{os.environ['PATH']}",
           "RELOADER_IMAGE": "ghcr.io/stakater/reloader:test", "SKIP_BUILD": "true"}
    label_filter = ARGO_LABEL_FILTER if suite == "argo" else LABEL_FILTER
    cmd = [str(binary), f"-ginkgo.label-filter={label_filter}", "-ginkgo.v", f"-ginkgo.json-report={report}",
           "-ginkgo.timeout=60m", "-test.timeout=70m"]
    if os.environ.get("RELOADER_E2E_FOCUS"):  # a regular expression over spec names, to re-run a few
        cmd.append(f"-ginkgo.focus={os.environ['RELOADER_E2E_FOCUS']}")
    started = time.monotonic()
    with (harness.workdir / "ginkgo.log").open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=tree / "test" / "e2e" / suite, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None:
                harness.serve()
                time.sleep(0.05)
        finally:
            harness.stop_operator()
    result = summarize(suite, report, commit, time.monotonic() - started, sorted(harness.unmapped))
    return {"against": against, **result}


def summarize(suite: str, report: Path, commit: str, seconds: float, unmapped: list[str]) -> dict[str, Any]:
    counts = {"passed": 0, "failed": 0, "skipped": 0, "pending": 0}
    failures: list[dict[str, str]] = []
    data = json.loads(report.read_text()) if report.exists() else []
    for suite_report in data:
        for spec in suite_report.get("SpecReports") or ():
            if spec.get("LeafNodeType") != "It":
                if spec.get("State") in ("failed", "panicked", "timedout"):
                    failures.append({"spec": spec.get("LeafNodeType", "setup"),
                                     "reason": (spec.get("Failure") or {}).get("Message", "")[:300]})
                    counts["failed"] += 1
                continue
            state = spec.get("State")
            name = " ".join([*(spec.get("ContainerHierarchyTexts") or []), spec.get("LeafNodeText", "")])
            if state == "passed":
                counts["passed"] += 1
            elif state in ("skipped",):
                counts["skipped"] += 1
            elif state == "pending":
                counts["pending"] += 1
            else:
                counts["failed"] += 1
                failures.append({"spec": name, "reason": (spec.get("Failure") or {}).get("Message", "")[:300]})
    return {"suite": suite, "reloader_commit": commit, "seconds": round(seconds), **counts,
            "unmapped_values": unmapped, "failures": failures}


def main() -> int:
    args = sys.argv[1:]
    against = "ours"
    for arg in list(args):
        if arg.startswith("--against="):
            against = arg.split("=", 1)[1]
            args.remove(arg)
    suites = args or list(SUITES)
    workdir = Path(tempfile.mkdtemp(prefix="reloader-e2e-", dir=os.environ.get("TMPDIR")))
    # The Argo Rollouts CRDs for every suite: with them, core and annotations deploy Reloader with
    # isArgoRollouts=true too (their argo-labelled specs stay filtered out), and the argo suite runs.
    argo_commit, created = install_argo_rollouts_crds()
    print(f"Argo Rollouts CRDs applied from argoproj/argo-rollouts {argo_commit[:12]}", file=sys.stderr)
    stand_in = RolloutStatusStandIn()
    stand_in.start()
    try:
        results = [run_suite(suite, workdir, against) for suite in suites]
    finally:
        stand_in.stop()
        # The cluster as found: the CRDs this run added go again (and every Rollout with them).
        for name in created:
            subprocess.run(["kubectl", "delete", "--ignore-not-found", name], capture_output=True)
    print(json.dumps(results, indent=2))
    print(f"logs: {workdir}", file=sys.stderr)
    return 1 if any(r["failed"] or not r["passed"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
