"""Collection planner benchmark: 1,000 jobs over 500 offers, quotas per cloud/region, a shared deadline.

Run: ``.venv/bin/python bench/plan_collection_bench.py [--jobs 1000] [--offers 500] [--deadline 48]
[--step-levels 0] [--pulp-timeout 60] [--seed 0]``

Jobs: the 26 job types of Gavel's ``simulation_throughputs.json`` at 1/2/4/8 GPUs (where measured),
steps drawn so a job takes 1-30 h on its fastest accelerator; ``--step-levels 0`` (default) draws
every job's steps at random, so each job is its own group (the hardest case: 1,000 groups of 1);
``--step-levels K`` draws them from K levels per job type, as a sweep would (groups merge).
Offers: synthetic, 2020-like per-GPU prices of K80/P100/V100 at 1/2/4/8 GPUs, 3 clouds, 20 regions,
1-3 zones each, spot (per zone) and on-demand (per region), 500 sampled. Quotas: every region and
every cloud, sized from the GPU demand so that several bind. Objective: ``SweepMinCost`` (all jobs
within the deadline at 95% confidence, each), then ``MinMakespanWithinBudget`` at 1.15x the
deadline plan's cost, by bisection and by the binary MILP.

Prints figures (nothing asserted): evaluation+build time, solve time, status, objective, gap; then
the pulp formulation of the same models, built and solved in a child process stopped after
``--pulp-timeout`` seconds, to show where its time goes (the issue's target: <= 10 s to optimal).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import pulp

from costopt.planning.collection import (
    CollectionInfeasible,
    CollectionSpec,
    JobGroup,
    MinMakespanWithinBudget,
    Quota,
    SolverOptions,
    SweepMinCost,
    build_pair_model,
    plan_collection,
)
from costopt.planning.collection_solve import PairModel, PulpBackend, new_highs
from costopt.planning.evaluate import OfferTable
from costopt.planning.model import Assumptions, JobSpec
from costopt.settings import Settings
from costopt.throughput import GAVEL_SIMULATION_FILE, ThroughputCatalog, load_throughput_file

REGIONS = {
    "aws": ["us-east-1", "us-east-2", "us-west-2", "eu-west-1", "eu-central-1", "ap-northeast-1", "ap-southeast-1",
            "ca-central-1"],
    "gcp": ["us-central1", "us-east1", "us-west1", "europe-west4", "asia-east1", "asia-northeast1",
            "australia-southeast1"],
    "azure": ["eastus", "westus2", "westeurope", "southcentralus", "japaneast"],
}  # fmt: skip
# On-demand USD per GPU-hour, 2020 list prices rounded (AWS p2/p3, GCP GPU + n1 share, Azure NC/NCv2/NCv3).
OD_PER_GPU = {
    "aws": {"k80": 0.90, "p100": 1.53, "v100": 3.06},
    "gcp": {"k80": 0.60, "p100": 1.60, "v100": 2.67},
    "azure": {"k80": 0.90, "p100": 2.07, "v100": 3.06},
}
SIZES = (1, 2, 4, 8)


def synthetic_offers(n_offers: int, rng: np.random.Generator) -> pd.DataFrame:
    rows = []
    for cloud, regions in REGIONS.items():
        for region in regions:
            mult = rng.uniform(1.0, 1.3)
            sep = "" if cloud == "aws" else "-"
            zones = [f"{region}{sep}{'abc'[i]}" for i in range(rng.integers(1, 4))]
            for acc, per_gpu in OD_PER_GPU[cloud].items():
                for n in SIZES:
                    itype = f"{acc}x{n}"
                    rows.append((cloud, region, "", itype, "on_demand", acc, n, round(per_gpu * n * mult, 4)))
                    for zone in zones:
                        spot = per_gpu * n * mult * rng.uniform(0.22, 0.45)
                        rows.append((cloud, region, zone, itype, "spot", acc, n, round(spot, 4)))
    frame = pd.DataFrame(
        rows, columns=["cloud", "region", "zone", "instance_type", "market", "accelerator", "gpu_count", "usd_per_hour"]
    )
    pick = np.sort(rng.choice(len(frame), size=min(n_offers, len(frame)), replace=False))
    return frame.iloc[pick].reset_index(drop=True)


def synthetic_jobs(catalog: ThroughputCatalog, n_jobs: int, levels: int, rng: np.random.Generator) -> list[JobGroup]:
    types = catalog.job_types()
    options = []  # (job type, gpus, fastest steps/s)
    for jt in types:
        for n in SIZES:
            speeds = [c.steps_per_s for acc in ("k80", "p100", "v100") if (c := catalog.get(jt, acc, n)) is not None]
            if speeds and max(speeds) > 0:
                options.append((jt, n, max(speeds)))
    by_type: dict[str, list[tuple[Any, int, float]]] = {}
    for opt in options:
        by_type.setdefault(opt[0].name, []).append(opt)
    names = sorted(by_type)
    level_hours = {name: rng.uniform(1.0, 30.0, size=max(levels, 1)) for name in names}
    counts: dict[tuple[Any, int, float], int] = {}
    for _ in range(n_jobs):
        name = names[rng.integers(len(names))]
        jt, n, fastest = by_type[name][rng.integers(len(by_type[name]))]
        hours = level_hours[name][rng.integers(levels)] if levels > 0 else rng.uniform(1.0, 30.0)
        steps = float(round(fastest * 3600.0 * hours))
        counts[(jt, n, steps)] = counts.get((jt, n, steps), 0) + 1
    return [
        JobGroup(JobSpec(jt, steps, gpu_count=n), count, f"{jt.name} x{n} {steps:.0f} steps")
        for (jt, n, steps), count in counts.items()
    ]


def synthetic_quotas(offers: pd.DataFrame, groups: list[JobGroup], rng: np.random.Generator) -> tuple[Quota, ...]:
    demand = sum(g.count * g.job.gpu_count for g in groups)
    present = offers[["cloud", "region"]].drop_duplicates()
    n_regions = len(present)
    quotas = [
        Quota(str(cloud), str(region), int(8 * round(1.4 * demand / n_regions * rng.uniform(0.5, 1.5) / 8)))
        for cloud, region in present.itertuples(index=False)
    ]
    quotas += [Quota(cloud, None, int(0.42 * demand)) for cloud in sorted(present["cloud"].unique())]
    return tuple(quotas)


def _pulp_child(model: PairModel, budget: float | None, out: Any) -> None:
    """Build the pulp problem (timed), then solve it with pulp.HiGHS (timed); report through ``out``."""
    new_highs()  # keep HiGHS's once-per-process banner off stdout
    t0 = time.perf_counter()
    backend = PulpBackend(model)
    ub = model.full_bounds()
    problem, n = backend._jobs_problem("bench_min_cost", ub)
    total = backend._total_cost(n)
    problem += total
    if budget is not None:
        problem += total <= budget, "budget"
    built = time.perf_counter() - t0
    out.put(("built", built))
    t1 = time.perf_counter()
    problem.solve(pulp.HiGHS(msg=False, gapRel=0.0))
    out.put(("solved", time.perf_counter() - t1, pulp.value(problem.objective)))


def time_pulp(label: str, model: PairModel, timeout: float) -> None:
    ctx = mp.get_context("spawn")  # not fork: HiGHS threads of this process would not survive it
    queue = ctx.Queue()
    proc = ctx.Process(target=_pulp_child, args=(model, None, queue), daemon=True)
    start = time.perf_counter()
    proc.start()
    proc.join(timeout)
    messages = []
    while not queue.empty():
        messages.append(queue.get())
    if proc.is_alive():
        proc.terminate()
        proc.join()
    built = next((m[1] for m in messages if m[0] == "built"), None)
    solved = next((m for m in messages if m[0] == "solved"), None)
    wall = time.perf_counter() - start
    size = f"{model.n_pairs:,} int vars, {model.n_groups + model.n_quotas:,} rows"
    if solved is None:
        where = "building expressions" if built is None else f"solve() after {built:.2f} s of expressions"
        print(f"  pulp ({label}, {size}): stopped after {wall:.1f} s, still in {where}")
    else:
        print(
            f"  pulp ({label}, {size}): expressions {built:.2f} s + solve() {solved[1]:.2f} s "
            f"(pulp->highspy model transfer + HiGHS); {wall:.2f} s wall with the child's start, "
            f"objective ${solved[2]:,.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--offers", type=int, default=500)
    parser.add_argument("--deadline", type=float, default=48.0)
    parser.add_argument("--step-levels", type=int, default=0)
    parser.add_argument("--pulp-timeout", type=float, default=60.0)
    parser.add_argument("--milp-timeout", type=float, default=30.0, help="time limit of the binary makespan MILP")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=None, help="shared data folder (default ../shared/data)")
    parser.add_argument(
        "--json",
        action="store_true",
        help="only the goal's figure (the default LP-guided pruned sweep, to proven optimality) as one JSON object",
    )
    args = parser.parse_args()

    data = args.data or Settings().data_dir
    if data is None:
        raise SystemExit("../shared/data not found: pass --data")
    rng = np.random.default_rng(args.seed)
    catalog = ThroughputCatalog.from_measurements(load_throughput_file(data / GAVEL_SIMULATION_FILE))
    offers = synthetic_offers(args.offers, rng)
    table = OfferTable.from_frame(offers)
    groups = synthetic_jobs(catalog, args.jobs, args.step_levels, rng)
    quotas = synthetic_quotas(offers, groups, rng)
    assumptions = Assumptions(per_gpu_packing=True)
    demand = sum(g.count * g.job.gpu_count for g in groups)
    if not args.json:
        print(
            f"instance: {sum(g.count for g in groups)} jobs in {len(groups)} groups ({demand} GPUs), "
            f"{len(table)} offers in {offers['region'].nunique()} regions of {offers['cloud'].nunique()} clouds, "
            f"{len(quotas)} quotas, deadline {args.deadline:g} h"
        )

    sweep = CollectionSpec(tuple(groups), SweepMinCost(args.deadline), quotas)
    t0 = time.perf_counter()
    try:
        plan = plan_collection(sweep, table, catalog, assumptions)
    except CollectionInfeasible as exc:  # the instance is built feasible: a failure (exit 1, the reason on stderr)
        raise SystemExit(f"sweep infeasible ({exc.binding}): {exc}") from exc
    if args.json:
        figures = {
            "jobs": sum(g.count for g in groups),
            "offers": len(table),
            "quotas": len(quotas),
            "sweep_total_s": time.perf_counter() - t0,
            "build_s": plan.build_seconds,
            "solve_s": plan.solve_seconds,
            "status": str(plan.status),
            "mip_gap": plan.mip_gap,
        }
        print(json.dumps(figures))
        return
    print(
        f"SweepMinCost (scipy, LP-guided, pruned): evaluate+build {plan.build_seconds:.3f} s, "
        f"solve {plan.solve_seconds:.3f} s ({plan.solves} solve(s)), status {plan.status}, gap {plan.mip_gap:.2e}, "
        f"objective ${plan.total_expected_cost_usd:,.2f}, pairs {plan.pairs_admissible:,} admissible -> "
        f"{plan.pairs_in_model:,} in model"
    )
    print(f"  {plan.reason}")
    for label, opts in (
        ("whole MILP to HiGHS, pruned", SolverOptions(lp_guided=False)),
        ("LP-guided, unpruned", SolverOptions(prune=False, lp_guided=True)),
        ("whole MILP to HiGHS, unpruned", SolverOptions(prune=False, lp_guided=False)),
    ):
        other = plan_collection(sweep, table, catalog, assumptions, options=opts)
        print(
            f"SweepMinCost (scipy, {label}, {other.pairs_in_model:,} pairs): build {other.build_seconds:.3f} s, "
            f"solve {other.solve_seconds:.3f} s, status {other.status}, objective ${other.total_expected_cost_usd:,.2f}"
        )

    budget = (plan.total_expected_cost_usd * Decimal("1.15")).quantize(Decimal("0.01"))
    fast = CollectionSpec(tuple(groups), MinMakespanWithinBudget(budget), quotas)
    Method = tuple[Literal["bisect", "milp"], float | None]
    methods: tuple[Method, ...] = (("bisect", None), ("milp", args.milp_timeout))
    for method, limit in methods:
        t0 = time.perf_counter()
        try:
            mk = plan_collection(
                fast, table, catalog, assumptions, options=SolverOptions(makespan_method=method, time_limit_s=limit)
            )
        except CollectionInfeasible as exc:
            print(f"MinMakespanWithinBudget infeasible ({exc.binding}): {exc}")
            break
        print(
            f"MinMakespanWithinBudget ${budget} ({method}, time limit {limit} s): "
            f"total {time.perf_counter() - t0:.3f} s"
            f" (build {mk.build_seconds:.3f} s, solve {mk.solve_seconds:.3f} s, {mk.solves} solves),"
            f" status {mk.status},"
            f" gap {mk.mip_gap:.2e}, makespan {mk.makespan_hours:.2f} h at ${mk.total_expected_cost_usd:,.2f}"
        )

    pruned_model = build_pair_model(sweep, table, catalog, assumptions)
    full_model = build_pair_model(sweep, table, catalog, assumptions, prune=False)
    print(f"pulp formulation of the same SweepMinCost model (child process, stopped after {args.pulp_timeout:g} s):")
    time_pulp("pruned", pruned_model, args.pulp_timeout)
    time_pulp("unpruned", full_model, args.pulp_timeout)


if __name__ == "__main__":
    main()
