"""The collections-of-jobs planner: hand-computed optima, constraints, infeasibility, money, determinism.

The tiny instance (on-demand, no restart time, so every figure is exact by hand): a job type runs at
1 step/s on a K80 and 4 steps/s on a V100; a job of 36,000 steps takes 10 h on a K80, 2.5 h on a V100.

    offer 0  aws us-east-1   V100  $3.00/h  -> $7.50 per job, 2.5 h
    offer 1  aws us-east-1   K80   $1.00/h  -> $10.00 per job, 10 h
    offer 2  gcp us-central1 V100  $5.00/h  -> $12.50 per job, 2.5 h
    offer 3  gcp us-central1 K80   $0.90/h  -> $9.00 per job, 10 h

Three jobs, quota aws/us-east-1 = 2 GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from costopt.planning import collection
from costopt.planning.collection import (
    CollectionInfeasible,
    CollectionPlan,
    CollectionSolverError,
    CollectionSpec,
    JobGroup,
    MinMakespanWithinBudget,
    MinTotalCost,
    Quota,
    SolverOptions,
    SweepMinCost,
    build_pair_model,
    plan_collection,
)
from costopt.planning.evaluate import OfferTable, evaluate
from costopt.planning.model import Assumptions, InvalidJob, JobSpec, money, to_cents
from costopt.throughput import (
    GAVEL_SIMULATION_FILE,
    JobType,
    Throughput,
    ThroughputCatalog,
    ThroughputKey,
    load_throughput_file,
)

COLUMNS = ["cloud", "region", "zone", "instance_type", "market", "accelerator", "gpu_count", "usd_per_hour"]
TOY = JobType("ToyNet", 32)
EXACT = Assumptions(restart_hours=0.0, per_gpu_packing=True)
PACKED = Assumptions(per_gpu_packing=True)
"""The paper's model: quotas count the job's GPUs (the product's default is whole-instance)."""
STEPS = 36_000.0

TINY_ROWS = [
    ("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "on_demand", "v100", 1, 3.00),
    ("aws", "us-east-1", "us-east-1a", "p2.xlarge", "on_demand", "k80", 1, 1.00),
    ("gcp", "us-central1", "us-central1-a", "v100-1", "on_demand", "v100", 1, 5.00),
    ("gcp", "us-central1", "us-central1-a", "k80-1", "on_demand", "k80", 1, 0.90),
]
AWS_QUOTA = (Quota("aws", "us-east-1", 2),)


def catalog_of(cells: dict[tuple[JobType, str, int], float]) -> ThroughputCatalog:
    """A measured catalog from ``{(job type, accelerator, gpus): steps/s}``."""
    return ThroughputCatalog(
        {ThroughputKey(jt, acc, n): Throughput(v, "measured") for (jt, acc, n), v in cells.items()}
    )


def toy_catalog() -> ThroughputCatalog:
    return catalog_of({(TOY, "k80", 1): 1.0, (TOY, "v100", 1): 4.0, (TOY, "k80", 2): 1.8, (TOY, "v100", 2): 7.5})


def table_of(rows: Sequence[tuple[object, ...]]) -> OfferTable:
    return OfferTable.from_frame(pd.DataFrame(rows, columns=COLUMNS))


def group(count: int = 3, name: str = "A", steps: float = STEPS, gpus: int = 1) -> JobGroup:
    return JobGroup(JobSpec(TOY, steps, gpu_count=gpus), count, name)


def plan_tiny(objective: object, quotas: tuple[Quota, ...] = AWS_QUOTA, **options: object) -> CollectionPlan:
    spec = CollectionSpec((group(),), objective, quotas)  # type: ignore[arg-type]
    return plan_collection(spec, table_of(TINY_ROWS), toy_catalog(), EXACT, options=SolverOptions(**options))  # type: ignore[arg-type]


def placements(plan: CollectionPlan) -> dict[tuple[str, int], int]:
    return {(ga.group, a.offer_row): a.count for ga in plan.assignments for a in ga.allocations}


# --- hand-computed optima ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["scipy", "pulp"])
def test_min_total_cost_fills_the_quota_with_the_cheapest_then_goes_elsewhere(backend: str) -> None:
    plan = plan_tiny(MinTotalCost(), backend=backend)
    # 2 jobs on aws V100 ($7.50 each, quota full), the third on gcp K80 ($9.00): $24.00.
    assert plan.total_expected_cost_usd == Decimal("24.00")
    assert placements(plan) == {("A", 0): 2, ("A", 3): 1}
    assert plan.makespan_hours == 10.0
    assert plan.status == "optimal" and plan.mip_gap == 0.0
    assert [(u.quota.name, u.gpus_used, u.full) for u in plan.quota_use] == [("aws/us-east-1", 2, True)]
    assert "quotas add +6.7%" in plan.reason and "aws/us-east-1 2/2 GPUs" in plan.reason


def test_without_quotas_every_job_takes_the_cheapest_offer() -> None:
    plan = plan_tiny(MinTotalCost(), quotas=())
    assert plan.total_expected_cost_usd == Decimal("22.50")
    assert placements(plan) == {("A", 0): 3}


@pytest.mark.parametrize("backend", ["scipy", "pulp"])
def test_sweep_deadline_excludes_offers_too_slow_for_it(backend: str) -> None:
    plan = plan_tiny(SweepMinCost(deadline_hours=5.0), backend=backend)
    # K80s take 10 h > 5 h: 2 on aws V100, the third on gcp V100 ($12.50): $27.50.
    assert plan.total_expected_cost_usd == Decimal("27.50")
    assert placements(plan) == {("A", 0): 2, ("A", 2): 1}
    assert plan.max_hours_at_confidence == 2.5


@pytest.mark.parametrize(("backend", "method"), [("scipy", "bisect"), ("scipy", "milp"), ("pulp", "milp")])
@pytest.mark.parametrize(
    ("budget", "makespan", "cost"),
    [
        ("30", 2.5, "27.50"),  # all three on V100s fit the budget
        ("27.50", 2.5, "27.50"),  # exactly at the budget
        ("26", 10.0, "24.00"),  # the V100 outside the quota is too dear: a K80 sets the makespan
    ],
)
def test_min_makespan_within_budget_hand_computed(
    backend: str, method: str, budget: str, makespan: float, cost: str
) -> None:
    plan = plan_tiny(MinMakespanWithinBudget(Decimal(budget)), backend=backend, makespan_method=method)
    assert plan.makespan_hours == makespan
    assert plan.total_expected_cost_usd == Decimal(cost)
    assert plan.total_expected_cost_usd <= Decimal(budget)
    assert plan.status == "optimal" and plan.mip_gap == 0.0


def test_among_equal_makespans_the_cheapest_is_chosen() -> None:
    # Budget $40: makespan 2.5 h with any mix of V100s; the cheapest such mix is 2 aws + 1 gcp.
    plan = plan_tiny(MinMakespanWithinBudget(Decimal(40)))
    assert plan.makespan_hours == 2.5
    assert plan.total_expected_cost_usd == Decimal("27.50")


# --- infeasibility names what binds --------------------------------------------------------------


def test_budget_too_small_names_the_budget_and_the_minimum_cost() -> None:
    with pytest.raises(CollectionInfeasible) as info:
        plan_tiny(MinMakespanWithinBudget(Decimal(20)))
    assert info.value.binding == "budget"
    assert info.value.min_cost_usd == Decimal("24.00")
    assert "$20 budget is too small" in str(info.value) and "$24.00" in str(info.value)


def test_deadline_no_offer_meets_names_the_group_and_the_fastest_hours() -> None:
    with pytest.raises(CollectionInfeasible) as info:
        plan_tiny(SweepMinCost(deadline_hours=2.0))
    assert info.value.binding == "deadline"
    assert info.value.group == "A"
    assert "group 'A'" in str(info.value)
    assert "fastest placement needs 2.5 h > 2 h deadline" in str(info.value)


def test_deadline_reports_the_worst_group_and_counts_the_others() -> None:
    spec = CollectionSpec(
        (group(1, "short", STEPS), group(1, "long", 4 * STEPS), group(1, "fine", STEPS / 100)),
        SweepMinCost(deadline_hours=2.0),
    )
    with pytest.raises(CollectionInfeasible) as info:
        plan_collection(spec, table_of(TINY_ROWS), toy_catalog(), EXACT)
    assert info.value.group == "long"
    assert "10.0 h > 2 h" in str(info.value) and "1 other group(s)" in str(info.value)


def test_quotas_too_small_name_the_quota_and_the_missing_gpus() -> None:
    aws_only = [r for r in TINY_ROWS if r[0] == "aws"]
    spec = CollectionSpec((group(3),), MinTotalCost(), AWS_QUOTA)
    with pytest.raises(CollectionInfeasible) as info:
        plan_collection(spec, table_of(aws_only), toy_catalog(), EXACT)
    assert info.value.binding == "quota"
    assert info.value.shortfall_gpus == {"aws/us-east-1": 1}
    assert "quota aws/us-east-1 (2 GPUs) is short by 1 GPUs" in str(info.value)


def test_quota_shortfall_is_the_least_extra_capacity_over_all_quotas() -> None:
    quotas = (Quota("aws", None, 1), Quota("gcp", "us-central1", 0), Quota("azure", None, 5))
    spec = CollectionSpec((group(4, gpus=2),), SweepMinCost(deadline_hours=8.0), quotas)
    with pytest.raises(CollectionInfeasible) as info:
        plan_collection(spec, table_of([*TINY_ROWS, *[(*r[:6], 2, r[7] * 2) for r in TINY_ROWS]]), toy_catalog(), EXACT)
    # 4 jobs x 2 GPUs = 8 GPUs, 1 available: 7 GPUs short in total, on aws and/or gcp.
    assert info.value.binding == "quota"
    assert sum(info.value.shortfall_gpus.values()) == 7
    assert set(info.value.shortfall_gpus) <= {"aws", "gcp/us-central1"}
    assert "within the 8 h deadline" in str(info.value)


def test_a_group_no_offer_can_run_is_named() -> None:
    spec = CollectionSpec((group(1, "big", gpus=8),), MinTotalCost())
    with pytest.raises(CollectionInfeasible) as info:
        plan_collection(spec, table_of(TINY_ROWS), toy_catalog(), EXACT)
    assert info.value.binding == "throughput" and info.value.group == "big"
    assert "instance has fewer GPUs than the job" in str(info.value)


def test_no_offers_at_all() -> None:
    spec = CollectionSpec((group(),), MinTotalCost())
    with pytest.raises(CollectionInfeasible) as info:
        plan_collection(spec, table_of([]), toy_catalog(), EXACT)
    assert info.value.binding == "offers"


def test_a_group_is_planned_on_the_catalog_of_its_precision() -> None:
    amp = catalog_of({(TOY, "k80", 1): 1.0, (TOY, "v100", 1): 12.0})  # tensor cores: 3x on the V100
    fp32_group = group(1, "fp32")
    amp_group = JobGroup(JobSpec(TOY, STEPS, precision="amp"), 1, "amp")
    spec = CollectionSpec((fp32_group, amp_group), MinTotalCost())
    plan = plan_collection(spec, table_of(TINY_ROWS), toy_catalog(), EXACT, catalogs={"amp": amp})
    hours = {ga.group: ga.allocations[0].expected_hours for ga in plan.assignments}
    assert hours["fp32"] == pytest.approx(STEPS / 4.0 / 3600)  # the fp32 catalog's 4 steps/s
    assert hours["amp"] == pytest.approx(STEPS / 12.0 / 3600)
    with pytest.raises(InvalidJob, match="'amp' runs at amp"):  # never silently on the fp32 catalog
        plan_collection(spec, table_of(TINY_ROWS), toy_catalog(), EXACT)


# --- constraints hold on a larger instance -------------------------------------------------------


def mixed_instance() -> tuple[CollectionSpec, OfferTable, ThroughputCatalog]:
    """Four groups (1, 2 and 4 GPUs), spot and on-demand in 4 regions, quotas that bind."""
    other = JobType("OtherNet", 64)
    cat = catalog_of(
        {
            (TOY, "k80", 1): 1.0,
            (TOY, "p100", 1): 3.0,
            (TOY, "v100", 1): 4.0,
            (TOY, "v100", 2): 7.5,
            (TOY, "p100", 2): 5.0,
            (other, "k80", 1): 0.5,
            (other, "v100", 1): 3.0,
            (other, "v100", 4): 10.0,
            (other, "p100", 4): 6.0,
        }
    )
    rows: list[tuple[object, ...]] = []
    rng = np.random.default_rng(7)
    regions = [("aws", "us-east-1"), ("aws", "us-west-2"), ("gcp", "us-central1"), ("azure", "eastus")]
    per_gpu = {"k80": 0.9, "p100": 1.5, "v100": 3.0}
    for cloud, region in regions:
        for acc, price in per_gpu.items():
            for n in (1, 4, 8):
                for market in ("on_demand", "spot"):
                    factor = 1.0 if market == "on_demand" else rng.uniform(0.25, 0.5)
                    zone = "" if market == "on_demand" else f"{region}-a"
                    rows.append((cloud, region, zone, f"{acc}x{n}", market, acc, n, round(price * n * factor, 4)))
    groups = (
        JobGroup(JobSpec(TOY, 50_000.0), 6, "toy-1gpu"),
        JobGroup(JobSpec(TOY, 90_000.0, gpu_count=2), 4, "toy-2gpu"),
        JobGroup(JobSpec(other, 40_000.0, gpu_count=4), 3, "other-4gpu"),
        JobGroup(JobSpec(other, 20_000.0), 5, "other-1gpu"),
    )
    quotas = (Quota("aws", "us-east-1", 6), Quota("aws", None, 16), Quota("gcp", None, 10), Quota("azure", "eastus", 8))
    spec = CollectionSpec(groups, SweepMinCost(deadline_hours=12.0), quotas)
    return spec, table_of(rows), cat


def gpus_under(plan: CollectionPlan, quota: Quota) -> int:
    return sum(
        a.count * a.gpus_per_job
        for ga in plan.assignments
        for a in ga.allocations
        if a.cloud == quota.cloud and (quota.region is None or a.region == quota.region)
    )


@pytest.mark.parametrize("objective", [SweepMinCost(deadline_hours=12.0), MinTotalCost(), None])
def test_quotas_respected_and_every_job_placed(objective: object) -> None:
    spec, table, cat = mixed_instance()
    if objective is None:
        cheapest = plan_collection(replace(spec, objective=MinTotalCost()), table, cat, PACKED)
        objective = MinMakespanWithinBudget(to_cents(cheapest.total_expected_cost_usd * Decimal("1.2")))
    plan = plan_collection(replace(spec, objective=objective), table, cat, PACKED)  # type: ignore[arg-type]
    for use in plan.quota_use:
        assert gpus_under(plan, use.quota) == use.gpus_used <= use.quota.max_gpus
    assert any(use.full for use in plan.quota_use)  # the instance is built so that quotas bind
    for g, ga in zip(spec.groups, plan.assignments, strict=True):
        assert ga.group == g.name and sum(a.count for a in ga.allocations) == g.count == ga.count


def test_deadline_respected_by_every_allocation() -> None:
    spec, table, cat = mixed_instance()
    plan = plan_collection(spec, table, cat, PACKED)
    hours = [a.hours_at_confidence for ga in plan.assignments for a in ga.allocations]
    assert all(h is not None and h <= 12.0 for h in hours)
    assert plan.max_hours_at_confidence == max(h for h in hours if h is not None)
    assert plan.makespan_hours <= plan.max_hours_at_confidence


def test_budget_respected_exactly_in_decimal() -> None:
    spec, table, cat = mixed_instance()
    cheapest = plan_collection(replace(spec, objective=MinTotalCost()), table, cat, PACKED)
    for factor in ("1", "1.05", "1.5", "3"):
        budget = cheapest.total_expected_cost_usd * Decimal(factor)
        plan = plan_collection(replace(spec, objective=MinMakespanWithinBudget(budget)), table, cat, PACKED)
        assert plan.total_expected_cost_usd <= budget


def test_a_bigger_budget_never_lengthens_the_makespan() -> None:
    spec, table, cat = mixed_instance()
    cheapest = plan_collection(replace(spec, objective=MinTotalCost()), table, cat, PACKED).total_expected_cost_usd
    spans = [
        plan_collection(
            replace(spec, objective=MinMakespanWithinBudget(cheapest * Decimal(f))), table, cat, PACKED
        ).makespan_hours
        for f in ("1", "1.1", "1.3", "2")
    ]
    assert spans == sorted(spans, reverse=True)


def test_joint_confidence_is_at_least_as_strict_as_per_job() -> None:
    spec, table, cat = mixed_instance()
    per_job = plan_collection(spec, table, cat, PACKED)
    joint = plan_collection(replace(spec, objective=SweepMinCost(deadline_hours=12.0, joint=True)), table, cat, PACKED)
    assert joint.total_expected_cost_usd >= per_job.total_expected_cost_usd
    assert "all jobs together" in joint.reason and "each job" in per_job.reason


def test_whole_instance_gpus_count_against_quotas_without_per_gpu_packing() -> None:
    # One 1-GPU job, only a 4-GPU offer, a 3-GPU quota: fits when it pays per GPU, not when it holds 4.
    rows = [("aws", "us-east-1", "", "p3.8xlarge", "on_demand", "v100", 4, 12.0)]
    spec = CollectionSpec((group(1),), MinTotalCost(), (Quota("aws", "us-east-1", 3),))
    packed = plan_collection(spec, table_of(rows), toy_catalog(), EXACT)
    assert packed.total_expected_cost_usd == Decimal("7.50")  # $3/GPU-h x 2.5 h
    with pytest.raises(CollectionInfeasible) as info:
        plan_collection(spec, table_of(rows), toy_catalog(), replace(EXACT, per_gpu_packing=False))
    assert info.value.shortfall_gpus == {"aws/us-east-1": 1}


# --- money ---------------------------------------------------------------------------------------


def test_money_is_exact_decimal_and_sums_to_the_cent() -> None:
    spec, table, cat = mixed_instance()
    plan = plan_collection(spec, table, cat, PACKED)
    total = Decimal(0)
    for ga in plan.assignments:
        assert ga.cost_usd == sum((a.cost_usd for a in ga.allocations), Decimal(0))
        for a in ga.allocations:
            assert isinstance(a.cost_per_job_usd, Decimal)
            assert a.cost_usd == a.count * a.cost_per_job_usd
            assert a.cost_per_job_usd == money(a.job_usd_per_hour) * money(a.expected_hours)  # no move: no location
        total += ga.cost_usd
    assert plan.total_expected_cost_usd == total
    assert to_cents(plan.total_expected_cost_usd) == to_cents(total)
    assert f"${to_cents(total)}" in plan.reason


def test_move_cost_is_part_of_each_job_cost() -> None:
    from costopt.domain import Cloud
    from costopt.planning.model import Location

    job = JobSpec(TOY, STEPS, checkpoint_gb=100.0, location=Location(Cloud.GCP, "us-central1"))
    spec = CollectionSpec((JobGroup(job, 2, "moving"),), MinTotalCost())
    plan = plan_collection(spec, table_of(TINY_ROWS), toy_catalog(), EXACT)
    # aws V100: $7.50 + 100 GB x $0.12 (GCP to the internet) = $19.50; gcp K80 in place: $9.00.
    assert placements(plan) == {("moving", 3): 2}
    assert plan.total_expected_cost_usd == Decimal("18.00")


# --- determinism, sharing, pruning, options ------------------------------------------------------


def test_same_inputs_same_plan() -> None:
    spec, table, cat = mixed_instance()
    a, b = plan_collection(spec, table, cat, PACKED), plan_collection(spec, table, cat, PACKED)
    assert a.assignments == b.assignments
    assert a.total_expected_cost_usd == b.total_expected_cost_usd
    assert a.reason == b.reason


def test_offer_order_does_not_change_the_optimum() -> None:
    spec, table, cat = mixed_instance()
    shuffled = OfferTable.from_frame(table.frame.sample(frac=1.0, random_state=3).reset_index(drop=True))
    assert float(plan_collection(spec, shuffled, cat, PACKED).total_expected_cost_usd) == pytest.approx(
        float(plan_collection(spec, table, cat, PACKED).total_expected_cost_usd), rel=1e-9
    )


def test_identical_jobs_share_one_evaluation(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[JobSpec] = []
    real = evaluate

    def counting(job: JobSpec, *args: object, **kwargs: object) -> object:
        calls.append(job)
        return real(job, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(collection, "evaluate", counting)
    spec = CollectionSpec((group(2, "a"), group(3, "b"), group(1, "c", steps=2 * STEPS)), MinTotalCost())
    plan_collection(spec, table_of(TINY_ROWS), toy_catalog(), EXACT)
    assert len(calls) == 2  # "a" and "b" are the same job spec


def test_pruning_is_exact_and_shrinks_the_model() -> None:
    spec, table, cat = mixed_instance()
    for objective in (spec.objective, MinTotalCost(), MinMakespanWithinBudget(Decimal(400))):
        s = replace(spec, objective=objective)
        pruned = plan_collection(s, table, cat, PACKED)
        full = plan_collection(s, table, cat, PACKED, options=SolverOptions(prune=False))
        assert pruned.pairs_in_model < full.pairs_in_model == full.pairs_admissible == pruned.pairs_admissible
        assert float(pruned.total_expected_cost_usd) == pytest.approx(float(full.total_expected_cost_usd), rel=1e-9)
        assert pruned.makespan_hours == full.makespan_hours or not isinstance(objective, MinMakespanWithinBudget)
        assert build_pair_model(s, table, cat, PACKED).n_pairs == pruned.pairs_in_model  # what plan_collection solves


def test_lp_guided_and_whole_milp_agree() -> None:
    spec, table, cat = mixed_instance()
    for objective in (spec.objective, MinTotalCost(), MinMakespanWithinBudget(Decimal(400))):
        s = replace(spec, objective=objective)
        guided = plan_collection(s, table, cat, PACKED, options=SolverOptions(lp_guided=True))
        whole = plan_collection(s, table, cat, PACKED, options=SolverOptions(lp_guided=False))
        assert float(guided.total_expected_cost_usd) == pytest.approx(float(whole.total_expected_cost_usd), rel=1e-9)
        assert guided.makespan_hours == whole.makespan_hours or not isinstance(objective, MinMakespanWithinBudget)


def test_a_requested_gap_is_reported_and_kept() -> None:
    spec, table, cat = mixed_instance()
    plan = plan_collection(spec, table, cat, PACKED, options=SolverOptions(mip_rel_gap=0.05))
    assert plan.status == "optimal" and 0.0 <= plan.mip_gap <= 0.05


def test_time_limit_stops_the_search_and_reports_the_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([False])  # time for the first solve (the cheapest placement), none after it
    monkeypatch.setattr(collection._Run, "out_of_time", lambda self: next(clock, True))
    plan = plan_tiny(MinMakespanWithinBudget(Decimal(30)), time_limit_s=60.0)
    # Only the cheapest placement was found (makespan 10 h); the 2.5 h lower bound is proven: gap 75%.
    assert plan.status == "time_limit"
    assert plan.makespan_hours == 10.0
    assert plan.mip_gap == pytest.approx(0.75)
    assert "stopped at the time limit, gap 75.00%" in plan.reason


def test_time_limit_before_any_placement_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collection._Run, "remaining", lambda self: -1.0)
    with pytest.raises(CollectionSolverError, match="time limit"):
        plan_tiny(MinTotalCost(), time_limit_s=1.0)


# --- inputs --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: JobGroup(JobSpec(TOY, STEPS), 0, "zero"),
        lambda: JobGroup(JobSpec(TOY, STEPS), 1, " "),
        lambda: Quota("aws", "us-east-1", -1),
        lambda: Quota("", None, 4),
        lambda: SweepMinCost(deadline_hours=0.0),
        lambda: SweepMinCost(deadline_hours=10.0, confidence=1.0),
        lambda: MinMakespanWithinBudget(100.0),  # type: ignore[arg-type]
        lambda: MinMakespanWithinBudget(Decimal(0)),
        lambda: CollectionSpec((), MinTotalCost()),
        lambda: CollectionSpec((group(1, "x"), group(2, "x")), MinTotalCost()),
        lambda: CollectionSpec((group(),), MinTotalCost(), (Quota("aws", None, 1), Quota("AWS", None, 2))),
        lambda: SolverOptions(mip_rel_gap=1.0),
        lambda: SolverOptions(time_limit_s=0.0),
    ],
)
def test_invalid_inputs_are_refused_with_a_typed_error(make: object) -> None:
    with pytest.raises(InvalidJob):
        make()  # type: ignore[operator]


def test_quota_cloud_matches_case_insensitively() -> None:
    assert Quota("AWS", "us-east-1", 2).name == "aws/us-east-1"
    assert Quota("gcp", None, 2).name == "gcp"
    assert MinMakespanWithinBudget(500).budget_usd == Decimal(500)  # type: ignore[arg-type]


# --- on the real Gavel catalog ------------------------------------------------------------------


def test_a_sweep_of_gavel_job_types_meets_its_deadline_under_quotas(shared_data: Path) -> None:
    cat = ThroughputCatalog.from_measurements(load_throughput_file(shared_data / GAVEL_SIMULATION_FILE))
    resnet = JobType("ResNet-50", 64)
    lm = JobType("LM", 20)
    rows: list[tuple[object, ...]] = []
    for cloud, region in (("aws", "us-east-1"), ("aws", "us-west-2"), ("gcp", "us-central1")):
        for acc, per_gpu in (("k80", 0.9), ("p100", 1.46), ("v100", 3.06)):
            for n in (1, 4, 8):
                rows.append((cloud, region, "", f"{acc}x{n}", "on_demand", acc, n, per_gpu * n))
                rows.append((cloud, region, f"{region}-a", f"{acc}x{n}", "spot", acc, n, per_gpu * n * 0.3))
    groups = (
        JobGroup(JobSpec(resnet, 100_000.0, gpu_count=4), 8, "resnet-sweep"),
        JobGroup(JobSpec(lm, 500_000.0), 12, "lm-sweep"),
    )
    quotas = (Quota("aws", "us-east-1", 16), Quota("gcp", None, 12))
    plan = plan_collection(
        CollectionSpec(groups, SweepMinCost(deadline_hours=24.0), quotas), table_of(rows), cat, PACKED
    )
    assert plan.status == "optimal"
    assert plan.max_hours_at_confidence is not None and plan.max_hours_at_confidence <= 24.0
    for use in plan.quota_use:
        assert use.gpus_used <= use.quota.max_gpus
    assert sum(a.count for ga in plan.assignments for a in ga.allocations) == 20
