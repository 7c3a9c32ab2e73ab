"""Go peers built from source, for the side-by-side benchmarks (bench/sections/go_peers.py, bench/reloader_bench.py)
and Reloader's own e2e suites (tests/reloader_e2e.py): stakater Reloader, mittwald kubernetes-replicator.

    .venv/bin/python -m testsupport.peer_build         # build (or find cached) every peer; print commit and binary

Where the source comes from, first found wins:
  1. $BENCH_PEER_SOURCE_<NAME> (a git directory, bare or not), e.g. BENCH_PEER_SOURCE_RELOADER;
  2. the snapshot the search tool's ``fetch`` leaves (``$BENCH_PEER_MIRROR``, default /work/.mirror,
     ``<owner>+<repo>/repo``): the Go module proxy refuses both peers' modules (403 Forbidden for
     github.com/stakater/Reloader and github.com/mittwald/kubernetes-replicator), so on this machine that
     is the only way in;
  3. a work tree already in the cache (``<cache>/<owner>-<repo>-<commit12>/src``, left by an earlier build).
A binary already built for that commit is reused; with no source at all, the newest cached binary is used.
Nothing found: :class:`PeerUnavailable` says why, and the benchmark records "peer not available: <why>".

Builds run under ``~/.cache/kopf-operators/peers/<owner>-<repo>-<commit12>/`` (``src/``, ``bin/``, ``build.log``,
``COMMIT``) with GOTOOLCHAIN=local CGO_ENABLED=0 ``go build -trimpath -ldflags="-s -w"``, one build per
directory at a time (a lock file); the peer's code is never copied into this repository.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from testsupport.launcher import stop_group

CACHE = Path(os.environ.get("KOPF_OPERATORS_CACHE", Path.home() / ".cache" / "kopf-operators")) / "peers"
MIRROR = Path(os.environ.get("BENCH_PEER_MIRROR", "/work/.mirror"))


class PeerUnavailable(Exception):
    pass


@dataclasses.dataclass(frozen=True)
class Peer:
    name: str
    repo: str  # owner/name on GitHub
    binary: str
    # go.mod pins the proxy refuses -> the version to use instead (only applied when go.mod has the pin)
    replace: tuple[tuple[str, str, str], ...] = ()

    @property
    def cache_prefix(self) -> str:
        return self.repo.replace("/", "-").lower()

    @property
    def env_name(self) -> str:
        return f"BENCH_PEER_SOURCE_{self.name.upper()}"


PEERS: dict[str, Peer] = {
    "reloader": Peer(
        "reloader", "stakater/Reloader", "reloader",
        # Reloader 1.4.14 pins openshift/api at a pseudo-version the proxy refuses; its own
        # openshift/client-go asks for this one (see /work/shared/notes/peers.md).
        replace=(("github.com/openshift/api", "v0.0.0-20260402111718-ad9eb11110b6",
                  "v0.0.0-20260326111139-30c2ef7a272e"),)),
    "replicator": Peer("replicator", "mittwald/kubernetes-replicator", "kubernetes-replicator"),
}


@dataclasses.dataclass(frozen=True)
class Built:
    peer: str
    repo: str
    commit: str
    binary: Path
    built_now: bool
    source: str

    def describe(self) -> str:
        return f"{self.repo}@{self.commit[:12]} ({self.binary}, source: {self.source})"


def _git(git_dir: Path, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def _git_dir(path: Path) -> Path | None:
    if (path / ".git").is_dir():
        return path / ".git"
    if (path / "HEAD").is_file() and (path / "objects").is_dir():
        return path
    return None


def find_source(peer: Peer) -> tuple[Path | None, str]:
    """(git directory, where it came from), or (None, why not)."""
    tried = []
    env = os.environ.get(peer.env_name)
    if env:
        git_dir = _git_dir(Path(env))
        if git_dir:
            return git_dir, f"${peer.env_name}"
        tried.append(f"${peer.env_name}={env} is no git directory")
    mirror = MIRROR / peer.repo.replace("/", "+") / "repo"
    git_dir = _git_dir(mirror)
    if git_dir:
        return git_dir, f"fetch snapshot {mirror}"
    tried.append(f"no snapshot at {mirror} (the search tool's `fetch github:{peer.repo}` puts one there)")
    return None, "; ".join(tried)


def _cached(peer: Peer) -> list[Path]:
    """Cache directories of this peer, newest first."""
    dirs = [d for d in CACHE.glob(f"{peer.cache_prefix}-*") if d.is_dir() and (d / "COMMIT").is_file()]
    return sorted(dirs, key=lambda d: d.stat().st_mtime, reverse=True)


def build(name: str, log: bool = True) -> Built:
    peer = PEERS[name]
    git_dir, where = find_source(peer)
    if git_dir is None:
        # no snapshot: a source tree or a binary the cache kept from an earlier build
        for d in _cached(peer):
            commit = (d / "COMMIT").read_text().strip()
            if (d / "bin" / peer.binary).is_file():
                return Built(name, peer.repo, commit, d / "bin" / peer.binary, False, f"cached binary in {d}")
            if (d / "src" / "go.mod").is_file():
                return _build_tree(peer, d, commit, None, f"cached source in {d}", log)
        raise PeerUnavailable(f"no source of github.com/{peer.repo} on this machine ({where}), and the Go module "
                              "proxy does not serve it as a module; nothing cached in " + str(CACHE))
    commit = _git(git_dir, "rev-parse", "HEAD")
    d = CACHE / f"{peer.cache_prefix}-{commit[:12]}"
    return _build_tree(peer, d, commit, git_dir, where, log)


def _build_tree(peer: Peer, d: Path, commit: str, git_dir: Path | None, where: str, log: bool) -> Built:
    binary = d / "bin" / peer.binary
    if binary.is_file():
        return Built(peer.name, peer.repo, commit, binary, False, where)
    if shutil.which("go") is None:
        raise PeerUnavailable("no Go toolchain (`go`) on PATH to build it")
    d.mkdir(parents=True, exist_ok=True)
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another benchmark may be building the same commit
        if binary.is_file():
            return Built(peer.name, peer.repo, commit, binary, False, where)
        src = d / "src"
        if git_dir is not None and not (src / "go.mod").is_file():
            shutil.rmtree(src, ignore_errors=True)
            src.mkdir()
            archive = subprocess.Popen(["git", f"--git-dir={git_dir}", "archive", commit], stdout=subprocess.PIPE)
            subprocess.run(["tar", "-x", "-C", str(src)], stdin=archive.stdout, check=True)
            if archive.wait():
                raise PeerUnavailable(f"git archive of {git_dir} failed")
        (d / "COMMIT").write_text(commit + "\n")
        env = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
        started = time.monotonic()
        if log:
            print(f"[peer_build] building {peer.repo}@{commit[:12]} in {d} (go mod download + go build; "
                  "a few minutes the first time)", file=sys.stderr, flush=True)
        with open(d / "build.log", "ab") as out:
            def go(*args: str) -> None:
                out.write(f"$ go {' '.join(args)}\n".encode())
                out.flush()
                res = subprocess.run(["go", *args], cwd=src, env=env, stdout=out, stderr=subprocess.STDOUT)
                if res.returncode:
                    raise PeerUnavailable(f"`go {' '.join(args)}` failed for {peer.repo}@{commit[:12]}; see "
                                          f"{d / 'build.log'}")

            gomod = (src / "go.mod").read_text()
            for module, refused, instead in peer.replace:
                if f"{module} {refused}" in gomod and f"=> {module} {instead}" not in gomod:
                    go("mod", "edit", f"-replace={module}={module}@{instead}")
                    go("mod", "download", f"{module}@{instead}")
            go("build", "-trimpath", "-ldflags=-s -w", "-o", str(binary), ".")
        if log:
            print(f"[peer_build] built {binary} in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        return Built(peer.name, peer.repo, commit, binary, True, where)


def build_test(name: str, package: str, output: str) -> tuple[Path, Path, str]:
    """``go test -c`` of one package of a peer's source (e.g. Reloader's e2e suite ``./test/e2e/core/``),
    cached next to its binary: (test binary, source tree, commit). The tree comes from :func:`build`."""
    built = build(name)
    d = built.binary.parent.parent
    src, binary = d / "src", d / "bin" / output
    if not (src / "go.mod").is_file():
        raise PeerUnavailable(f"no source tree for {built.describe()} (only a cached binary)")
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not binary.is_file():
            print(f"[peer_build] go test -c {package} ({built.repo}@{built.commit[:12]})", file=sys.stderr, flush=True)
            env = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
            with open(d / "build.log", "ab") as out:
                res = subprocess.run(["go", "test", "-c", "-o", str(binary), package], cwd=src, env=env, stdout=out,
                                     stderr=subprocess.STDOUT)
            if res.returncode:
                raise PeerUnavailable(f"`go test -c {package}` failed for {built.repo}; see {d / 'build.log'}")
    return binary, src, built.commit


# Reloader serves liveness on its metrics port, hard-coded to 9090 (it exits when that is taken).
RELOADER_HEALTH_URL = "http://127.0.0.1:9090/live"


class PeerProcess:
    """A peer's binary as a subprocess in its own process group, started once ``health_url`` answers 200;
    also a context manager (``with PeerProcess(...) as peer:``)."""

    def __init__(self, binary: Path, args: list[str], env: dict[str, str], health_url: str, log_path: Path) -> None:
        self.binary, self.args, self.env, self.health_url, self.log_path = binary, args, env, health_url, log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            out.write(f"\n===== {self.binary} {' '.join(self.args)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen([str(self.binary), *self.args], env={**os.environ, **self.env},
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.binary.name} exited with {self.proc.returncode}; log: {self.log_path}")
            try:
                with urllib.request.urlopen(self.health_url, timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.binary.name} not healthy at {self.health_url} after {timeout} s; "
                           f"log: {self.log_path}")

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM to its process group, then SIGKILL after ``timeout`` s."""
        if self.proc is not None:
            stop_group(self.proc, signal.SIGTERM, timeout)
        self.proc = None

    def __enter__(self) -> PeerProcess:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m testsupport.peer_build", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("peers", nargs="*", help=f"some of {', '.join(PEERS)} (default: all)")
    args = parser.parse_args()
    for name in args.peers:
        if name not in PEERS:
            parser.error(f"unknown peer {name!r}: one of {', '.join(PEERS)}")
    args.peers = args.peers or list(PEERS)
    failed = False
    for name in args.peers:
        try:
            print(f"{name}: {build(name).describe()}")
        except PeerUnavailable as exc:
            failed = True
            print(f"{name}: peer not available: {exc}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
