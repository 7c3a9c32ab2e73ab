"""The API server's audit log (cluster/cluster.sh audit-log; policy in cluster/audit-policy.yaml): who
asked for what. Two ways to cut it: by byte offsets (``AuditLog.mark``; the benchmark's per-section counts)
and by time (``audit_now``; a test's "after this moment")."""

from __future__ import annotations

import datetime
import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from testsupport.paths import cluster_script

# The chart's ServiceAccounts (release kopf-operators-e2e in the tests) authenticate with this prefix.
CHART_USER_PREFIX = "system:serviceaccount:kopf-operators"

Entry = dict[str, Any]


def audit_log_path() -> Path:
    return Path(cluster_script("audit-log").strip())


def audit_now() -> str:
    """A timestamp to count requests from, in the audit log's own format (compares as a string)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def resource_of(entry: Entry) -> str:
    """"resource" or "resource/subresource" of an entry's objectRef ("" when it has none)."""
    ref = entry.get("objectRef") or {}
    return ref.get("resource", "") + ("/" + ref["subresource"] if ref.get("subresource") else "")


class AuditLog:
    """The cluster's audit log file; entries read from a byte offset (a ``mark``) on."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or audit_log_path()

    def mark(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def entries(self, start: int = 0, end: int | None = None) -> Iterator[Entry]:
        """Entries between two marks (whole file by default); a torn last line is skipped."""
        with self.path.open("rb") as fh:
            fh.seek(start)
            data = fh.read() if end is None else fh.read(max(0, end - start))
        for raw in data.splitlines():
            try:
                yield json.loads(raw)
            except ValueError:
                continue

    def requests(self, start: int, end: int | None = None, user: str = "") -> Counter[str]:
        """``user``'s requests between two marks, as "verb resource[/subresource]" counts. A watch counts
        when it starts; every other request when it completes."""
        out: Counter[str] = Counter()
        for ev in self.entries(start, end):
            if ev.get("user", {}).get("username") != user:
                continue
            verb, stage = ev.get("verb"), ev.get("stage")
            if (verb == "watch") != (stage == "ResponseStarted") and stage != "Panic":
                continue
            out[f"{verb} {resource_of(ev) or '?'}"] += 1
        return out

    def about(self, namespace: str, since: str, user_prefix: str = CHART_USER_PREFIX,
              keep: Callable[[Entry], bool] = lambda entry: entry.get("objectRef", {}).get("resource") != "events",
              ) -> list[Entry]:
        """Entries of users starting with ``user_prefix`` about objects in ``namespace`` received after
        ``since`` (an ``audit_now()``); Events excluded unless ``keep`` says otherwise."""
        return [entry for entry in self.entries()
                if entry.get("user", {}).get("username", "").startswith(user_prefix)
                and (entry.get("objectRef") or {}).get("namespace") == namespace
                and entry.get("requestReceivedTimestamp", "") > since and keep(entry)]


def operator_requests(namespace: str, since: str) -> list[tuple[str, str, str]]:
    """(verb, resource, name) of the operator's requests about ``namespace`` after ``since``, from the
    API server's audit log (Events excluded). The operator must run as the chart's ServiceAccount."""
    return [(entry["verb"], resource_of(entry), (entry.get("objectRef") or {}).get("name", ""))
            for entry in AuditLog().about(namespace, since)]
