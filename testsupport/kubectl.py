"""kubectl against the local cluster (admin credentials unless told otherwise)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from testsupport.paths import KUBECONFIG


class KubectlError(subprocess.CalledProcessError):
    """A failed kubectl call whose message carries kubectl's own complaint (its stderr)."""

    def __str__(self) -> str:
        return f"{super().__str__()}: {(self.stderr or '').strip()[-2000:]}"


def kubectl(*args: str, input: str | None = None, check: bool = True, timeout: float = 60,
            kubeconfig: Path = KUBECONFIG) -> subprocess.CompletedProcess[str]:
    """Run kubectl; the completed process (text). ``check``: a non-zero exit raises :class:`KubectlError`."""
    cmd = ["kubectl", "--kubeconfig", str(kubeconfig), *args]
    done = subprocess.run(cmd, input=input, text=True, capture_output=True, check=False, timeout=timeout)
    if check and done.returncode:
        raise KubectlError(done.returncode, cmd, done.stdout, done.stderr)
    return done


def kubectl_json(*args: str) -> Any:
    return json.loads(kubectl(*args, "-o", "json").stdout)


def apply_yaml(text: str, namespace: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    ns = ["-n", namespace] if namespace else []
    return kubectl("apply", *ns, "-f", "-", input=text, check=check)


def wait_crds_served(directory: Path, timeout: float = 60) -> None:
    """The CRDs in ``directory`` Established and served. Established comes first: for a moment after it,
    a list of a new CRD's kind answers 429 ("storage is (re)initializing"). kubectl's client waits that
    out (it follows Retry-After), so one list of each kind here spares every later client the retry."""
    kubectl("wait", "--for=condition=Established", f"--timeout={timeout:.0f}s", "-f", str(directory),
            timeout=timeout + 10)
    found = kubectl_json("get", "-f", str(directory))
    for crd in found.get("items", [found]):
        kubectl("get", f"{crd['spec']['names']['plural']}.{crd['spec']['group']}", "--all-namespaces",
                "-o", "name", timeout=timeout)
