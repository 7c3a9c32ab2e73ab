"""Secrets' digests on workloads keyed with the installation's key (HMAC-SHA256): not guessable from
the workload alone; the first pass after the upgrade adopts them without rolling; the key is read, or
created once (a second replica racing reads the first's), by the first pass."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from kopf_operators.core.api import AlreadyExists
from kopf_operators.reroller import controller as reroller
from kopf_operators.reroller import patches, plans, settings
from kopf_operators.reroller.plans import Action
from kopf_operators.reroller.views import Source, SourceView, source_view
from tests.unit.fake_access import FakeAccess

KEY = b"k" * 32
SECRET = Source("Secret", "creds")
CONF = Source("ConfigMap", "conf")


def views(secret_data: str) -> dict[tuple[str, str], SourceView]:
    return {("Secret", "creds"): source_view("Secret", {"metadata": {}, "data": {"p": secret_data}}),
            ("ConfigMap", "conf"): source_view("ConfigMap", {"metadata": {}, "data": {"k": "v"}})}


def test_a_secrets_digest_is_keyed_and_a_configmaps_is_not() -> None:
    lookup = views("aHVudGVyMg==")
    plain = plans.snapshot([SECRET, CONF], lookup)
    keyed = plans.snapshot([SECRET, CONF], lookup, digest_key=KEY)
    other = plans.snapshot([SECRET, CONF], lookup, digest_key=b"o" * 32)
    assert keyed.per_source["configmap/conf"] == plain.per_source["configmap/conf"]
    secret = keyed.per_source["secret/creds"]
    assert secret.startswith(plans.KEYED) and len(secret) == len(plans.KEYED) + 8
    assert secret[len(plans.KEYED):] != plain.per_source["secret/creds"]
    assert other.per_source["secret/creds"] != secret  # it depends on the key
    scoped = plans.snapshot([SECRET], lookup, ((("Secret", "creds"), ("p",)),), digest_key=KEY)
    scope, _, value = scoped.per_source["secret/creds"].removeprefix(plans.KEYED).partition(".")
    assert len(scope) == 4 and len(value) == 8


def test_the_first_pass_after_the_upgrade_adopts_the_keyed_digests_without_rolling() -> None:
    lookup = views("djE=")
    old = plans.snapshot([SECRET, CONF], lookup)
    baseline = patches.baseline_annotations(plans.plan({}, old), old)
    keyed = plans.snapshot([SECRET, CONF], lookup, digest_key=KEY)
    adopted = plans.plan(baseline, keyed)
    assert adopted.action is Action.BASELINE
    # Keyed from then on: a real change of the Secret rolls, a ConfigMap's too.
    after = patches.baseline_annotations(adopted, keyed)
    changed = plans.snapshot([SECRET, CONF], views("djI="), digest_key=KEY)
    assert plans.plan(after, changed).changed == ("secret/creds",)
    assert plans.plan(after, keyed).action is Action.NONE


def test_the_key_is_created_once_by_the_first_pass_and_read_after() -> None:
    async def scenario(access: FakeAccess) -> tuple[bytes | None, bytes | None]:
        indexes: dict[str, Any] = {index_id: {} for index_id in reroller.INDEXES}
        ctl = reroller.RerollerController(access, settings.Options(), indexes, key_namespace="ops")  # type: ignore[arg-type]
        first, again = await ctl.digest_key(), await ctl.digest_key()
        await ctl.stop()
        return first, again

    access = FakeAccess()
    first, again = asyncio.run(scenario(access))
    assert first is not None and len(first) == reroller.DIGEST_KEY_BYTES and again == first
    assert [c[:4] for c in access.calls] == [("read", "Secret", "ops", reroller.DIGEST_KEY_SECRET),
                                            ("create", "Secret", "ops", reroller.DIGEST_KEY_SECRET)]


def test_of_two_replicas_racing_to_create_the_key_the_second_reads_the_firsts() -> None:
    theirs = base64.b64encode(b"t" * 32).decode()
    stored: dict[str, Any] = {"metadata": {"name": reroller.DIGEST_KEY_SECRET}, "data": {"key": theirs}}
    access = FakeAccess()
    access.answer("read", None, stored)
    access.answer("create", AlreadyExists(409, "AlreadyExists"))
    assert asyncio.run(reroller.load_digest_key(access, "ops")) == b"t" * 32  # type: ignore[arg-type]


def test_without_an_operator_namespace_the_digests_stay_unkeyed_and_nothing_is_written() -> None:
    async def scenario(access: FakeAccess) -> bytes | None:
        indexes: dict[str, Any] = {index_id: {} for index_id in reroller.INDEXES}
        ctl = reroller.RerollerController(access, settings.Options(), indexes)  # type: ignore[arg-type]
        key = await ctl.digest_key()
        await ctl.stop()
        return key

    access = FakeAccess()
    assert asyncio.run(scenario(access)) is None and access.calls == []
