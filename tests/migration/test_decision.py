"""The migration decision rule, on hand-computed cases, and its vectorized form against the scalar one.

Common setting (unless a test says otherwise): 1,000,000 steps left at 10 steps/s on a $1.00/h AWS
us-east-1a offer, so the remaining work costs 1e6 / 36,000 * $1 = $27.78 there, and the margin is
max(5% x $27.78, $1) = $1.3889. A 10 GB checkpoint lives in us-east-1.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import numpy as np
import pytest

from costopt.domain import Cloud, Market, OfferKey
from costopt.migration.decision import (
    Action,
    InvalidDecisionInput,
    MigrationRule,
    MoveArrays,
    OfferQuote,
    Reason,
    RunningJob,
    choose,
    decide,
    decide_many,
    egress_matrix,
)
from costopt.planning.model import Location

NOW = datetime(2020, 3, 1, 12, tzinfo=UTC)
HERE = OfferQuote(OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT), 1.00, 10.0)


def job(remaining: float = 1e6, *, moved_hours_ago: float | None = None, gb: float = 10.0) -> RunningJob:
    moved = None if moved_hours_ago is None else NOW - timedelta(hours=moved_hours_ago)
    return RunningJob(remaining, HERE, Location(Cloud.AWS, "us-east-1"), gb, moved)


def quote(cloud: Cloud, region: str, zone: str, usd: float, steps_per_s: float = 10.0) -> OfferQuote:
    return OfferQuote(OfferKey(cloud, region, zone, "x", Market.SPOT), usd, steps_per_s)


AZURE_HALF = quote(Cloud.AZURE, "eastus", "", 0.50)


def close(value: Decimal, expected: float) -> bool:
    return abs(float(value) - expected) < 1e-9


def test_moves_when_the_saving_beats_egress_restart_and_overlap_by_the_margin() -> None:
    d = decide(job(), AZURE_HALF, NOW)
    # saving 1e6 * (1 - 0.5) / 36000 = 13.8889; move: 10 GB x $0.09 (AWS to the internet) = 0.90,
    # restart 10 min x $0.50 = 0.08333, overlap 5 min x $1.00 = 0.08333 -> 1.06667
    assert d.action is Action.MOVE and d.reason is Reason.SAVES_ENOUGH
    assert d.target == AZURE_HALF
    assert close(d.saving_usd, 1e6 * 0.5 / 36000)
    assert close(d.move_cost_usd, 0.9 + 0.5 / 6 + 1.0 / 12)
    assert close(d.margin_usd, 0.05 * 1e6 / 36000)


def test_stays_when_the_net_saving_does_not_clear_the_margin() -> None:
    # another zone of the region (no egress) at $0.98: saving 0.5556, move 0.98/6 + 1/12 = 0.2467 -> net 0.31 < 1.39
    d = decide(job(), quote(Cloud.AWS, "us-east-1", "us-east-1b", 0.98), NOW)
    assert d.action is Action.STAY and d.reason is Reason.BELOW_MARGIN and d.target is None
    assert close(d.saving_usd, 1e6 * 0.02 / 36000)
    assert close(d.move_cost_usd, 0.98 / 6 + 1.0 / 12)


def test_stays_when_no_candidate_saves_more_than_its_move_costs() -> None:
    d = decide(job(), quote(Cloud.AWS, "us-east-1", "us-east-1b", 0.995), NOW)
    assert d.action is Action.STAY and d.reason is Reason.NO_SAVING


def test_the_margin_is_at_least_one_dollar() -> None:
    # 100,000 steps left: $2.78 here; 5% is $0.14, so the $1 floor binds. Half price saves $1.39,
    # the move costs 1.067 (10 GB cross-cloud) -> net 0.32 < $1: stay. Without egress it would move.
    small = job(1e5)
    d = decide(small, AZURE_HALF, NOW)
    assert d.action is Action.STAY and close(d.margin_usd, 1.0)
    d = decide(job(1e5, gb=0.0), quote(Cloud.AWS, "us-east-1", "us-east-1b", 0.5), NOW)
    # saving 1.3889, move 0.5/6 + 1/12 = 0.1667 -> net 1.222 > 1.0
    assert d.action is Action.MOVE and close(d.margin_usd, 1.0)


def test_no_move_within_the_dwell_time_but_at_its_end() -> None:
    d = decide(job(moved_hours_ago=23.9), AZURE_HALF, NOW)
    assert d.action is Action.STAY and d.reason is Reason.DWELL
    assert close(d.saving_usd, 1e6 * 0.5 / 36000)  # the figures still say why it would pay
    assert decide(job(moved_hours_ago=24.0), AZURE_HALF, NOW).action is Action.MOVE
    custom = MigrationRule(dwell_hours=6.0)
    assert decide(job(moved_hours_ago=6.0), AZURE_HALF, NOW, custom).action is Action.MOVE


def test_throughput_counts_a_faster_dearer_gpu_can_be_the_cheaper_place() -> None:
    # here $1.00/h at 10 steps/s (2.78e-5 $/step); there $3.00/h at 50 steps/s (1.67e-5 $/step), same region
    d = decide(job(gb=0.0), quote(Cloud.AWS, "us-east-1", "us-east-1b", 3.0, 50.0), NOW)
    assert d.action is Action.MOVE
    assert close(d.saving_usd, 1e6 * (1 / 36000 - 3 / 180000))
    assert close(d.move_cost_usd, 3.0 / 6 + 1.0 / 12)


def test_choose_takes_the_largest_net_saving_not_the_lowest_price() -> None:
    # Azure $0.50 nets 13.889 - 1.0667 = 12.82; AWS us-east-1b $0.52 nets 13.333 - 0.17 = 13.16
    aws = quote(Cloud.AWS, "us-east-1", "us-east-1b", 0.52)
    d = choose(job(), [AZURE_HALF, aws], NOW)
    assert d.action is Action.MOVE and d.target == aws
    assert close(d.move_cost_usd, 0.52 / 6 + 1.0 / 12)


def test_preemption_recovers_at_once_where_finishing_is_cheapest() -> None:
    # moved an hour ago (dwell ignored). Relaunch here: 27.78 + restart 1/6 = 27.94;
    # Azure: 13.89 + 0.9 + 0.5/6 = 14.87 (no overlap: the old instance is gone)
    d = choose(job(moved_hours_ago=1.0), [HERE, AZURE_HALF], NOW, preempted=True)
    assert d.action is Action.MOVE and d.reason is Reason.PREEMPTED and d.target == AZURE_HALF
    assert close(d.move_cost_usd, 0.9 + 0.5 / 6)
    assert d.margin_usd == 0


def test_preemption_of_a_nearly_done_job_relaunches_the_same_offer() -> None:
    # 1,000 steps left: here 0.0278 + 0.1667 = 0.194; Azure 0.0139 + 0.9833 = 0.997
    d = choose(job(1000.0), [HERE, AZURE_HALF], NOW, preempted=True)
    assert d.action is Action.MOVE and d.target == HERE
    assert close(d.move_cost_usd, 1.0 / 6)


def test_the_current_offer_is_never_a_move_target_while_running() -> None:
    d = choose(job(), [HERE], NOW)
    assert d.action is Action.STAY and d.reason is Reason.NO_CANDIDATE


def test_no_candidate_at_all_stays() -> None:
    # a running job with nowhere else to go (the rebalancer excludes its own offer): failed on an empty argmax
    d = choose(job(), [], NOW)
    assert d.action is Action.STAY and d.reason is Reason.NO_CANDIDATE and d.target is None


def test_offers_that_cannot_run_the_job_are_no_candidates() -> None:
    d = decide(job(), quote(Cloud.AZURE, "eastus", "", 0.01, 0.0), NOW)
    assert d.action is Action.STAY and d.reason is Reason.NO_CANDIDATE and d.saving_usd == 0


def test_egress_matrix_uses_the_rates_of_the_source_cloud() -> None:
    m = egress_matrix(
        ["aws", "aws", "azure"],
        ["us-east-1", "us-east-1", "eastus"],
        ["aws", "aws", "azure", "azure"],
        ["us-east-1", "us-west-2", "eastus", "southcentralus"],
    )
    assert m.tolist() == [[0.0, 0.02, 0.09, 0.09], [0.0, 0.02, 0.09, 0.09], [0.087, 0.087, 0.0, 0.02]]


def test_bad_inputs_raise_typed_errors() -> None:
    with pytest.raises(InvalidDecisionInput):
        decide(job(-1.0), AZURE_HALF, NOW)
    nan_here = RunningJob(1e6, OfferQuote(HERE.key, float("nan"), 10.0), Location(Cloud.AWS, "us-east-1"))
    with pytest.raises(InvalidDecisionInput):
        decide(nan_here, AZURE_HALF, NOW)
    with pytest.raises(InvalidDecisionInput):
        decide_many(
            remaining_steps=[1.0, 2.0, 3.0],
            here_usd_per_hour=[1.0, 1.0],
            here_steps_per_s=1.0,
            cand_usd_per_hour=[[1.0], [1.0], [1.0]],
            cand_steps_per_s=1.0,
            egress_usd_per_gb=0.0,
            checkpoint_gb=0.0,
            hours_since_move=np.inf,
            rule=MigrationRule(),
        )
    with pytest.raises(InvalidDecisionInput):
        MigrationRule(dwell_hours=-1.0)


def test_the_vectorized_rule_agrees_with_the_scalar_rule_job_by_job() -> None:
    rng = np.random.default_rng(7)
    places = [
        (Cloud.AWS, "us-east-1", "us-east-1a"),
        (Cloud.AWS, "us-east-1", "us-east-1b"),
        (Cloud.AWS, "us-west-2", "us-west-2a"),
        (Cloud.AZURE, "eastus", ""),
        (Cloud.AZURE, "southcentralus", ""),
    ]
    rule = MigrationRule()
    n_jobs, n_cand = 200, len(places)
    prices = rng.uniform(0.2, 3.0, size=(n_jobs, n_cand))
    tputs = rng.choice([0.0, 1.0, 3.0, 8.0], size=(n_jobs, n_cand), p=[0.1, 0.3, 0.3, 0.3])
    current = rng.integers(0, n_cand, size=n_jobs)
    tputs[np.arange(n_jobs), current] = np.maximum(tputs[np.arange(n_jobs), current], 1.0)
    remaining = rng.uniform(1e3, 1e7, size=n_jobs)
    gb = rng.uniform(0.0, 50.0, size=n_jobs)
    since = rng.choice([np.inf, 3.0, 30.0], size=n_jobs)
    preempted = rng.random(n_jobs) < 0.2
    src = [places[c] for c in current]
    egress = egress_matrix(
        [p[0].value for p in src], [p[1] for p in src], [p[0].value for p in places], [p[1] for p in places]
    )
    out = decide_many(
        remaining_steps=remaining,
        here_usd_per_hour=prices[np.arange(n_jobs), current],
        here_steps_per_s=tputs[np.arange(n_jobs), current],
        cand_usd_per_hour=prices,
        cand_steps_per_s=tputs,
        egress_usd_per_gb=egress,
        checkpoint_gb=gb,
        hours_since_move=since,
        rule=rule,
        current=current,
        preempted=preempted,
    )
    reasons = set()
    for j in range(n_jobs):
        quotes = [
            OfferQuote(OfferKey(c, r, z, "x", Market.SPOT), float(prices[j, k]), float(tputs[j, k]))
            for k, (c, r, z) in enumerate(places)
        ]
        moved = None if np.isinf(since[j]) else NOW - timedelta(hours=float(since[j]))
        rj = RunningJob(
            float(remaining[j]),
            quotes[current[j]],
            Location(places[current[j]][0], places[current[j]][1]),
            float(gb[j]),
            moved,
        )
        d = choose(rj, quotes, NOW, rule, preempted=bool(preempted[j]))
        assert (d.action is Action.MOVE) == bool(out.move[j])
        assert int(d.reason) == int(out.reason[j])
        if out.move[j]:
            assert d.target == quotes[int(out.target[j])]
        reasons.add(d.reason)
    assert {Reason.SAVES_ENOUGH, Reason.PREEMPTED, Reason.BELOW_MARGIN, Reason.DWELL} <= reasons


# --- written against the mutants that survived `make mutate` (docs/reliability.md) ------------------


def _many(**kw: object) -> MoveArrays:
    args: dict[str, object] = {
        "remaining_steps": 1e6,
        "here_usd_per_hour": 1.0,
        "here_steps_per_s": 10.0,
        "cand_usd_per_hour": [0.5, 0.4],
        "cand_steps_per_s": 10.0,
        "egress_usd_per_gb": 0.0,
        "checkpoint_gb": 0.0,
        "hours_since_move": np.inf,
        "rule": MigrationRule(),
    }
    args.update(kw)
    return decide_many(**args)  # type: ignore[arg-type]


def test_the_vectorized_rule_broadcasts_one_candidate_row_over_the_jobs_and_defaults_to_no_current() -> None:
    out = _many(remaining_steps=[1e6, 2e6, 3e6], cand_usd_per_hour=[0.5, 0.4])  # 3 jobs, 2 columns
    assert out.move.tolist() == [True, True, True]
    assert out.target.tolist() == [1, 1, 1]  # column 1 is no "current" by default
    assert out.reason.tolist() == [Reason.SAVES_ENOUGH] * 3
    saving = out.saving.tolist()
    assert saving == pytest.approx([r * (1 / 36000 - 0.4 / 36000) for r in (1e6, 2e6, 3e6)], rel=1e-12)


def test_the_valid_mask_takes_candidates_out() -> None:
    out = _many(remaining_steps=[1e6, 1e6], valid=[[True, False], [False, False]])
    assert out.target.tolist() == [0, -1]
    assert out.reason.tolist() == [Reason.SAVES_ENOUGH, Reason.NO_CANDIDATE]
    assert _many(valid=[False, True]).target.tolist() == [1]  # one row, broadcast
    assert _many(valid=[True, False]).target.tolist() == [0]


def test_a_net_saving_equal_to_the_margin_does_not_move() -> None:
    d = decide(job(gb=0.0), quote(Cloud.AWS, "us-east-1", "us-east-1b", 0.5), NOW)
    net = float(d.saving_usd) - float(d.move_cost_usd)
    at_margin = MigrationRule(margin_fraction=0.0, margin_min_usd=net)
    d = decide(job(gb=0.0), quote(Cloud.AWS, "us-east-1", "us-east-1b", 0.5), NOW, at_margin)
    assert d.action is Action.STAY and d.reason is Reason.BELOW_MARGIN
    below = MigrationRule(margin_fraction=0.0, margin_min_usd=net * (1 - 1e-9))
    assert decide(job(gb=0.0), quote(Cloud.AWS, "us-east-1", "us-east-1b", 0.5), NOW, below).action is Action.MOVE


def test_a_rule_of_zeros_is_valid_and_moves_on_any_net_saving() -> None:
    free = MigrationRule(
        margin_fraction=0.0, margin_min_usd=0.0, dwell_hours=0.0, restart_hours=0.0, checkpoint_overlap_hours=0.0
    )
    d = decide(job(gb=0.0, moved_hours_ago=0.0), quote(Cloud.AWS, "us-east-1", "us-east-1b", 0.999), NOW, free)
    assert d.action is Action.MOVE and d.move_cost_usd == 0 and d.margin_usd == 0


def test_nothing_left_to_run_stays_and_bad_amounts_are_refused() -> None:
    d = decide(job(0.0), AZURE_HALF, NOW)
    assert d.action is Action.STAY and d.saving_usd == 0
    for bad in ({"remaining_steps": float("nan")}, {"remaining_steps": -1.0}, {"checkpoint_gb": -0.5}):
        with pytest.raises(InvalidDecisionInput, match="remaining steps and checkpoint sizes must be numbers >= 0"):
            _many(**bad)
    with pytest.raises(InvalidDecisionInput, match="remaining steps and checkpoint size must be >= 0"):
        decide(job(gb=-1.0), AZURE_HALF, NOW)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("remaining_steps", [[1.0, 2.0], [3.0, 4.0]]),
        ("checkpoint_gb", [1.0, 2.0, 3.0]),
        ("hours_since_move", [1.0, 2.0, 3.0]),
        ("here_usd_per_hour", [1.0, 2.0, 3.0]),
        ("here_steps_per_s", [1.0, 2.0, 3.0]),
        ("preempted", [True, False, True]),
        ("current", [0, 1, 0]),
        ("cand_steps_per_s", [1.0, 2.0, 3.0]),
        ("egress_usd_per_gb", [0.0, 0.0, 0.0]),
    ],
)
def test_a_mis_shaped_input_is_named(name: str, value: object) -> None:
    with pytest.raises(InvalidDecisionInput, match=f"^{name} has shape"):
        _many(**{"remaining_steps": [1e6, 1e6], name: value})


def test_decide_recovers_a_preempted_job_and_names_the_zone() -> None:
    b = quote(Cloud.AWS, "us-east-1", "us-east-1b", 0.5)
    d = decide(job(moved_hours_ago=1.0), b, NOW, preempted=True)
    assert d.action is Action.MOVE and d.reason is Reason.PREEMPTED and d.margin_usd == 0
    assert d.explanation.startswith("move to aws us-east-1/us-east-1b x (spot): preempted")
    assert decide(job(), AZURE_HALF, NOW).explanation.startswith("move to azure eastus x (spot): the saving")
    assert decide(job(), HERE, NOW).explanation == "stay: no candidate offer can run the job (no candidate)"


def test_the_overlap_is_billed_at_the_current_price_and_a_free_or_slow_candidate_counts() -> None:
    here = OfferQuote(HERE.key, 2.0, 10.0)  # $2/h here: 5 min of overlap costs $2/12
    running = RunningJob(1e6, here, Location(Cloud.AWS, "us-east-1"), 0.0)
    d = decide(running, quote(Cloud.AWS, "us-east-1", "us-east-1b", 1.0), NOW)
    assert close(d.move_cost_usd, 1.0 / 6 + 2.0 / 12)
    free = decide(running, quote(Cloud.AWS, "us-east-1", "us-east-1b", 0.0), NOW)  # a $0 offer is a candidate
    assert free.action is Action.MOVE and close(free.move_cost_usd, 2.0 / 12)
    slow = decide(running, quote(Cloud.AWS, "us-east-1", "us-east-1b", 0.05, 0.5), NOW)  # 0.5 steps/s
    assert slow.reason is not Reason.NO_CANDIDATE
    at_no_cost = RunningJob(1e6, OfferQuote(HERE.key, 0.0, 10.0), Location(Cloud.AWS, "us-east-1"), 0.0)
    assert decide(at_no_cost, AZURE_HALF, NOW).reason is Reason.NO_SAVING  # a free place is a valid place
    stuck = RunningJob(1e6, OfferQuote(HERE.key, 1.0, 0.0), Location(Cloud.AWS, "us-east-1"), 0.0)
    with pytest.raises(InvalidDecisionInput, match="a throughput > 0 where it runs"):
        decide(stuck, AZURE_HALF, NOW)


def test_a_dwelling_job_without_a_saving_is_not_reported_as_dwelling() -> None:
    d = decide(job(moved_hours_ago=1.0), quote(Cloud.AWS, "us-east-1", "us-east-1b", 0.995), NOW)
    assert d.action is Action.STAY and d.reason is Reason.NO_SAVING
    d = decide(job(moved_hours_ago=1.0), quote(Cloud.AWS, "us-east-1", "us-east-1b", 0.98), NOW)
    assert d.reason is Reason.BELOW_MARGIN
    assert d.explanation.startswith("stay: the net saving does not clear the margin (saving $0.56, move $0.25")
