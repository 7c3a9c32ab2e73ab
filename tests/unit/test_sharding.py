"""The chart's shipped shard split covers every namespace exactly once (with Kopf's own glob matching)."""

from __future__ import annotations

import itertools
import string

import yaml
from kopf._cogs.structs.references import match_namespace

from tests.kube import REPO


def shipped_shards() -> list[dict[str, object]]:
    values = yaml.safe_load((REPO / "charts" / "kopf-operators" / "values.yaml").read_text())
    return list(values["sharding"]["shards"])


def serving(name: str, shards: list[dict[str, object]]) -> list[str]:
    return [str(shard["name"]) for shard in shards
            if any(match_namespace(name, str(pattern)) for pattern in shard["namespaces"])]  # type: ignore[attr-defined]


def test_every_namespace_name_belongs_to_exactly_one_shard() -> None:
    shards = shipped_shards()
    # A namespace name is a DNS label: it starts and ends with [a-z0-9]; the split is by the first one.
    alphabet = string.ascii_lowercase + string.digits
    names = [a + rest for a, rest in itertools.product(alphabet, ("", "x", "-1", "kube-system"[1:]))]
    for name in [*names, "default", "kube-system", "kopf-operators", "0day", "zz-top"]:
        assert len(serving(name, shards)) == 1, (name, serving(name, shards))


def test_exactly_one_shard_runs_cluster_scoped_work() -> None:
    assert [s["name"] for s in shipped_shards() if s.get("clusterScoped")] == ["a"]
