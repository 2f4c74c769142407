"""The migration's transitions as rows: ``checkpointed`` and ``launched`` are passed through in the
transition that follows them (one compare-and-set each instead of two), their hooks still fire at the
points a crash test kills at, and a row an older version left in one of them is still resumed."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, select, update

from costopt.db.migration_schema import migrations
from costopt.migration.ledger_sync import write_copy_start
from costopt.migration.records import CopyStart, State
from providers.local import LocalProvider
from tests.migration.test_machine import (
    CRASH_POINTS,
    OFFERS,
    Crash,
    assert_ledger_consistent,
    assert_one_copy,
    billed_migrator,
    billed_started_job,
)

pytestmark = pytest.mark.one_backend_each


def _row(engine: Engine, migration_id: int) -> tuple[str, str | None]:
    with engine.connect() as conn:
        row = conn.execute(
            select(migrations.c.state, migrations.c.new_instance_id).where(migrations.c.id == migration_id)
        ).one()
    return str(row.state), row.new_instance_id


def _latest_id(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(migrations.c.id).order_by(migrations.c.id.desc()).limit(1)).scalar_one())


def test_a_move_writes_five_states_and_fires_every_hook_in_order(
    engine: Engine, local: LocalProvider, tmp_path: Path
) -> None:
    ledger, mig = billed_started_job(engine, local, tmp_path)
    seen: list[tuple[str, str, str | None]] = []

    def hook(point: str) -> None:
        if point.startswith(("enter:", "launch:")):
            seen.append((point, *_row(engine, _latest_id(engine))))

    rec = billed_migrator(engine, local, ledger, hook=hook).move("job-1", OFFERS)
    assert rec.state is State.DONE, rec.reason
    points = [p for p, _, _ in seen]
    assert points == list(CRASH_POINTS)  # every fault-injection point, in order
    rows = {p: (state, new) for p, state, new in seen}
    # checkpointed is committed as launching (with the token); launched is not committed at all: the row
    # learns the new copy with the hand-over to verifying
    assert rows["enter:checkpointed"] == ("launching", None)
    assert rows["enter:launched"] == ("launching", None)
    assert rows["enter:verifying"] == ("verifying", rec.new_instance_id)
    assert_one_copy(mig, local)
    assert_ledger_consistent(engine, ledger, local, "job-1")


@pytest.mark.parametrize("legacy", [State.CHECKPOINTED, State.LAUNCHED])
def test_a_row_left_in_a_passed_through_state_by_an_older_version_is_resumed(
    engine: Engine, local: LocalProvider, tmp_path: Path, legacy: State
) -> None:
    ledger, mig = billed_started_job(engine, local, tmp_path)
    point = "enter:checkpointing" if legacy is State.CHECKPOINTED else "enter:launched"

    def hook(p: str) -> None:
        if p == point:
            raise Crash(p)

    with pytest.raises(Crash):
        billed_migrator(engine, local, ledger, hook=hook).move("job-1", OFFERS)
    mid = _latest_id(engine)
    values: dict[str, object] = {"state": legacy.value}
    if legacy is State.LAUNCHED:  # as the older version committed it: the new copy's id and start
        (inst,) = local.list({"costopt-job": "job-1", "costopt-epoch": "2"})
        assert inst.launched_at is not None
        values["new_instance_id"] = inst.instance_id
        with engine.begin() as conn:
            start = CopyStart("job-1", 2, inst.instance_id, inst.offer, inst.launched_at, mid, source_offer=OFFERS[0])
            write_copy_start(conn, local.name, start, inst.launched_at)
    else:
        assert mig.migration(mid).state is State.CHECKPOINTING
    with engine.begin() as conn:
        conn.execute(update(migrations).where(migrations.c.id == mid).values(**values))
    resumed = billed_migrator(engine, local, ledger, hook=lambda p: None).resume("job-1")
    assert [r.state for r in resumed] == [State.DONE], [r.reason for r in resumed]
    assert mig.job("job-1").epoch == 2
    assert_one_copy(mig, local)
    assert_ledger_consistent(engine, ledger, local, "job-1")
    assert len(ledger.intervals(job_id="job-1")) == 2
