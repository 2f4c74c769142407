"""``run_offline``: N jobs through the job service's path (engine, rebalancer, migrator, watcher, ledger)
over the simulated cloud, on simulated time; a reused database starts empty; in-memory checkpoints."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from costopt.agent import control
from costopt.agent.storage import MemoryStorage, drop_memory, open_storage
from costopt.domain import Cloud, Market, OfferKey
from costopt.jobs.offline import ALWAYS_MOVE, OfflineError, OfflineJob, memory_database, run_offline
from costopt.jobs.placement import Placement
from costopt.jobs.records import JobRecord
from costopt.ledger import StepPrices
from costopt.risk.hazard import HazardModel
from providers.sim import SimCloud
from tests.price_support import step_prices

T0 = datetime(2020, 3, 2, tzinfo=UTC)
A = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.ON_DEMAND)
B = OfferKey(Cloud.AWS, "us-east-1", "us-east-1b", "p3.2xlarge", Market.ON_DEMAND)
RATE = 10.0
NO_HAZARD = HazardModel(defaults=dict.fromkeys(Cloud, 0.0))


def _prices() -> StepPrices:
    day_before = T0 - timedelta(days=1)
    return step_prices([(A, day_before, 1.0), (A, T0 + timedelta(hours=24), 3.0), (B, day_before, 2.0)])


class Cheapest:
    """Both offers, cheapest first at ``at`` (what a policy gives the engine)."""

    def __init__(self, prices: StepPrices) -> None:
        self.prices = prices

    def _one(self, offer: OfferKey, steps: float, at: datetime) -> Placement | None:
        found = self.prices.steps(offer, at, at + timedelta(microseconds=1))
        if not found:
            return None
        price = found[-1].usd_per_hour
        hours = steps / RATE / 3600
        return Placement(offer, price, RATE, hours, Decimal(repr(round(hours * price, 6))))

    def rank(
        self,
        job: JobRecord,
        *,
        remaining_steps: float,
        at: datetime,
        exclude: Collection[OfferKey] = (),
        top: int = 10,
    ) -> Sequence[Placement]:
        out = [p for o in (A, B) if o not in exclude and (p := self._one(o, remaining_steps, at)) is not None]
        return sorted(out, key=lambda p: p.usd_per_hour)[:top]

    def at_offer(self, job: JobRecord, offer: OfferKey, *, remaining_steps: float, at: datetime) -> Placement | None:
        return self._one(offer, remaining_steps, at)


def _jobs(n: int, steps: int) -> list[OfflineJob]:
    spec = {"command": ["train"], "throughput": {"v100": RATE}, "checkpoint_gb": 1.0}
    return [OfflineJob(steps, spec, name=f"job-{i}") for i in range(n)]


def test_jobs_run_to_the_end_with_their_steps_and_their_bills() -> None:
    prices = _prices()
    cloud = SimCloud(prices, NO_HAZARD, start=T0)
    run = run_offline(cloud, prices, Cheapest(prices), _jobs(2, 360_000), until=T0 + timedelta(days=3))
    assert run.finished and len(run.jobs) == 2
    for job in run.jobs:
        assert job.state.value == "succeeded" and job.steps_done == 360_000 and job.offer == A
        (copy,) = run.copies[job.id]
        assert copy.end_reason == "finished"
        hours = Decimal((copy.ended_at - copy.started_at).total_seconds()) / 3600  # type: ignore[operator]
        assert run.costs[job.id].total_usd == pytest.approx(hours * 1, abs=Decimal("0.000001"))  # $1/h on A
        assert 10 < hours < 11  # 10 h of training, plus boot and hourly checkpoints
    assert not run.rebalances  # no rule given: no rebalancing


def test_the_rebalancer_moves_running_jobs_when_prices_change() -> None:
    prices = _prices()
    cloud = SimCloud(prices, NO_HAZARD, start=T0)
    run = run_offline(
        cloud, prices, Cheapest(prices), _jobs(1, 1_440_000), until=T0 + timedelta(days=3), rule=ALWAYS_MOVE
    )
    (job,) = run.jobs
    assert job.state.value == "succeeded" and job.offer == B  # A costs $3/h from 24:00, B $2/h
    moves = [e for e in run.events[job.id] if e.kind == "move"]
    assert len(moves) == 1 and moves[0].at >= T0 + timedelta(hours=24)
    assert [c.offer for c in run.copies[job.id]] == [A, B]
    first = run.rebalances[0]
    assert first.at == T0 + timedelta(hours=24) and first.items[0].outcome.value == "moved"


def test_a_reused_database_is_emptied_and_checkpoints_are_freed() -> None:
    prices = _prices()
    db = memory_database()
    firsts = []
    for _ in range(2):
        cloud = SimCloud(prices, NO_HAZARD, start=T0)
        run = run_offline(
            cloud, prices, Cheapest(prices), _jobs(1, 36_000), until=T0 + timedelta(days=1), db=db, reset_db=True
        )
        firsts.append(run)
        assert len(run.copies[run.jobs[0].id]) == 1
    assert firsts[0].costs[firsts[0].jobs[0].id].total_usd == firsts[1].costs[firsts[1].jobs[0].id].total_usd
    with db.connect() as conn:
        assert conn.exec_driver_sql("select count(*) from jobs").scalar_one() == 1  # the second run's only
    assert not [r for r in MemoryStorage._ROOTS if r.startswith("offline-")]  # freed after each run


def test_kept_checkpoints_can_be_audited() -> None:
    prices = _prices()
    cloud = SimCloud(prices, NO_HAZARD, start=T0)
    root = "mem://offline-test-audit"
    run = run_offline(
        cloud, prices, Cheapest(prices), _jobs(1, 36_000), until=T0 + timedelta(days=1), checkpoint_root=root
    )
    (job,) = run.jobs
    audit = control.audit_job(f"{root}/{job.id}", 36_000)
    assert audit.ok and audit.steps_done == 36_000, audit.problems
    drop_memory(root)
    assert open_storage(f"{root}/{job.id}").list_files("") == []


def test_bad_input_is_refused() -> None:
    prices = _prices()
    cloud = SimCloud(prices, NO_HAZARD, start=T0)
    with pytest.raises(OfflineError, match="at least one job"):
        run_offline(cloud, prices, Cheapest(prices), [], until=T0 + timedelta(days=1))
    with pytest.raises(OfflineError, match="after"):
        run_offline(cloud, prices, Cheapest(prices), _jobs(1, 10), until=T0)


def test_memory_storage_keeps_files_logs_and_listings_like_a_directory() -> None:
    s = open_storage("mem://storage-test/job")
    assert isinstance(s, MemoryStorage)
    s.write_atomic("checkpoints/ckpt-1", b"one")
    s.write_atomic("checkpoints/ckpt-2", b"two")
    s.write_atomic("epoch.json", b"{}")
    s.append_lines("progress/e1.jsonl", ["a", "b"])
    s.append_lines("progress/e1.jsonl", ["c"])
    again = open_storage("mem://storage-test/job")  # another handle on the same location
    assert again.read_bytes("checkpoints/ckpt-2") == b"two" and again.read_bytes("nope") is None
    assert again.list_files("checkpoints") == ["checkpoints/ckpt-1", "checkpoints/ckpt-2"]
    assert again.list_logs("progress") == ["progress/e1.jsonl"] and again.read_lines("progress/e1.jsonl") == [
        "a",
        "b",
        "c",
    ]
    again.delete("checkpoints/ckpt-1")
    again.delete("checkpoints/missing")
    assert s.list_files("checkpoints") == ["checkpoints/ckpt-2"] and s.list_temps("checkpoints") == []
    drop_memory("mem://storage-test")
    assert open_storage("mem://storage-test/job").list_files("checkpoints") == []
    with pytest.raises(ValueError, match="name"):
        open_storage("mem://")
