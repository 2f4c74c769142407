"""Planning collections of jobs: the dynamic-pricing paper's higher-level objectives.

A collection is a set of job groups (``count`` identical jobs each, e.g. the points of a
hyperparameter sweep) that run **at the same time**, under GPU quotas per cloud or per region.

Model
-----
Each group is evaluated once over every offer with :func:`costopt.planning.evaluate.evaluate`
(identical job specs share one evaluation), giving per (group ``g``, offer ``o``) the expected hours
``h[g,o]``, the expected cost of one job ``c[g,o]`` (USD, preemption overhead and checkpoint move
included) and, for a deadline, the hours at the confidence. Integer variables ``n[g,o] >= 0`` say how
many jobs of ``g`` run on ``o``:

- ``sum_o n[g,o] = count_g`` (every job placed);
- ``sum_{g, o in q} gpus[g,o] * n[g,o] <= max_gpus_q`` for every quota ``q`` (region None: the whole
  cloud); ``gpus[g,o]`` is the job's GPU count under per-GPU packing (the paper's assumption), the
  offer's whole instance otherwise;
- ``n[g,o] = 0`` where the job cannot run there, or, under a deadline, where its hours at the
  confidence exceed the deadline.

Offers have no capacity of their own: an offer is a price for as many instances as wanted, and
capacity enters only through quotas (an assumption, stated).

Objectives
----------
- :class:`MinTotalCost`: minimize ``sum c[g,o] n[g,o]``.
- :class:`SweepMinCost`: the same over the pairs that meet the deadline at the confidence (per job;
  ``joint=True`` makes it hold for all jobs together under independent preemptions).
- :class:`MinMakespanWithinBudget`: minimize the makespan ``max h[g,o]`` over used pairs subject to
  ``sum c n <= budget``; among placements of that makespan, the cheapest.

The makespan is found by an **exact bisection** over the distinct candidate hours (default): the
optimal makespan is one of the ``h[g,o]``, and "a placement within budget using only pairs with
``h <= H``" is monotone in ``H``. So each probe is a yes/no question on one built model (the pairs
above ``H`` switched off through their bounds, plus the budget row): any placement within budget
answers yes, a proof of infeasibility answers no, and neither depends on a MIP gap. The search
starts at the lower bound ``max_g min_o h[g,o]`` (often optimal), takes ``O(log K)`` probes, and ends
with one min-cost solve at the makespan found (the cheapest placement of that makespan). The
alternative (``makespan_method="milp"``) is the textbook formulation with binaries ``y[g,o]``,
``n <= count * y`` and ``T >= h * y``; its dual bound seeds the bisection, which closes any gap left.
It is exact too, but the big-M links make its LP relaxation weak and it doubles the variables: on
the benchmark instance HiGHS has not closed it after 30 s, where the bisection takes a few seconds
(``bench/plan_collection_bench.py``). Both are kept and cross-checked in tests.

Solving
-------
The default backend builds the constraint matrices directly as scipy sparse arrays and, for every
min-cost solve, runs the **LP-guided exact method** of
:class:`~costopt.planning.collection_solve.MatrixBackend`: LP relaxation (warm-started between
probes), Lagrangian bound and reduced costs, then a MILP over a small "core" of pairs whose reduced
cost is within a width of 0, widened until the core provably holds the optimum. Collections have
nearly integral LP relaxations, so this is an order of magnitude faster than handing HiGHS the
whole MILP (its primal heuristics spend seconds finding the first incumbent); on mid-sized models
with a weaker relaxation it can be up to ~2x slower, so it is used from
:data:`~costopt.planning.collection_solve.GUIDED_MIN_PAIRS` pairs on (``SolverOptions.lp_guided``
overrides). The pulp backend
states the same models readably for small instances; tests check that all agree.

Pruning (exact)
---------------
Pairs that cannot run or miss the deadline are dropped. Within one group, two offers falling in the
same quotas with the same GPUs per job are interchangeable for every constraint, so an offer is
dropped when another of that class is no costlier (min-cost objectives) or no costlier *and* no
slower (makespan): moving its jobs to the dominating offer keeps every row satisfied and the
objective no worse. Nothing else is pruned.

Money
-----
The solver works in floats; results are Decimal: one job on a pair costs
``money(job USD/h) * money(expected hours) + money(move USD)`` (as :mod:`costopt.planning.single`),
and ``total_expected_cost_usd`` is exactly ``sum count * cost_per_job``. A budget is checked against
that Decimal total (a solution over it by solver tolerance is re-solved with a tightened row).

Infeasibility is stated with what binds (:class:`CollectionInfeasible`, never an assert): a group no
offer can run (``throughput``), a group no offer finishes in time (``deadline``, with the fastest
placement's hours), quotas too small (``quota``: an elastic model with a slack per quota, minimizing
the total excess, names the quotas and by how many GPUs), a budget below the cheapest placement
(``budget``, with that minimum).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

import numpy as np
import numpy.typing as npt
import pandas as pd
import scipy.sparse as sp

from costopt.planning.collection_solve import (
    GUIDED_MIN_PAIRS,
    Backend,
    CollectionSolverError,
    MatrixBackend,
    PairModel,
    PulpBackend,
    SolveResult,
)
from costopt.planning.evaluate import WHY_NOT, Evaluation, OfferTable, evaluate, throughput_by_accelerator
from costopt.planning.model import Assumptions, Infeasible, InvalidJob, JobSpec, money, to_cents
from costopt.throughput.catalog import ThroughputCatalog
from costopt.throughput.model import DEFAULT_PRECISION, JobType, Precision

__all__ = [
    "Allocation",
    "CollectionInfeasible",
    "CollectionObjective",
    "CollectionPlan",
    "CollectionSolverError",
    "CollectionSpec",
    "GroupAssignment",
    "JobGroup",
    "MinMakespanWithinBudget",
    "MinTotalCost",
    "Quota",
    "QuotaUse",
    "SolverOptions",
    "SweepMinCost",
    "build_pair_model",
    "catalog_for_group",
    "plan_collection",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


# --- inputs -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobGroup:
    """``count`` identical jobs (``job``), named ``name`` (unique within a collection)."""

    job: JobSpec
    count: int
    name: str

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise InvalidJob(f"group {self.name!r}: count must be an int >= 1, got {self.count!r}")
        if not isinstance(self.name, str) or not self.name.strip():
            raise InvalidJob(f"a job group needs a non-empty name, got {self.name!r}")


@dataclass(frozen=True, slots=True)
class Quota:
    """At most ``max_gpus`` GPUs held at once in ``cloud`` (``region`` None: all its regions) or in
    one region of it. The cloud is matched case-insensitively against the offers' ``cloud``."""

    cloud: str
    region: str | None
    max_gpus: int

    def __post_init__(self) -> None:
        if not isinstance(self.cloud, str) or not self.cloud.strip():
            raise InvalidJob(f"a quota needs a cloud, got {self.cloud!r}")
        object.__setattr__(self, "cloud", self.cloud.strip().lower())
        if self.region is not None and (not isinstance(self.region, str) or not self.region):
            raise InvalidJob(f"quota region must be a non-empty string or None, got {self.region!r}")
        if isinstance(self.max_gpus, bool) or not isinstance(self.max_gpus, int) or self.max_gpus < 0:
            raise InvalidJob(f"quota {self.name}: max_gpus must be an int >= 0, got {self.max_gpus!r}")

    @property
    def name(self) -> str:
        """``cloud/region``, or ``cloud`` for a whole-cloud quota."""
        return self.cloud if self.region is None else f"{self.cloud}/{self.region}"


@dataclass(frozen=True, slots=True)
class MinTotalCost:
    """Cheapest total expected cost of the collection (USD), no deadline."""

    name: Literal["min-total-cost"] = "min-total-cost"


@dataclass(frozen=True, slots=True)
class SweepMinCost:
    """Cheapest total expected cost such that every job finishes within ``deadline_hours`` with
    probability ``confidence`` (preemptions at that quantile, as the single-job deadline objective).

    The confidence is per job; ``joint=True`` asks it of all ``N`` jobs together, assuming independent
    preemptions: each job then needs ``confidence ** (1 / N)``.
    """

    deadline_hours: float
    confidence: float = 0.95
    joint: bool = False
    name: Literal["sweep-min-cost"] = "sweep-min-cost"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.deadline_hours) and self.deadline_hours > 0):
            raise InvalidJob(f"the deadline must be a positive number of hours, got {self.deadline_hours}")
        if not 0.5 <= self.confidence < 1:
            raise InvalidJob(f"confidence must be in [0.5, 1), got {self.confidence}")


@dataclass(frozen=True, slots=True)
class MinMakespanWithinBudget:
    """Shortest makespan (hours until the last job's expected end; all jobs start together) such that
    the total expected cost stays within ``budget_usd``; ties go to the cheapest."""

    budget_usd: Decimal
    name: Literal["min-makespan-budget"] = "min-makespan-budget"

    def __post_init__(self) -> None:
        if isinstance(self.budget_usd, int) and not isinstance(self.budget_usd, bool):
            object.__setattr__(self, "budget_usd", Decimal(self.budget_usd))
        if not isinstance(self.budget_usd, Decimal):
            raise InvalidJob(f"the budget must be a Decimal (USD), got {self.budget_usd!r}")
        if not (self.budget_usd.is_finite() and self.budget_usd > 0):
            raise InvalidJob(f"the budget must be positive, got {self.budget_usd}")


CollectionObjective = MinTotalCost | SweepMinCost | MinMakespanWithinBudget


@dataclass(frozen=True, slots=True)
class CollectionSpec:
    """Job groups, the shared objective and the GPU quotas (cloud or region; several may cover the
    same offer, and all apply)."""

    groups: tuple[JobGroup, ...]
    objective: CollectionObjective
    quotas: tuple[Quota, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", tuple(self.groups))
        object.__setattr__(self, "quotas", tuple(self.quotas))
        if not self.groups:
            raise InvalidJob("a collection needs at least one job group")
        names = [g.name for g in self.groups]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise InvalidJob(f"job group names must be unique, repeated: {dupes}")
        keys = [q.name for q in self.quotas]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise InvalidJob(f"one quota per cloud/region, repeated: {dupes}")

    @property
    def total_jobs(self) -> int:
        return sum(g.count for g in self.groups)


@dataclass(frozen=True, slots=True)
class SolverOptions:
    """How to solve. ``backend``: ``scipy`` (sparse matrices, ``scipy.optimize.milp``) or ``pulp``
    (readable, small models). ``makespan_method``: ``bisect`` (exact, default) or ``milp`` (binaries).
    ``time_limit_s``: wall-clock seconds for all solves together, counted once the model is built
    (None: none); when it stops the search early the plan says so (``status="time_limit"``) with the
    gap reached, and when no placement was found by then :class:`CollectionSolverError` is raised. ``mip_rel_gap``:
    relative gap at which HiGHS may stop (0: proven optimal). ``prune``: drop dominated pairs (exact).
    ``lp_guided``: the scipy backend's exact LP-guided min-cost solve (see
    :class:`~costopt.planning.collection_solve.MatrixBackend`), False hands HiGHS the whole MILP,
    None (default) picks the guided solve for models of at least
    :data:`~costopt.planning.collection_solve.GUIDED_MIN_PAIRS` pairs."""

    backend: Literal["scipy", "pulp"] = "scipy"
    makespan_method: Literal["bisect", "milp"] = "bisect"
    time_limit_s: float | None = None
    mip_rel_gap: float = 0.0
    prune: bool = True
    lp_guided: bool | None = None

    def __post_init__(self) -> None:
        if self.backend not in ("scipy", "pulp"):
            raise InvalidJob(f"backend must be 'scipy' or 'pulp', got {self.backend!r}")
        if self.makespan_method not in ("bisect", "milp"):
            raise InvalidJob(f"makespan_method must be 'bisect' or 'milp', got {self.makespan_method!r}")
        if self.time_limit_s is not None and not self.time_limit_s > 0:
            raise InvalidJob(f"time_limit_s must be > 0 or None, got {self.time_limit_s}")
        if not 0 <= self.mip_rel_gap < 1:
            raise InvalidJob(f"mip_rel_gap must be in [0, 1), got {self.mip_rel_gap}")


# --- outputs ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Allocation:
    """``count`` jobs of a group on one offer (``offer_row``: row of ``OfferTable.frame``).

    ``gpus_per_job``: GPUs each job holds against quotas. ``expected_hours``: per job.
    ``hours_at_confidence``: per job, under a deadline objective (None otherwise).
    ``cost_per_job_usd``: expected USD of one job; ``cost_usd = count * cost_per_job_usd`` exactly.
    """

    offer_row: int
    count: int
    cloud: str
    region: str
    zone: str
    instance_type: str
    market: str
    accelerator: str
    gpus_per_job: int
    job_usd_per_hour: float
    expected_hours: float
    hours_at_confidence: float | None
    cost_per_job_usd: Decimal
    cost_usd: Decimal


@dataclass(frozen=True, slots=True)
class GroupAssignment:
    """Where the jobs of one group go (allocations by offer row); ``cost_usd`` is their exact sum."""

    group: str
    count: int
    allocations: tuple[Allocation, ...]
    cost_usd: Decimal


@dataclass(frozen=True, slots=True)
class QuotaUse:
    """GPUs the plan holds at once under a quota (``gpus_used <= quota.max_gpus``)."""

    quota: Quota
    gpus_used: int

    @property
    def full(self) -> bool:
        return self.gpus_used >= self.quota.max_gpus


@dataclass(frozen=True, slots=True)
class CollectionPlan:
    """The placement of every job of a collection.

    ``total_expected_cost_usd``: exact sum of the allocations (Decimal USD). ``makespan_hours``: the
    longest expected hours of a used placement. ``max_hours_at_confidence``: the same at the deadline's
    confidence (deadline objective only). ``status``: ``optimal`` (within ``mip_rel_gap``) or
    ``time_limit``. ``mip_gap``: relative gap of the primary objective (cost; makespan for the
    makespan objective); ``cost_gap``: of the final cost minimization. ``solves``: MILPs solved.
    ``pairs_admissible`` (group, offer) pairs could be used; ``pairs_in_model`` after exact pruning.
    """

    spec: CollectionSpec
    assignments: tuple[GroupAssignment, ...]
    total_expected_cost_usd: Decimal
    makespan_hours: float
    max_hours_at_confidence: float | None
    quota_use: tuple[QuotaUse, ...]
    status: Literal["optimal", "time_limit"]
    mip_gap: float
    cost_gap: float
    build_seconds: float
    solve_seconds: float
    solves: int
    solver: str
    offers_considered: int
    pairs_admissible: int
    pairs_in_model: int
    reason: str


class CollectionInfeasible(Infeasible):
    """No placement of the whole collection meets the constraints. ``binding`` is ``offers``,
    ``throughput``, ``deadline``, ``quota`` or ``budget``; ``group`` names the group that binds (deadline,
    throughput); ``shortfall_gpus`` maps each quota that binds to the GPUs it lacks; ``min_cost_usd``
    is the cheapest achievable total when the budget binds."""

    def __init__(
        self,
        message: str,
        *,
        binding: str,
        group: str | None = None,
        shortfall_gpus: Mapping[str, int] | None = None,
        min_cost_usd: Decimal | None = None,
    ) -> None:
        super().__init__(message, binding=binding)
        self.group = group
        self.shortfall_gpus: dict[str, int] = dict(shortfall_gpus or {})
        self.min_cost_usd = min_cost_usd


# --- evaluation ---------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Grid:
    """Per (group, offer) figures, G x O arrays."""

    feasible: BoolArray
    admissible: BoolArray
    why_not: IntArray
    cost: FloatArray
    hours: FloatArray
    q_hours: FloatArray | None
    job_price: FloatArray
    move: FloatArray
    gpus: IntArray


def _job_confidence(objective: CollectionObjective, total_jobs: int) -> float | None:
    if not isinstance(objective, SweepMinCost):
        return None
    if objective.joint:
        return float(objective.confidence ** (1.0 / total_jobs))
    return objective.confidence


def catalog_for_group(
    group: JobGroup, catalog: ThroughputCatalog, catalogs: Mapping[Precision, ThroughputCatalog] | None
) -> ThroughputCatalog:
    """The catalog ``group``'s jobs are planned on: ``catalogs[precision]`` for their precision, else
    ``catalog`` for jobs at the default ``fp32``. Raises :class:`~costopt.planning.model.InvalidJob` for a
    group at another precision without its catalog (planning it on the ``fp32`` one would be wrong)."""
    precision = group.job.precision
    if catalogs is not None and precision in catalogs:
        return catalogs[precision]
    if precision == DEFAULT_PRECISION:
        return catalog
    raise InvalidJob(
        f"group {group.name!r} runs at {precision}: pass its catalog as catalogs={{{precision!r}: ...}} "
        "(api.planning.catalog_at builds it)"
    )


def _evaluate_groups(
    spec: CollectionSpec,
    table: OfferTable,
    catalog: ThroughputCatalog,
    assumptions: Assumptions,
    catalogs: Mapping[Precision, ThroughputCatalog] | None = None,
) -> _Grid:
    confidence = _job_confidence(spec.objective, spec.total_jobs)
    tput_caches: dict[Precision, dict[tuple[JobType, int], tuple[np.ndarray, np.ndarray]]] = {}
    done: dict[JobSpec, tuple[Evaluation, FloatArray | None]] = {}
    rows: list[tuple[Evaluation, FloatArray | None]] = []
    for group in spec.groups:
        job = group.job
        if job not in done:
            at = catalog_for_group(group, catalog, catalogs)
            tput_cache = tput_caches.setdefault(job.precision, {})
            key = (job.job_type, job.gpu_count)
            if key not in tput_cache:
                tput_cache[key] = throughput_by_accelerator(at, job.job_type, job.gpu_count, table.accelerators)
            ev = evaluate(job, table, at, assumptions, tput_cache=tput_cache)
            q = ev.hours_at_confidence(confidence, assumptions) if confidence is not None else None
            done[job] = (ev, q)
        rows.append(done[job])
    feasible = np.stack([ev.feasible for ev, _ in rows])
    q_hours = np.stack([q for _, q in rows if q is not None]) if confidence is not None else None
    admissible = feasible.copy()
    if q_hours is not None and isinstance(spec.objective, SweepMinCost):
        with np.errstate(invalid="ignore"):
            admissible &= q_hours <= spec.objective.deadline_hours
    if assumptions.per_gpu_packing:
        per_job = np.array([g.job.gpu_count for g in spec.groups], dtype=np.int64)
        gpus = np.broadcast_to(per_job[:, None], feasible.shape).copy()
    else:
        gpus = np.broadcast_to(table.gpus.astype(np.int64)[None, :], feasible.shape).copy()
    return _Grid(
        feasible=feasible,
        admissible=admissible,
        why_not=np.stack([ev.why_not for ev, _ in rows]).astype(np.int64),
        cost=np.stack([ev.expected_cost for ev, _ in rows]),
        hours=np.stack([ev.expected_hours for ev, _ in rows]),
        q_hours=q_hours,
        job_price=np.stack([ev.job_price for ev, _ in rows]),
        move=np.stack([ev.move_cost for ev, _ in rows]),
        gpus=gpus,
    )


def _describe(group: JobGroup) -> str:
    jobs = f"{group.count} job{'s' if group.count != 1 else ''}"
    return f"group {group.name!r} ({group.job.job_type.name} on {group.job.gpu_count} GPU(s), {jobs})"


def _check_groups(spec: CollectionSpec, grid: _Grid) -> None:
    """Raise for a group no offer can run, or (deadline) none finishes in time: the worst one."""
    for g, group in enumerate(spec.groups):
        if not grid.feasible[g].any():
            codes, counts = np.unique(grid.why_not[g][grid.why_not[g] > 0], return_counts=True)
            parts = ", ".join(f"{n} offers: {WHY_NOT[int(c)]}" for c, n in zip(codes, counts, strict=True))
            raise CollectionInfeasible(
                f"{_describe(group)}: no offer can run it ({parts})", binding="throughput", group=group.name
            )
    objective = spec.objective
    if not isinstance(objective, SweepMinCost) or grid.q_hours is None:
        return
    late = [g for g in range(len(spec.groups)) if not grid.admissible[g].any()]
    if not late:
        return
    fastest = {g: float(np.nanmin(np.where(grid.feasible[g], grid.q_hours[g], np.nan))) for g in late}
    worst = max(late, key=lambda g: (fastest[g], -g))
    others = f" ({len(late) - 1} other group(s) cannot either)" if len(late) > 1 else ""
    scope = "all jobs together" if objective.joint else "each job"
    raise CollectionInfeasible(
        f"{_describe(spec.groups[worst])}: the fastest placement needs {fastest[worst]:.1f} h > "
        f"{objective.deadline_hours:g} h deadline at {objective.confidence:.0%} confidence ({scope}){others}; "
        "loosen the deadline or the confidence",
        binding="deadline",
        group=spec.groups[worst].name,
    )


# --- pairs and pruning --------------------------------------------------------------------------


def _quota_members(quotas: tuple[Quota, ...], table: OfferTable) -> BoolArray:
    """(Q x O) whether each offer falls under each quota."""
    cloud = np.array([str(c).lower() for c in table.cloud], dtype=object)
    out = np.zeros((len(quotas), len(table)), dtype=bool)
    for i, q in enumerate(quotas):
        mask = cloud == q.cloud
        if q.region is not None:
            mask &= table.region == q.region
        out[i] = mask
    return out


def _prune(g: IntArray, o: IntArray, grid: _Grid, members: BoolArray, *, pareto: bool) -> IntArray:
    """Indices (into the pair arrays) of the pairs kept: per (group, quota cells, GPUs per job), the
    cheapest (``pareto=False``) or the cost/hours Pareto front (``pareto=True``); ties keep the
    lowest offer row. Exact: see the module docstring."""
    if members.shape[0]:
        _, cell = np.unique(members.T, axis=0, return_inverse=True)
        cell = np.asarray(cell, dtype=np.int64).reshape(-1)
    else:
        cell = np.zeros(members.shape[1], dtype=np.int64)
    cost, hours, gpus = grid.cost[g, o], grid.hours[g, o], grid.gpus[g, o]
    order = np.lexsort((o, hours, cost, gpus, cell[o], g))
    sg, sc, sn = g[order], cell[o][order], gpus[order]
    start = np.ones(len(order), dtype=bool)
    start[1:] = (sg[1:] != sg[:-1]) | (sc[1:] != sc[:-1]) | (sn[1:] != sn[:-1])
    if not pareto:
        keep = start
    else:
        segment = np.cumsum(start) - 1
        sh = pd.Series(hours[order])
        prev_best = sh.groupby(segment).cummin().groupby(segment).shift(1).to_numpy()
        keep = start | (hours[order] < np.nan_to_num(prev_best, nan=np.inf))
    kept: IntArray = np.sort(order[keep]).astype(np.int64)
    return kept


def _pair_model(spec: CollectionSpec, grid: _Grid, members: BoolArray, prune: bool) -> tuple[PairModel, int]:
    """The solver's pair arrays (after exact pruning) and the number of admissible pairs."""
    g_all, o_all = np.nonzero(grid.admissible)
    g_all, o_all = g_all.astype(np.int64), o_all.astype(np.int64)
    admissible = len(g_all)
    if prune and admissible:
        keep = _prune(g_all, o_all, grid, members, pareto=isinstance(spec.objective, MinMakespanWithinBudget))
        g, o = g_all[keep], o_all[keep]
    else:
        g, o = g_all, o_all
    gpus = grid.gpus[g, o].astype(np.int64)
    if members.shape[0]:
        in_quota = sp.csc_array(members.astype(np.float64))[:, o]
        quota_rows = sp.csr_array(in_quota @ sp.diags_array(gpus.astype(np.float64)))
    else:
        quota_rows = sp.csr_array((0, len(g)))
    model = PairModel(
        group=g,
        offer=o,
        cost=grid.cost[g, o].astype(np.float64),
        hours=grid.hours[g, o].astype(np.float64),
        gpus=gpus,
        counts=np.array([grp.count for grp in spec.groups], dtype=np.int64),
        quota_rows=quota_rows,
        quota_max=np.array([q.max_gpus for q in spec.quotas], dtype=np.int64),
    )
    return model, admissible


# --- the solve ----------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _Outcome:
    """The chosen solution (jobs per pair) and how it was reached."""

    jobs: IntArray
    status: Literal["optimal", "time_limit"]
    mip_gap: float
    cost_gap: float


_NOT_SOLVED = SolveResult("no_solution", None, float("nan"), float("inf"), 0.0)


class _Run:
    """One planning run: the model, its backend, the clock and the exact money."""

    def __init__(
        self, spec: CollectionSpec, table: OfferTable, grid: _Grid, model: PairModel, options: SolverOptions
    ) -> None:
        self.spec, self.table, self.grid, self.model, self.options = spec, table, grid, model, options
        backend: Backend = (
            MatrixBackend(
                model,
                mip_rel_gap=options.mip_rel_gap,
                lp_guided=model.n_pairs >= GUIDED_MIN_PAIRS if options.lp_guided is None else options.lp_guided,
            )
            if options.backend == "scipy"
            else PulpBackend(model, mip_rel_gap=options.mip_rel_gap)
        )
        self.backend = backend
        self.started = time.perf_counter()
        self.solves = 0
        self.solve_seconds = 0.0
        self.full_ub = model.full_bounds()
        self._usd: dict[int, Decimal] = {}

    # clock
    def remaining(self) -> float | None:
        if self.options.time_limit_s is None:
            return None
        return self.options.time_limit_s - (time.perf_counter() - self.started)

    def out_of_time(self) -> bool:
        left = self.remaining()
        return left is not None and left <= 0

    def _record(self, result: SolveResult) -> SolveResult:
        self.solves += 1
        self.solve_seconds += result.seconds
        return result

    def min_cost(self, ub: FloatArray, budget: float | None, *, first_feasible: bool = False) -> SolveResult:
        if self.out_of_time():
            return _NOT_SOLVED
        return self._record(self.backend.min_cost(ub, budget, self.remaining(), first_feasible=first_feasible))

    def min_makespan(self, budget: float) -> SolveResult:
        if self.out_of_time():
            return _NOT_SOLVED
        return self._record(self.backend.min_makespan(self.full_ub, budget, self.remaining()))

    def min_quota_excess(self) -> SolveResult:
        if self.out_of_time():
            return _NOT_SOLVED
        return self._record(self.backend.min_quota_excess(self.full_ub, self.remaining()))

    # money
    def usd_per_job(self, k: int) -> Decimal:
        """Exact Decimal USD of one job on pair ``k``."""
        if k not in self._usd:
            g, o = int(self.model.group[k]), int(self.model.offer[k])
            self._usd[k] = money(float(self.grid.job_price[g, o])) * money(float(self.grid.hours[g, o])) + money(
                float(self.grid.move[g, o])
            )
        return self._usd[k]

    def total_usd(self, jobs: IntArray) -> Decimal:
        return sum((int(jobs[k]) * self.usd_per_job(int(k)) for k in np.flatnonzero(jobs)), Decimal(0))

    def makespan(self, jobs: IntArray) -> float:
        return float(self.model.hours[jobs > 0].max())

    # diagnosis
    def quota_failure(self) -> CollectionInfeasible:
        """Solve the elastic model and name the quotas that bind, with the GPUs each lacks."""
        result = self.min_quota_excess()
        if result.slack is None:
            return CollectionInfeasible(
                "the quotas cannot hold every job at once (the time limit stopped the diagnosis of which)",
                binding="quota",
            )
        short = {
            q.name: math.ceil(float(s) - 1e-6) for q, s in zip(self.spec.quotas, result.slack, strict=True) if s > 1e-6
        }
        parts = "; ".join(
            f"quota {q.name} ({q.max_gpus} GPUs) is short by {short[q.name]} GPUs"
            for q in self.spec.quotas
            if q.name in short
        )
        objective = self.spec.objective
        context = f" within the {objective.deadline_hours:g} h deadline" if isinstance(objective, SweepMinCost) else ""
        hint = " (raise these quotas" + (", or loosen the deadline)" if context else ")")
        return CollectionInfeasible(
            f"the GPU quotas cannot hold all {self.spec.total_jobs} jobs at once{context}: {parts}{hint}",
            binding="quota",
            shortfall_gpus=short,
        )

    def no_solution(self) -> CollectionSolverError:
        return CollectionSolverError(
            f"the time limit ({self.options.time_limit_s:g} s) stopped the solver before any placement was "
            "found; raise time_limit_s"
        )


def _solve_min_cost(run: _Run) -> _Outcome:
    result = run.min_cost(run.full_ub, None)
    if result.status == "infeasible":
        raise run.quota_failure()
    if result.jobs is None:
        raise run.no_solution()
    status: Literal["optimal", "time_limit"] = "optimal" if result.status == "optimal" else "time_limit"
    return _Outcome(result.jobs, status, result.gap, result.gap)


def _probe(run: _Run, ub: FloatArray, budget: Decimal, *, first_feasible: bool) -> SolveResult:
    """Min cost under the budget row (``first_feasible``: any placement within budget, a decision).

    A solution whose exact Decimal total exceeds the budget (by the solver's float tolerance) is
    re-solved with the row tightened by twice the excess."""
    rhs = float(budget)
    result = run.min_cost(ub, rhs, first_feasible=first_feasible)
    for _ in range(3):
        if result.jobs is None:
            return result
        excess = run.total_usd(result.jobs) - budget
        if excess <= 0:
            return result
        rhs -= max(2 * float(excess), 1e-9 * max(1.0, float(budget)))
        result = run.min_cost(ub, rhs, first_feasible=first_feasible)
    if result.jobs is not None and run.total_usd(result.jobs) <= budget:
        return result
    return _NOT_SOLVED


def _cheapest_or_budget_failure(run: _Run, budget: Decimal) -> SolveResult:
    """The cheapest placement over every pair (quotas only); raise when it breaks the budget."""
    base = run.min_cost(run.full_ub, None)
    if base.status == "infeasible":
        raise run.quota_failure()
    if base.jobs is None:
        raise run.no_solution()
    cheapest = run.total_usd(base.jobs)
    if cheapest <= budget:
        return base
    proven = base.status == "optimal" and base.gap <= 1e-9
    retry = None if proven else _probe(run, run.full_ub, budget, first_feasible=False)
    if retry is not None and retry.jobs is not None:
        return retry
    quotas = " under the quotas" if run.spec.quotas else ""
    note = "" if proven else f" (best found; solver gap {base.gap:.2%})"
    raise CollectionInfeasible(
        f"the ${budget} budget is too small: the cheapest placement of all {run.spec.total_jobs} jobs"
        f"{quotas} costs ${to_cents(cheapest)} expected{note}; raise the budget to at least that",
        binding="budget",
        min_cost_usd=cheapest,
    )


def _solve_makespan(run: _Run, objective: MinMakespanWithinBudget) -> _Outcome:
    """Exact bisection over the distinct pair hours (or the binary MILP first), then the cheapest
    placement at the makespan found. See the module docstring."""
    budget = objective.budget_usd
    m = run.model
    base = _cheapest_or_budget_failure(run, budget)
    candidates = np.unique(m.hours)
    starts = np.searchsorted(m.group, np.arange(m.n_groups))
    lower = float(np.max(np.minimum.reduceat(m.hours, starts)))
    # Every candidate below ``lo`` is infeasible (some group has no pair that fast): proven.
    lo = int(np.searchsorted(candidates, lower))
    best: SolveResult = base
    best_is_cheapest = True  # the cheapest placement at its own makespan (no final solve needed)
    best_idx = int(np.searchsorted(candidates, run.makespan(_jobs(base))))
    proven_lo, undecided = lo, False

    def ub_at(index: int) -> FloatArray:
        out: FloatArray = np.where(m.hours <= candidates[index], run.full_ub, 0.0)
        return out

    def take(result: SolveResult, cheapest: bool) -> None:
        nonlocal best, best_idx, best_is_cheapest
        if result.jobs is not None:
            best, best_is_cheapest = result, cheapest
            best_idx = int(np.searchsorted(candidates, run.makespan(result.jobs)))

    if run.options.makespan_method == "milp" and lo < best_idx:
        # Binaries: T >= hours * y. Its dual bound is a proven lower bound on the makespan; the
        # bisection below closes any gap left (none when the MILP is solved to optimality).
        stage1 = run.min_makespan(float(budget))
        if stage1.jobs is not None:
            if run.total_usd(stage1.jobs) <= budget:
                take(stage1, cheapest=False)
            dual = stage1.objective * (1.0 - stage1.gap)
            bound_idx = int(np.searchsorted(candidates, dual - 1e-9 * (1.0 + abs(dual))))
            proven_lo = lo = min(max(lo, bound_idx), best_idx)
    first = True
    while lo < best_idx and not run.out_of_time():
        mid = lo if first else (lo + best_idx) // 2  # the lower bound first: it is often the optimum
        first = False
        result = _probe(run, ub_at(mid), budget, first_feasible=True)
        if result.jobs is not None:
            take(result, cheapest=False)
        elif result.status == "infeasible":
            lo = mid + 1
            if not undecided:
                proven_lo = lo
        else:  # stopped by the time limit without a verdict: search above; the proven bound stays
            lo, undecided = mid + 1, True
    if not best_is_cheapest and not run.out_of_time():
        final = _probe(run, ub_at(best_idx), budget, first_feasible=False)
        take(final, cheapest=final.status == "optimal")
    top = float(candidates[best_idx])
    gap = 0.0 if proven_lo >= best_idx else (top - float(candidates[proven_lo])) / top
    exact = proven_lo >= best_idx and best_is_cheapest and best.status == "optimal"
    return _Outcome(_jobs(best), "optimal" if exact else "time_limit", gap, best.gap)


def _jobs(result: SolveResult) -> IntArray:
    if result.jobs is None:  # pragma: no cover - callers only keep results with a solution
        raise CollectionSolverError("internal: a kept solve has no solution")
    return result.jobs


# --- assembling the plan ------------------------------------------------------------------------


def _assignments(run: _Run, jobs: IntArray) -> tuple[GroupAssignment, ...]:
    frame = run.table.frame
    q_hours = run.grid.q_hours
    per_group: list[list[Allocation]] = [[] for _ in run.spec.groups]
    for k in np.flatnonzero(jobs):
        g, o = int(run.model.group[k]), int(run.model.offer[k])
        row = frame.iloc[o]
        count = int(jobs[k])
        each = run.usd_per_job(int(k))
        per_group[g].append(
            Allocation(
                offer_row=o,
                count=count,
                cloud=str(row["cloud"]),
                region=str(row["region"]),
                zone=str(row["zone"]),
                instance_type=str(row["instance_type"]),
                market=str(row["market"]),
                accelerator=str(row["accelerator"]),
                gpus_per_job=int(run.model.gpus[k]),
                job_usd_per_hour=float(run.grid.job_price[g, o]),
                expected_hours=float(run.grid.hours[g, o]),
                hours_at_confidence=None if q_hours is None else float(q_hours[g, o]),
                cost_per_job_usd=each,
                cost_usd=count * each,
            )
        )
    return tuple(
        GroupAssignment(
            group=group.name,
            count=group.count,
            allocations=tuple(allocs),
            cost_usd=sum((a.cost_usd for a in allocs), Decimal(0)),
        )
        for group, allocs in zip(run.spec.groups, per_group, strict=True)
    )


def _verify(run: _Run, jobs: IntArray, total: Decimal) -> tuple[QuotaUse, ...]:
    """Check the solution against every constraint in exact integers/Decimal (typed error, no assert)."""
    m = run.model
    placed = np.bincount(m.group, weights=jobs, minlength=m.n_groups).astype(np.int64)
    if not np.array_equal(placed, m.counts):
        raise CollectionSolverError("the solver's placement does not place every job exactly once")
    used = np.zeros(m.n_quotas, dtype=np.int64)
    if m.n_quotas:
        rows = m.quota_rows.tocsr()
        used = np.rint(rows @ jobs.astype(np.float64)).astype(np.int64)
    if np.any(used > m.quota_max):
        raise CollectionSolverError("the solver's placement exceeds a quota")
    objective = run.spec.objective
    if isinstance(objective, MinMakespanWithinBudget) and total > objective.budget_usd:
        raise CollectionSolverError("the solver's placement exceeds the budget")
    return tuple(QuotaUse(q, int(u)) for q, u in zip(run.spec.quotas, used, strict=True))


def _reason(run: _Run, outcome: _Outcome, total: Decimal, makespan: float, quota_use: tuple[QuotaUse, ...]) -> str:
    spec, objective, m, grid = run.spec, run.spec.objective, run.model, run.grid
    jobs = outcome.jobs
    offers = len(np.unique(m.offer[jobs > 0]))
    clouds = sorted({str(run.table.cloud[o]) for o in m.offer[jobs > 0]})
    n = spec.total_jobs
    head = f"{n} job{'s' if n != 1 else ''} in {len(spec.groups)} group(s) on {offers} offer(s) ({', '.join(clouds)})"
    figures = f"${to_cents(total)} expected, makespan {makespan:.1f} h"
    if isinstance(objective, MinMakespanWithinBudget):
        k = int(np.flatnonzero((jobs > 0) & (m.hours == makespan))[0])
        g, o = int(m.group[k]), int(m.offer[k])
        row = run.table.frame.iloc[o]
        lead = (
            f"shortest makespan within the ${objective.budget_usd} budget: {head}, {figures}"
            f" (${to_cents(objective.budget_usd - total)} of the budget left); the makespan is set by group "
            f"{spec.groups[g].name!r} on {row['cloud']} {row['region']} {row['accelerator']} ({row['market']})"
        )
    else:
        lead = f"cheapest placement of {head}: {figures}"
        if isinstance(objective, SweepMinCost):
            scope = "all jobs together" if objective.joint else "each job"
            lead += (
                f", within the {objective.deadline_hours:g} h deadline at {objective.confidence:.0%} "
                f"confidence ({scope})"
            )
        free = float(
            sum(grp.count * float(np.min(grid.cost[g][grid.admissible[g]])) for g, grp in enumerate(spec.groups))
        )
        extra = float(total) / free - 1 if free > 0 else 0.0
        if spec.quotas:
            lead += (
                f"; the quotas add {extra:+.1%} over the quota-free cheapest (${free:,.2f})"
                if extra > 1e-9
                else "; the quotas cost nothing (the quota-free cheapest fits)"
            )
    full = [f"{u.quota.name} {u.gpus_used}/{u.quota.max_gpus} GPUs" for u in quota_use if u.full]
    quotas = f"; full quotas: {', '.join(full)}" if full else ""
    if outcome.status == "time_limit":
        how = f"stopped at the time limit, gap {outcome.mip_gap:.2%}"
    elif outcome.mip_gap > 0:
        how = f"within the requested gap: {outcome.mip_gap:.2%}"
    else:
        how = "optimal"
    return f"{lead}{quotas} ({how})"


def build_pair_model(
    spec: CollectionSpec,
    table: OfferTable,
    catalog: ThroughputCatalog,
    assumptions: Assumptions | None = None,
    *,
    prune: bool = True,
    catalogs: Mapping[Precision, ThroughputCatalog] | None = None,
) -> PairModel:
    """The (group, offer) pair arrays :func:`plan_collection` hands the solver (for benchmarks and
    inspection): evaluation, admissibility and exact pruning, without solving. Raises
    :class:`CollectionInfeasible` as :func:`plan_collection` does before any solve."""
    a = assumptions or Assumptions()
    if len(table) == 0:
        raise CollectionInfeasible("no offer is in effect at the planning time", binding="offers")
    grid = _evaluate_groups(spec, table, catalog, a, catalogs)
    _check_groups(spec, grid)
    return _pair_model(spec, grid, _quota_members(spec.quotas, table), prune)[0]


def plan_collection(
    spec: CollectionSpec,
    table: OfferTable,
    catalog: ThroughputCatalog,
    assumptions: Assumptions | None = None,
    *,
    options: SolverOptions | None = None,
    catalogs: Mapping[Precision, ThroughputCatalog] | None = None,
) -> CollectionPlan:
    """Place every job of ``spec`` on the offers of ``table`` under its objective and quotas.

    A group's throughputs come from the catalog of its jobs' precision (:func:`catalog_for_group`):
    ``catalogs[precision]``, else ``catalog`` for ``fp32`` jobs.

    Each group is evaluated once (:func:`costopt.planning.evaluate.evaluate`); the MILP is solved by
    the backend of ``options`` (see the module docstring). Raises :class:`CollectionInfeasible` naming
    what binds (``offers``, ``throughput``, ``deadline``, ``quota``, ``budget``), and
    :class:`CollectionSolverError` when the solver itself fails or the time limit stops it before any
    placement is found. Deterministic: the same inputs give the same plan.
    """
    a = assumptions or Assumptions()
    opts = options or SolverOptions()
    t0 = time.perf_counter()
    if len(table) == 0:
        raise CollectionInfeasible(
            "no offer is in effect at the planning time (check `costopt prices sources`)", binding="offers"
        )
    grid = _evaluate_groups(spec, table, catalog, a, catalogs)
    _check_groups(spec, grid)
    members = _quota_members(spec.quotas, table)
    model, admissible = _pair_model(spec, grid, members, opts.prune)
    run = _Run(spec, table, grid, model, opts)
    build_seconds = time.perf_counter() - t0
    objective = spec.objective
    if isinstance(objective, MinMakespanWithinBudget):
        outcome = _solve_makespan(run, objective)
    else:
        outcome = _solve_min_cost(run)
    assignments = _assignments(run, outcome.jobs)
    total = sum((ga.cost_usd for ga in assignments), Decimal(0))
    quota_use = _verify(run, outcome.jobs, total)
    makespan = run.makespan(outcome.jobs)
    used = outcome.jobs > 0
    max_q = None
    if grid.q_hours is not None:
        max_q = float(grid.q_hours[model.group[used], model.offer[used]].max())
    return CollectionPlan(
        spec=spec,
        assignments=assignments,
        total_expected_cost_usd=total,
        makespan_hours=makespan,
        max_hours_at_confidence=max_q,
        quota_use=quota_use,
        status=outcome.status,
        mip_gap=float(outcome.mip_gap),
        cost_gap=float(outcome.cost_gap),
        build_seconds=build_seconds,
        solve_seconds=run.solve_seconds,
        solves=run.solves,
        solver=run.backend.name,
        offers_considered=len(table),
        pairs_admissible=admissible,
        pairs_in_model=model.n_pairs,
        reason=_reason(run, outcome, total, makespan, quota_use),
    )
