"""A managed job's ledger lines carry its team: the migrator's sync looks the team up in ``jobs``
(intervals, egress, restart and overlap lines alike), a job without a ``jobs`` row (a drill) bills to
team "", and migration 0008 gives the lines billed before that their job's team."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from costopt.db.engine import make_engine, migrate
from costopt.domain import Cloud, Market, OfferKey
from costopt.jobs.records import JobRepository, NewJob
from costopt.jobs.teams import TeamRepository
from costopt.ledger.model import ChargeKind, ChargeRecord, IntervalRecord
from costopt.ledger.sql import SqlLedger
from costopt.migration.ledger_sync import sync_ledger, write_copy_end, write_copy_start, write_verified
from costopt.migration.records import CopyEnd, CopyStart, EndReason
from costopt.planning.model import EgressRates
from tests.conftest import BACKENDS, PG_ADMIN_URL, pg_schema
from tests.reports.prices import steps

T = datetime(2020, 3, 2, tzinfo=UTC)
A = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)
B = OfferKey(Cloud.AWS, "us-west-2", "us-west-2a", "p3.2xlarge", Market.SPOT)
EGRESS = EgressRates(inter_region={Cloud.AWS: 0.02}, internet={Cloud.AWS: 0.09})


def _copy(engine: Engine, job_id: str, epoch: int, instance: str, offer: OfferKey, start: datetime, **kw: Any) -> None:
    with engine.begin() as conn:
        write_copy_start(conn, "sim", CopyStart(job_id, epoch, instance, offer, start, **kw), start)
        write_verified(conn, "sim", job_id, instance, start + timedelta(minutes=5), start)


def _end(engine: Engine, job_id: str, epoch: int, instance: str, at: datetime, reason: EndReason) -> None:
    with engine.begin() as conn:
        write_copy_end(conn, "sim", CopyEnd(job_id, epoch, instance, None, None, at, reason), at)


def test_the_sync_bills_a_managed_jobs_copies_and_charges_to_its_team(engine: Engine) -> None:
    team = TeamRepository(engine).create_team("vision")
    job, _ = JobRepository(engine).create(NewJob(team.id, {"steps": 10}, 10, "sim"))
    ledger = SqlLedger(engine, steps({A: [(T, 1.0)], B: [(T, 1.5)]}))
    _copy(engine, job.id, 1, "i-1", A, T)
    assert sync_ledger(engine, ledger, egress=EGRESS).pending == 0  # opened with its team, not closed yet
    _copy(engine, job.id, 2, "i-2", B, T + timedelta(hours=2), migration_id=7, source_offer=A, egress_gb=Decimal(2))
    _end(engine, job.id, 1, "i-1", T + timedelta(hours=2, minutes=3), EndReason.MOVED)
    _copy(engine, "drill-1", 1, "i-3", A, T)  # the migrator's own job (a drill): no jobs row

    assert sync_ledger(engine, ledger, egress=EGRESS).pending == 0

    teams = {ln.record.instance_id: ln.record.team for ln in ledger.intervals()}
    assert teams == {"i-1": team.id, "i-2": team.id, "i-3": ""}
    assert ledger.intervals(job_id=job.id)[0].record.ended_at == T + timedelta(hours=2, minutes=3)
    kinds = {(c.record.kind, c.record.team) for c in ledger.charges(job_id=job.id)}
    assert kinds == {(ChargeKind.EGRESS, team.id), (ChargeKind.RESTART, team.id), (ChargeKind.OVERLAP, team.id)}
    # 2:03 x $1 + 1:00 x $1.5 + 2 GB x $0.02
    assert ledger.costs(team=team.id, end=T + timedelta(hours=3)).total_usd == Decimal("3.59")


@pytest.fixture(params=BACKENDS)
def at_0007(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """A database migrated to 0007 only (before the team backfill)."""
    if request.param == "sqlite":
        eng = make_engine(f"sqlite:///{tmp_path / 'old.db'}")
        migrate(eng, "0007")
        yield eng
        eng.dispose()
        return
    with pg_schema() as schema:
        eng = make_engine(PG_ADMIN_URL, connect_args={"options": f"-csearch_path={schema}"})
        migrate(eng, "0007")
        yield eng
        eng.dispose()


def test_migration_0008_gives_lines_billed_without_a_team_their_jobs_team(at_0007: Engine) -> None:
    engine = at_0007
    team = TeamRepository(engine).create_team("vision")
    job, _ = JobRepository(engine).create(NewJob(team.id, {"steps": 10}, 10, "sim"))
    ledger = SqlLedger(engine, steps({A: [(T, 1.0)]}))
    for key, jid in (("k1", job.id), ("k2", "drill-1")):  # what the sync wrote before 0008: no team
        ledger.record_interval(IntervalRecord(key, jid, f"i-{key}", A, T))
        ledger.record_charge(ChargeRecord(f"{key}:egress", jid, ChargeKind.EGRESS, T, amount_usd=Decimal(1)))
    assert {ln.record.team for ln in ledger.intervals()} == {""}

    migrate(engine)

    assert {ln.record.job_id: ln.record.team for ln in ledger.intervals()} == {job.id: team.id, "drill-1": ""}
    assert {c.record.job_id: c.record.team for c in ledger.charges()} == {job.id: team.id, "drill-1": ""}
    closed = IntervalRecord("k1", job.id, "i-k1", A, T, T + timedelta(hours=1), team=team.id)
    assert ledger.record_interval(closed).amount_usd == Decimal(1)  # closed with its team: no conflict
