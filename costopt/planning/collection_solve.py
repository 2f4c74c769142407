"""The collection planner's mixed-integer programs, stated twice on the same pair arrays.

A *pair* ``k`` is an admissible (job group, offer) combination; ``n[k]`` (integer, ``0 <= n[k] <= ub[k]``)
is how many jobs of the group run on the offer. Every model shares the rows

- ``sum_{k in g} n[k] = count_g`` for every group ``g`` (every job placed), and
- ``sum_k gpus[k] * n[k] * [offer of k in quota q] <= max_gpus_q`` for every quota ``q``,

and differs by objective (see the methods of :class:`MatrixBackend`). A pair is switched off by
giving it ``ub[k] = 0``, so one built model serves every probe of a bisection.

:class:`MatrixBackend` builds the constraint matrices directly as scipy sparse arrays (vectorized:
no Python loop per variable or per term) and solves with ``scipy.optimize.milp`` (HiGHS).
:class:`PulpBackend` states the same models in pulp, constraint by constraint, readable, solved by
``pulp.HiGHS`` (highspy). Building pulp expressions costs Python objects per term, so it is meant for
small models and for cross-checking the matrix form in tests (``bench/plan_collection_bench.py``
measures both).

Units: cost in USD per job (float inside the solver), hours, GPUs. Solver statuses are mapped to
:data:`Status`; anything else raises :class:`CollectionSolverError` (never an assert).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, Protocol

import highspy
import numpy as np
import numpy.typing as npt
import pulp
import scipy.sparse as sp
from scipy.optimize import Bounds, LinearConstraint, milp

from costopt.errors import CostoptError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

Status = Literal["optimal", "time_limit", "infeasible", "no_solution"]
"""``optimal``: solved to the requested relative gap; ``time_limit``: stopped by the time limit with a
feasible solution; ``infeasible``: proven infeasible; ``no_solution``: stopped before finding one."""

INTEGRALITY_TOLERANCE = 1e-4
"""A solver value farther than this from an integer is a solver failure, not a rounding matter."""


class CollectionSolverError(CostoptError):
    """The MILP solver failed in a way that says nothing about the collection (error status, an
    unbounded model, a non-integral solution). The message carries the solver's own words."""


@dataclass(frozen=True, eq=False)
class PairModel:
    """The admissible (group, offer) pairs of a collection, column-wise.

    ``group``, ``offer``: int64 arrays of length K (pairs sorted by group, then offer row).
    ``cost``: expected USD per job; ``hours``: expected hours per job; ``gpus``: GPUs one job holds,
    counted against quotas (int64). ``counts``: jobs per group (G,). ``quota_rows``: (Q x K) sparse,
    entry ``gpus[k]`` where pair ``k``'s offer falls in quota ``q``; ``quota_max``: (Q,) GPUs.
    """

    group: IntArray
    offer: IntArray
    cost: FloatArray
    hours: FloatArray
    gpus: IntArray
    counts: IntArray
    quota_rows: sp.csr_array
    quota_max: IntArray

    @property
    def n_pairs(self) -> int:
        return len(self.group)

    @property
    def n_groups(self) -> int:
        return len(self.counts)

    @property
    def n_quotas(self) -> int:
        return len(self.quota_max)

    def full_bounds(self) -> FloatArray:
        """Upper bound of every pair when all are allowed: its group's job count."""
        return self.counts[self.group].astype(np.float64)


@dataclass(frozen=True, eq=False)
class SolveResult:
    """One MILP solve. ``jobs``: integer jobs per pair (None without a solution); ``objective``: the
    solver's objective (USD, hours or GPUs of excess by model; NaN without a solution); ``gap``: the
    relative MIP gap reached (0 when proven optimal, inf without a solution); ``slack``: GPUs over
    each quota (elastic model only)."""

    status: Status
    jobs: IntArray | None
    objective: float
    gap: float
    seconds: float
    slack: FloatArray | None = None

    @property
    def has_solution(self) -> bool:
        return self.jobs is not None


class Backend(Protocol):
    """What the planner asks of a formulation. ``ub``: per-pair upper bounds (0 switches a pair off);
    ``budget``: a cap on total expected cost (USD) or None; ``time_limit``: seconds or None."""

    name: str

    def min_cost(self, ub: FloatArray, budget: float | None, time_limit: float | None) -> SolveResult:
        """Minimize total expected cost (USD) over the rows, optionally under the budget."""
        ...

    def min_makespan(self, ub: FloatArray, budget: float | None, time_limit: float | None) -> SolveResult:
        """Minimize ``T`` with ``T >= hours[k]`` for every used pair (binary ``y[k]``, ``n[k] <= ub[k] y[k]``)."""
        ...

    def min_quota_excess(self, ub: FloatArray, time_limit: float | None) -> SolveResult:
        """The elastic model: slack ``s_q >= 0`` GPUs added to each quota, minimize ``sum_q s_q``."""
        ...


def _round_jobs(x: FloatArray, n_pairs: int) -> IntArray:
    jobs = np.rint(x[:n_pairs])
    worst = float(np.max(np.abs(x[:n_pairs] - jobs))) if n_pairs else 0.0
    if worst > INTEGRALITY_TOLERANCE:
        raise CollectionSolverError(f"the solver returned a non-integral job count (off by {worst:g})")
    out: IntArray = np.maximum(jobs, 0).astype(np.int64)
    return out


def _options(time_limit: float | None, mip_rel_gap: float) -> dict[str, float | bool]:
    opts: dict[str, float | bool] = {"disp": False, "presolve": True, "mip_rel_gap": mip_rel_gap}
    if time_limit is not None:
        opts["time_limit"] = max(float(time_limit), 0.01)
    return opts


class MatrixBackend:
    """The models as scipy sparse matrices, solved by ``scipy.optimize.milp`` (HiGHS).

    The assignment and quota blocks are built once (``O(K)`` vectorized work); each solve stacks
    the extra columns/rows its model needs.
    """

    name = "scipy-milp-highs"

    def __init__(self, model: PairModel, *, mip_rel_gap: float = 0.0) -> None:
        self.model = model
        self.mip_rel_gap = mip_rel_gap
        k, g = model.n_pairs, model.n_groups
        cols = np.arange(k)
        self.assign = sp.csr_array((np.ones(k), (model.group, cols)), shape=(g, k))
        self.counts = model.counts.astype(np.float64)
        self.quota = model.quota_rows
        self.quota_max = model.quota_max.astype(np.float64)
        self.cost_row = sp.csr_array(model.cost.reshape(1, -1))

    def _solve(
        self,
        c: FloatArray,
        integrality: FloatArray,
        lb: FloatArray,
        ub: FloatArray,
        constraints: list[LinearConstraint],
        time_limit: float | None,
        n_pairs: int,
    ) -> tuple[SolveResult, FloatArray | None]:
        start = time.perf_counter()
        res = milp(
            c,
            integrality=integrality,
            bounds=Bounds(lb, ub),
            constraints=constraints,
            options=_options(time_limit, self.mip_rel_gap),
        )
        seconds = time.perf_counter() - start
        status_code = int(res.status)
        x = None if res.x is None else np.asarray(res.x, dtype=np.float64)
        if status_code == 2:
            return SolveResult("infeasible", None, float("nan"), float("inf"), seconds), None
        if status_code not in (0, 1):
            raise CollectionSolverError(f"HiGHS (scipy.optimize.milp) failed: {res.message}")
        if x is None:
            return SolveResult("no_solution", None, float("nan"), float("inf"), seconds), None
        status: Status = "optimal" if status_code == 0 else "time_limit"
        gap = float(res.mip_gap) if res.mip_gap is not None else 0.0
        jobs = _round_jobs(x, n_pairs)
        return SolveResult(status, jobs, float(res.fun), max(gap, 0.0), seconds), x

    def _rows(self, extra_cols: int, budget: float | None) -> list[LinearConstraint]:
        """Assignment, quota and budget rows, padded with ``extra_cols`` zero columns on the right."""

        def pad(block: sp.csr_array) -> sp.csr_array:
            if extra_cols == 0:
                return block
            return sp.hstack([block, sp.csr_array((block.shape[0], extra_cols))], format="csr")

        rows = [LinearConstraint(pad(self.assign), self.counts, self.counts)]
        if self.model.n_quotas:
            rows.append(LinearConstraint(pad(self.quota), -np.inf, self.quota_max))
        if budget is not None:
            rows.append(LinearConstraint(pad(self.cost_row), -np.inf, budget))
        return rows

    def min_cost(self, ub: FloatArray, budget: float | None, time_limit: float | None) -> SolveResult:
        k = self.model.n_pairs
        result, _ = self._solve(
            self.model.cost, np.ones(k), np.zeros(k), ub, self._rows(0, budget), time_limit, k
        )
        return result

    def min_makespan(self, ub: FloatArray, budget: float | None, time_limit: float | None) -> SolveResult:
        """Variables ``[n (K), y (K), T]``: rows ``n - ub*y <= 0`` and ``hours*y - T <= 0`` on top of
        the shared ones; objective ``T`` (hours)."""
        m, k = self.model, self.model.n_pairs
        eye = sp.eye_array(k, format="csr")
        link = sp.hstack([eye, sp.diags_array(-ub).tocsr(), sp.csr_array((k, 1))], format="csr")
        timing = sp.hstack([sp.csr_array((k, k)), sp.diags_array(m.hours).tocsr(), -np.ones((k, 1))], format="csr")
        rows = self._rows(k + 1, budget)
        rows.append(LinearConstraint(link, -np.inf, 0.0))
        rows.append(LinearConstraint(timing, -np.inf, 0.0))
        c = np.zeros(2 * k + 1)
        c[-1] = 1.0
        integrality = np.concatenate([np.ones(2 * k), [0.0]])
        lb = np.zeros(2 * k + 1)
        hi = np.concatenate([ub, (ub > 0).astype(np.float64), [np.inf]])
        result, _ = self._solve(c, integrality, lb, hi, rows, time_limit, k)
        return result

    def min_quota_excess(self, ub: FloatArray, time_limit: float | None) -> SolveResult:
        m, k, q = self.model, self.model.n_pairs, self.model.n_quotas
        assign = sp.hstack([self.assign, sp.csr_array((m.n_groups, q))], format="csr")
        quota = sp.hstack([self.quota, -sp.eye_array(q, format="csr")], format="csr")
        rows = [
            LinearConstraint(assign, self.counts, self.counts),
            LinearConstraint(quota, -np.inf, self.quota_max),
        ]
        c = np.concatenate([np.zeros(k), np.ones(q)])
        integrality = np.concatenate([np.ones(k), np.zeros(q)])
        hi = np.concatenate([ub, np.full(q, np.inf)])
        result, x = self._solve(c, integrality, np.zeros(k + q), hi, rows, time_limit, k)
        if x is None:
            return result
        return SolveResult(result.status, result.jobs, result.objective, result.gap, result.seconds, x[k:])


_HIGHS_TIME_LIMITED = {
    highspy.HighsModelStatus.kTimeLimit,
    highspy.HighsModelStatus.kIterationLimit,
    highspy.HighsModelStatus.kInterrupt,
    highspy.HighsModelStatus.kSolutionLimit,
}
_HIGHS_INFEASIBLE = {highspy.HighsModelStatus.kInfeasible, highspy.HighsModelStatus.kUnboundedOrInfeasible}


class PulpBackend:
    """The same models in pulp, one readable constraint per group and per quota; HiGHS via highspy.

    ``pulp.HiGHS`` reports a time-limited run as "Optimal", so the status is read from the highspy
    model itself (``problem.solverModel``).
    """

    name = "pulp-highs"

    def __init__(self, model: PairModel, *, mip_rel_gap: float = 0.0) -> None:
        self.model = model
        self.mip_rel_gap = mip_rel_gap
        m = model
        self.pairs_of_group: list[list[int]] = [[] for _ in range(m.n_groups)]
        for k, g in enumerate(m.group.tolist()):
            self.pairs_of_group[g].append(k)
        quota = m.quota_rows.tocsr()
        self.pairs_in_quota: list[list[tuple[int, float]]] = [
            list(
                zip(
                    quota.indices[quota.indptr[q] : quota.indptr[q + 1]].tolist(),
                    quota.data[quota.indptr[q] : quota.indptr[q + 1]].tolist(),
                    strict=True,
                )
            )
            for q in range(m.n_quotas)
        ]

    def _jobs_problem(self, name: str, ub: FloatArray) -> tuple[pulp.LpProblem, list[pulp.LpVariable]]:
        """A problem with the job variables and the shared rows (every job placed; quotas)."""
        m = self.model
        problem = pulp.LpProblem(name, pulp.LpMinimize)
        n = [
            pulp.LpVariable(f"jobs_g{g}_o{o}", lowBound=0, upBound=float(u), cat=pulp.LpInteger)
            for g, o, u in zip(m.group.tolist(), m.offer.tolist(), ub.tolist(), strict=True)
        ]
        for g, pairs in enumerate(self.pairs_of_group):
            problem += pulp.lpSum(n[k] for k in pairs) == int(m.counts[g]), f"place_all_jobs_of_group_{g}"
        for q, terms in enumerate(self.pairs_in_quota):
            problem += pulp.lpSum(gpus * n[k] for k, gpus in terms) <= int(m.quota_max[q]), f"quota_{q}"
        return problem, n

    def _total_cost(self, n: list[pulp.LpVariable]) -> pulp.LpAffineExpression:
        return pulp.lpSum(float(c) * v for c, v in zip(self.model.cost.tolist(), n, strict=True))

    def _run(
        self, problem: pulp.LpProblem, n: list[pulp.LpVariable], time_limit: float | None
    ) -> tuple[SolveResult, pulp.LpProblem]:
        start = time.perf_counter()
        solver = pulp.HiGHS(
            msg=False,
            gapRel=self.mip_rel_gap,
            timeLimit=None if time_limit is None else max(float(time_limit), 0.01),
        )
        problem.solve(solver)
        seconds = time.perf_counter() - start
        highs = problem.solverModel
        status = highs.getModelStatus()
        if status in _HIGHS_INFEASIBLE:
            return SolveResult("infeasible", None, float("nan"), float("inf"), seconds), problem
        found = problem.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
        if status in _HIGHS_TIME_LIMITED and not found:
            return SolveResult("no_solution", None, float("nan"), float("inf"), seconds), problem
        if status != highspy.HighsModelStatus.kOptimal and status not in _HIGHS_TIME_LIMITED:
            raise CollectionSolverError(f"HiGHS (pulp) failed: {highs.modelStatusToString(status)}")
        x = np.array([v.varValue or 0.0 for v in n], dtype=np.float64)
        gap = float(highs.getInfo().mip_gap)
        result_status: Status = "optimal" if status == highspy.HighsModelStatus.kOptimal else "time_limit"
        objective = float(pulp.value(problem.objective))
        gap = 0.0 if not np.isfinite(gap) or gap < 0 else gap
        return SolveResult(result_status, _round_jobs(x, len(n)), objective, gap, seconds), problem

    def min_cost(self, ub: FloatArray, budget: float | None, time_limit: float | None) -> SolveResult:
        problem, n = self._jobs_problem("collection_min_cost", ub)
        total = self._total_cost(n)
        problem += total
        if budget is not None:
            problem += total <= budget, "budget"
        return self._run(problem, n, time_limit)[0]

    def min_makespan(self, ub: FloatArray, budget: float | None, time_limit: float | None) -> SolveResult:
        problem, n = self._jobs_problem("collection_min_makespan", ub)
        makespan = pulp.LpVariable("makespan_hours", lowBound=0)
        problem += makespan
        for k, (jobs, hours, cap) in enumerate(zip(n, self.model.hours.tolist(), ub.tolist(), strict=True)):
            used = pulp.LpVariable(f"used_{k}", cat=pulp.LpBinary)
            problem += jobs <= float(cap) * used, f"jobs_only_on_used_pair_{k}"
            problem += makespan >= float(hours) * used, f"makespan_covers_pair_{k}"
        if budget is not None:
            problem += self._total_cost(n) <= budget, "budget"
        return self._run(problem, n, time_limit)[0]

    def min_quota_excess(self, ub: FloatArray, time_limit: float | None) -> SolveResult:
        m = self.model
        problem = pulp.LpProblem("collection_quota_excess", pulp.LpMinimize)
        n = [
            pulp.LpVariable(f"jobs_g{g}_o{o}", lowBound=0, upBound=float(u), cat=pulp.LpInteger)
            for g, o, u in zip(m.group.tolist(), m.offer.tolist(), ub.tolist(), strict=True)
        ]
        excess = [pulp.LpVariable(f"excess_gpus_quota_{q}", lowBound=0) for q in range(m.n_quotas)]
        problem += pulp.lpSum(excess)
        for g, pairs in enumerate(self.pairs_of_group):
            problem += pulp.lpSum(n[k] for k in pairs) == int(m.counts[g]), f"place_all_jobs_of_group_{g}"
        for q, terms in enumerate(self.pairs_in_quota):
            problem += (
                pulp.lpSum(gpus * n[k] for k, gpus in terms) <= int(m.quota_max[q]) + excess[q],
                f"elastic_quota_{q}",
            )
        result, _ = self._run(problem, n, time_limit)
        if not result.has_solution:
            return result
        slack = np.array([v.varValue or 0.0 for v in excess], dtype=np.float64)
        return SolveResult(result.status, result.jobs, result.objective, result.gap, result.seconds, slack)
