"""What a tenant writes to abuse the shared operator process, and the slow host its checks call: one
definition for the end-to-end test (tests/e2e/test_tenant_abuse.py) and the benchmark's ``tenant_abuse``
section, so that both measure the same abuse."""

from __future__ import annotations

import http.server
import threading
import time
from typing import Any

from kopf_operators.blackadder.settings import GROUP as CHAOS_GROUP
from kopf_operators.blackadder.settings import LEDGER_KEY, LEDGER_LABEL, TENANT_KIND, ledger_label, ledger_name
from kopf_operators.blackadder.settings import VERSION as CHAOS_VERSION
from kopf_operators.copyrator.rules import GROUP as COPY_GROUP
from kopf_operators.copyrator.rules import KIND as RULE_KIND
from kopf_operators.copyrator.rules import PUSH_TO_ANNOTATION
from kopf_operators.copyrator.rules import VERSION as COPY_VERSION
from kopf_operators.reroller.settings import RELOADER_CONFIGMAPS

CAP = 262144  # the chart's operators.copyrator.maxSourceBytes


class SlowHost:
    """A local host (nothing leaves the machine) that answers 200 and then one byte a second for
    ``seconds`` (or until the client gives up); it counts the requests it was sent, by path, and those
    still open."""

    def __init__(self, seconds: int = 120) -> None:
        self.paths: list[str] = []
        self.open = 0
        outer = self

        class Slow(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.paths.append(self.path)
                outer.open += 1
                try:
                    self.send_response(200)
                    self.send_header("Content-Length", "100000")
                    self.end_headers()
                    for _ in range(seconds):
                        self.wfile.write(b".")
                        self.wfile.flush()
                        time.sleep(1)
                except OSError:
                    pass  # the client gave up (its deadline)
                finally:
                    outer.open -= 1

            do_POST = do_GET

            def log_message(self, *_: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = int(self.server.server_address[1])

    def sent(self, prefix: str) -> int:
        return sum(path.startswith(prefix) for path in self.paths)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def tenant_objects(port: int, tenant: str, targets: list[str]) -> list[dict[str, Any]]:
    """Everything the tenant writes in its own namespace ``tenant``: a backtracking reload pattern, a
    TenantChaosAgent with its most checks against the slow host on ``port``, a ledger-like Secret and a
    rule copying it into ``targets`` (namespaces not the tenant's), ConfigMaps over the size cap and
    many unconsented pushes."""
    slow = f"http://localhost:{port}"
    big = "x" * (CAP + 1024)
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a" * 40}, "data": {"k": "v"}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "stall", "annotations": {
            RELOADER_CONFIGMAPS: "(a|a)*b,(a)\\1"}}, "spec": {
            "replicas": 1, "selector": {"matchLabels": {"app": "stall"}}, "template": {
                "metadata": {"labels": {"app": "stall"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}},
        {"apiVersion": CHAOS_GROUP + "/" + CHAOS_VERSION, "kind": TENANT_KIND, "metadata": {"name": "hog"},
         "spec": {"eagerness": 0, "pauseDuration": 5, "podNames": {"include": "(a|a)*b"},
                  "steadyState": {"intervalSeconds": 1, "failureThreshold": 100, "checks": [
                      {"name": f"c{i}", "http": {"url": f"{slow}/hog{i}", "timeoutSeconds": 5}} for i in range(4)]}}},
        # A Secret dressed as the tenant agent's ledger, and a rule copying it where ledgers are read.
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": ledger_name("hog"), "labels": {
            LEDGER_LABEL: ledger_label("hog"), "share": "ledger"}}, "stringData": {LEDGER_KEY: "{}"}},
        {"apiVersion": f"{COPY_GROUP}/{COPY_VERSION}", "kind": RULE_KIND, "metadata": {"name": "into-theirs"},
         "spec": {"ruleType": "secret", "selector": {"share": "ledger"}, "namespace": tenant,
                  "targetNamespaces": list(targets)}},
    ]
    for i in range(3):  # over the cap: refused, never held with their data
        objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": f"big-{i}", "annotations": {PUSH_TO_ANNOTATION: "*"}}, "data": {"blob": big}})
    for i in range(20):  # under the cap, pushed at every namespace, none of which consents
        objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": f"push-{i}", "annotations": {PUSH_TO_ANNOTATION: "*"}}, "data": {"blob": "y" * 100_000}})
    return objects


def elsewhere_agent(port: int) -> dict[str, Any]:
    """A TenantChaosAgent for a namespace no administrator allowed tenant chaos in: it must send nothing."""
    return {"apiVersion": f"{CHAOS_GROUP}/{CHAOS_VERSION}", "kind": TENANT_KIND, "metadata": {"name": "elsewhere"},
            "spec": {"eagerness": 0, "pauseDuration": 5, "steadyState": {"intervalSeconds": 1, "checks": [
                {"name": "c", "http": {"url": f"http://localhost:{port}/elsewhere"}}]}}}
