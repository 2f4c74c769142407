"""``backtest job``: one job through the simulated cloud, the decision rule and the ledger.

A hand-computed move on made-up prices, then ResNet-50 over one week of the real 2020-03 us-east-1 spot
prices with invariants: the ledger's total is the sum of its lines, the steps done are the steps asked,
two instances of the job overlap only while the old one writes its checkpoint, every interval is billed
at the prices in effect, runs are deterministic per seed."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from costopt.backtest.job import (
    JobBacktest,
    JobBacktestError,
    WorkloadTiming,
    run_job_backtest,
)
from costopt.domain import Cloud, Market, OfferKey
from costopt.ledger import ChargeKind, MemoryLedger, StepPrices
from costopt.ledger.sql import SqlLedger
from costopt.risk.availability import load_availability_logs
from costopt.risk.hazard import HazardModel
from costopt.settings import Settings
from costopt.throughput.catalog import ThroughputCatalog
from costopt.throughput.loaders import GAVEL_ORACLE_FILE, load_throughput_file
from costopt.throughput.model import JobType, Throughput, ThroughputKey
from providers.sim import SimConfig, sim_factory

RESNET = "ResNet-50 (batch size 128)"
WEEK = (datetime(2020, 3, 2, tzinfo=UTC), datetime(2020, 3, 9, tzinfo=UTC))
NO_HAZARD = HazardModel(defaults=dict.fromkeys(Cloud, 0.0))
CHECKPOINT = WorkloadTiming().checkpoint

# --- a move on made-up prices, computed by hand ------------------------------------------------------------

T0 = datetime(2020, 3, 2, tzinfo=UTC)
A = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)
B = OfferKey(Cloud.AWS, "us-west-2", "us-west-2a", "p3.2xlarge", Market.SPOT)


def _toy_prices() -> StepPrices:
    rows = [(A, T0 - timedelta(days=1), 1.00), (A, T0 + timedelta(hours=24), 3.00), (B, T0 - timedelta(days=1), 1.50)]
    frame = pd.DataFrame(
        [
            {
                "cloud": k.cloud.value,
                "region": k.region,
                "zone": k.zone,
                "instance_type": k.instance_type,
                "market": k.market.value,
                "valid_from": t,
                "usd_per_hour": p,
            }
            for k, t, p in rows
        ]
    )
    return StepPrices.from_history(frame, {("aws", "p3.2xlarge"): ("v100", 1.0)})


TOY_CATALOG = ThroughputCatalog({ThroughputKey(JobType.parse("Toy"), "v100"): Throughput(10.0, "measured")})


def test_a_move_is_decided_by_the_rule_and_billed_by_hand() -> None:
    # 60 h of training at 10 steps/s. A costs $1/h, then $3/h from 24:00; B (another region) $1.50/h.
    # Boot 3 min, restore 2 min, a 1-min checkpoint after every training hour.
    # On A from 0:03: by 24:00, 23 cycles of 61 min + 34 min = 1414 training minutes = 848,400 steps.
    # 24:00: the rule moves (saving $54.65 >> move $0.215 + margin $5.47); B launched at 24:00, A writes its
    # checkpoint until 24:01 and is terminated. B trains from 24:05 the 2186 minutes left, with 37
    # checkpoints: done at 24:05 + 2223 min = 61:08.
    result = run_job_backtest(
        _toy_prices(),
        TOY_CATALOG,
        sim_factory(),
        job_type="Toy",
        steps=2_160_000,
        start=T0,
        end=T0 + timedelta(days=5),
        hazards=NO_HAZARD,
        checkpoint_gb=2.0,
    )
    r = result.result
    assert r.finished and r.steps_done == 2_160_000 and r.lost_steps == 0
    assert r.moves == 1 and r.preemptions == 0
    assert r.finished_at == T0 + timedelta(hours=61, minutes=8)
    a, b = r.report.lines
    assert (a.record.offer, a.starts_at, a.record.end_reason) == (A, T0, "moved")
    assert a.ends_at == T0 + timedelta(hours=24, minutes=1)
    assert (b.record.offer, b.starts_at, b.record.end_reason) == (B, T0 + timedelta(hours=24), "done")
    assert b.ends_at == r.finished_at
    assert a.amount_usd == Decimal("24.05")  # 24 h x $1 + 1 min x $3 (the checkpoint overlap)
    assert b.amount_usd == Decimal("55.7")  # 37 h 8 min x $1.50
    assert r.report.memo_usd(ChargeKind.EGRESS) == Decimal("0.04")  # 2 GB x $0.02 between AWS regions
    assert r.report.memo_usd(ChargeKind.OVERLAP) == Decimal("0.05")
    assert r.report.memo_usd(ChargeKind.RESTART) == Decimal("0.05") + Decimal("0.125")  # A: 3 min, B: 5 min
    assert r.total_usd == Decimal("79.79")
    move = [d for d in r.decisions if d.action == "move"]
    assert len(move) == 1 and move[0].reason == "saves_enough" and move[0].at == T0 + timedelta(hours=24)
    d = result.as_dict()
    assert d["total_cost_usd"] == 79.79 and d["moves"] == 1
    json.dumps(d)


def test_static_and_dynamic_policies_on_the_same_prices() -> None:
    kw = {
        "job_type": "Toy",
        "steps": 2_160_000,
        "start": T0,
        "end": T0 + timedelta(days=5),
        "hazards": NO_HAZARD,
        "checkpoint_gb": 2.0,
    }
    static = run_job_backtest(_toy_prices(), TOY_CATALOG, sim_factory(), policy="static", **kw).result  # type: ignore[arg-type]
    free = run_job_backtest(_toy_prices(), TOY_CATALOG, sim_factory(), policy="dynamic", **kw).result  # type: ignore[arg-type]
    assert static.moves == 0 and len(static.report.lines) == 1
    assert free.moves == 1
    assert static.total_usd > free.total_usd
    with pytest.raises(JobBacktestError, match="policy"):
        run_job_backtest(_toy_prices(), TOY_CATALOG, sim_factory(), policy="sometimes", **kw)  # type: ignore[arg-type]


def test_a_job_not_done_by_the_end_leaves_an_open_interval_costed_up_to_it() -> None:
    end = T0 + timedelta(hours=10)
    r = run_job_backtest(
        _toy_prices(), TOY_CATALOG, sim_factory(), job_type="Toy", steps=2_160_000, start=T0, end=end, hazards=NO_HAZARD
    ).result
    assert not r.finished and r.stopped_at == end
    (line,) = r.report.lines
    assert line.open and line.ends_at == end
    assert line.amount_usd == Decimal("10")  # 10 h at $1
    assert 0 < r.steps_done < 2_160_000


def test_nothing_to_start_on_is_an_error() -> None:
    with pytest.raises(JobBacktestError, match="no offer"):
        run_job_backtest(
            _toy_prices(),
            TOY_CATALOG,
            sim_factory(),
            job_type="Toy",
            steps=1000,
            start=T0,
            end=T0 + timedelta(days=1),
            regions=["eu-west-1"],
        )


# --- one week of real prices ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def week(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[StepPrices, object]]:
    """The 2020 AWS spot history in a scratch store (through the importer), read back as step prices
    for us-east-1 over the week, and the store itself."""
    from api.wiring import build_store
    from pricing.importer import import_paths

    tmp = tmp_path_factory.mktemp("job")
    store = build_store(Settings(database_url=f"sqlite:///{tmp / 'store.db'}", data_dir=shared_data))
    reports = import_paths(store, [shared_data / "prices" / "aws_spot_price_history_2019-12_2020-03_p2_p3.csv"])
    assert [r.status for r in reports] == ["imported"]
    yield StepPrices.load(store, *WEEK, regions=["us-east-1"]), store
    store.engine.dispose()


@pytest.fixture(scope="module")
def catalog(shared_data: Path) -> ThroughputCatalog:
    return ThroughputCatalog.from_measurements(load_throughput_file(shared_data / GAVEL_ORACLE_FILE))


@pytest.fixture(scope="module")
def hazards(shared_data: Path) -> HazardModel:
    logs = shared_data / "raw" / "training_on_a_dime" / "logs"
    lifetimes, _ = load_availability_logs(logs.glob("*/availability/*.out"))
    return HazardModel.from_lifetimes(lifetimes)


STEPS = 500_000  # ~2 V100-days of ResNet-50 (2.85 steps/s on a V100)


def _run(prices: StepPrices, catalog: ThroughputCatalog, hz: HazardModel, **kw: object) -> JobBacktest:
    args: dict[str, object] = {"job_type": RESNET, "steps": STEPS, "start": WEEK[0], "end": WEEK[1], "hazards": hz}
    args.update(kw)
    return run_job_backtest(prices, catalog, sim_factory(), **args)  # type: ignore[arg-type]


def _check_invariants(bt: JobBacktest, prices: StepPrices) -> None:
    r = bt.result
    rep = r.report
    # the total is the sum of the lines (intervals + additive charges), exactly
    assert rep.total_micro_usd == sum(ln.amount_micro_usd for ln in rep.lines) + sum(
        c.amount_micro_usd for c in rep.charges if c.additive
    )
    # steps done == steps asked
    assert r.finished and r.steps_done == STEPS
    lines = sorted(rep.lines, key=lambda ln: ln.starts_at)
    assert lines[0].starts_at == WEEK[0] and lines[-1].ends_at == r.finished_at
    for prev, nxt in itertools.pairwise(lines):
        assert nxt.starts_at <= prev.ends_at  # no gap: a recovery or a move starts as the old one ends
        overlap = prev.ends_at - nxt.starts_at
        assert overlap <= CHECKPOINT  # two instances overlap only while the old one writes its checkpoint
        assert overlap == timedelta(0) or prev.record.end_reason == "moved"
    # every interval billed at the prices in effect: an independent float integration agrees to 1e-6 USD
    for ln in lines:
        steps = prices.steps(ln.record.offer, ln.starts_at, ln.ends_at)
        bounds = [max(s.valid_from, ln.starts_at) for s in steps] + [ln.ends_at]
        hours = np.diff([b.timestamp() for b in bounds]) / 3600.0
        expected = float(np.dot(hours, [s.usd_per_hour for s in steps])) * float(ln.record.share)
        assert abs(float(ln.amount_usd) - expected) < 1e-6
    d = bt.as_dict()
    json.dumps(d)
    assert d["total_cost_usd"] == round(float(rep.total_usd), 2)
    assert d["steps_done"] == d["steps_requested"]


@pytest.mark.parametrize("policy", ["static", "dynamic", "dynamic_migration_cost"])
def test_resnet50_over_a_week_of_real_prices(week, catalog, hazards, policy: str) -> None:
    prices, _ = week
    bt = _run(prices, catalog, hazards, policy=policy, seed=0)
    _check_invariants(bt, prices)
    r = bt.result
    assert 48 < r.hours < 60  # ~49 h of training, plus checkpoints, boots and any preemption
    assert all(ln.record.offer.region == "us-east-1" for ln in r.report.lines)
    assert r.report.memo_usd(ChargeKind.EGRESS) == 0  # one region: no egress
    if policy == "static":
        assert r.moves == 0
        assert len({ln.record.offer for ln in r.report.lines}) == 1


def test_runs_are_deterministic_per_seed(week, catalog, hazards) -> None:
    prices, _ = week
    one = _run(prices, catalog, hazards, seed=3).as_dict()
    assert one == _run(prices, catalog, hazards, seed=3).as_dict()
    many = {json.dumps(_run(prices, catalog, hazards, seed=s).as_dict()["intervals"]) for s in range(4)}
    assert len(many) > 1  # seeds differ in their preemptions


def test_preemptions_lose_work_since_the_last_checkpoint_and_the_job_still_finishes(week, catalog) -> None:
    prices, _ = week
    often = HazardModel(defaults=dict.fromkeys(Cloud, 0.2))  # a preemption every 5 h on average
    bt = _run(prices, catalog, often, seed=1, end=WEEK[0] + timedelta(days=5))
    _check_invariants(bt, prices)
    r = bt.result
    assert r.preemptions >= 3
    assert 0 < r.lost_steps < r.preemptions * 2.85 * 3660  # at most one checkpoint interval (and a bit) each
    assert r.report.memo_usd(ChargeKind.LOST_WORK) > 0
    assert len(r.report.lines) == r.preemptions + r.moves + 1
    assert sum(1 for ln in r.report.lines if ln.record.end_reason == "preempted") == r.preemptions
    # a checkpoint written on the 2-minute notice saves the work
    saved = run_job_backtest(
        prices,
        catalog,
        sim_factory(SimConfig(checkpoint_on_notice=True)),
        job_type=RESNET,
        steps=STEPS,
        start=WEEK[0],
        end=WEEK[0] + timedelta(days=5),
        hazards=often,
        seed=1,
    ).result
    assert saved.lost_steps == 0 and saved.preemptions >= 3


def test_the_ledger_in_the_database_holds_the_same_figures(week, catalog, hazards) -> None:
    prices, store = week
    ledger = SqlLedger(store.engine, prices)
    bt = _run(prices, catalog, hazards, seed=2, ledger=ledger, job_id="db-job", team="vision")
    memory = _run(prices, catalog, hazards, seed=2, ledger=MemoryLedger(prices), job_id="db-job", team="vision")
    assert bt.result.total_usd == memory.result.total_usd
    assert ledger.costs(team="vision").total_usd == bt.result.total_usd
    # recording the run's intervals again (a retry) changes nothing
    for line in ledger.intervals(job_id="db-job"):
        ledger.record_interval(line.record)
    assert ledger.costs(job_id="db-job").total_usd == bt.result.total_usd
    # the first day alone, clipped and integrated within it
    day = ledger.costs(job_id="db-job", start=WEEK[0], end=WEEK[0] + timedelta(days=1))
    assert 0 < day.total_usd < bt.result.total_usd
    assert sum(ln.hours for ln in day.lines) == pytest.approx(24.0, abs=0.1)


# --- the preemption study's pieces ------------------------------------------------------------------------


def test_the_preemption_study_reproduces_the_engine_without_preemptions_and_loses_work_with_them(
    paper_inputs, hazards
) -> None:
    from costopt.backtest.preemption import preemption_study

    study = preemption_study(
        paper_inputs, sim_factory(), hazards, models=("A3C",), job_days=(1.0,), seeds=(0,), start_days=2
    )
    assert study.runs == 7 * 2 * 2  # policies x start days x (clean + one seed)
    cells = {c.policy: c for c in study.cells}
    assert set(cells) == {
        "baseline",
        "gpu_type",
        "multi_gpu",
        "multi_cloud",
        "dynamic",
        "dynamic_migration_cost",
        "on_demand",
    }
    for c in cells.values():
        assert c.unfinished == 0
        # the sim's accounting (boots, hourly checkpoints) stays within 2% of the paper engine's ratios
        assert c.reduction_clean == pytest.approx(c.paper_reduction, rel=0.02)
    assert cells["on_demand"].mean_preemptions == 0
    k80 = cells["gpu_type"]  # AWS K80s: preempted often, the saving shrinks
    assert k80.mean_preemptions > 5 and k80.reduction < k80.reduction_clean and 0 < k80.survives < 1
    assert k80.lost_work_share > 0
