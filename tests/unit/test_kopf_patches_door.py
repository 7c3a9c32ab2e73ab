"""The door to Kopf's internals (core/kopf_patches/door.py) and the process-wide Kopf settings: the version
check, the measurement knob, the reads of Kopf's registries, the diff base only where a handler uses it.
Each patch has its own test module beside this one (test_kopf_patches_<patch>.py).

These test modules are the only ones besides the door's package that may import ``kopf._…``: they pin
the lines of Kopf's private code that the patches rely on
(``test_no_module_but_the_door_imports_kopfs_internals``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kopf
import pytest
from kopf._core.reactor import processing

from kopf_operators.blackadder import settings as blackadder
from kopf_operators.copyrator import rules as copyrator
from kopf_operators.core.kopf_patches.door import KOPF_TESTED_VERSION, SKIP_ENV, kopf_version, skipped_patches
from kopf_operators.core.process import DiffBaseWhereUsed
from kopf_operators.immortal import decisions as immortal
from testsupport.paths import REPO

# Loads the files the way `kopf run` does, then prints the groups whose handlers use the diff base.
_PROBE = """
import glob, json, kopf
from kopf_operators.core.kopf_patches import door, registries
door.install()
registries.preload(sorted(glob.glob("operators/*.py")))
registry = kopf.get_default_registry()
groups = door.change_detecting_groups(registry)
print(json.dumps(None if groups is None else sorted(groups)))
handlers = registries.all_handlers(registry)
pod_handlers = [handler.id for kind, of_kind in handlers.items() if kind != "_activities" for handler in of_kind
                if handler.selector is not None and "pods" in (handler.selector.any_name, handler.selector.plural)]
print(json.dumps(sorted(pod_handlers)))
sync = [handler.id for of_kind in handlers.values() for handler in of_kind
        if not registries.is_async_handler(handler) and handler.id not in ("login_via_client", "login_via_pykube")]
print(json.dumps(sync))
"""


def _probe() -> list[Any]:
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=REPO, env={**os.environ, "CHAOS_TENANTS": "true"},
                         capture_output=True, text=True, check=True, timeout=120)
    return [json.loads(line) for line in out.stdout.strip().splitlines()[-3:]]


# What a fresh process looks like after importing every operator file (as `kopf run` does) and then,
# optionally, installing the patches with a given "installed" Kopf version.
_STATE_PROBE = """
import asyncio.sslproto, glob, json, sys
from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.clients import api
from kopf._core.reactor import processing, running
from kopf_operators.core import runtime
from kopf_operators.core.kopf_patches import door, registries
registries.preload(sorted(glob.glob("operators/*.py")))
def state():
    return {"processor": getattr(processing.process_resource_event, "_governed", False),
            "toggles": getattr(aiotoggles.ToggleSet, "_wakes_only_on_change", False),
            "lean": getattr(api.stream, "_lean", False),
            "tls": asyncio.sslproto.SSLProtocol.max_size == runtime.TLS_READ_BUFFER_BYTES,
            "warm": door.warm_standby()}
imported = state()
installed = door.install(version=sys.argv[1]) if len(sys.argv) > 1 else None
print(json.dumps({"imported": imported, "installed": installed, "after": state()}))
"""


def _state(*version: str, skip: str = "") -> tuple[dict[str, Any], str]:
    out = subprocess.run([sys.executable, "-c", _STATE_PROBE, *version], cwd=REPO, capture_output=True, text=True,
                         check=True, timeout=120,
                         env={**os.environ, "CHAOS_TENANTS": "true", SKIP_ENV: skip})
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_importing_every_operator_file_changes_nothing_in_kopf() -> None:
    state, _ = _state()
    assert not any(state["imported"].values()), state


def test_install_patches_kopf_when_it_is_the_tested_version() -> None:
    state, stderr = _state(KOPF_TESTED_VERSION)
    assert state["installed"] is True
    assert all(state["after"].values()), state
    assert "Kopf" not in stderr


def test_install_refuses_another_kopf_version_in_one_line_and_patches_nothing() -> None:
    state, stderr = _state("1.99.0")
    assert state["installed"] is False
    assert not any(state["after"].values()), state  # stock Kopf: no patch, a cold standby
    lines = [line for line in stderr.splitlines() if "1.99.0" in line]
    assert len(lines) == 1 and KOPF_TESTED_VERSION in lines[0] and "unpatched" in lines[0]


def test_a_measurement_leaves_out_only_the_patches_it_names() -> None:
    """KOPF_PATCHES_SKIP (paired bench runs against stock Kopf): the named patches are not installed,
    the others are; without the governed processor a standby is cold (nothing holds its handlers)."""
    state, stderr = _state(KOPF_TESTED_VERSION, skip="govern_event_processing, small_tls_read_buffers")
    assert state["installed"] is True
    assert state["after"] == {"processor": False, "toggles": True, "lean": True, "tls": False, "warm": False}
    lines = [line for line in stderr.splitlines() if SKIP_ENV in line]
    assert len(lines) == 1 and "govern_event_processing, small_tls_read_buffers" in lines[0]
    with pytest.raises(ValueError, match="no patch named lean"):  # a typo would measure nothing
        skipped_patches({SKIP_ENV: "lean"})


def test_unpatched_the_process_leaves_every_event_and_diff_base_to_kopf() -> None:
    """On stock Kopf nothing reads Kopf's private registries: every group keeps its diff base, and
    no event policy is made (the processor is Kopf's own)."""
    probe = ("import glob, json, kopf\n"
             "from kopf_operators.core.kopf_patches import door, registries\n"
             "registries.preload(sorted(glob.glob('operators/*.py')))\n"
             "print(json.dumps(door.change_detecting_groups(kopf.get_default_registry())))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True,
                         timeout=120)
    assert json.loads(out.stdout.strip().splitlines()[-1]) is None


def test_kopf_is_pinned_to_the_version_the_patches_were_tested_with() -> None:
    pyproject = (REPO / "pyproject.toml").read_text()
    pins = re.findall(r'"kopf==([^"]+)"', pyproject)
    assert pins == [KOPF_TESTED_VERSION]
    assert kopf_version() == KOPF_TESTED_VERSION  # what this venv runs


# The door's package, and its tests: every other file of the project reaches Kopf's internals only
# through the door.
DOOR = ("kopf_operators/core/kopf_patches/", "tests/unit/test_kopf_patches_")


def test_no_module_but_the_door_imports_kopfs_internals() -> None:
    private = re.compile(r"\bkopf\._[a-z]")
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    assert "kopf_operators/core/kopf_patches/door.py" in files
    offenders = sorted(path for path in files if not path.startswith(DOOR) and (REPO / path).exists()
                       and private.search((REPO / path).read_text()))
    assert offenders == []


def test_the_diff_base_is_kept_only_for_the_groups_with_change_handlers_or_daemons() -> None:
    groups, _, _ = _probe()
    assert groups == sorted({copyrator.GROUP, blackadder.GROUP})
    assert immortal.GROUP not in groups and "" not in groups  # ImmortalContainers, pods, ConfigMaps: none


class Recording(kopf.DiffBaseStorage):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        self.calls.append("build")
        return kopf.BodyEssence(spec=dict(body.get("spec") or {}))

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        self.calls.append("fetch")
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        self.calls.append("store")


def body(api_version: str) -> kopf.Body:
    return kopf.Body({"apiVersion": api_version, "kind": "X", "metadata": {"name": "x"}, "spec": {"a": 1}})


def test_bodies_of_other_groups_cost_no_copy_and_show_no_change() -> None:
    inner = Recording()
    storage = DiffBaseWhereUsed(inner, frozenset({copyrator.GROUP}))
    for skipped in ("v1", f"{immortal.GROUP}/{immortal.VERSION}", "apps/v1"):
        assert storage.build(body=body(skipped)) == {}
        assert storage.fetch(body=body(skipped)) is None
    assert inner.calls == []
    assert storage.build(body=body(f"{copyrator.GROUP}/v1")) == {"spec": {"a": 1}}
    assert storage.fetch(body=body(f"{copyrator.GROUP}/v1")) is None
    assert inner.calls == ["build", "fetch"]


def test_without_a_known_group_every_body_keeps_its_diff_base() -> None:
    inner = Recording()
    storage = DiffBaseWhereUsed(inner, None)
    storage.build(body=body("v1"))
    storage.fetch(body=body("v1"))
    assert inner.calls == ["build", "fetch"]


def test_pods_are_read_only_by_the_immortal_handlers_that_their_fingerprint_covers() -> None:
    """The immortal operator skips a pod's modification that leaves ``pod_fingerprint`` unchanged, for
    every handler of the process: a new handler or index of pods elsewhere must extend it first."""
    _, pod_handlers, _ = _probe()
    assert pod_handlers == ["immortal-pod-event", "immortal-pods"]


def test_every_handler_and_index_runs_on_the_event_loop() -> None:
    """Kopf runs a sync handler in a worker thread on every call (a hand-off each way, a task for its
    shield, a copy of the context): an index function of ours, cheap and pure, is ``async def``
    and runs inline."""
    _, _, sync = _probe()
    assert sync == []


def test_kopf_posts_events_from_at_most_the_configured_number_of_workers() -> None:
    """``settings.posting.worker_limit`` and ``idle_timeout`` (set by ``configure``) are what bound Kopf's
    concurrent Event posts, each on its own connection of an unbounded pool (pinned: Kopf's poster)."""
    posting = Path(processing.__file__).parent.parent / "engines" / "posting.py"
    source = posting.read_text()
    assert "aiotasks.Scheduler(limit=settings.posting.worker_limit)" in source
    assert "settings.posting.idle_timeout" in source
