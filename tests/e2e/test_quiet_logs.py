"""At the default log level the operators write one line per action and nothing for events that change
nothing (issue #11: 'Quiet by default'), so that in a busy cluster the log shows what was done."""

from __future__ import annotations

import re
import time
from typing import Any

from tests.kube import OperatorProcess, stays, wait_for
from testsupport.kubectl import apply_yaml


def settled(proc: OperatorProcess, quiet_for: float = 2.0, timeout: float = 60) -> int:
    """Wait until the log has not grown for ``quiet_for`` seconds; the number of lines then."""
    last = [len(proc.output().splitlines()), time.monotonic()]

    def probe() -> bool:
        lines = len(proc.output().splitlines())
        if lines != last[0]:
            last[:] = [lines, time.monotonic()]
        return time.monotonic() - last[1] >= quiet_for

    wait_for(probe, timeout=timeout, interval=0.2, what="the start-up log lines to settle")
    return int(last[0])


def new_lines(proc: OperatorProcess, since: int) -> list[str]:
    return [line for line in proc.output().splitlines()[since:] if line.strip()]


def test_unrelated_changes_write_no_log_line_and_an_action_writes_its_line(
        namespace: str, operator_process: OperatorProcess, core: Any, apps: Any) -> None:
    operator_process.stop()  # the session's verbose operator would act on the same objects
    quiet = OperatorProcess(log_name="quiet", verbose=False)
    quiet.start()
    try:
        # Start-up lines settle once the initial listings are done (the liveness probe's requests are
        # not logged either).
        baseline = settled(quiet)

        # 45 changes no operator cares about.
        for i in range(10):
            core.create_namespaced_config_map(namespace, {"metadata": {"name": f"plain-{i}"}, "data": {"k": "v"}})
        for i in range(10):
            core.patch_namespaced_config_map(f"plain-{i}", namespace, {"data": {"k": "changed"}})
        for i in range(10):
            core.create_namespaced_secret(namespace, {"metadata": {"name": f"plain-{i}"}, "stringData": {"k": "v"}})
        for i in range(5):
            apps.create_namespaced_deployment(namespace, {
                "metadata": {"name": f"plain-{i}"},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": f"plain-{i}"}},
                         "template": {"metadata": {"labels": {"app": f"plain-{i}"}},
                                      "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}})
        for i in range(10):
            core.delete_namespaced_config_map(f"plain-{i}", namespace)

        # Then one action; its line is the barrier after which the unrelated events were seen too.
        apply_yaml("""
apiVersion: immortalcontainer.flugel.it/v1alpha1
kind: ImmortalContainer
metadata: {name: loud}
spec: {image: nginx:latest}
""", namespace)
        wait_for(lambda: any("Counted start #1" in line for line in new_lines(quiet, baseline)),
                 timeout=30, what="the action's log lines")
        after = len(quiet.output().splitlines())
        stays(lambda: len(quiet.output().splitlines()) == after, seconds=3, what="no further log lines")
        lines = new_lines(quiet, baseline)
        unrelated = [line for line in lines if not re.search(r"\bloud\b|loud-immortalpod", line)]
        assert not unrelated, "lines not about an action:\n" + "\n".join(unrelated)
        # One line per action: the pod created, and the start counted.
        assert len(lines) == 2, "\n".join(lines)
        assert "Created pod loud-immortalpod" in lines[0] and "Counted start #1" in lines[1]
    finally:
        quiet.stop()
