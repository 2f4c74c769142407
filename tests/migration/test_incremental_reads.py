"""The reads the engine makes after every recovery, narrowed to what is new or named (both backends): a
job's migrations after a given one and its newest, its copies of given instances, and a migration's
charge lines by key, each the same rows as the whole read filtered."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from costopt.agent import job_env
from costopt.agent.storage import drop_memory
from costopt.jobs.costs import CopyKeys, job_charges, migration_charge_keys, migration_cost
from costopt.ledger.sql import SqlLedger
from costopt.migration.records import State
from tests.providers.test_sim_agent import OD_A, OD_B, RATE, _prices, make_cloud, migrator


@pytest.fixture
def uri(tmp_path: Path) -> Iterator[str]:
    location = f"mem://incremental-{tmp_path.name}"
    yield location
    drop_memory(location)


def test_history_after_an_id_the_newest_migration_copies_by_instance_and_charges_by_key(
    engine: Engine, uri: str
) -> None:
    cloud = make_cloud()
    ledger = SqlLedger(engine, _prices())
    mig = migrator(engine, cloud, ledger=ledger)
    assert mig.latest_migration("job-1") is None and mig.history("job-1") == []
    mig.register_job("job-1", (), uri, env=job_env(50_000, steps_per_second=RATE))
    assert mig.start("job-1", [OD_A]).state is State.DONE
    for offer in (OD_B, OD_A):  # two moves across regions: egress, overlap and restart lines
        cloud.run_to(cloud.now() + timedelta(minutes=40))
        assert mig.move("job-1", [offer], checkpoint_gb=2).state is State.DONE

    history = mig.history("job-1")
    assert [m.id for m in history] == sorted(m.id for m in history) and len(history) == 3
    assert mig.history("job-1", after_id=history[0].id) == history[1:]
    assert mig.history("job-1", after_id=history[-1].id) == []
    assert mig.latest_migration("job-1") == history[-1]

    every = mig.copies("job-1")
    last = history[-1]
    named = {last.old_instance_id or "", last.new_instance_id or ""}
    assert mig.copies("job-1", instance_ids=named) == [c for c in every if c.instance_id in named]
    assert mig.copies("job-1", instance_ids=set()) == []

    old = next(c for c in every if c.instance_id == last.old_instance_id)
    new = next(c for c in every if c.instance_id == last.new_instance_id)
    keys = CopyKeys(old.interval_key, new.interval_key)
    wanted = migration_charge_keys("job-1", last.id, keys)
    picked = ledger.charges_by_key(wanted)
    whole = job_charges(ledger, "job-1")
    assert picked == [c for c in whole if c.record.charge_key in wanted] and len(picked) >= 2  # egress, restart
    assert migration_cost(picked, "job-1", last.id, keys) == migration_cost(whole, "job-1", last.id, keys)
    assert migration_cost(picked, "job-1", last.id, keys).known
    assert ledger.charges_by_key([]) == []
