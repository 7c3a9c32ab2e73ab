"""Fault-injection helpers for the end-to-end fault suite: a TCP proxy that can cut the operator
off from the API server, a kubeconfig pointing through it, and small log/convergence helpers."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from tests.kube import OperatorProcess


class ApiProxy:
    """A threaded TCP proxy on 127.0.0.1 in front of the API server.

    ``cut()`` resets every open connection and closes the listening socket, so new connections are
    refused (as when the API server is down); ``restore()`` listens again on the same port.
    TLS passes through untouched: the operator still verifies the API server's certificate.
    """

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._open = False
        self.accepted = 0

    def start(self) -> None:
        self._listen()

    def _listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(128)
        self.port = sock.getsockname()[1]
        with self._lock:
            self._listener = sock
            self._open = True
        threading.Thread(target=self._accept_loop, args=(sock,), daemon=True, name="proxy-accept").start()

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by cut()/close()
            with self._lock:
                if not self._open:
                    client.close()
                    continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._conns.update({client, upstream})
                self.accepted += 1
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True, name="proxy-pump").start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                readable, _, _ = select.select([a, b], [], [], 1.0)
                for src in readable:
                    data = src.recv(65536)
                    if not data:
                        return
                    (b if src is a else a).sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for sock in (a, b):
                with contextlib.suppress(OSError):
                    sock.close()
            with self._lock:
                self._conns.difference_update({a, b})

    def cut(self) -> None:
        """Refuse new connections and reset the open ones (RST, like a crashed server)."""
        with self._lock:
            self._open = False
            listener, self._listener = self._listener, None
            conns = list(self._conns)
        if listener is not None:
            listener.close()
        for sock in conns:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def restore(self) -> None:
        self._listen()

    def close(self) -> None:
        self.cut()


def proxied_kubeconfig(source: Path, proxy: ApiProxy, path: Path) -> Path:
    """A copy of ``source`` (same CA and credentials) whose server is the proxy. The certificate's
    original host name is kept for TLS verification (tls-server-name)."""
    config = yaml.safe_load(source.read_text())
    for cluster in config["clusters"]:
        server = urlsplit(cluster["cluster"]["server"])
        cluster["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
        cluster["cluster"]["tls-server-name"] = server.hostname
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def upstream_of(kubeconfig: Path) -> tuple[str, int]:
    config = yaml.safe_load(kubeconfig.read_text())
    server = urlsplit(config["clusters"][0]["cluster"]["server"])
    return str(server.hostname), int(server.port or 443)


class LogWindow:
    """The part of an operator's log written after a point in time (the log file is shared by
    every test that uses the session's operator)."""

    def __init__(self, operator: OperatorProcess) -> None:
        self.operator = operator
        self.offset = len(operator.output())

    def text(self) -> str:
        return self.operator.output()[self.offset:]

    def lines(self, needle: str = "") -> list[str]:
        return [line for line in self.text().splitlines() if needle in line]

    def tracebacks(self, about: str = "") -> list[str]:
        """Tracebacks whose log record (the ``[ERROR ...]`` line that precedes the traceback) concerns
        ``about`` (e.g. a namespace): other tests' leftovers (a namespace still terminating) are not
        this test's business."""
        lines = self.text().splitlines()
        found = []
        for i, line in enumerate(lines):
            if "Traceback" not in line:
                continue
            header = next((lines[j] for j in range(i - 1, max(-1, i - 40), -1)
                           if lines[j].startswith("[") and "[DEBUG" not in lines[j]), "")
            if about in header:
                found.append(header)
        return found
