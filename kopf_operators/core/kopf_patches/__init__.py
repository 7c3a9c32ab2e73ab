"""The one door to Kopf's internals: every use of ``kopf._…`` and every monkeypatch of the process lives in
this package, one module per patch, beside the door that checks Kopf's version and installs them.

- ``door``: ``install()`` (version-checked: only on ``KOPF_TESTED_VERSION``), what is installed, the
  measurement knob ``KOPF_PATCHES_SKIP``, and the reads that depend on it (``change_detecting_groups``);
- ``toggles``: ``wake_gate_waiters_only_on_change`` (Kopf's ToggleSet);
- ``governed``: ``govern_event_processing`` (Kopf's event processor under the operator's ``EventPolicy``,
  the Lease's gate, listed objects' handlers deferred);
- ``lean``: ``lean_watched_bodies`` (no managedFields; listings paged and read ahead);
- ``shards``: ``filter_shards_in_process`` (hash shards filtered by the process itself);
- ``allocator``: ``start_allocator_trim`` (glibc's ``malloc_trim``; its code: ``core/runtime.py``);
- ``stop``: ``when_stop_requested`` (Kopf's stop, heard at once; patches nothing);
- ``registries``: reads of Kopf's private registries and its loader (patches nothing).

asyncio's TLS read buffer (``small_tls_read_buffers``) is installed by the door too; its code is
``core/runtime.py`` (asyncio's, not Kopf's). docs/kopf-patches.md has each patch's measured gain and
upstream report. No name is re-exported here: import each from its module.
"""
