"""The engine every policy runs through: static, free-moving and rule-moving jobs on hand-made prices.

Throughputs are 1 step/s unless a test says otherwise, so a job of ``3600 h`` steps is ``h`` hours of
work and costs USD/h x hours.
"""

from __future__ import annotations

import numpy as np
import pytest

from costopt.backtest.engine import CostCube, JobBatch, PlacementPolicy, build_cost_cube, run_backtest
from costopt.backtest.grid import BacktestError, OfferSet, PriceGrid, build_price_grid
from costopt.migration.decision import MigrationRule
from tests.backtest.conftest import DAY0, history, offer, offers

TPUT = {"m": {"k80": 1.0, "v100": 1.0}}


def cube_of(points, offer_set: OfferSet, periods: int, *, period_hours: float = 24.0, tput=TPUT) -> CostCube:
    grid = build_price_grid(history(points), offer_set, DAY0, periods, period_hours)
    return build_cost_cube(grid, tput, ["m"])


def jobs(hours: list[float], starts: list[int] | None = None, gb: float = 0.0, steps_per_s: float = 1.0) -> JobBatch:
    n = len(hours)
    return JobBatch(
        model=np.zeros(n, dtype=np.int64),
        steps=np.array(hours) * 3600.0 * steps_per_s,
        start=np.array(starts or [0] * n, dtype=np.int64),
        checkpoint_gb=np.full(n, gb),
    )


def everything(c: CostCube) -> np.ndarray:
    return np.ones(len(c.offers), dtype=bool)


A = offer("a", zone="r1a")
B = offer("b", zone="r1b")


def test_a_static_policy_pays_its_own_offers_price_as_it_changes_day_by_day() -> None:
    points = [
        (A, "2020-02-01T00:00:00Z", 1.0),
        (A, "2020-03-02T12:00:00Z", 2.0),
        (A, "2020-03-03T12:00:00Z", 0.5),
        (B, "2020-02-01T00:00:00Z", 1.5),
    ]
    c = cube_of(points, offers(A, B), 6)
    res = run_backtest(c, jobs([72.0, 60.0]), PlacementPolicy("static", everything(c)))
    # chosen on day 0 (A at 1.0 < B at 1.5) and kept while A costs 2.0 on day 1 and 0.5 on day 2
    assert res.first_offer.tolist() == [0, 0] and res.moves.tolist() == [0, 0]
    assert res.cost.tolist() == pytest.approx([24 * 1.0 + 24 * 2.0 + 24 * 0.5, 24 * 1.0 + 24 * 2.0 + 12 * 0.5])
    assert res.finish_hours.tolist() == pytest.approx([72.0, 60.0])


def test_a_job_pays_its_gpu_share_of_a_multi_gpu_instance() -> None:
    big = offer("big", zone="r1a", gpus=4.0)
    c = cube_of([(A, "2020-02-01T00:00:00Z", 1.0), (big, "2020-02-01T00:00:00Z", 3.0)], offers(A, big), 3)
    res = run_backtest(c, jobs([10.0]), PlacementPolicy("static", everything(c)))
    assert c.offers.label(int(res.first_offer[0])).endswith("big (spot)")
    assert res.cost[0] == pytest.approx(10 * 3.0 / 4)


def test_throughput_per_dollar_decides_a_dearer_faster_gpu_can_win() -> None:
    k80 = offer("k", zone="r1a", acc="k80")
    v100 = offer("v", zone="r1a", acc="v100")
    tput = {"m": {"k80": 1.0, "v100": 4.0}}
    c = cube_of(
        [(k80, "2020-02-01T00:00:00Z", 1.0), (v100, "2020-02-01T00:00:00Z", 3.0)], offers(k80, v100), 3, tput=tput
    )
    res = run_backtest(c, jobs([40.0], steps_per_s=1.0), PlacementPolicy("static", everything(c)))
    assert res.first_offer[0] == 1  # V100: 3.0 / 4 = 0.75 per K80-hour of work < 1.0
    assert res.cost[0] == pytest.approx(10 * 3.0) and res.finish_hours[0] == pytest.approx(10.0)


def test_a_static_choice_only_sees_offers_priced_on_its_start_day_and_dynamic_picks_up_new_ones() -> None:
    late = offer("late", zone="r1b")
    points = [(A, "2020-02-01T00:00:00Z", 1.0), (late, "2020-03-02T06:00:00Z", 0.25)]
    c = cube_of(points, offers(A, late), 4)
    static = run_backtest(c, jobs([48.0]), PlacementPolicy("static", everything(c)))
    dynamic = run_backtest(c, jobs([48.0]), PlacementPolicy("dynamic", everything(c), mode="free"))
    assert static.cost[0] == pytest.approx(48.0)
    assert dynamic.cost[0] == pytest.approx(24 * 1.0 + 24 * 0.25) and dynamic.moves[0] == 1


def test_free_dynamic_never_costs_more_than_static_when_every_offer_runs_equally_fast() -> None:
    # With equal throughputs both policies do the same work every day and dynamic pays the least
    # price of each day, so it can only be cheaper, job by job (random prices, late-appearing offers).
    rng = np.random.default_rng(11)
    for seed in range(5):
        names = [offer(f"o{i}", zone=f"z{i}", cloud=("aws", "azure")[i % 2]) for i in range(5)]
        points = []
        for i, o in enumerate(names):
            first = 0 if i == 0 else int(rng.integers(0, 10))
            for d in range(first, 30):
                points.append(
                    (o, f"2020-03-{1 + d:02d}T{int(rng.integers(0, 24)):02d}:00:00Z", float(rng.uniform(0.2, 2)))
                )
        c = cube_of(points, offers(*names), 40)
        batch = jobs(list(rng.uniform(1, 200, size=60)), list(rng.integers(0, 10, size=60)), gb=float(seed))
        static = run_backtest(c, batch, PlacementPolicy("multi_cloud", everything(c)))
        dynamic = run_backtest(c, batch, PlacementPolicy("dynamic", everything(c), mode="free"))
        assert np.all(dynamic.cost <= static.cost + 1e-9)
        assert np.all(dynamic.finish_hours == static.finish_hours)


def test_greedy_dynamic_can_cost_more_than_static_when_it_moves_to_a_faster_gpu_during_a_price_spike() -> None:
    # Not a theorem in general: S (1 step/s) is the cheapest per step except on day 1, when its price
    # doubles and F (2 steps/s at $3.6/h: $1.8 per S-hour of work) is cheaper per step. Dynamic runs
    # day 1 on F and does twice the work at $1.8; static does half of it at $2.0 and the other half on
    # day 3 at $1.0 (average $1.5). Static: 24 + 48 + 24 + 24 = 120; dynamic: 24 + 86.4 + 24 = 134.4.
    s = offer("s", zone="r1a", acc="k80")
    f = offer("f", zone="r1a", acc="v100")
    points = [
        (s, "2020-02-01T00:00:00Z", 1.0),
        (s, "2020-03-02T00:00:00Z", 2.0),
        (s, "2020-03-03T00:00:00Z", 1.0),
        (f, "2020-02-01T00:00:00Z", 3.6),
    ]
    c = cube_of(points, offers(s, f), 6, tput={"m": {"k80": 1.0, "v100": 2.0}})
    static = run_backtest(c, jobs([96.0]), PlacementPolicy("multi_cloud", everything(c)))
    dynamic = run_backtest(c, jobs([96.0]), PlacementPolicy("dynamic", everything(c), mode="free"))
    assert static.cost[0] == pytest.approx(120.0)
    assert dynamic.cost[0] == pytest.approx(134.4)


def test_a_rule_move_pays_egress_overlap_and_restart_exactly() -> None:
    # Day 0: A (aws) $1 < B (azure) $2. Day 1: A $3, B $0.5. 48 h of work, 10 GB checkpoint.
    # Day 1 decision: 86,400 steps left; saving 86400 x 2.5 / 3600 = 60; move 10 x 0.09 + 0.5 / 6 +
    # 3.0 / 12 = 1.2333; margin max(5% x 72, 1) = 3.6 -> move. Day 1 on B: 10 min restart, 23 h 50 min
    # of work; the last 10 min of work on day 2.
    a = offer("a", cloud="aws", region="us-east-1", zone="us-east-1a")
    b = offer("b", cloud="azure", region="eastus")
    points = [
        (a, "2020-02-01T00:00:00Z", 1.0),
        (a, "2020-03-02T00:00:00Z", 3.0),
        (b, "2020-02-01T00:00:00Z", 2.0),
        (b, "2020-03-02T00:00:00Z", 0.5),
    ]
    c = cube_of(points, offers(a, b), 4)
    rule = PlacementPolicy("rule", everything(c), mode="rule", rule=MigrationRule())
    res = run_backtest(c, jobs([48.0], gb=10.0), rule)
    assert res.moves[0] == 1
    assert res.move_cost[0] == pytest.approx(0.9 + 0.5 / 6 + 3.0 / 12)
    assert res.cost[0] == pytest.approx(24.0 + 0.9 + 3.0 / 12 + 0.5 * 24 + 0.5 / 6)
    assert res.finish_hours[0] == pytest.approx(48.0 + 1 / 6)
    assert len(res.log) == 1 and res.log.saving[0] == pytest.approx(60.0) and res.log.margin[0] == pytest.approx(3.6)


def random_hourly_cube(seed: int) -> CostCube:
    rng = np.random.default_rng(seed)
    names = [
        offer("a", cloud="aws", region="us-east-1", zone="us-east-1a"),
        offer("b", cloud="aws", region="us-west-2", zone="us-west-2a", acc="k80"),
        offer("c", cloud="azure", region="eastus"),
        offer("d", cloud="azure", region="southcentralus", acc="k80", gpus=4.0),
    ]
    points = []
    for o in names:
        for h in range(0, 24 * 20, 3):
            points.append((o, f"2020-03-{1 + h // 24:02d}T{h % 24:02d}:00:00Z", float(rng.uniform(0.3, 3.0))))
    return cube_of(points, offers(*names), 24 * 40, period_hours=1.0, tput={"m": {"k80": 1.0, "v100": 3.0}})


def test_the_rule_policy_respects_dwell_and_margin_on_every_move() -> None:
    c = random_hourly_cube(3)
    rng = np.random.default_rng(5)
    batch = jobs(list(rng.uniform(10, 300, size=80)), list(rng.integers(0, 24 * 5, size=80)), gb=20.0)
    rule = MigrationRule(dwell_hours=24.0)
    res = run_backtest(c, batch, PlacementPolicy("rule", everything(c), mode="rule", every_periods=1, rule=rule))
    log = res.log
    assert len(log) > 20
    assert np.all(log.hours_since_move >= 24.0)
    assert np.all(log.saving - log.move_cost > log.margin)
    assert np.all(log.margin >= rule.margin_min_usd)
    per_job = np.bincount(log.job, weights=log.move_cost, minlength=len(batch))
    assert per_job == pytest.approx(res.move_cost)  # the money charged is the money the rule judged
    dwell = MigrationRule(dwell_hours=72.0)
    tighter = run_backtest(c, batch, PlacementPolicy("rule", everything(c), mode="rule", rule=dwell))
    assert np.all(tighter.log.hours_since_move >= 72.0) and len(tighter.log) < len(log)
    no_margin = MigrationRule(dwell_hours=24.0, margin_fraction=0.0, margin_min_usd=0.0)
    eager = run_backtest(c, batch, PlacementPolicy("rule", everything(c), mode="rule", rule=no_margin))
    assert len(eager.log) > len(log)


def test_simulations_are_deterministic() -> None:
    c1, c2 = random_hourly_cube(9), random_hourly_cube(9)
    batch = jobs([50.0, 120.0, 7.5], [0, 30, 70], gb=5.0)
    for mode in ("static", "free", "rule"):
        r1 = run_backtest(c1, batch, PlacementPolicy(mode, everything(c1), mode=mode, every_periods=6))
        r2 = run_backtest(c2, batch, PlacementPolicy(mode, everything(c2), mode=mode, every_periods=6))
        assert r1.cost.tolist() == r2.cost.tolist() and r1.log.dst.tolist() == r2.log.dst.tolist()


def test_impossible_runs_raise_typed_errors() -> None:
    c = cube_of([(A, "2020-03-02T00:00:00Z", 1.0)], offers(A), 3)
    with pytest.raises(BacktestError, match="no allowed offer"):
        run_backtest(c, jobs([1.0]), PlacementPolicy("static", everything(c)))  # A has no price on day 0
    with pytest.raises(BacktestError, match="not done"):
        run_backtest(c, jobs([100.0], [1]), PlacementPolicy("static", everything(c)))
    hourly: PriceGrid = build_price_grid(history([(A, "2020-02-01T00:00:00Z", 1.0)]), offers(A), DAY0, 5, 0.1)
    hc = build_cost_cube(hourly, TPUT, ["m"])
    with pytest.raises(BacktestError, match="restart"):
        run_backtest(hc, jobs([0.2]), PlacementPolicy("rule", everything(hc), mode="rule"))
    with pytest.raises(BacktestError):
        JobBatch(np.zeros(1, dtype=np.int64), np.zeros(1), np.zeros(1, dtype=np.int64), np.zeros(1))
