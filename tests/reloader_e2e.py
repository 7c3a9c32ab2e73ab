"""stakater Reloader's own end-to-end suites, run against our re-roller (issue #13): ``make reloader-e2e``.

    .venv/bin/python -m tests.reloader_e2e [core annotations flags advanced]   # exit 1 on any failure
    .venv/bin/python -m tests.reloader_e2e --against=reloader core             # the same, Reloader itself
    .venv/bin/python -m tests.reloader_e2e --race-free core                    # make reloader-e2e RACE_FREE=1

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

Timelines of failures: the suite and the operator under test (ours or Reloader) each run as a
ServiceAccount bound to cluster-admin, so the API server's audit log (cluster/audit-policy.yaml logs
ServiceAccounts only) records both on one clock. For each failed spec the report lists, from that log,
the suite's source edits, the operator's writes to the workload and the suite's read of the workload's
"prior" annotation value before it starts watching, and says whether the rollout was answered before
that read (the suite's read-after-update race: it then waits for a second change that never comes).

``--race-free`` (``make reloader-e2e RACE_FREE=1``; opt-in, the default mode is the unmodified
comparison): the suites are built from a copy of Reloader's tree with tests/reloader_race_free.patch
applied, and only that. The patch changes their test helpers (test/e2e/utils) alone: each source
write (create, update, delete of a ConfigMap or Secret) first notes the API server's current revision,
and WaitReloaded (WaitEnvVar: the env-vars strategy) reads the workload's "prior" annotation (its
STAKATER_ variable) as it was at that revision (a LIST with
resourceVersionMatch=Exact) instead of with a GET after the write; where that read fails it falls back
to the GET. The specs themselves are untouched. The fetched tree is never edited (the copy sits beside
it, keyed by the patch's hash); if the patch no longer applies the run stops before any suite, saying so.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from tests.kube import wait_for
from testsupport import peer_build
from testsupport.audit import AuditLog, Entry, resource_of
from testsupport.kubectl import apply_yaml, kubectl
from testsupport.launcher import KopfProcess
from testsupport.paths import REPO, helm_binary
from testsupport.tokens import token_kubeconfig

SUITES = ("core", "annotations", "flags", "advanced", "argo")
LABEL_FILTER = "!argo && !csi && !openshift"
ARGO_LABEL_FILTER = "!csi && !openshift"
ARGO_ROLLOUTS_GIT_DIR = Path(os.environ.get("ARGO_ROLLOUTS_GIT_DIR", "/work/.mirror/argoproj+argo-rollouts/repo"))
SETTLE_SECONDS = 3.0
# RACE_FREE=1: the one change made to Reloader's suites (their test helpers only), see race_free_tree.
RACE_FREE_PATCH = REPO / "tests" / "reloader_race_free.patch"
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
    existing = set(kubectl("get", "crd", "-o", "name").stdout.split())
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
        kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=text)
    wait_for(lambda: kubectl("wait", "--for=condition=Established", "--timeout=10s", "crd/rollouts.argoproj.io",
                             check=False).returncode == 0,
             timeout=60, interval=1, what="the Rollout CRD established")
    return commit, created


HARNESS_NAMESPACE = "reloader-e2e-harness"
IDENTITIES = ("suite", "operator")  # ServiceAccounts in HARNESS_NAMESPACE: who is who in the audit log
WORKLOAD_RESOURCES = {"deployments", "daemonsets", "statefulsets", "rollouts", "cronjobs", "jobs"}
SOURCE_RESOURCES = {"configmaps", "secrets"}


def audited_kubeconfigs(workdir: Path) -> dict[str, Path]:
    """Kubeconfigs for the suite and the operator as ServiceAccounts bound to cluster-admin (as the admin
    kubeconfig is): the audit log records their requests, the admin's it does not."""
    manifests: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace",
                                        "metadata": {"name": HARNESS_NAMESPACE}}]
    for name in IDENTITIES:
        manifests.append({"apiVersion": "v1", "kind": "ServiceAccount",
                          "metadata": {"name": name, "namespace": HARNESS_NAMESPACE}})
        manifests.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                          "metadata": {"name": f"{HARNESS_NAMESPACE}-{name}"},
                          "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                      "name": "cluster-admin"},
                          "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": HARNESS_NAMESPACE}]})
    apply_yaml(yaml.safe_dump_all(manifests))
    return {name: token_kubeconfig(name, HARNESS_NAMESPACE, workdir / f"kubeconfig-{name}") for name in IDENTITIES}


def remove_identities() -> None:
    kubectl("delete", "--ignore-not-found", "--wait=false", "namespace", HARNESS_NAMESPACE, check=False)
    for name in IDENTITIES:
        kubectl("delete", "--ignore-not-found", "clusterrolebinding", f"{HARNESS_NAMESPACE}-{name}", check=False)


def moment(stamp: str) -> datetime.datetime:
    """An RFC 3339 time with any number of fraction digits (Ginkgo drops trailing zeros; the audit log has 6)."""
    head, _, fraction = stamp.rstrip("Z").partition(".")
    return datetime.datetime.fromisoformat(f"{head}.{(fraction + '000000')[:6]}+00:00")


class Request(NamedTuple):
    """One request in the audit log, as a failed spec's timeline shows it."""
    received: datetime.datetime
    answered: datetime.datetime
    who: str  # "suite" or "operator"
    verb: str
    resource: str
    name: str
    code: int


def spec_timeline(entries: list[Entry], start: str, end: str) -> dict[str, Any]:
    """What the audit log shows between a spec's start and end: the suite's edits of sources, the
    operator's writes to workloads, the suite's reads and watches of workloads (ms from the spec's
    start), and a verdict on the read-after-update race. A "write" is any write of the operator to the
    workload (a rollout, or our baseline annotation); the operator's log (operator.log) says which."""
    t0, t1 = moment(start), moment(end)
    users = {f"system:serviceaccount:{HARNESS_NAMESPACE}:{name}": name for name in IDENTITIES}
    write_verbs = ("create", "update", "patch", "delete")
    requests: list[Request] = []
    for entry in entries:
        received = moment(entry.get("requestReceivedTimestamp", "1970-01-01T00:00:00Z"))
        verb, stage = entry.get("verb", ""), entry.get("stage")
        if not t0 <= received <= t1 or stage != ("ResponseStarted" if verb == "watch" else "ResponseComplete"):
            continue
        who = users.get(entry.get("user", {}).get("username", ""), "")
        resource, name = resource_of(entry), (entry.get("objectRef") or {}).get("name", "")
        if who == "suite":
            relevant = ((resource in SOURCE_RESOURCES and verb in write_verbs)
                        or (resource in WORKLOAD_RESOURCES and verb in ("get", "watch") and bool(name)))
        else:
            relevant = who == "operator" and resource.split("/")[0] in WORKLOAD_RESOURCES and verb in write_verbs
        if relevant:
            answered = moment(str(entry.get("stageTimestamp") or entry["requestReceivedTimestamp"]))
            code = int((entry.get("responseStatus") or {}).get("code", 0))
            requests.append(Request(received, answered, who, verb, resource, name, code))
    requests.sort()

    def ms(at: datetime.datetime) -> str:
        return f"+{(at - t0).total_seconds() * 1000:.1f} ms"

    lines = [f"{ms(r.received)} {r.who} {r.verb} {r.resource}/{r.name} -> {r.code} (answered {ms(r.answered)})"
             for r in requests]
    watches = [r for r in requests if r.who == "suite" and r.verb == "watch"]
    edits = [r for r in requests if r.who == "suite" and r.resource in SOURCE_RESOURCES and r.verb != "create"]
    verdict = "no watch of a workload by the suite in this spec"
    if watches and edits:
        wait = watches[-1]  # WaitReloaded: a GET for the "prior" value, then a watch
        edit = max((r for r in edits if r.received <= wait.received), default=edits[-1])
        prior = max((r for r in requests if r.who == "suite" and r.verb == "get" and r.resource == wait.resource
                     and r.name == wait.name and r.received <= wait.received), default=None)
        writes = [r for r in requests if r.who == "operator" and r.resource.split("/")[0] == wait.resource
                  and r.name == wait.name and r.received >= edit.received and r.code < 300]
        if not writes:
            verdict = f"no write to {wait.resource}/{wait.name} by the operator after the edit at {ms(edit.received)}"
        elif prior is not None and writes[0].received < prior.answered:
            # The GET reads storage somewhere between its receipt and its answer, the write commits
            # somewhere between its own: when the two overlap, the write may be what the GET read. With no
            # annotation before the edit, a failure then means it was (any value satisfies the watch).
            when = ("before the read was received" if writes[0].answered < prior.received
                    else "while the read was in flight")
            verdict = (f"the suite's race: the edit was answered at {ms(edit.answered)}; the operator's "
                       f"{writes[0].verb} of {wait.resource}/{wait.name} (received {ms(writes[0].received)}, "
                       f"answered {ms(writes[0].answered)}) came {when}, the suite's 'prior value' GET (received "
                       f"{ms(prior.received)}, answered {ms(prior.answered)}); then it waited for a second change")
        elif prior is None:  # RACE_FREE=1: the prior value is read at the revision before the edit
            verdict = (f"not the race: no GET of the prior value (race-free mode reads it as of before the "
                       f"edit); the operator's first write after the edit was received at {ms(writes[0].received)}")
        else:
            verdict = (f"not the race: the operator's first write after the edit was received at "
                       f"{ms(writes[0].received)}, after the suite's read of the prior value was answered "
                       f"({ms(prior.answered)})")
    return {"verdict": verdict, "timeline": lines}


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
    def __init__(self, workdir: Path, kubeconfig: Path, against: str = "ours") -> None:
        self.against = against
        self.workdir = workdir
        self.control = workdir / "control"
        self.control.mkdir(parents=True, exist_ok=True)
        self.reloader: peer_build.PeerProcess | None = None
        self.operator: KopfProcess | None = None
        self.log_path = workdir / "operator.log"
        self.unmapped: set[str] = set()
        self.kubeconfig = kubeconfig  # the operator's (or Reloader's): the "operator" ServiceAccount

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


class PatchDoesNotApply(SystemExit):
    """Reloader's suites changed where the race-free patch edits them: refuse rather than run unpatched."""


def race_free_tree(tree: Path, patch: Path = RACE_FREE_PATCH) -> Path:
    """A copy of Reloader's source tree with ``patch`` applied (``src-race-free-<patch hash>`` beside it;
    the fetched tree itself is never edited, so the default mode and other users of it see it as
    fetched). ``git apply --check`` first: if the patch no longer applies, stop with PatchDoesNotApply."""
    digest = hashlib.sha256(patch.read_bytes()).hexdigest()[:12]
    copy = tree.parent / f"{tree.name}-race-free-{digest}"
    with open(tree.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (copy / ".race-free-applied").is_file():
            return copy
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(tree, copy, symlinks=True)
        check = subprocess.run(["git", "apply", "--check", str(patch)], cwd=copy, capture_output=True, text=True)
        if check.returncode:
            shutil.rmtree(copy, ignore_errors=True)
            raise PatchDoesNotApply(
                f"RACE_FREE=1: {patch.name} no longer applies to Reloader's source at {tree} "
                f"(its test/e2e/utils changed):\n{check.stderr.strip()}\nUpdate the patch (it only moves "
                f"WaitReloaded's and WaitEnvVar's prior-value reads to before the source write) "
                f"or run without RACE_FREE.")
        subprocess.run(["git", "apply", str(patch)], cwd=copy, check=True)
        (copy / ".race-free-applied").write_text(digest + "\n")
    return copy


def build_race_free_test(suite: str) -> tuple[Path, Path, str]:
    """Like peer_build.build_test, from the race-free copy of the tree: (test binary, tree, commit)."""
    _, tree, commit = peer_build.build_test("reloader", f"./test/e2e/{suite}/", f"e2e-{suite}")
    copy = race_free_tree(tree)
    binary = copy / ".bin" / f"e2e-{suite}"
    with open(tree.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not binary.is_file():
            print(f"[reloader_e2e] go test -c ./test/e2e/{suite}/ (race-free copy {copy.name})", file=sys.stderr,
                  flush=True)
            env = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
            subprocess.run(["go", "test", "-c", "-o", str(binary), f"./test/e2e/{suite}/"], cwd=copy, env=env,
                           check=True)
    return binary, copy, commit


def run_suite(suite: str, workdir: Path, kubeconfigs: dict[str, Path], against: str = "ours",
              race_free: bool = False) -> dict[str, Any]:
    if race_free:
        binary, tree, commit = build_race_free_test(suite)
    else:
        binary, tree, commit = peer_build.build_test("reloader", f"./test/e2e/{suite}/", f"e2e-{suite}")
    harness = Harness(workdir / suite, kubeconfigs["operator"], against)
    report = harness.workdir / "report.json"
    audit = AuditLog()
    mark = audit.mark()
    env = {**os.environ, "KUBECONFIG": str(kubeconfigs["suite"]),
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
    if result["failures"]:
        entries = list(audit.entries(mark))
        for failure in result["failures"]:
            if failure.get("start"):
                failure.update(spec_timeline(entries, failure["start"], failure["end"]))
    return {"against": against, "race_free": race_free, **result}


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
                failures.append({"spec": name, "reason": (spec.get("Failure") or {}).get("Message", "")[:300],
                                 "start": spec.get("StartTime", ""), "end": spec.get("EndTime", "")})
    return {"suite": suite, "reloader_commit": commit, "seconds": round(seconds), **counts,
            "unmapped_values": unmapped, "failures": failures}


def main() -> int:
    args = sys.argv[1:]
    against = "ours"
    race_free = "--race-free" in args
    for arg in list(args):
        if arg.startswith("--against="):
            against = arg.split("=", 1)[1]
            args.remove(arg)
        elif arg == "--race-free":
            args.remove(arg)
    suites = args or list(SUITES)
    if race_free:  # before anything else: refuse at once when the patch no longer applies
        _, tree, _ = peer_build.build_test("reloader", f"./test/e2e/{suites[0]}/", f"e2e-{suites[0]}")
        race_free_tree(tree)
    workdir = Path(tempfile.mkdtemp(prefix="reloader-e2e-", dir=os.environ.get("TMPDIR")))
    # The Argo Rollouts CRDs for every suite: with them, core and annotations deploy Reloader with
    # isArgoRollouts=true too (their argo-labelled specs stay filtered out), and the argo suite runs.
    argo_commit, created = install_argo_rollouts_crds()
    print(f"Argo Rollouts CRDs applied from argoproj/argo-rollouts {argo_commit[:12]}", file=sys.stderr)
    kubeconfigs = audited_kubeconfigs(workdir)
    stand_in = RolloutStatusStandIn()
    stand_in.start()
    try:
        results = [run_suite(suite, workdir, kubeconfigs, against, race_free) for suite in suites]
    finally:
        stand_in.stop()
        remove_identities()
        # The cluster as found: the CRDs this run added go again (and every Rollout with them).
        for name in created:
            kubectl("delete", "--ignore-not-found", name, check=False)
    print(json.dumps(results, indent=2))
    print(f"logs: {workdir}", file=sys.stderr)
    return 1 if any(r["failed"] or not r["passed"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
