"""``kopf run`` of operator files in a subprocess, as a user starts it: the one launcher of the tests,
the benchmark and the Reloader comparisons."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from testsupport.paths import REPO

# Kopf's API client logs each retried request at ERROR level ("Request attempt #1/9 failed; will
# retry"): a transient condition it handles (e.g. 429 while a CRD's storage re-initialises), not a fault.
TRANSIENT_API_RETRY = re.compile(r"Request attempt #\d+/\d+ failed; will retry")


def counter(text: str, name: str, **labels: str) -> float:
    """One sample of a Prometheus text exposition (0 when absent): ``name`` with exactly ``labels``."""
    rendered = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    match = re.search(rf"^{re.escape(name)}\{{{re.escape(rendered)}\}} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def total(text: str, name: str) -> float:
    """The sum of every sample of ``name`` in a Prometheus text exposition, whatever its labels (0 when absent)."""
    sample = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", re.MULTILINE)
    return sum(float(m.group(1)) for m in sample.finditer(text))


class OperatorFailed(AssertionError):
    """The operator exited, or did not become healthy in time (the message carries its log's tail)."""


# Ports handed to an operator to listen on (health, metrics) come from below the kernel's ephemeral
# range (32768 up, by default) and below the ports kwokctl takes for its clusters (just under 32768):
# a port the kernel hands out for a bind to port 0 is an ephemeral one, which an outgoing connection
# can take before the operator binds it ("Address already in use").
LISTEN_PORTS = range(20000, 30000)


def free_port() -> int:
    """A port no socket on this machine uses now, for a process started next to listen on."""
    for _ in range(200):
        port = random.choice(LISTEN_PORTS)
        if port_free(port):
            return port
    raise RuntimeError(f"no free port in {LISTEN_PORTS}")


def port_free(port: int) -> bool:
    """Whether ``port`` can be bound on all interfaces now (e.g. Reloader's hard-coded metrics port 9090)."""
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def stop_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    """Send ``sig`` to the process group ``proc`` leads (started with ``start_new_session``), wait
    ``timeout`` s, then SIGKILL the group. No-op when it has exited."""
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def all_operator_files(root: Path = REPO) -> list[str]:
    """operators/*.py of a checkout, sorted, absolute."""
    return sorted(str(p) for p in (root / "operators").glob("*.py"))


class KopfProcess:
    """``kopf run [--standalone] <scope> [--verbose] <extra_args> --liveness=... <files>`` against the
    cluster ``kubeconfig`` names, logging to ``log_path`` (appended, one header line per start).

    ``namespaces``: Kopf namespace globs (a shard); empty: ``--all-namespaces``. ``metrics_port``: set
    METRICS_PORT to a free port (unless ``env`` names one), so that parallel operators do not collide.
    ``root``: run from another checkout (its own kopf_operators package goes first on PYTHONPATH)."""

    def __init__(self, files: Sequence[str], kubeconfig: Path, log_path: Path, env: dict[str, str] | None = None,
                 *, standalone: bool = True, verbose: bool = True, namespaces: Sequence[str] = (),
                 extra_args: Sequence[str] = (), metrics_port: bool = True, root: Path = REPO,
                 log_env: bool = False) -> None:
        self.files = list(files)
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.extra_env = dict(env or {})
        self.standalone = standalone
        self.verbose = verbose  # False: the default log level, as the chart runs it
        self.namespaces = list(namespaces)
        self.extra_args = list(extra_args)
        self.set_metrics_port = metrics_port
        self.root = root
        self.log_env = log_env  # the header names the extra environment (benchmark knobs; no credentials there)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.health_port = 0
        self.metrics_port = 0

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        # The entry point with Kopf's patches (kopf_operators/__main__.py); plain `kopf run` for a
        # checkout from before it.
        entry = ([sys.executable, "-m", "kopf_operators"] if (self.root / "kopf_operators" / "__main__.py").exists()
                 else [str(Path(sys.executable).parent / "kopf")])
        mode = ["--standalone"] if self.standalone else []
        scope = [f"--namespace={pattern}" for pattern in self.namespaces] or ["--all-namespaces"]
        return [*entry, "run", *mode, *scope, *(["--verbose"] if self.verbose else []), *self.extra_args,
                f"--liveness=http://127.0.0.1:{self.health_port}/healthz", *self.files]

    def start(self, timeout: float = 60) -> None:
        """Start it (no-op when running) and wait until its liveness endpoint answers 200."""
        if self.running:
            return
        self.launch()
        self.wait_healthy(timeout)

    def launch(self) -> None:
        """Start the process and return at once (``wait_healthy`` waits for it): replicas started
        at the same instant."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.health_port = free_port()
        cmd = self.command()
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        if self.set_metrics_port:
            self.metrics_port = int(self.extra_env.get("METRICS_PORT") or free_port())
            env["METRICS_PORT"] = str(self.metrics_port)
        env.update(self.extra_env)
        if self.root != REPO:
            env["PYTHONPATH"] = os.pathsep.join([str(self.root), *filter(None, [env.get("PYTHONPATH")])])
        self.starts += 1
        with self.log_path.open("ab") as log:
            header = f"\n===== start #{self.starts}: {' '.join(cmd)}"
            log.write(f"{header}{f' env={self.extra_env}' if self.log_env else ''}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(cmd, cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def wait_healthy(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self._healthy():
            if time.monotonic() > deadline:
                raise OperatorFailed(f"the operator is not healthy after {timeout}s (log: {self.log_path}):\n"
                                     f"{self.tail()}")
            time.sleep(0.1)

    def _healthy(self) -> bool:
        if not self.running:
            raise OperatorFailed(f"operator exited with {self.proc and self.proc.returncode} "
                                 f"(log: {self.log_path}):\n{self.tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=1) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        """Signal the process group, wait ``timeout`` s, then SIGKILL it."""
        if self.proc is not None:
            stop_group(self.proc, sig, timeout)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, as when a node dies or the OOM killer strikes."""
        self.stop(signal.SIGKILL)

    def restart(self) -> None:
        self.stop()
        self.start()

    def metrics(self) -> str:
        """The operator's Prometheus text endpoint."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            return str(resp.read().decode())

    def metric(self, name: str, **labels: str) -> float:
        """One sample of the operator's metrics now (``counter``); without ``labels``: the sum of all of ``name``'s."""
        text = self.metrics()
        return counter(text, name, **labels) if labels else total(text, name)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

    def records(self) -> list[str]:
        """Log records, each with its continuation lines (a traceback belongs to the line before it)."""
        records: list[str] = []
        for line in self.output().splitlines():
            if line.startswith("[") or not records:
                records.append(line)
            else:
                records[-1] += "\n" + line
        return records

    def errors(self, about: str | None = None) -> list[str]:
        """ERROR records and tracebacks in the log (tests assert there are none), optionally only those
        mentioning ``about`` (a namespace, say): in the full suite all four operators share one log."""
        return [rec for rec in self.records()
                if re.search(r"Traceback|\[ERROR", rec) and (about is None or about in rec)
                and not TRANSIENT_API_RETRY.search(rec)]

    def tracebacks(self, about: str = "") -> list[str]:
        """The first lines of the log records with a traceback (a crash, not a handled error) whose
        first line mentions ``about`` (a namespace, say: other tests' leftovers are not this one's)."""
        return [header for header, _, rest in (rec.partition("\n") for rec in self.records())
                if "Traceback" in rest and about in header]
