"""Leader election on a Lease (core/election.py): only the holder acts, a standby writes nothing but its
attempts at the Lease, a dead holder is replaced within the lease duration, a released Lease at once
by a standby (a process that has just started leaves it to the standby for a retry period and a second).

The candidates talk through the real access layer to an in-memory Lease endpoint (resourceVersions,
409 on a taken name or a stale version) on a virtual clock: no cluster, no waiting."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import kopf
import pytest

from kopf_operators.core import access as access_module
from kopf_operators.core import api, metrics
from kopf_operators.core.election import ElectionThread, Elector, LeaseSettings
from kopf_operators.core.kopf_patches.governed import EventPolicy, governed
from kopf_operators.core.process import ACCESS, EVENT_POLICY

SETTINGS = LeaseSettings(enabled=True, name="kopf-operators", namespace="ops")


class LeaseServer:
    """The API server's Lease endpoint, in memory: the requests as the access layer sends them."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.writes: list[tuple[str, str]] = []  # (method, holderIdentity written)
        self.reads = 0
        self.down = False  # every request fails (503) while True

    async def request(self, method: str, url: str, body: Any, content_type: str,
                      accept: str = "") -> dict[str, Any] | None:
        if self.down:
            raise api.ApiError(503, "Service Unavailable")
        assert "/apis/coordination.k8s.io/v1/namespaces/ops/leases" in url, url
        if method == "GET":
            self.reads += 1
            return json.loads(json.dumps(self.lease)) if self.lease else None
        self.writes.append((method, (body.get("spec") or {}).get("holderIdentity", "")))
        if method == "POST" and self.lease is not None:
            raise api.ApiError(409, "Conflict", "already exists")
        current = (self.lease or {}).get("metadata", {}).get("resourceVersion")
        stale = current is None or body["metadata"].get("resourceVersion") != current
        if method == "PUT" and stale:
            raise api.Conflict(409, "Conflict")
        self.version += 1
        self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.version)}}
        return json.loads(json.dumps(self.lease))

    @property
    def holder(self) -> str:
        return ((self.lease or {}).get("spec") or {}).get("holderIdentity", "")


class Clock:
    """Virtual time: a candidate's sleep advances it (the candidates take turns)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def candidate(server: LeaseServer, clock: Clock, name: str, settings: LeaseSettings = SETTINGS,
              lost: list[str] | None = None) -> Elector:
    access = access_module.Access(client=None)
    access._once = server.request  # type: ignore[method-assign]
    return Elector(access, settings, on_lost=lambda: (lost if lost is not None else []).append(name),
                   identity=name, clock=clock, wall=lambda: clock.now)


async def step(elector: Elector) -> bool:
    """One attempt, as ``run()`` makes it (a failed attempt is False)."""
    sent = elector.clock()
    ok = await elector._attempt(SETTINGS.renew_deadline)
    if ok:
        elector._renewed_at = sent
        if elector.leading:
            elector.acting.fence.close_at(sent + elector.settings.renew_deadline, elector.clock)
        else:
            elector._acquired()
    return ok


def leader_gauge(name: str) -> float:
    return metrics.LEADER.labels(lease=name)._value.get()


def test_settings_from_the_environment(tmp_path: Path) -> None:
    none = tmp_path / "absent"
    assert LeaseSettings.from_env({}, none) == LeaseSettings(False, "kopf-operators", "default", 15, 10, 2)
    sa = tmp_path / "namespace"
    sa.write_text("ops\n")
    assert LeaseSettings.from_env({"LEADER_ELECTION": "1"}, sa).namespace == "ops"
    assert LeaseSettings.from_env({"LEADER_ELECTION": "yes"}, sa).enabled
    assert LeaseSettings.from_env({"POD_NAMESPACE": "pods"}, sa).namespace == "pods"
    assert LeaseSettings.from_env({"POD_NAMESPACE": "pods", "LEASE_NAMESPACE": "leases"}, sa).namespace == "leases"
    custom = LeaseSettings.from_env({"LEADER_ELECTION": "true", "LEASE_NAME": "rel", "LEASE_DURATION_SECONDS": "20",
                                     "LEASE_RENEW_DEADLINE_SECONDS": "12", "LEASE_RETRY_PERIOD_SECONDS": "3"}, none)
    assert custom == LeaseSettings(True, "rel", "default", 20, 12, 3)


@pytest.mark.parametrize("env", [
    {"LEASE_DURATION_SECONDS": "10"},  # the renew deadline (10) must be shorter than the duration
    {"LEASE_RENEW_DEADLINE_SECONDS": "2"},  # the retry period (2) must be shorter than the renew deadline
    {"LEASE_DURATION_SECONDS": "1.5"},  # whole seconds (sub-second leases elect two leaders)
    {"LEASE_RETRY_PERIOD_SECONDS": "0"},
    {"LEADER_ELECTION": "maybe"},
])
def test_malformed_settings_fail_at_start(env: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        LeaseSettings.from_env(env, tmp_path / "absent")


def test_the_first_candidate_acts_and_the_other_writes_nothing_while_it_renews() -> None:
    async def scenario() -> None:
        server, clock = LeaseServer(), Clock()
        a, b = candidate(server, clock, "a"), candidate(server, clock, "b")
        assert a.access.paused and b.access.paused  # nobody acts before it holds the Lease
        assert await step(a) and not a.access.paused and leader_gauge("kopf-operators") == 1
        assert server.holder == "a" and server.lease["spec"]["leaseDurationSeconds"] == 15
        writes = len(server.writes)
        for _ in range(30):  # a minute: a renews every 2 s, b looks every 2 s
            clock.now += 1
            assert await step(a)
            clock.now += 1
            assert not await step(b)
        assert b.access.paused and not b.leading
        assert [holder for _, holder in server.writes[writes:]] == ["a"] * 30  # b: not one write
        assert server.lease["spec"]["leaseTransitions"] == 0

    asyncio.run(scenario())


def test_a_dead_holder_is_replaced_after_its_renew_deadline_and_within_the_lease_duration() -> None:
    """The holder is SIGKILLed right after a renewal: the standby takes over after the holder's renew
    deadline (when a live holder would have stepped down), and at most the lease duration after the kill."""
    async def scenario(phase: float) -> None:
        server, clock = LeaseServer(), Clock()
        a, b = candidate(server, clock, "a"), candidate(server, clock, "b")
        await step(a)
        clock.now += phase
        for _ in range(5):
            assert not await step(b)
            clock.now += 2 - phase
            await step(a)
            clock.now += phase
        killed = last_renewal = clock.now - phase
        while not await step(b):
            clock.now += min(2.0, max(0.0, b.expiry() - clock.now) + 0.01)
            assert clock.now - killed < 30
        assert not b.access.paused and server.holder == "b"
        assert last_renewal + SETTINGS.renew_deadline < clock.now <= killed + SETTINGS.duration + 0.02
        assert server.lease["spec"]["leaseTransitions"] == 1  # type: ignore[index]

    for phase in (0.0, 0.5, 1.0, 1.5, 1.99):  # where the standby's polls fall between the holder's renewals
        asyncio.run(scenario(phase))


async def holder_and_warm_standby(server: LeaseServer, clock: Clock, offset: float) -> tuple[Elector, Elector]:
    """a holds the Lease; b has stood by for 4 s, looking ``offset`` s after each of a's renewals."""
    a, b = candidate(server, clock, "a"), candidate(server, clock, "b")
    await step(a)
    for _ in range(2):
        clock.now += offset
        assert not await step(b)
        clock.now += 2 - offset
        assert await step(a)
    return a, b


def test_a_released_lease_is_taken_over_at_the_next_look() -> None:
    async def scenario() -> None:
        server, clock = LeaseServer(), Clock()
        a, b = await holder_and_warm_standby(server, clock, 1.0)
        await a.release()
        assert a.access.paused and server.holder == "" and leader_gauge("kopf-operators") == 0
        with pytest.raises(api.Paused):  # a released holder writes nothing more
            await a.access.create(api.POD, {"metadata": {"namespace": "ns", "name": "p"}})
        clock.now += 0.1
        assert await step(b) and server.holder == "b"

    asyncio.run(scenario())


def test_a_process_that_has_just_started_leaves_a_released_lease_to_the_warm_standby() -> None:
    """A holder's pod deleted: it releases the Lease as the Deployment's replacement starts. The
    replacement, cold, does not take it before the standby's next look; alone, it takes it a retry
    period and a second after it first saw it released, looking no more often than every retry period."""
    async def scenario(standby_looks_in: float) -> None:
        server, clock = LeaseServer(), Clock()
        a, b = await holder_and_warm_standby(server, clock, 0.1)
        await a.release()
        clock.now += 0.05
        fresh = candidate(server, clock, "fresh")
        assert not await step(fresh)  # its first look: released, but it has only just started
        clock.now += standby_looks_in
        assert not await step(fresh)
        assert await step(b) and server.holder == "b"  # the standby, at its next look (within 2 s)
        clock.now += 2
        assert not await step(fresh)  # now held by b

    for looks_in in (0.05, 1.0, 1.9):
        asyncio.run(scenario(looks_in))

    async def alone() -> None:
        server, clock = LeaseServer(), Clock()
        a = candidate(server, clock, "a")
        await step(a)
        await a.release()
        fresh = candidate(server, clock, "fresh")
        fresh.sleep = virtual_sleep_for(clock)
        started, reads = clock.now, server.reads
        election = asyncio.create_task(fresh.run())
        while not fresh.leading:
            await asyncio.sleep(0)
        assert server.holder == "fresh"
        assert started + SETTINGS.retry_period + 1 <= clock.now <= started + SETTINGS.retry_period + 1.1
        assert server.reads - reads <= 3  # a look every retry period at most, not a poll while it waits
        fresh.stop()
        await asyncio.wait_for(election, 1)

    asyncio.run(alone())


def test_the_release_follows_a_renewal_that_was_in_flight() -> None:
    async def scenario() -> None:
        server, clock = LeaseServer(), Clock()
        a = candidate(server, clock, "a")
        await step(a)
        stale = a.lease
        clock.now += 2
        await step(a)  # the answer of this renewal was lost when the election stopped
        a.lease = stale
        await a.release()
        assert server.holder == ""

    asyncio.run(scenario())


def virtual_sleep_for(clock: Clock) -> Any:
    async def sleep(seconds: float) -> None:
        clock.now += seconds
        await asyncio.sleep(0)
    return sleep


def test_a_standby_told_to_stop_never_takes_the_lease_the_holder_then_releases() -> None:
    async def scenario() -> None:
        server, clock = LeaseServer(), Clock()
        a, b = candidate(server, clock, "a"), candidate(server, clock, "b")
        await step(a)
        election = asyncio.create_task(b.run())  # real sleeps, a still clock: a's claim holds
        await asyncio.sleep(0.01)  # b polls, sees a's claim, waits a retry period
        writes = len(server.writes)
        b.stop()  # SIGTERM to the standby
        await a.release()  # ... and the holder hands over in the same moment
        await asyncio.wait_for(election, 1)
        assert server.holder == "" and b.access.paused and not b.leading
        assert server.writes[writes:] == [("PUT", "")]  # a's release only: b asked for nothing more

    asyncio.run(scenario())


def test_a_lease_won_by_an_attempt_in_flight_at_the_stop_is_handed_back_unused() -> None:
    async def scenario() -> None:
        server, clock = LeaseServer(), Clock()
        b = candidate(server, clock, "b")
        answered = server.request
        sent, go = asyncio.Event(), asyncio.Event()

        async def slow(method: str, url: str, body: Any, content_type: str, accept: str = "") -> dict[str, Any] | None:
            if method != "GET" and body["spec"].get("holderIdentity") == "b" and not go.is_set():
                sent.set()
                await go.wait()  # the stop arrives while this write is on its way
            return await answered(method, url, body, content_type)

        b.access._once = slow  # type: ignore[method-assign]
        b.sleep = virtual_sleep_for(clock)
        election = asyncio.create_task(b.run())
        await asyncio.wait_for(sent.wait(), 1)
        b.stop()
        go.set()
        await asyncio.wait_for(election, 1)
        assert [w[1] for w in server.writes] == ["b", ""]  # won, then released at once
        assert b.access.paused and not b.leading and leader_gauge("kopf-operators") == 0
        with pytest.raises(api.Paused):  # it never acted in between, and does not now
            await b.access.create(api.POD, {"metadata": {"namespace": "ns", "name": "p"}})

    asyncio.run(scenario())


def test_a_holder_told_to_stop_releases_the_lease_at_once() -> None:
    async def scenario() -> None:
        server, clock = LeaseServer(), Clock()
        a = candidate(server, clock, "a")
        a.sleep = asyncio.sleep  # real time: the stop must cut the pause between renewals short
        election = asyncio.create_task(a.run())
        await asyncio.sleep(0.01)
        assert server.holder == "a" and not a.access.paused
        a.stop()
        await asyncio.wait_for(election, 0.5)  # not after the 2 s retry period
        assert server.holder == "" and a.access.paused
        writes = len(server.writes)
        await a.release()  # the cleanup handler's release finds nothing more to do
        assert len(server.writes) == writes

    asyncio.run(scenario())


def test_a_holder_that_lost_the_lease_leaves_the_new_holders_claim_alone_at_release(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        server, clock = LeaseServer(), Clock()
        a, b = candidate(server, clock, "a"), candidate(server, clock, "b")
        await step(a)
        clock.now += SETTINGS.duration + 1  # a's renewals starved: b takes the Lease over
        assert not await step(b)  # b's first look
        clock.now += SETTINGS.duration + 1
        assert await step(b)
        with caplog.at_level("INFO", logger="kopf_operators.election"):
            await a.release()  # a's cleanup, with its own (stale) copy naming it
        assert server.holder == "b"
        assert "Released the Lease" not in caplog.text

    asyncio.run(scenario())


def test_a_holder_that_cannot_renew_stops_acting_at_its_renew_deadline_and_exits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(access_module, "BACKOFF_SECONDS", 0.0)  # the layer's retries of each attempt: no real wait

    async def scenario() -> None:
        server, clock, lost = LeaseServer(), Clock(), list[str]()

        async def sleep(seconds: float) -> None:
            clock.now += seconds
            if clock.now > start + 4:
                server.down = True  # the API server becomes unreachable for this replica
            await asyncio.sleep(0)

        a = candidate(server, clock, "a", lost=lost)
        a.sleep = sleep
        start = clock.now
        await asyncio.wait_for(a.run(), 5)  # returns once it has lost the Lease
        assert lost == ["a"] and a.access.paused and not a.leading
        stopped = clock.now - start - 4  # after the last renewal that could succeed
        assert SETTINGS.renew_deadline - SETTINGS.retry_period <= stopped <= SETTINGS.renew_deadline + 2

    asyncio.run(scenario())


def test_a_holder_that_finds_another_holder_exits() -> None:
    async def scenario() -> None:
        server, clock, lost = LeaseServer(), Clock(), list[str]()
        a = candidate(server, clock, "a", lost=lost)
        await step(a)
        server.lease["spec"]["holderIdentity"] = "usurper"  # type: ignore[index]
        server.version += 1
        server.lease["metadata"]["resourceVersion"] = str(server.version)  # type: ignore[index]

        async def sleep(seconds: float) -> None:
            clock.now += seconds
            await asyncio.sleep(0)

        a.sleep = sleep
        a._renewed_at = clock.now
        await asyncio.wait_for(a.run(), 5)
        assert lost == ["a"] and a.access.paused

    asyncio.run(scenario())


def test_twins_started_at_once_elect_exactly_one() -> None:
    async def scenario() -> None:
        for _ in range(20):
            server, clock = LeaseServer(), Clock()
            twins = [candidate(server, clock, name) for name in ("a", "b")]
            won = await asyncio.gather(*(step(twin) for twin in twins))
            assert sorted(won) == [False, True]
            assert [twin.access.paused for twin in twins] == [not w for w in won]

    asyncio.run(scenario())


def test_a_standby_sends_no_write_and_posts_no_event_but_its_lease_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    posted: list[Any] = []
    monkeypatch.setattr(kopf, "event", lambda *args, **kwargs: posted.append(args))
    layer = access_module.Access(client=None)
    layer.paused = True
    sent: list[str] = []

    async def once(method: str, url: str, body: Any, content_type: str, accept: str = "") -> dict[str, Any]:
        sent.append(f"{method} {url}")
        return {}

    layer._once = once  # type: ignore[method-assign]

    async def writes() -> None:
        for write in (layer.create(api.POD, {"metadata": {"namespace": "ns", "name": "p"}}),
                      layer.patch(api.CONFIGMAP, "ns", "c", {"data": {}}),
                      layer.delete(api.POD, "ns", "p", uid="u"),
                      layer.evict("ns", "p")):
            with pytest.raises(api.Paused):
                await write
        await layer.create(api.LEASE, {"metadata": {"namespace": "ops", "name": "kopf-operators"}})

    asyncio.run(writes())
    layer.event({"metadata": {"name": "x"}}, "Normal", "Reason", "message")
    assert posted == [] and sent == ["POST /apis/coordination.k8s.io/v1/namespaces/ops/leases"]


def test_a_warm_standby_indexes_every_event_and_holds_only_kopfs_change_handlers_until_it_acts() -> None:
    """Kopf's processor indexes an object, then waits on its "indexed" gate before the handlers: the
    patched processor adds the Lease to that gate (``ActingGate``) for resources with Kopf's change
    handlers (Kopf writes their state itself). Event-only resources run on: their controllers write
    nothing while paused, and sweep at once when the replica starts to act."""

    async def scenario() -> None:
        steps: list[str] = []

        class Indexed:  # Kopf's operator_indexed toggle set: every index is already filled
            async def wait_for(self, value: bool) -> None:
                pass

        async def process(operator_indexed: Any, raw_event: dict[str, Any], **_: Any) -> None:
            steps.append(f"indexed {raw_event['object']['metadata']['name']}")
            await operator_indexed.wait_for(True)
            steps.append(f"handled {raw_event['object']['metadata']['name']}")

        memo = kopf.Memo()
        access = ACCESS.set(memo, access_module.Access(None))
        EVENT_POLICY.set(memo, EventPolicy(frozenset({"flant.com"}), None))
        access.paused = True
        governing = governed(process)

        def event(group: str, name: str) -> asyncio.Future[Any]:
            return asyncio.ensure_future(governing(
                memobase=memo, resource=kopf.Resource(group, "v1", "things"), resource_indexed=None,
                operator_indexed=Indexed(), stream_pressure=asyncio.Event(),
                raw_event={"type": "ADDED", "object": {"metadata": {"name": name}}}))

        rule, configmap = event("flant.com", "rule"), event("", "cm")
        await asyncio.wait_for(configmap, 1)
        await asyncio.sleep(0.05)
        assert steps == ["indexed rule", "indexed cm", "handled cm"] and not rule.done()
        access.paused = False
        await asyncio.wait_for(rule, 1)
        assert steps[-1] == "handled rule"

    asyncio.run(scenario())


def test_a_holder_whose_renewals_stall_is_fenced_at_its_renew_deadline_before_it_notices() -> None:
    """The renewals run on a thread of their own; the process's writes are fenced at the renew deadline
    of the last renewal that succeeded, even when nothing (neither the election nor the process's event
    loop) has run since: no write after the moment the Lease could be taken over."""
    async def scenario() -> None:
        server, clock = LeaseServer(), Clock()
        a = candidate(server, clock, "a")
        assert await step(a)
        clock.now += 2
        assert await step(a)  # the last renewal that succeeds: fenced at clock.now + 10
        pod = {"metadata": {"namespace": "ns", "name": "p"}}
        clock.now += SETTINGS.renew_deadline - 0.01
        assert not a.access.paused
        sent: list[str] = []

        async def once(method: str, url: str, body: Any, content_type: str, accept: str = "") -> dict[str, Any]:
            sent.append(method)
            return {}

        a.access._once = once  # type: ignore[method-assign]
        await a.access.create(api.POD, pod)  # still inside the renew deadline
        clock.now += 0.01
        assert a.leading and a.access.paused  # the election has not run: the fence alone
        with pytest.raises(api.Paused):
            await a.access.create(api.POD, pod)
        a.access.event({"metadata": {"name": "x"}}, "Normal", "Reason", "message")  # dropped too
        assert sent == ["POST"]
        await a.access.create(api.LEASE, {"metadata": {"namespace": "ops", "name": "kopf-operators"}})
        assert sent == ["POST", "POST"]  # its attempts at the Lease still pass

    asyncio.run(scenario())


def test_a_write_that_waited_past_the_fence_is_not_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write refused by a busy server (503) is retried by the access layer after a backoff; a retry
    that would be sent after the fence is not sent at all."""
    monkeypatch.setattr(access_module, "BACKOFF_SECONDS", 0.0)

    async def scenario() -> None:
        server, clock = LeaseServer(), Clock()
        a = candidate(server, clock, "a")
        assert await step(a)
        sent: list[float] = []

        async def once(method: str, url: str, body: Any, content_type: str, accept: str = "") -> dict[str, Any]:
            sent.append(clock.now)
            clock.now += SETTINGS.renew_deadline  # the answer comes after the deadline
            raise api.ApiError(503, "Service Unavailable")

        a.access._once = once  # type: ignore[method-assign]
        with pytest.raises(api.Paused):
            await a.access.create(api.POD, {"metadata": {"namespace": "ns", "name": "p"}})
        assert len(sent) == 1

    asyncio.run(scenario())


def test_the_election_thread_renews_while_the_process_loop_is_blocked_and_fences_it_when_it_cannot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder's renewals do not wait for the process's event loop (busy with 10,000 objects, or
    here blocked outright for longer than the renew deadline); once they fail, the process's writes
    stop at the renew deadline and ``on_lost`` runs on the process's loop."""
    fast = LeaseSettings(enabled=True, name="kopf-operators", namespace="ops", duration=3, renew_deadline=2,
                         retry_period=1)
    monkeypatch.setattr(access_module, "BACKOFF_SECONDS", 0.0)  # the unreachable server's retries: no real wait

    async def scenario() -> None:
        server, lost = LeaseServer(), list[str]()
        process = access_module.Access(client=None)
        election = ElectionThread(process, fast, on_lost=lambda: lost.append(threading.current_thread().name),
                                  identity="a")
        election.elector.access._once = server.request  # type: ignore[method-assign]
        assert process.paused
        election.start()
        await asyncio.wait_for(process.until_acting(), 2)
        assert server.holder == "a" and not process.paused
        renewals = len(server.writes)
        time.sleep(fast.renew_deadline + 0.5)  # the process's loop runs nothing meanwhile
        assert len(server.writes) - renewals >= 2 and not process.paused and server.holder == "a"
        server.down = True
        cut = time.monotonic()
        while not process.paused:
            await asyncio.sleep(0.05)
        assert time.monotonic() - cut <= fast.renew_deadline + 0.5
        await asyncio.wait_for(election.done, 3)
        assert lost == [threading.current_thread().name]  # on the process's thread, not the election's
        with pytest.raises(api.Paused):
            await process.create(api.POD, {"metadata": {"namespace": "ns", "name": "p"}})

    asyncio.run(scenario())


def test_the_election_thread_releases_the_lease_when_closed() -> None:
    async def scenario() -> None:
        server = LeaseServer()
        process = access_module.Access(client=None)
        election = ElectionThread(process, SETTINGS, on_lost=lambda: None, identity="a")
        election.elector.access._once = server.request  # type: ignore[method-assign]
        election.start()
        await asyncio.wait_for(process.until_acting(), 2)
        await election.close(3)
        assert election.done.done() and server.holder == "" and process.paused

    asyncio.run(scenario())
