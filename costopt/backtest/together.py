"""A collection of jobs with a shared deadline, planned together vs one by one, backtested on real prices.

On each of the paper's start days (00:00 UTC) a collection of single-GPU jobs arrives with one
deadline (hours from the start) under GPU quotas per cloud region. Two planners place it on the
paper's offers of that day (AWS spot of the region and Azure spot; prices of the day by the
end-of-day rule, no preemption hazard):

- **together**: :func:`costopt.planning.collection.plan_collection` with
  :class:`~costopt.planning.collection.SweepMinCost` (the cheapest placement of all jobs that meets
  the deadline, under the quotas: a MILP);
- **one by one**: each job in arrival order with :func:`costopt.planning.single.plan_job` and
  :class:`~costopt.planning.model.MinCostByDeadline` over the offers whose quotas still have a GPU free;
  a job nothing free can finish in time takes the fastest free offer and misses the deadline.

Each placement is then run through the backtest engine as a static policy on its offer (the price of
each day as it changes), which gives the realized cost and finish time. Jobs are ``job_days``
V100-days each (as in the paper's table), one GPU each (per-GPU packing, so quotas count GPUs).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal

import numpy as np
import pandas as pd

from costopt.backtest.engine import JobBatch, PlacementPolicy, run_backtest, total_usd
from costopt.backtest.grid import BacktestError
from costopt.backtest.paper import (
    PAPER_MODELS,
    PAPER_REGIONS,
    SECONDS_PER_DAY,
    PaperInputs,
    RegionSetup,
    region_setup,
)
from costopt.domain import Cloud
from costopt.planning.collection import (
    CollectionInfeasible,
    CollectionSpec,
    JobGroup,
    Quota,
    SolverOptions,
    SweepMinCost,
    plan_collection,
)
from costopt.planning.evaluate import OfferTable
from costopt.planning.model import Assumptions, Infeasible, JobSpec, MinCostByDeadline, MinTime
from costopt.planning.single import plan_job
from costopt.risk.hazard import HazardModel
from costopt.throughput.catalog import ThroughputCatalog
from costopt.throughput.model import JobType, Throughput, ThroughputKey

__all__ = [
    "DEFAULT_QUOTAS",
    "CollectionCase",
    "CollectionOutcome",
    "TogetherSweep",
    "collection_sweep",
    "mixed_collection",
]

log = logging.getLogger(__name__)

DEFAULT_QUOTAS: tuple[Quota, ...] = (
    Quota("aws", "us-east-1", 8),
    Quota("aws", "us-west-2", 8),
    Quota("azure", "eastus", 8),
    Quota("azure", "northcentralus", 8),
    Quota("azure", "southcentralus", 8),
)
"""8 GPUs per region (an assumption of the order of new accounts' default spot/low-priority quotas)."""

NO_HAZARD = HazardModel(defaults=dict.fromkeys(Cloud, 0.0))


@dataclass(frozen=True, slots=True)
class CollectionCase:
    """A collection: ``jobs`` (model, count) in arrival order (one by one places them in this order,
    group by group), each ``job_days`` V100-days, all due ``deadline_hours`` after the start."""

    name: str
    jobs: tuple[tuple[str, int], ...]
    job_days: float
    deadline_hours: float
    confidence: float = 0.95

    @property
    def total(self) -> int:
        return sum(n for _, n in self.jobs)


def mixed_collection(n_jobs: int, job_days: float = 0.5, deadline_hours: float = 36.0) -> CollectionCase:
    """``n_jobs`` jobs spread evenly over the paper's six models (``n_jobs`` a multiple of 6)."""
    if n_jobs % len(PAPER_MODELS):
        raise BacktestError(f"a mixed collection needs a multiple of {len(PAPER_MODELS)} jobs, got {n_jobs}")
    each = n_jobs // len(PAPER_MODELS)
    return CollectionCase(f"mixed-{n_jobs}", tuple((m, each) for m in PAPER_MODELS), job_days, deadline_hours)


@dataclass(frozen=True, slots=True)
class CollectionOutcome:
    """One collection on one start day under one planner. ``planned_usd``: the planner's expected
    total; ``realized_usd``: the engine's total on the day-by-day prices; ``late``: jobs finishing after
    the deadline; ``makespan_hours``: the last job's finish; ``infeasible``: the planner found no
    placement meeting the deadline under the quotas (then the money figures are 0)."""

    region: str
    case: str
    planner: str
    start_day: date
    jobs: int
    planned_usd: Decimal
    realized_usd: Decimal
    late: int
    makespan_hours: float
    infeasible: bool


@dataclass(frozen=True, eq=False)
class TogetherSweep:
    outcomes: tuple[CollectionOutcome, ...]
    seconds: float

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([{k: getattr(o, k) for k in CollectionOutcome.__slots__} for o in self.outcomes])

    def summary(self) -> pd.DataFrame:
        """Per region, case and planner: mean realized and planned cost over the start days where both
        planners placed everything, late jobs and infeasible days."""
        f = self.frame()
        f["realized"] = f["realized_usd"].astype(float)
        f["planned"] = f["planned_usd"].astype(float)
        ok = f.groupby(["region", "case", "start_day"])["infeasible"].transform("max") == 0
        agg = (
            f[ok]
            .groupby(["region", "case", "planner"])
            .agg(days=("start_day", "nunique"), planned=("planned", "mean"), realized=("realized", "mean"))
        )
        late = f.groupby(["region", "case", "planner"]).agg(late=("late", "sum"), infeasible=("infeasible", "sum"))
        return agg.join(late, how="outer").reset_index()


def _catalog(inputs: PaperInputs, models: Sequence[str]) -> ThroughputCatalog:
    cells = {
        ThroughputKey(JobType.parse(m), acc): Throughput(v, "measured")
        for m in models
        for acc, v in inputs.throughputs[m].items()
    }
    return ThroughputCatalog(cells)


def _table(setup: RegionSetup, period: int) -> tuple[OfferTable, np.ndarray]:
    """The multi-cloud spot offers priced in ``period`` (columns of the planner) and their columns in
    the grid."""
    grid = setup.grid
    cols = np.flatnonzero(setup.policies["multi_cloud"].allowed & np.isfinite(grid.usd_per_hour[period]))
    frame = grid.offers.frame.iloc[cols].reset_index(drop=True).copy()
    frame["usd_per_hour"] = grid.usd_per_hour[period, cols]
    return OfferTable.from_frame(frame, NO_HAZARD), cols


def _quota_free(table: OfferTable, quotas: Sequence[Quota], used: Mapping[str, int]) -> np.ndarray:
    free = np.ones(len(table), dtype=bool)
    for q in quotas:
        inside = np.array([str(c).lower() == q.cloud for c in table.cloud], dtype=bool)
        if q.region is not None:
            inside &= table.region == q.region
        if used.get(q.name, 0) >= q.max_gpus:
            free &= ~inside
    return free


def _one_by_one(
    case: CollectionCase,
    table: OfferTable,
    catalog: ThroughputCatalog,
    quotas: Sequence[Quota],
    steps: Mapping[str, float],
    assumptions: Assumptions,
) -> tuple[list[int], Decimal]:
    """Rows of ``table`` for each job in arrival order, and the planned total (USD)."""
    used: dict[str, int] = {}
    rows: list[int] = []
    total = Decimal(0)
    tables: dict[bytes, OfferTable] = {}
    for model, count in case.jobs:
        job = JobSpec(JobType.parse(model), steps[model])
        for _ in range(count):
            free = np.flatnonzero(_quota_free(table, quotas, used))
            if free.size == 0:
                raise CollectionInfeasible(
                    f"{case.name}: the quotas hold fewer GPUs than the {case.total} jobs", binding="quota"
                )
            key = free.tobytes()
            if key not in tables:  # the free offers change only when a quota fills up
                tables[key] = OfferTable.from_frame(table.frame.iloc[free].reset_index(drop=True), NO_HAZARD)
            sub = tables[key]
            try:
                plan = plan_job(job, MinCostByDeadline(case.deadline_hours, case.confidence), sub, catalog, assumptions)
            except Infeasible:
                plan = plan_job(job, MinTime(), sub, catalog, assumptions)
            w = plan.winner
            hit = np.flatnonzero(
                (sub.cloud == w.cloud)
                & (sub.region == w.region)
                & (sub.zone == w.zone)
                & (sub.instance_type == w.instance_type)
                & (sub.market == w.market)
            )
            row = int(free[int(hit[0])])
            rows.append(row)
            total += w.expected_cost_usd
            for q in quotas:
                if str(table.cloud[row]).lower() == q.cloud and (q.region is None or table.region[row] == q.region):
                    used[q.name] = used.get(q.name, 0) + 1
    return rows, total


def _together(
    case: CollectionCase,
    table: OfferTable,
    catalog: ThroughputCatalog,
    quotas: Sequence[Quota],
    steps: Mapping[str, float],
    assumptions: Assumptions,
    options: SolverOptions,
) -> tuple[list[int], Decimal]:
    groups = tuple(JobGroup(JobSpec(JobType.parse(m), steps[m]), n, m) for m, n in case.jobs)
    spec = CollectionSpec(groups, SweepMinCost(case.deadline_hours, case.confidence), tuple(quotas))
    plan = plan_collection(spec, table, catalog, assumptions, options=options)
    rows: list[int] = []
    for assignment in plan.assignments:  # groups in the case's order
        for alloc in assignment.allocations:
            rows.extend([alloc.offer_row] * alloc.count)
    return rows, plan.total_expected_cost_usd


def collection_sweep(
    inputs: PaperInputs,
    cases: Sequence[CollectionCase],
    *,
    regions: Sequence[str] = PAPER_REGIONS,
    quotas: Sequence[Quota] = DEFAULT_QUOTAS,
    start_days: Sequence[date] | None = None,
    options: SolverOptions | None = None,
) -> TogetherSweep:
    """Plan and backtest every case on every start day of each region, together and one by one."""
    t0 = time.perf_counter()
    models = sorted({m for c in cases for m, _ in c.jobs})
    missing = [m for m in models if m not in inputs.throughputs]
    if missing:
        raise BacktestError(f"no throughput for {missing}")
    catalog = _catalog(inputs, models)
    assumptions = Assumptions(per_gpu_packing=True)  # the paper's assumption: quotas count GPUs
    opts = options or SolverOptions(time_limit_s=30.0)
    longest = max(c.job_days for c in cases)
    outcomes: list[CollectionOutcome] = []
    for region in regions:
        setup = region_setup(inputs, region, models=models, job_days=(longest,), start_days=start_days)
        index = {m: i for i, m in enumerate(setup.cube.models)}
        for day in setup.start_days:
            period = setup.grid.period_of(datetime(day.year, day.month, day.day, tzinfo=UTC))
            table, cols = _table(setup, period)
            for case in cases:
                steps = {m: inputs.throughputs[m]["v100"] * case.job_days * SECONDS_PER_DAY for m, _ in case.jobs}
                order = [m for m, n in case.jobs for _ in range(n)]
                for planner in ("together", "one_by_one"):
                    try:
                        if planner == "together":
                            rows, planned = _together(case, table, catalog, quotas, steps, assumptions, opts)
                        else:
                            rows, planned = _one_by_one(case, table, catalog, quotas, steps, assumptions)
                    except CollectionInfeasible as exc:
                        log.info("%s %s %s: infeasible (%s)", region, case.name, day, exc.binding)
                        outcomes.append(
                            CollectionOutcome(
                                region, case.name, planner, day, case.total, Decimal(0), Decimal(0), 0, 0.0, True
                            )
                        )
                        continue
                    realized, finish = _realize(setup, cols[np.array(rows)], order, index, steps, period)
                    outcomes.append(
                        CollectionOutcome(
                            region=region,
                            case=case.name,
                            planner=planner,
                            start_day=day,
                            jobs=case.total,
                            planned_usd=planned,
                            realized_usd=realized,
                            late=int((finish > case.deadline_hours + 1e-9).sum()),
                            makespan_hours=float(finish.max()),
                            infeasible=False,
                        )
                    )
    return TogetherSweep(outcomes=tuple(outcomes), seconds=time.perf_counter() - t0)


def _realize(
    setup: RegionSetup,
    offer_cols: np.ndarray,
    order: Sequence[str],
    index: Mapping[str, int],
    steps: Mapping[str, float],
    period: int,
) -> tuple[Decimal, np.ndarray]:
    """Total realized cost (USD) and each job's finish hours after the start, each job a static policy
    on its offer through the engine."""
    n = len(order)
    jobs = JobBatch(
        model=np.array([index[m] for m in order], dtype=np.int64),
        steps=np.array([steps[m] for m in order]),
        start=np.full(n, period, dtype=np.int64),
        checkpoint_gb=np.zeros(n),
    )
    cost = np.zeros(n)
    finish = np.zeros(n)
    for col in np.unique(offer_cols):
        mine = np.flatnonzero(offer_cols == col)
        allowed = np.zeros(len(setup.grid.offers), dtype=bool)
        allowed[col] = True
        sub = JobBatch(jobs.model[mine], jobs.steps[mine], jobs.start[mine], jobs.checkpoint_gb[mine])
        res = run_backtest(setup.cube, sub, PlacementPolicy(f"offer {col}", allowed))
        cost[mine] = res.cost
        finish[mine] = res.finish_hours - period * setup.grid.period_hours
    return total_usd(cost), finish
