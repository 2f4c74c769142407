"""The fleet tables' lock order on PostgreSQL (costopt/fleets/store.py's module doc): a transaction that writes
a fleet's row and its instances' rows locks the fleet's row first, so a release (the fleet, then its instances)
never deadlocks with a lost instance or a scale-down. The soak's run M had one release answered 503
("the database is unavailable right now"): a deadlock between a release and the executor's lost instance,
which locked the instance's row and then the fleet's. SQLite's writer locks the whole file: nothing to test."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from sqlalchemy import Engine, text, update

from costopt.db.fleets_schema import fleet_instances, fleets
from costopt.domain import Cloud, Market, OfferKey
from costopt.fleets.model import InstanceState, NewFleet, NewInstance
from costopt.fleets.store import FleetRepository

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
V100 = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)
K80 = OfferKey(Cloud.AWS, "us-east-1", "us-east-1b", "p2.xlarge", Market.SPOT)
BLOCKED_WITHIN_S = 30.0
"""How long the test waits for the writer under test to queue behind the release's lock (not a timing
assertion: a writer that never queues fails the test either way)."""


def _fleet(repo: FleetRepository) -> tuple[str, list[str]]:
    fleet, _ = repo.create(
        NewFleet(
            team_id="team-a",
            policy="max_min_fairness_perf",
            instances=(
                NewInstance(V100, "v100", 1, "local", Decimal("0.95")),
                NewInstance(K80, "k80", 1, "local", Decimal("0.35")),
            ),
            round_s=60.0,
            resolve_rounds=1000,
        )
    )
    ids = [i.id for i in repo.instances(fleet.id)]
    for iid in ids:
        assert repo.update_instance(iid, state=InstanceState.RUNNING)
    return fleet.id, ids


def _blocked_by(engine: Engine, pid: int) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))"), {"pid": pid}
            ).scalar_one()
        )


@pytest.mark.parametrize("writer", ["lose_instance", "drain"])
def test_a_release_holding_the_fleet_row_never_deadlocks_with_a_lost_instance_or_a_scale_down(
    engine: Engine, writer: str
) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite's writer locks the whole file: no row locks to order")
    repo = FleetRepository(engine, now=lambda: T0)
    fleet_id, (first, second) = _fleet(repo)
    work: Callable[[], object] = (
        (lambda: repo.lose_instance(first, "worker not synced"))
        if writer == "lose_instance"
        else (lambda: repo.drain(fleet_id, [first]))
    )
    failures: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # reported by the test below
            failures.append(exc)

    # the release's transaction, step by step: the fleet's row first ...
    with engine.connect() as release:
        release.execute(text("SET lock_timeout = '10s'"))
        release.execute(update(fleets).where(fleets.c.id == fleet_id).values(state="released", dirty=True))
        pid = int(release.execute(text("SELECT pg_backend_pid()")).scalar_one())
        other = threading.Thread(target=run)
        other.start()
        waited = time.monotonic()
        while not _blocked_by(engine, pid):
            assert other.is_alive(), f"the {writer} did not wait for the release's lock on the fleet: {failures}"
            assert time.monotonic() - waited < BLOCKED_WITHIN_S, f"the {writer} never queued behind the release"
            time.sleep(0.02)
        # ... then its instances: the writer waiting on the fleet's row holds none of them (it would be a
        # deadlock, one side cancelled by PostgreSQL; or the lock timeout here)
        changed = release.execute(
            update(fleet_instances)
            .where(fleet_instances.c.fleet_id == fleet_id)
            .values(state=InstanceState.DRAINING.value, end_reason="fleet released")
        ).rowcount
        release.commit()
    other.join(BLOCKED_WITHIN_S)
    assert not other.is_alive()
    assert changed == 2
    assert failures == []
    states = {i.id: i.state for i in repo.instances(fleet_id)}
    # after the release, a lost instance is lost (from draining); a drain leaves it draining
    assert states[first] is (InstanceState.LOST if writer == "lose_instance" else InstanceState.DRAINING)
    assert states[second] is InstanceState.DRAINING
