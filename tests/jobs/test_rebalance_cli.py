"""``costopt rebalance --once``: nothing to do on an empty database (both backends), nothing done while
the service holds the pass's lease, rows per job and exit 3 when a move failed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from api.cli import rebalance as rebalance_cli
from api.cli.main import app
from api.rebalancing import REBALANCE_LEASE, PassByHand
from costopt.db.engine import make_engine, migrate
from costopt.domain import Cloud, Market, OfferKey
from costopt.jobs.leases import LeaseStore
from costopt.jobs.rebalance import Outcome, RebalanceItem, RebalanceReport
from costopt.settings import get_settings
from tests.conftest import BACKENDS, PG_ADMIN_URL, pg_schema

runner = CliRunner()


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    def use(url: str) -> None:
        monkeypatch.setenv("COSTOPT_DATABASE_URL", url)
        monkeypatch.setenv("COSTOPT_LOCAL_PROVIDER_DIR", str(tmp_path / "local"))
        get_settings.cache_clear()

    if request.param == "sqlite":
        use(f"sqlite:///{tmp_path / 'cli.db'}")
        yield f"sqlite:///{tmp_path / 'cli.db'}"
    else:
        with pg_schema() as schema:
            url = f"{PG_ADMIN_URL}?options=-csearch_path%3D{schema}"
            use(url)
            yield url
    get_settings.cache_clear()


def test_an_empty_database_has_nothing_to_rebalance(db_url: str) -> None:
    result = runner.invoke(app, ["rebalance", "--once"])
    assert result.exit_code == 0, result.stderr
    assert "no running job" in result.stderr and "nothing to rebalance" in result.stderr
    dry = runner.invoke(app, ["rebalance", "--once", "--dry-run", "-f", "json"])
    assert dry.exit_code == 0, dry.stderr
    lease = LeaseStore(make_engine(db_url)).get(REBALANCE_LEASE)
    assert lease is not None and lease.runs == 2 and lease.expires_at is None  # taken, then released


def test_while_the_service_runs_its_pass_nothing_is_done(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    service = LeaseStore(engine, owner="service-replica-1")
    assert service.claim_tick(REBALANCE_LEASE, datetime.now(UTC), timedelta(minutes=5))
    result = runner.invoke(app, ["rebalance", "--once"])
    assert result.exit_code == 0, result.stderr
    assert "the service is running a rebalance pass right now" in result.stderr
    assert "service-replica-1" in result.stderr and "nothing done" in result.stderr
    state = service.get(REBALANCE_LEASE)
    assert state is not None and state.owner == "service-replica-1" and state.runs == 1
    engine.dispose()


def test_without_once_the_command_says_how_to_run_it() -> None:
    result = runner.invoke(app, ["rebalance"])
    assert result.exit_code == 2
    assert "--once" in result.stderr


HERE = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.ON_DEMAND)
THERE = OfferKey(Cloud.AWS, "us-east-1", "us-east-1b", "p3.2xlarge", Market.SPOT)


def _report(*items: RebalanceItem) -> RebalanceReport:
    return RebalanceReport(datetime(2026, 12, 1, 15, tzinfo=UTC), False, items)


def test_each_job_is_a_row_with_its_saving_or_why_it_stays_and_a_failed_move_exits_3(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    moved = RebalanceItem(
        "job-a",
        "team-a",
        Outcome.MOVED,
        "move to aws us-east-1/us-east-1b p3.2xlarge (spot): the saving ... beats the move cost by the margin",
        HERE,
        THERE,
        3.06,
        0.918,
        Decimal("59.44"),
        Decimal("0.42"),
        Decimal("4.25"),
    )
    stays = RebalanceItem(
        "job-b", "team-a", Outcome.STAYED, "stay: the net saving does not clear the margin", HERE, None, 3.06
    )
    failed = RebalanceItem("job-c", "team-b", Outcome.FAILED, "the move failed: CloudError: quota", HERE, THERE)
    outcomes: list[Any] = [PassByHand(_report(moved, stays)), PassByHand(_report(moved, stays, failed))]
    monkeypatch.setattr(rebalance_cli, "_run", lambda settings, *, dry_run: outcomes.pop(0))

    ok = runner.invoke(app, ["rebalance", "--once", "-f", "json"])
    assert ok.exit_code == 0, ok.stderr
    rows = {r["job_id"]: r for r in json.loads(ok.stdout)}
    assert rows["job-a"]["outcome"] == "moved"
    assert rows["job-a"]["net_saving_usd"] == "59.02"  # saving minus the move's cost, exact
    assert rows["job-a"]["to_offer"] == str(THERE)
    assert rows["job-b"]["reason"] == "stay: the net saving does not clear the margin"
    assert rows["job-b"]["net_saving_usd"] is None
    assert "moved 1 of 2 running jobs" in ok.stderr and "$59.02" in ok.stderr

    bad = runner.invoke(app, ["rebalance", "--once"])
    assert bad.exit_code == 3
    assert "job-c" in bad.stdout and "1 failed" in bad.stderr


def test_a_pass_by_hand_proposes_but_never_moves_a_job_on_the_in_process_simulated_cloud(engine) -> None:
    from types import SimpleNamespace

    from api.rebalancing import build_rebalancer
    from costopt.jobs.model import JobState
    from costopt.jobs.records import JobRepository, NewJob
    from costopt.settings import Settings
    from tests.jobs.test_rebalance import CHEAP, HERE, FakeMove, FakePlacements

    at = datetime(2026, 12, 1, 15, tzinfo=UTC)
    repo = JobRepository(engine, now=lambda: at)
    ids = {}
    for provider in ("sim", "local"):
        job, _ = repo.create(NewJob(team_id="t", spec={}, steps_total=1_000_000, provider=provider))
        repo.transition(job.id, JobState.LAUNCHING, "launching")
        repo.transition(job.id, JobState.RUNNING, "running", offer=HERE, usd_per_hour=Decimal(3))
        ids[provider] = job.id
    move = FakeMove(repo)
    service = SimpleNamespace(
        repo=repo,
        placements=FakePlacements({HERE: (3.0, 10.0), CHEAP: (1.0, 10.0)}),
        engine=SimpleNamespace(move=move, rank_top=10),
        clock=lambda: at,
    )
    by_hand = build_rebalancer(service, Settings(), in_service=False)  # type: ignore[arg-type]
    dry = {i.job_id: i.outcome for i in by_hand.run_once(dry_run=True).items}
    assert dry == {ids["sim"]: Outcome.PROPOSED, ids["local"]: Outcome.PROPOSED}
    items = {i.job_id: i for i in by_hand.run_once(dry_run=False).items}
    assert items[ids["local"]].outcome is Outcome.MOVED
    assert items[ids["sim"]].outcome is Outcome.FAILED and "live in the service process" in items[ids["sim"]].reason
    assert [c[0] for c in move.calls] == [ids["local"]] and repo.get(ids["sim"]).offer == HERE
    in_service = build_rebalancer(service, Settings())  # type: ignore[arg-type]
    assert {i.outcome for i in in_service.run_once(dry_run=False).items} == {Outcome.MOVED, Outcome.STAYED}
