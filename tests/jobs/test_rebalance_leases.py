"""Scheduler leases on both backends: racing owners run each tick exactly once, a live lease blocks the
next tick, an expired one is taken over, the heartbeat keeps a long run's lease, a pass by hand holds the
lease without taking a tick."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from costopt.jobs.leases import LeaseStore

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TTL = timedelta(seconds=30)


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> datetime:
        return self.t


def test_owners_racing_for_the_same_ticks_run_each_exactly_once(engine):
    stores = [LeaseStore(engine, owner=f"replica-{i}") for i in range(4)]
    ticks = [T0 + timedelta(seconds=s) for s in range(40)]
    wins: list[tuple[str, datetime]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    barriers = [threading.Barrier(len(stores)) for _ in ticks]

    def race(store: LeaseStore) -> None:
        try:
            for tick, barrier in zip(ticks, barriers, strict=True):
                barrier.wait()
                if store.claim_tick("collect:aws-spot", tick, TTL):
                    with lock:
                        wins.append((store.owner, tick))
                    store.release("collect:aws-spot")
        except BaseException as exc:
            errors.append(exc)
            for b in barriers:
                b.abort()

    threads = [threading.Thread(target=race, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(t for _, t in wins) == ticks  # every tick once, none twice
    state = stores[0].get("collect:aws-spot")
    assert state is not None and state.last_tick == ticks[-1] and state.runs == len(ticks)
    assert state.expires_at is None  # released


def test_a_tick_runs_once_and_never_an_older_one(engine):
    clock = Clock()
    a, b = LeaseStore(engine, owner="a", now=clock), LeaseStore(engine, owner="b", now=clock)
    tick = T0
    assert a.claim_tick("watch", tick, TTL)
    a.release("watch")
    assert not b.claim_tick("watch", tick, TTL)  # a late replica finds the tick taken
    assert not a.claim_tick("watch", tick - timedelta(seconds=5), TTL)  # an older tick never runs
    assert b.claim_tick("watch", tick + timedelta(seconds=5), TTL)
    with pytest.raises(ValueError, match="tz-aware"):
        a.claim_tick("watch", datetime(2026, 1, 2), TTL)


def test_a_live_lease_blocks_the_next_tick_and_an_expired_one_is_taken_over(engine):
    clock = Clock()
    a, b = LeaseStore(engine, owner="a", now=clock), LeaseStore(engine, owner="b", now=clock)
    assert a.claim_tick("rebalance", T0, TTL)  # a runs, and dies without releasing
    clock.t = T0 + timedelta(seconds=10)
    assert not b.claim_tick("rebalance", T0 + timedelta(seconds=10), TTL)  # a's run may still go on
    holder = b.holder("rebalance")
    assert holder is not None and holder.owner == "a"
    clock.t = T0 + TTL + timedelta(microseconds=1)
    assert b.holder("rebalance") is None
    assert b.claim_tick("rebalance", T0 + timedelta(seconds=40), TTL)  # expired: taken over
    assert not a.renew("rebalance", TTL)  # a's heartbeat learns it lost the lease
    a.release("rebalance")  # a no-op for a: b still holds it
    state = b.holder("rebalance")
    assert state is not None and state.owner == "b" and state.runs == 2


def test_renewing_keeps_the_lease(engine):
    clock = Clock()
    a, b = LeaseStore(engine, owner="a", now=clock), LeaseStore(engine, owner="b", now=clock)
    assert a.claim_tick("engine", T0, TTL)
    for step in range(1, 5):
        clock.t = T0 + step * timedelta(seconds=20)  # past the first expiry, renewed each time
        assert a.renew("engine", TTL)
        assert not b.claim_tick("engine", clock.t, TTL)
    a.release("engine")
    assert b.claim_tick("engine", clock.t, TTL)


def test_a_pass_by_hand_holds_the_lease_without_taking_a_tick(engine):
    clock = Clock()
    service, cli = LeaseStore(engine, owner="service", now=clock), LeaseStore(engine, owner="cli", now=clock)
    assert service.claim_tick("rebalance", T0, TTL)
    assert not cli.acquire("rebalance", TTL)  # the service's pass runs now
    service.release("rebalance")
    assert cli.acquire("rebalance", TTL)
    assert not service.claim_tick("rebalance", T0 + timedelta(hours=1), TTL)  # the pass by hand runs
    cli.release("rebalance")
    assert service.claim_tick("rebalance", T0 + timedelta(hours=1), TTL)
    state = service.get("rebalance")
    assert state is not None and state.last_tick == T0 + timedelta(hours=1) and state.runs == 3


def test_the_heartbeat_keeps_a_long_run_from_being_overlapped(engine):
    # renewed every third of the ttl by a thread: 2 s leave it room on a loaded machine (0.3 s did not, at load 15)
    ttl = timedelta(seconds=2)
    a, b = LeaseStore(engine, owner="a"), LeaseStore(engine, owner="b")
    start = datetime.now(UTC)
    with a.hold("reconcile", ttl, tick=start) as won:
        assert won
        deadline = time.monotonic() + 5.0  # two and a half ttls
        while time.monotonic() < deadline:
            assert not b.claim_tick("reconcile", datetime.now(UTC), ttl)
            time.sleep(0.25)
    state = b.get("reconcile")
    assert state is not None and state.expires_at is None  # released at the end of the block
    assert b.claim_tick("reconcile", datetime.now(UTC), ttl)
    with a.hold("reconcile", ttl) as won_again:
        assert not won_again  # b holds it


def test_a_failing_run_still_releases_its_lease(engine):
    a, b = LeaseStore(engine, owner="a"), LeaseStore(engine, owner="b")
    with pytest.raises(RuntimeError), a.hold("watch", TTL, tick=datetime.now(UTC)):
        raise RuntimeError("the run failed")
    assert b.holder("watch") is None
    with pytest.raises(ValueError, match="positive"):
        b.acquire("watch", timedelta(0))
