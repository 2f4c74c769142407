"""``backtest job``: one job through the job service's path (engine, rebalancer, migrator, watcher, ledger)
over the simulated cloud.

A hand-computed move on made-up prices, then ResNet-50 over one week of the real 2020-03 us-east-1 spot
prices with invariants: the ledger's total is the sum of its lines, the steps done are the steps asked,
one copy at a time with no gap beyond a poll, every interval is billed at the prices in effect, runs are
deterministic per seed; preemptions recovered through the watcher; the preemption study's smoke run."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from costopt.backtest.job import JobBacktest, JobBacktestError, run_job_backtest
from costopt.domain import Cloud, Market, OfferKey
from costopt.ledger import ChargeKind, StepPrices
from costopt.ledger.sql import SqlLedger
from costopt.risk.availability import load_availability_logs
from costopt.risk.hazard import HazardModel
from costopt.settings import Settings
from costopt.simulated import WorkloadTiming
from costopt.throughput.catalog import ThroughputCatalog
from costopt.throughput.loaders import GAVEL_ORACLE_FILE, load_throughput_file
from costopt.throughput.model import JobType, Throughput, ThroughputKey
from providers.sim import SimConfig, sim_factory
from tests.price_support import step_prices

RESNET = "ResNet-50 (batch size 128)"
WEEK = (datetime(2020, 3, 2, tzinfo=UTC), datetime(2020, 3, 9, tzinfo=UTC))
NO_HAZARD = HazardModel(defaults=dict.fromkeys(Cloud, 0.0))

# --- a move on made-up prices, computed by hand ------------------------------------------------------------

T0 = datetime(2020, 3, 2, tzinfo=UTC)
A = OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT)
B = OfferKey(Cloud.AWS, "us-west-2", "us-west-2a", "p3.2xlarge", Market.SPOT)


def _toy_prices() -> StepPrices:
    return step_prices(
        [(A, T0 - timedelta(days=1), 1.00), (A, T0 + timedelta(hours=24), 3.00), (B, T0 - timedelta(days=1), 1.50)]
    )


TOY_CATALOG = ThroughputCatalog({ThroughputKey(JobType.parse("Toy"), "v100"): Throughput(10.0, "measured")})


def test_a_move_is_decided_by_the_rule_and_billed_by_hand() -> None:
    # 60 h of training at 10 steps/s. A costs $1/h, then $3/h from 24:00; B (another region) $1.50/h.
    # Boot 3 min, restore 2 min, a 1-min checkpoint after every training hour.
    # On A from 0:03: by 24:00, 23 cycles of 61 min + 34 min = 1414 training minutes = 848,400 steps.
    # 24:00: the rebalancer's rule moves (saving $54.75 >> move $0.22 + margin $5.48); the migrator asks A
    # for a checkpoint (24:00-24:01), terminates it, and launches B at 24:01. B trains from 24:06 the 2186
    # minutes left, with 36 hourly checkpoints and a final one: done at 24:06 + 2223 min = 61:09.
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
    job = result.job
    assert result.finished and job.steps_done == 2_160_000 and result.lost_steps == 0
    assert result.moves == 1 and result.preemptions == 0
    assert job.finished_at == T0 + timedelta(hours=61, minutes=9)
    a, b = result.report.lines
    assert (a.record.offer, a.starts_at, a.record.end_reason) == (A, T0, "moved")
    assert a.ends_at == T0 + timedelta(hours=24, minutes=1)
    assert (b.record.offer, b.starts_at, b.record.end_reason) == (B, a.ends_at, "finished")
    assert b.ends_at == job.finished_at
    assert a.amount_usd == Decimal("24.05")  # 24 h x $1 + 1 min x $3 (the checkpoint before the move)
    assert b.amount_usd == Decimal("55.7")  # 37 h 8 min x $1.50
    assert result.report.memo_usd(ChargeKind.EGRESS) == Decimal("0.04")  # 2 GB x $0.02 between AWS regions
    assert result.total_usd == Decimal("79.79")
    moved = [d for d in result.decisions() if d["event"] == "rebalance" and d["action"] == "moved"]
    assert len(moved) == 1 and moved[0]["at"] == (T0 + timedelta(hours=24)).isoformat()
    assert "saving" in moved[0]["reason"] and moved[0]["target"].startswith("aws us-west-2")
    events = [e.kind for e in result.run.events[job.id]]
    assert events.count("move") == 1 and "preemption" not in events
    d = result.as_dict()
    assert d["total_cost_usd"] == 79.79 and d["moves"] == 1 and d["state"] == "succeeded"
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
    static = run_job_backtest(_toy_prices(), TOY_CATALOG, sim_factory(), policy="static", **kw)  # type: ignore[arg-type]
    free = run_job_backtest(_toy_prices(), TOY_CATALOG, sim_factory(), policy="dynamic", **kw)  # type: ignore[arg-type]
    assert static.moves == 0 and len(static.report.lines) == 1 and not static.run.rebalances
    assert free.moves == 1
    assert static.total_usd > free.total_usd
    with pytest.raises(JobBacktestError, match="policy"):
        run_job_backtest(_toy_prices(), TOY_CATALOG, sim_factory(), policy="sometimes", **kw)  # type: ignore[arg-type]


def test_a_job_not_done_by_the_end_leaves_an_open_interval_costed_up_to_it() -> None:
    end = T0 + timedelta(hours=10)
    r = run_job_backtest(
        _toy_prices(), TOY_CATALOG, sim_factory(), job_type="Toy", steps=2_160_000, start=T0, end=end, hazards=NO_HAZARD
    )
    assert not r.finished and r.run.ended_at == end and r.job.state.value == "running"
    (line,) = r.report.lines
    assert line.open and line.ends_at == end
    assert line.amount_usd == Decimal("10")  # 10 h at $1
    assert 0 < r.job.steps_done < 2_160_000


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
    rep = bt.report
    # the total is the sum of the lines (intervals + additive charges), exactly
    assert rep.total_micro_usd == sum(ln.amount_micro_usd for ln in rep.lines) + sum(
        c.amount_micro_usd for c in rep.charges if c.additive
    )
    # steps done == steps asked
    assert bt.finished and bt.job.steps_done == STEPS
    lines = sorted(rep.lines, key=lambda ln: ln.starts_at)
    assert lines[0].starts_at == WEEK[0] and lines[-1].ends_at == bt.job.finished_at
    for prev, nxt in itertools.pairwise(lines):
        # one copy at a time, and no gap but a poll: a recovery is launched when the copy is taken (a
        # recovery whose new copy was taken at once, at the migrator's next 30-s poll), a move's new copy
        # once the old one wrote its checkpoint and was terminated
        assert timedelta(0) <= nxt.starts_at - prev.ends_at <= timedelta(seconds=30)
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
    assert 48 < bt.hours < 60  # ~49 h of training, plus checkpoints, boots and any preemption
    assert bt.report.lines and all(ln.record.offer.region == "us-east-1" for ln in bt.report.lines)
    assert bt.report.memo_usd(ChargeKind.EGRESS) == 0  # one region: no egress
    if policy == "static":
        assert bt.moves == 0
        assert len({ln.record.offer for ln in bt.report.lines}) == 1


def test_runs_are_deterministic_per_seed(week, catalog, hazards) -> None:
    prices, _ = week

    def figures(seed: int) -> str:
        d = _run(prices, catalog, hazards, seed=seed).as_dict()
        # ids are random per run (job ids, instance ids): compare what was billed, where and when
        return json.dumps([{k: v for k, v in i.items() if k != "instance_id"} for i in d["intervals"]])

    assert figures(3) == figures(3)
    assert len({figures(s) for s in range(4)}) > 1  # seeds differ in their preemptions


def test_preemptions_are_recovered_through_the_watcher_and_the_job_still_finishes(week, catalog) -> None:
    prices, _ = week
    often = HazardModel(defaults=dict.fromkeys(Cloud, 0.2))  # a preemption every 5 h on average
    bt = _run(prices, catalog, often, seed=1, end=WEEK[0] + timedelta(days=5))
    _check_invariants(bt, prices)
    assert bt.preemptions >= 3
    events = bt.run.events[bt.job.id]
    # every preempted copy was recovered (a new copy taken during its own recovery rolls it back: the
    # watcher recovers again)
    recovered = sum(1 for e in events if e.kind in ("recovery", "recovery_failed"))
    assert recovered == bt.preemptions
    lines = bt.report.lines
    assert len(lines) == bt.preemptions + bt.moves + 1
    assert sum(1 for ln in lines if ln.record.end_reason == "preempted") == bt.preemptions
    # AWS's 2-minute notice: the simulated agent writes a checkpoint at once (1 minute) and stops, so a
    # preempted copy loses no steps; the copy after it restores (restart memo charges)
    assert bt.lost_steps == 0
    assert bt.report.memo_usd(ChargeKind.RESTART) > 0
    # without time for a checkpoint on the notice (a 5-minute one), the work since the last one is lost
    slow = SimConfig(timing=WorkloadTiming(checkpoint=timedelta(minutes=5)))
    lossy = run_job_backtest(
        prices,
        catalog,
        sim_factory(slow),
        job_type=RESNET,
        steps=STEPS,
        start=WEEK[0],
        end=WEEK[0] + timedelta(days=5),
        hazards=often,
        seed=1,
    )
    assert lossy.finished and lossy.preemptions >= 3
    assert 0 < lossy.lost_steps < lossy.preemptions * 2.85 * 3900  # at most a checkpoint interval (and a bit) each


def test_the_ledger_in_the_database_holds_the_same_figures(week, catalog, hazards) -> None:
    prices, _ = week
    bt = _run(prices, catalog, hazards, seed=2)
    ledger = SqlLedger(bt.run.db, prices)
    job_id = bt.job.id
    assert ledger.costs(job_id=job_id, as_of=bt.run.ended_at).total_usd == bt.total_usd > 0
    # recording the run's intervals again (a retry) changes nothing
    for line in ledger.intervals(job_id=job_id):
        ledger.record_interval(line.record)
    assert ledger.costs(job_id=job_id).total_usd == bt.total_usd
    # the first day alone, clipped and integrated within it
    day = ledger.costs(job_id=job_id, start=WEEK[0], end=WEEK[0] + timedelta(days=1))
    assert 0 < day.total_usd < bt.total_usd
    assert sum(ln.hours for ln in day.lines) == pytest.approx(24.0, abs=0.1)


# --- the preemption study's pieces ------------------------------------------------------------------------


@pytest.mark.slow
def test_the_preemption_study_reproduces_the_engine_without_preemptions_and_pays_for_preemptions(
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
    # AWS's 2-minute notice fits the simulated agent's 1-minute checkpoint: a preempted copy loses no
    # work, the job pays the restarts and the time its copies are not training
    assert k80.lost_work_share == 0 and k80.mean_hours > k80.mean_hours_clean


def test_the_studys_report_cadence_leaves_its_cells_as_the_default_cadence(paper_inputs, hazards) -> None:
    """The study's scripts build their clouds with ``report_every=STUDY_REPORT_EVERY`` (fewer agent events):
    A3C (its K80s preempted many times a day, its dynamic policies moving) gives the cells of the cloud's
    default 10-minute cadence."""
    from costopt.backtest.preemption import STUDY_REPORT_EVERY, preemption_study

    assert SimConfig().report_every != STUDY_REPORT_EVERY  # else this compares a cadence with itself
    kw: dict[str, object] = {"models": ("A3C",), "job_days": (1.0,), "seeds": (0,), "start_days": 1}
    coarse = preemption_study(
        paper_inputs,
        sim_factory(SimConfig(report_every=STUDY_REPORT_EVERY)),
        hazards,
        **kw,  # type: ignore[arg-type]
    )
    default = preemption_study(paper_inputs, sim_factory(), hazards, **kw)  # type: ignore[arg-type]
    assert coarse.frame()["mean_preemptions"].sum() > 0  # preempted runs are compared, not just calm ones
    assert coarse.frame().equals(default.frame())


def test_the_study_reuses_only_runs_whose_placements_answer_alike(paper_inputs, hazards) -> None:
    """On 2020-02-18 (before Azure's prices) ResNet-50's ``gpu_type`` picks the baseline's V100 and
    ``multi_cloud`` the ``multi_gpu`` offer: those two runs of each (clean, seed) take the earlier
    one's outcome; and a run with hazards whose seed reclaims nothing near its copies (on-demand, a V100
    the seed does not reclaim in that day) takes the outcome of its run without them. The cells are those
    of running every run."""
    from costopt.backtest.preemption import preemption_study

    kw: dict[str, object] = {"models": (RESNET,), "job_days": (1.0,), "seeds": (0,), "start_days": 1}
    reused = preemption_study(paper_inputs, sim_factory(), hazards, **kw)  # type: ignore[arg-type]
    every = preemption_study(paper_inputs, sim_factory(), hazards, reuse=False, **kw)  # type: ignore[arg-type]
    assert (reused.runs, every.runs) == (14, 14)
    # 4 by their placements (gpu_type as baseline, multi_cloud as multi_gpu, clean and seeded), 4 by their
    # seed's cloud drawing nothing near the run without hazards (on_demand, baseline, multi_gpu, dynamic)
    assert (reused.reused, every.reused) == (8, 0)
    assert reused.frame().equals(every.frame())  # the same cells (NaN where no saving), run by run
    # a policy on another offer is run: A3C's gpu_type (K80) is not the baseline's V100
    a3c = preemption_study(
        paper_inputs, sim_factory(), hazards, models=("A3C",), job_days=(1.0,), seeds=(0,), start_days=1
    )
    assert a3c.reused == 3  # multi_cloud as multi_gpu (clean and seeded), and on_demand's seeded run
