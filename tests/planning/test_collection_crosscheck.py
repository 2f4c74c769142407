"""The collection planner's formulations agree with each other and with brute force on random instances.

Random small instances (hypothesis draws a seed; derandomized, so CI is reproducible): 1-3 synthetic
job types, 3-9 offers over 4 regions of 3 clouds (spot and on-demand, 1-8 GPUs), 1-3 groups, random
region and cloud quotas. Every objective is solved by the scipy matrix form (LP-guided and whole
MILP, pruned and not, bisection and binary makespan MILP) and by the pulp form; all must report the
same optimum (1e-6 relative) or all must report infeasibility. On the tiniest instances an
enumeration of every assignment is the oracle.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from decimal import Decimal

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costopt.planning.collection import (
    CollectionInfeasible,
    CollectionObjective,
    CollectionSpec,
    JobGroup,
    MinMakespanWithinBudget,
    MinTotalCost,
    Quota,
    SolverOptions,
    SweepMinCost,
    plan_collection,
)
from costopt.planning.evaluate import OfferTable, evaluate
from costopt.planning.model import Assumptions, JobSpec, to_cents
from costopt.throughput import JobType, ThroughputCatalog
from tests.planning.test_collection import catalog_of, table_of

REGIONS = (("aws", "us-east-1"), ("aws", "us-west-2"), ("gcp", "us-central1"), ("azure", "eastus"))
PER_GPU = {"k80": 0.9, "p100": 1.5, "v100": 3.0}
ASSUMPTIONS = Assumptions(per_gpu_packing=True)  # the paper's model (quotas count job GPUs)

VARIANTS = {
    "scipy": SolverOptions(),
    "scipy-lp-guided": SolverOptions(lp_guided=True),
    "scipy-lp-guided-unpruned": SolverOptions(lp_guided=True, prune=False),
    "scipy-whole-milp-unpruned": SolverOptions(lp_guided=False, prune=False),
    "scipy-binary-makespan": SolverOptions(makespan_method="milp"),
    "pulp": SolverOptions(backend="pulp", makespan_method="milp"),
    "pulp-bisect-unpruned": SolverOptions(backend="pulp", prune=False),
}


@dataclass(frozen=True)
class Instance:
    table: OfferTable
    catalog: ThroughputCatalog
    groups: tuple[JobGroup, ...]
    quotas: tuple[Quota, ...]
    deadline: float
    budget_factor: float


def random_instance(seed: int, *, max_offers: int = 9, max_count: int = 3) -> Instance:
    rng = np.random.default_rng(seed)
    types = [JobType("Net", bs) for bs in (16, 32, 64)][: int(rng.integers(1, 4))]
    cells: dict[tuple[JobType, str, int], float] = {}
    for jt in types:
        for acc, speed in (("k80", 1.0), ("p100", 2.5), ("v100", 4.0)):
            for n in (1, 2, 4):
                roll = rng.random()
                if roll < 0.1:
                    continue  # unknown
                cells[(jt, acc, n)] = 0.0 if roll < 0.2 else float(speed * n**0.85 * rng.uniform(0.7, 1.3))
    rows: list[tuple[object, ...]] = []
    for _ in range(int(rng.integers(3, max_offers + 1))):
        cloud, region = REGIONS[int(rng.integers(len(REGIONS)))]
        acc = str(rng.choice(list(PER_GPU)))
        n = int(rng.choice([1, 2, 4, 8]))
        market = str(rng.choice(["on_demand", "spot"]))
        factor = 1.0 if market == "on_demand" else float(rng.uniform(0.25, 0.6))
        zone = "" if market == "on_demand" else f"{region}-a"
        price = round(PER_GPU[acc] * n * factor * float(rng.uniform(0.8, 1.2)), 4)
        rows.append((cloud, region, zone, f"{acc}x{n}", market, acc, n, price))
    groups = tuple(
        JobGroup(
            JobSpec(
                types[int(rng.integers(len(types)))], float(rng.integers(5_000, 80_000)), int(rng.choice([1, 1, 2, 4]))
            ),
            int(rng.integers(1, max_count + 1)),
            f"g{i}",
        )
        for i in range(int(rng.integers(1, 4)))
    )
    quotas: list[Quota] = []
    for cloud, region in REGIONS:
        if rng.random() < 0.5:
            quotas.append(Quota(cloud, region, int(rng.integers(0, 13))))
    for cloud in ("aws", "gcp", "azure"):
        if rng.random() < 0.3:
            quotas.append(Quota(cloud, None, int(rng.integers(1, 17))))
    return Instance(
        table_of(rows),
        catalog_of(cells),
        tuple(groups),
        tuple(quotas),
        deadline=float(rng.uniform(2.0, 30.0)),
        budget_factor=float(rng.uniform(1.0, 1.6)),
    )


def objectives(inst: Instance) -> list[CollectionObjective]:
    out: list[CollectionObjective] = [MinTotalCost(), SweepMinCost(deadline_hours=inst.deadline)]
    try:
        cheapest = plan_collection(
            CollectionSpec(inst.groups, MinTotalCost(), inst.quotas), inst.table, inst.catalog, ASSUMPTIONS
        )
    except CollectionInfeasible:
        out.append(MinMakespanWithinBudget(Decimal(1000)))
    else:
        budget = to_cents(cheapest.total_expected_cost_usd * Decimal(repr(inst.budget_factor))) + Decimal("0.01")
        out.append(MinMakespanWithinBudget(budget))
        out.append(MinMakespanWithinBudget(cheapest.total_expected_cost_usd))  # exactly the minimum
    return out


Outcome = tuple[str, float, float]  # ("ok", cost, makespan) or ("infeasible", nan, nan)


def solve(inst: Instance, objective: CollectionObjective, options: SolverOptions) -> Outcome:
    spec = CollectionSpec(inst.groups, objective, inst.quotas)
    try:
        plan = plan_collection(spec, inst.table, inst.catalog, ASSUMPTIONS, options=options)
    except CollectionInfeasible:
        return ("infeasible", float("nan"), float("nan"))
    assert plan.status == "optimal" and plan.mip_gap <= 1e-9
    for use in plan.quota_use:
        assert use.gpus_used <= use.quota.max_gpus
    if isinstance(objective, MinMakespanWithinBudget):
        assert plan.total_expected_cost_usd <= objective.budget_usd
    if isinstance(objective, SweepMinCost):
        assert plan.max_hours_at_confidence is not None and plan.max_hours_at_confidence <= objective.deadline_hours
    return ("ok", float(plan.total_expected_cost_usd), plan.makespan_hours)


def assert_same(reference: Outcome, other: Outcome, objective: CollectionObjective, label: str) -> None:
    assert other[0] == reference[0], f"{label}: {other} vs {reference}"
    if reference[0] == "ok":
        assert other[1] == pytest.approx(reference[1], rel=1e-6), label
        if isinstance(objective, MinMakespanWithinBudget):
            assert other[2] == pytest.approx(reference[2], rel=1e-12), label


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_scipy_and_pulp_formulations_agree_on_random_small_instances(seed: int) -> None:
    inst = random_instance(seed)
    for objective in objectives(inst):
        outcomes = {name: solve(inst, objective, opts) for name, opts in VARIANTS.items()}
        reference = outcomes["scipy"]
        for name, outcome in outcomes.items():
            assert_same(reference, outcome, objective, f"{name} on {objective}")


def brute_force(inst: Instance, objective: CollectionObjective) -> Outcome:
    """Enumerate every assignment of every job to an admissible offer."""
    conf = objective.confidence if isinstance(objective, SweepMinCost) else None
    per_group = []
    for grp in inst.groups:
        ev = evaluate(grp.job, inst.table, inst.catalog, ASSUMPTIONS)
        ok = ev.feasible.copy()
        if conf is not None and isinstance(objective, SweepMinCost):
            ok &= ev.hours_at_confidence(conf, ASSUMPTIONS) <= objective.deadline_hours
        offers = [int(o) for o in np.flatnonzero(ok)]
        per_group.append([(combo, ev) for combo in itertools.combinations_with_replacement(offers, grp.count)])
    cloud = [str(c) for c in inst.table.cloud]
    region = [str(r) for r in inst.table.region]
    best: tuple[float, float] | None = None
    for choice in itertools.product(*per_group):
        cost, span = 0.0, 0.0
        used = [0] * len(inst.quotas)
        for grp, (combo, ev) in zip(inst.groups, choice, strict=True):
            for o in combo:
                cost += float(ev.expected_cost[o])
                span = max(span, float(ev.expected_hours[o]))
                for i, q in enumerate(inst.quotas):
                    if cloud[o] == q.cloud and (q.region is None or region[o] == q.region):
                        used[i] += grp.job.gpu_count
        if any(u > q.max_gpus for u, q in zip(used, inst.quotas, strict=True)):
            continue
        if isinstance(objective, MinMakespanWithinBudget):
            if cost > float(objective.budget_usd) * (1 + 1e-12):
                continue
            key = (span, cost)
        else:
            key = (cost, span)
        if best is None or key < best:
            best = key
    if best is None:
        return ("infeasible", float("nan"), float("nan"))
    if isinstance(objective, MinMakespanWithinBudget):
        return ("ok", best[1], best[0])
    return ("ok", best[0], best[1])


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_optimum_matches_brute_force_on_tiny_instances(seed: int) -> None:
    inst = random_instance(seed, max_offers=6, max_count=2)
    for objective in objectives(inst):
        expected = brute_force(inst, objective)
        assert_same(expected, solve(inst, objective, SolverOptions()), objective, f"scipy on {objective}")
        assert_same(expected, solve(inst, objective, VARIANTS["scipy-lp-guided"]), objective, f"guided on {objective}")
        assert_same(expected, solve(inst, objective, VARIANTS["pulp"]), objective, f"pulp on {objective}")
