"""A standby writes nothing: ``runtime.PeeringState`` mirrors Kopf's peering pause onto the access
layer, which then refuses every write. Driven by the installed Kopf's own peering code (its
``process_peering_event`` and toggle), so a Kopf upgrade that changes how it reports the pause fails here."""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import Any

import kopf
import pytest
from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.structs import references
from kopf._core.engines import peering

from kopf_operators.core import access as k8s
from kopf_operators.core.process import PeeringState

ME = peering.Identity("me")
PEERINGS = references.Resource("kopf.dev", "v1", "clusterkopfpeerings", namespaced=False)


def entry(priority: int, seconds_ago: float = 0, lifetime: int = 10) -> dict[str, Any]:
    seen = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds_ago)
    return {"priority": priority, "lifetime": lifetime, "lastseen": seen.isoformat()}


class Peers:
    """One process's view: Kopf's real pause toggle and our access layer, side by side."""

    def __init__(self, priority: int, mandatory: bool = True) -> None:
        self.settings = kopf.OperatorSettings()
        self.settings.peering.name = "kopf-operators"
        self.settings.peering.priority = priority
        self.settings.peering.mandatory = mandatory
        self.access = k8s.Access(client=None)  # no request is made here
        self.exits = 0  # how often the process would have exited (it lost its role after acting)
        PeeringState.follow(self.settings, self.access, on_lost_role=self.exit)
        # Kopf starts a mandatory peering paused (orchestration.spawn_missing_peerings).
        self.toggle = aiotoggles.Toggle(mandatory)

    def exit(self) -> None:
        self.exits += 1

    async def see(self, status: dict[str, Any]) -> None:
        woken = asyncio.Event()
        woken.set()  # Kopf would sleep until a blocking peer's deadline; the test need not
        await peering.process_peering_event(
            raw_event={"type": "MODIFIED", "object": {"metadata": {"name": "kopf-operators"}, "status": status}},
            namespace=None, resource=PEERINGS, identity=ME, settings=self.settings, autoclean=False,
            stream_pressure=woken, conflicts_found=self.toggle)


def test_the_access_layer_follows_kopfs_pause_through_every_transition() -> None:
    async def scenario() -> None:
        me = Peers(priority=-200)
        assert me.access.paused and me.toggle.is_on()  # paused until the first look at the peers
        await me.see({ME: entry(-200)})
        assert not me.access.paused and me.toggle.is_off()
        await me.see({ME: entry(-200), "younger": entry(-300)})  # a younger one stands by for us
        assert not me.access.paused and me.toggle.is_off() and me.exits == 0
        await me.see({ME: entry(-200), "older": entry(-100)})  # an older replica: it outranks us
        assert me.access.paused and me.toggle.is_on()
        assert me.exits == 1  # it had acted: it exits (the restart stands by from a fresh listing)
        await me.see({ME: entry(-200), "older": entry(-100, seconds_ago=11)})  # its lifetime is over
        assert not me.access.paused and me.toggle.is_off()
        await me.see({ME: entry(-200), "twin": entry(-200)})  # equal priorities: Kopf pauses everyone
        assert me.access.paused and me.toggle.is_on() and me.exits == 2


def test_a_standby_that_never_acted_does_not_exit() -> None:
    async def scenario() -> None:
        me = Peers(priority=-200)
        await me.see({ME: entry(-200), "older": entry(-100)})  # the older replica acts from the start
        await me.see({ME: entry(-200), "older": entry(-100), "dev": entry(100)})  # and pauses in turn
        assert me.access.paused and me.exits == 0

    asyncio.run(scenario())


def test_auto_detected_peering_exits_when_an_older_process_appears() -> None:
    async def scenario() -> None:
        me = Peers(priority=-200, mandatory=False)  # `make run`: acts from the start
        await me.see({ME: entry(-200), "older": entry(-100)})
        assert me.access.paused and me.exits == 1

    asyncio.run(scenario())

    asyncio.run(scenario())


def test_a_paused_process_sends_no_write_and_posts_no_event(monkeypatch: pytest.MonkeyPatch) -> None:
    posted: list[Any] = []
    monkeypatch.setattr(kopf, "event", lambda *args, **kwargs: posted.append(args))
    layer = k8s.Access(client=None)
    layer.paused = True

    async def writes() -> None:
        for write in (layer.create(k8s.POD, {"metadata": {"namespace": "ns", "name": "p"}}),
                      layer.patch(k8s.CONFIGMAP, "ns", "c", {"data": {}}),
                      layer.delete(k8s.POD, "ns", "p", uid="u"),
                      layer.evict("ns", "p")):
            with pytest.raises(k8s.Paused):
                await write

    asyncio.run(writes())
    layer.event({"metadata": {"name": "x"}}, "Normal", "Reason", "message")
    assert posted == []


def test_auto_detected_and_standalone_peering_start_active() -> None:
    assert not Peers(priority=0, mandatory=False).access.paused


def test_under_quiet_the_pause_is_still_seen_but_not_shown(caplog: pytest.LogCaptureFixture) -> None:
    peering_logger = logging.getLogger(PeeringState.LOGGER)
    root = logging.getLogger()
    saved = (root.level, peering_logger.level)
    root.setLevel(logging.WARNING)  # what `kopf run --quiet` does
    peering_logger.setLevel(logging.NOTSET)
    try:
        async def scenario() -> Peers:
            me = Peers(priority=-200)
            await me.see({ME: entry(-200)})
            await me.see({ME: entry(-200), "older": entry(-100)})
            return me

        with caplog.at_level(logging.WARNING):
            me = asyncio.run(scenario())
        assert me.access.paused
        assert "Pausing operations" not in caplog.text and "Resuming operations" not in caplog.text
    finally:
        root.setLevel(saved[0])
        peering_logger.setLevel(saved[1])
        for old in [f for f in peering_logger.filters if isinstance(f, PeeringState)]:
            peering_logger.removeFilter(old)
