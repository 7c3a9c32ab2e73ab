"""The door to Kopf's internals: the version check, and the one call that installs the patches.

Nothing here happens on import. ``install()`` applies the patches, once, and only when the installed
Kopf is the version they were written and tested for (``KOPF_TESTED_VERSION``, equal to the exact pin
in pyproject.toml). On another version it patches nothing, logs one line, and the process runs on
stock Kopf: slower and bigger in a burst (the figures below), correct all the same; with leader
election, a standby is then cold (``warm_standby()``).

``install()`` must run before Kopf's ``spawn_tasks`` binds its event processor
(``functools.partial(processing.process_resource_event, …)`` in ``kopf._core.reactor.running``) and
creates its toggle sets, i.e. before ``kopf run`` starts the operator and after nothing else. The one
place that calls it is the process's entry point, ``kopf-operators run …`` (``python -m
kopf_operators``, ``kopf_operators/__main__.py``): Kopf's own CLI with the patches installed first.
Plain ``kopf run operators/*.py`` still works, unpatched.

The patches, one module each beside this one (each module's docstring: what it fixes and its measured
gain; docs/kopf-patches.md has the figures and the text of each upstream report):

- ``toggles.wake_gate_waiters_only_on_change``: Kopf's ToggleSet wakes its waiters only on a change;
- ``governed.govern_event_processing``: ``governed`` around Kopf's per-event processor (a cap on objects
  processed at once, superseded/echoed/unchanged events skipped, the Lease's gate, and a listed
  object's handlers deferred as its raw event: ``defer_listed``);
- ``lean.lean_watched_bodies``: no ``metadata.managedFields`` in what Kopf lists and streams;
- ``runtime.small_tls_read_buffers``: asyncio's TLS read buffer of 64 KiB instead of 256 KiB;
- ``allocator.start_allocator_trim``: glibc's ``malloc_trim(0)`` every 10 s (started by the startup handler);
- ``shards.filter_shards_in_process``: always installed (sharding on a server without the gate needs it);
- reads only: ``registries`` (Kopf's registries and loader), ``stop.when_stop_requested``.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from collections.abc import Callable, Mapping

import kopf

from kopf_operators.core.kopf_patches.governed import govern_event_processing
from kopf_operators.core.kopf_patches.lean import lean_watched_bodies
from kopf_operators.core.kopf_patches.registries import groups_with_change_handlers
from kopf_operators.core.kopf_patches.shards import filter_shards_in_process
from kopf_operators.core.kopf_patches.toggles import wake_gate_waiters_only_on_change
from kopf_operators.core.runtime import small_tls_read_buffers

logger = logging.getLogger("kopf_operators.kopf_patches")

# The Kopf release these patches were written for and tested with: pyproject.toml pins exactly this one
# (tests/unit/test_kopf_patches_door.py checks that they agree).
KOPF_TESTED_VERSION = "1.45.2"

# A measurement knob, not a setting: the patches named here (comma-separated function names of
# ``PATCHES``) are left out, so that a paired bench run can compare a patch with stock Kopf in the same
# process otherwise (docs/kopf-patches.md, "Measuring a patch"). Unset in production.
SKIP_ENV = "KOPF_PATCHES_SKIP"
PATCHES = ("wake_gate_waiters_only_on_change", "govern_event_processing", "lean_watched_bodies",
           "small_tls_read_buffers", "start_allocator_trim")

_installed = False
_skipped: frozenset[str] = frozenset()


def kopf_version() -> str:
    return importlib.metadata.version("kopf")


def installed() -> bool:
    """Whether ``install()`` has patched this process."""
    return _installed


def skipped_patches(env: Mapping[str, str]) -> frozenset[str]:
    """The patches ``SKIP_ENV`` names; a name that is not one of ``PATCHES`` is refused (a typo would
    otherwise measure the patched process against itself)."""
    names = frozenset(filter(None, (name.strip() for name in env.get(SKIP_ENV, "").split(","))))
    unknown = sorted(names - set(PATCHES))
    if unknown:
        raise ValueError(f"{SKIP_ENV}: no patch named {', '.join(unknown)} (one of {', '.join(PATCHES)})")
    return names


def install(version: str | None = None, env: Mapping[str, str] | None = None) -> bool:
    """Apply every patch, once, if the installed Kopf (``version``: the installed one when None) is
    ``KOPF_TESTED_VERSION``; else patch nothing and say so in one line. True when patched. The
    patches ``SKIP_ENV`` names (``env``: the process's environment when None) are left out, in one
    line too."""
    global _installed, _skipped
    if _installed:
        return True
    skip = skipped_patches(os.environ if env is None else env)
    version = kopf_version() if version is None else version
    if version != KOPF_TESTED_VERSION:
        logger.warning(f"Kopf {version} is installed, but the patches of kopf_operators.core.kopf_patches were "
                       f"tested with Kopf {KOPF_TESTED_VERSION} only: running on stock Kopf, unpatched (slower and "
                       "bigger in a burst; a standby replica is cold). See docs/kopf-patches.md.")
        return False
    patches: dict[str, Callable[[], None]] = {
        "wake_gate_waiters_only_on_change": wake_gate_waiters_only_on_change,
        "govern_event_processing": govern_event_processing,
        "lean_watched_bodies": lean_watched_bodies,
        "small_tls_read_buffers": small_tls_read_buffers,
    }
    for name, patch in patches.items():
        if name not in skip:
            patch()
    filter_shards_in_process()  # not a measurement knob: sharding on a server without the gate needs it
    if skip:
        logger.warning(f"{SKIP_ENV}: left out {', '.join(sorted(skip))} (a measurement against stock Kopf)")
    _installed, _skipped = True, skip
    return True


def warm_standby() -> bool:
    """Whether a standby replica may run Kopf's watches and indexes while it waits for the Lease: only
    when ``governed`` holds every object's handlers at the Lease's gate (the patched processor)."""
    return applied("govern_event_processing")


def applied(patch: str) -> bool:
    """Whether ``patch`` (one of ``PATCHES``) is in place: installed, and not left out by ``SKIP_ENV``."""
    return _installed and patch not in _skipped


def change_detecting_groups(registry: kopf.OperatorRegistry) -> frozenset[str] | None:
    """The API groups of the handlers that use Kopf's change detection (``registries``); None when a
    selector names no group, or when not installed (then every group is treated as one that does)."""
    return groups_with_change_handlers(registry) if _installed else None
