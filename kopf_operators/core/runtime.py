"""asyncio and glibc, process-wide: the two tweaks the door to Kopf (core/kopf_patches/door.py) installs besides
its patches of Kopf. Neither touches Kopf; the door decides when they apply (its version check, its
measurement knob), so each is listed there with the patches."""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import ctypes
import functools
from collections.abc import Callable

# asyncio gives every TLS connection a 256 KiB read buffer, zeroed (so resident) at once: with the
# watches, Kopf's posters and the access layer's pool, 40-50 connections. A TLS record carries at most
# 16 KiB, so a smaller buffer only means more reads of a large listing.
TLS_READ_BUFFER_BYTES = 64 * 1024

# glibc keeps the pages a burst freed in its heaps until told otherwise; a trim of a ~150 MB heap takes a
# few milliseconds of one thread.
TRIM_SECONDS = 10.0

def small_tls_read_buffers() -> None:
    """asyncio's TLS read buffer of ``TLS_READ_BUFFER_BYTES`` (64 KiB) instead of 256 KiB, for every
    TLS connection opened after this (``asyncio.sslproto.SSLProtocol.max_size``, a private attribute).

    Fixes: asyncio zeroes (so makes resident) a 256 KiB buffer per TLS connection at once; the process
    holds 40-50 (Kopf's watches, its Event posters, the access layer's pool of 16). A TLS record carries
    at most 16 KiB, so a smaller buffer only means more reads of a large listing.

    Gain (docs/performance.md, "Fewer bytes per kept object"): idle RSS 74.8-75.0 -> 69.4-69.6 MB, and
    -6 MB of growth per 1,000 ImmortalContainers.
    Re-measured against stock asyncio (paired, docs/kopf-patches.md): without it, idle RSS +2.6-4.8 MB
    and a start over 2,000 ConfigMaps peaks 4.1-5.7 MB higher.

    Upstream: CPython, not filed yet (docs/kopf-patches.md, "asyncio's TLS read buffer")."""
    asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER_BYTES


def glibc_malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none (musl, macOS)."""
    try:
        return functools.partial(ctypes.CDLL("libc.so.6").malloc_trim, 0)
    except (OSError, AttributeError):
        return None


async def trim_allocator(trim: Callable[[], object], period: float) -> None:
    """Every ``period`` seconds, give the allocator's free pages back to the system (forever)."""
    while True:
        await asyncio.sleep(period)
        trim()
