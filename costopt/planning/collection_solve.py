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

import os
import sys
import threading
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
from costopt.highs import HIGHS_THREADS, configure

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

Status = Literal["optimal", "time_limit", "infeasible", "no_solution"]
"""``optimal``: solved to the requested relative gap; ``time_limit``: stopped by the time limit with a
feasible solution; ``infeasible``: proven infeasible; ``no_solution``: stopped before finding one."""

ABSOLUTE_GAP = 1e-6
"""HiGHS's default ``mip_abs_gap`` (objective units: USD or hours): a solution this close to the
lower bound is proven optimal."""

GUIDED_MIN_PAIRS = 10_000
"""From this many (group, offer) pairs on, the planner uses the LP-guided min-cost solve by default.
Measured (bench/plan_collection_bench.py and random 30-200-job instances): 1,000 jobs, 19,918 pairs:
0.3 s guided vs 3-5 s whole MILP; 1,500-6,000 pairs: 0.5x-2x, both under a few seconds."""

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

    def min_cost(
        self, ub: FloatArray, budget: float | None, time_limit: float | None, *, first_feasible: bool = False
    ) -> SolveResult:
        """Minimize total expected cost (USD) over the rows, optionally under the budget;
        ``first_feasible``: any feasible placement will do (a yes/no decision)."""
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


def _relative_gap(value: float, lower: float) -> float:
    """``(value - lower) / |value|``; 0 within HiGHS's absolute gap (:data:`ABSOLUTE_GAP`)."""
    if not np.isfinite(lower):
        return float("inf")
    diff = max(value - lower, 0.0)
    return 0.0 if diff <= ABSOLUTE_GAP else diff / max(abs(value), 1e-12)


def _options(time_limit: float | None, mip_rel_gap: float) -> dict[str, float | bool]:
    opts: dict[str, float | bool] = {"disp": False, "presolve": True, "mip_rel_gap": mip_rel_gap}
    if time_limit is not None:
        opts["time_limit"] = max(float(time_limit), 0.01)
    return opts


_HIGHS_TIME_LIMITED = {
    highspy.HighsModelStatus.kTimeLimit,
    highspy.HighsModelStatus.kIterationLimit,
    highspy.HighsModelStatus.kInterrupt,
    highspy.HighsModelStatus.kSolutionLimit,
}
_HIGHS_INFEASIBLE = {highspy.HighsModelStatus.kInfeasible, highspy.HighsModelStatus.kUnboundedOrInfeasible}


_BANNER_LOCK = threading.Lock()
_banner_shown = False


def new_highs() -> highspy.Highs:
    """A silent ``highspy.Highs``. HiGHS prints its banner on stdout when the first instance of a
    process is made, before any option can turn output off; that would corrupt a CLI's JSON, so the
    first construction runs with file descriptor 1 pointed at /dev/null (once per process)."""
    global _banner_shown
    with _BANNER_LOCK:
        if not _banner_shown:
            sys.stdout.flush()
            try:
                saved = os.dup(1)
            except OSError:  # no stdout to protect
                saved = -1
            try:
                if saved >= 0:
                    with open(os.devnull, "w") as devnull:
                        os.dup2(devnull.fileno(), 1)
                highspy.Highs()  # type: ignore[no-untyped-call]
            finally:
                if saved >= 0:
                    os.dup2(saved, 1)
                    os.close(saved)
            _banner_shown = True
    h = highspy.Highs()  # type: ignore[no-untyped-call]
    return configure(h)  # type: ignore[no-any-return]


class MatrixBackend:
    """The models as scipy sparse matrices, solved by HiGHS (``scipy.optimize.milp``; the LP relaxation
    through highspy, which keeps its basis between calls).

    The assignment and quota blocks are built once (``O(K)`` vectorized work, no Python loop per
    variable); each solve stacks the extra columns/rows its model needs.

    ``min_cost`` is **LP-guided** (``lp_guided=True``) and exact:

    1. The LP relaxation (simplex, warm-started from the previous call: bisection probes differ only
       in column bounds and the budget row) gives row duals ``y`` and reduced costs ``d = c - A^T y``.
       The Lagrangian bound ``L = y.b + sum_k min(d_k, 0) ub_k`` holds for *any* ``y`` with ``y <= 0``
       on ``<=`` rows (the duals are clipped so), so LP tolerances cannot make it wrong. An
       infeasible LP proves the MILP infeasible.
    2. For every feasible integer ``x``: ``c.x >= L + sum_k [d_k x_k if d_k > 0 else |d_k| (ub_k - x_k)]``.
       So a placement using a pair with ``|d_k| > w`` (or moving a ``d_k < -w`` pair off its upper
       bound) costs more than ``L + w``. The *core* of width ``w`` frees the pairs with ``|d_k| <= w``,
       holds the others at their LP-dual bound, and is solved as a small MILP (``milp``): its optimum
       ``U`` is globally optimal when ``U - L <= w``. The core starts at about the size of the LP's
       support (one pair per group, an eighth more, two per quota) and doubles (not proven, or
       infeasible); once it
       would pass half the pairs, the last core is exact: width ``U - L`` (every better placement),
       ``budget - L`` (every placement within the budget) or all pairs, where infeasibility is proven.
       So the worst case is about one whole-model solve plus geometrically smaller ones.

    Collections have nearly integral LP relaxations (1,000 jobs, 23 quotas: 6 fractional groups, the
    optimum $0.03 above ``L``), so the core holds a few pairs per group and solves in a fraction of a
    second, where handing HiGHS the whole MILP (``lp_guided=False``) spends seconds in its primal
    heuristics before the first incumbent.
    """

    name = "scipy-milp-highs"

    def __init__(self, model: PairModel, *, mip_rel_gap: float = 0.0, lp_guided: bool = True) -> None:
        self.model = model
        self.mip_rel_gap = mip_rel_gap
        self.lp_guided = lp_guided
        k, g = model.n_pairs, model.n_groups
        cols = np.arange(k)
        self.assign = sp.csr_array((np.ones(k), (model.group, cols)), shape=(g, k))
        self.assign_csc = self.assign.tocsc()
        self.counts = model.counts.astype(np.float64)
        self.quota = model.quota_rows
        self.quota_csc = model.quota_rows.tocsc()
        self.quota_max = model.quota_max.astype(np.float64)
        self.cost_row = sp.csr_array(model.cost.reshape(1, -1))
        self._all_cols = np.arange(k, dtype=np.int32)
        self._highs: highspy.Highs | None = None

    def _solve(
        self,
        c: FloatArray,
        integrality: FloatArray,
        lb: FloatArray,
        ub: FloatArray,
        constraints: list[LinearConstraint],
        time_limit: float | None,
        n_pairs: int,
        gap: float | None = None,
    ) -> tuple[SolveResult, FloatArray | None, float]:
        """Run ``milp``; (result, raw x, dual bound)."""
        start = time.perf_counter()
        res = milp(
            c,
            integrality=integrality,
            bounds=Bounds(lb, ub),
            constraints=constraints,
            options=_options(time_limit, self.mip_rel_gap if gap is None else gap),
        )
        seconds = time.perf_counter() - start
        status_code = int(res.status)
        x = None if res.x is None else np.asarray(res.x, dtype=np.float64)
        if status_code == 2:
            return SolveResult("infeasible", None, float("nan"), float("inf"), seconds), None, float("inf")
        if status_code not in (0, 1):
            raise CollectionSolverError(f"HiGHS (scipy.optimize.milp) failed: {res.message}")
        if x is None:
            return SolveResult("no_solution", None, float("nan"), float("inf"), seconds), None, float("-inf")
        status: Status = "optimal" if status_code == 0 else "time_limit"
        bound = float(res.mip_dual_bound) if res.mip_dual_bound is not None else float("-inf")
        reached = _relative_gap(float(res.fun), bound) if np.isfinite(bound) else float(res.mip_gap or 0.0)
        jobs = _round_jobs(x, n_pairs)
        return SolveResult(status, jobs, float(res.fun), max(reached, 0.0), seconds), x, bound

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

    def min_cost(
        self, ub: FloatArray, budget: float | None, time_limit: float | None, *, first_feasible: bool = False
    ) -> SolveResult:
        """Minimize total cost; ``first_feasible``: stop at any feasible placement (a decision)."""
        if not self.lp_guided:
            k = self.model.n_pairs
            gap = 1.0 if first_feasible else None
            rows = self._rows(0, budget)
            return self._solve(self.model.cost, np.ones(k), np.zeros(k), ub, rows, time_limit, k, gap)[0]
        return self._guided_min_cost(ub, budget, time_limit, first_feasible)

    def _relaxation(
        self, ub: FloatArray, budget: float | None, time_limit: float | None
    ) -> tuple[str, FloatArray, FloatArray]:
        """The LP relaxation of min cost, warm-started from the previous one (highspy keeps the
        model and its basis; only column bounds and the budget row change between calls).
        Returns (``optimal`` | ``infeasible`` | ``unknown``, duals of the assignment rows, duals of the
        quota rows then the budget row, clipped to <= 0)."""
        m = self.model
        h = self._highs
        if h is None:
            h = new_highs()
            stacked = sp.csc_array(sp.vstack([self.assign, self.quota, self.cost_row], format="csc"))
            lp = highspy.HighsLp()
            lp.num_col_ = m.n_pairs
            lp.num_row_ = stacked.shape[0]
            lp.col_cost_ = m.cost
            lp.col_lower_ = np.zeros(m.n_pairs)
            lp.col_upper_ = m.full_bounds()
            inf = highspy.kHighsInf
            lp.row_lower_ = np.concatenate([self.counts, np.full(m.n_quotas + 1, -inf)])
            lp.row_upper_ = np.concatenate([self.counts, self.quota_max, [inf]])
            lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
            lp.a_matrix_.start_ = stacked.indptr.astype(np.int32)
            lp.a_matrix_.index_ = stacked.indices.astype(np.int32)
            lp.a_matrix_.value_ = stacked.data.astype(np.float64)
            h.passModel(lp)
            h.setOptionValue("solver", "simplex")
            self._highs = h
        h.changeColsBounds(m.n_pairs, self._all_cols, np.zeros(m.n_pairs), ub)
        budget_row = m.n_groups + m.n_quotas
        h.changeRowBounds(budget_row, -highspy.kHighsInf, highspy.kHighsInf if budget is None else float(budget))
        h.setOptionValue("time_limit", highspy.kHighsInf if time_limit is None else max(float(time_limit), 0.01))
        h.run()
        status = h.getModelStatus()
        empty = np.zeros(0)
        if status in _HIGHS_INFEASIBLE:
            return "infeasible", empty, empty
        if status != highspy.HighsModelStatus.kOptimal:
            return "unknown", empty, empty
        row_dual = np.asarray(h.getSolution().row_dual, dtype=np.float64)
        return "optimal", row_dual[: m.n_groups], np.minimum(row_dual[m.n_groups :], 0.0)

    def _sub_min_cost(
        self,
        cols: IntArray,
        fixed: FloatArray,
        ub: FloatArray,
        budget: float | None,
        time_limit: float | None,
        gap: float,
    ) -> tuple[SolveResult, float]:
        """Min cost over the pairs ``cols`` with every other pair held at ``fixed``; (result over all
        pairs, dual bound of the total cost)."""
        m = self.model
        start = time.perf_counter()
        base_cost = float(m.cost @ fixed)
        rhs_eq = self.counts - self.assign @ fixed
        quota_left = self.quota_max - self.quota @ fixed if m.n_quotas else np.zeros(0)
        budget_left = None if budget is None else budget - base_cost
        if len(cols) == 0:
            ok = bool(np.all(np.abs(rhs_eq) < 1e-9) and np.all(quota_left > -1e-9))
            ok = ok and (budget_left is None or budget_left > -1e-9 * max(1.0, abs(budget or 0.0)))
            seconds = time.perf_counter() - start
            if not ok:
                return SolveResult("infeasible", None, float("nan"), float("inf"), seconds), float("inf")
            return SolveResult("optimal", _round_jobs(fixed, m.n_pairs), base_cost, 0.0, seconds), base_cost
        rows = [LinearConstraint(self.assign_csc[:, cols], rhs_eq, rhs_eq)]
        if m.n_quotas:
            rows.append(LinearConstraint(self.quota_csc[:, cols], -np.inf, quota_left))
        if budget_left is not None:
            rows.append(LinearConstraint(sp.csr_array(m.cost[cols].reshape(1, -1)), -np.inf, budget_left))
        n = len(cols)
        result, _, bound = self._solve(m.cost[cols], np.ones(n), np.zeros(n), ub[cols], rows, time_limit, n, gap)
        if result.jobs is None:
            return result, float("inf") if result.status == "infeasible" else float("-inf")
        full = fixed.copy()
        full[cols] = result.jobs
        jobs = _round_jobs(full, m.n_pairs)
        total = float(m.cost @ jobs)
        return SolveResult(result.status, jobs, total, result.gap, result.seconds), bound + base_cost

    def _guided_min_cost(
        self, ub: FloatArray, budget: float | None, time_limit: float | None, first_feasible: bool
    ) -> SolveResult:
        m = self.model
        start = time.perf_counter()

        def left() -> float | None:
            return None if time_limit is None else time_limit - (time.perf_counter() - start)

        def done(status: Status, jobs: IntArray | None, lower: float) -> SolveResult:
            seconds = time.perf_counter() - start
            if jobs is None:
                return SolveResult(status, None, float("nan"), float("inf"), seconds)
            value = float(m.cost @ jobs)
            return SolveResult(status, jobs, value, _relative_gap(value, lower), seconds)

        lp_status, y_eq, y_ub = self._relaxation(ub, budget, time_limit)
        if lp_status == "infeasible":
            return done("infeasible", None, float("inf"))
        if lp_status != "optimal":  # stopped early or odd: hand HiGHS the whole MILP
            rest = left()
            result = self._solve(
                m.cost,
                np.ones(m.n_pairs),
                np.zeros(m.n_pairs),
                ub,
                self._rows(0, budget),
                rest,
                m.n_pairs,
                1.0 if first_feasible else None,
            )[0]
            return SolveResult(result.status, result.jobs, result.objective, result.gap, time.perf_counter() - start)
        # (1) Lagrangian bound and reduced costs from the LP duals (y <= 0 on <= rows).
        reduced = m.cost - self.assign.T @ y_eq
        lower = float(y_eq @ self.counts)
        if m.n_quotas:
            reduced = reduced - self.quota.T @ y_ub[: m.n_quotas]
            lower += float(y_ub[: m.n_quotas] @ self.quota_max)
        if budget is not None:
            reduced = reduced - m.cost * y_ub[m.n_quotas]
            lower += float(y_ub[m.n_quotas] * budget)
        lower += float(np.minimum(reduced, 0.0) @ ub)
        # (2) The core: the ``size`` pairs of smallest |reduced cost| (width w) are free, the others
        # stay at the bound the LP dual says (0, or ub where d < 0). Every placement outside the core
        # costs more than lower + w, so a core optimum U with U - lower <= w is optimal. Otherwise
        # the core doubles; once it would pass half the pairs, the last step is exact: every pair
        # with |d| <= U - lower (every better placement), or <= budget - lower (every placement
        # within the budget), or all of them.
        usable = ub > 0
        magnitude = np.abs(reduced)
        ranked = np.sort(magnitude[usable])
        tol = 1e-7 * max(1.0, abs(lower))
        cap = float("inf") if budget is None else budget - lower
        size = m.n_groups + m.n_groups // 8 + 2 * m.n_quotas + 16  # about the LP's support, and a little

        target_gap = 1.0 if first_feasible else self.mip_rel_gap
        best: SolveResult | None = None
        best_lower = lower
        proven_infeasible = False
        while True:
            improve = float("inf") if best is None else best.objective - lower + tol
            if 2 * size >= len(ranked):
                width = min(cap, improve, float(ranked[-1]) if len(ranked) else 0.0)
                exact = True
            else:
                width = min(float(ranked[size - 1]), cap, improve)
                exact = width >= cap or width >= improve
            free = usable & (magnitude <= width + tol)
            fixed = np.where(usable & ~free & (reduced < 0), ub, 0.0)
            rest = left()
            if rest is not None and rest <= 0:
                break
            cols = np.flatnonzero(free).astype(np.int64)
            result, bound = self._sub_min_cost(cols, fixed, ub, budget, rest, target_gap)
            if result.jobs is not None:
                value = float(m.cost @ result.jobs)
                if best is None or value < best.objective:
                    best = result
                # A global bound: the core's own, or what any placement outside the core must cost.
                best_lower = max(best_lower, bound if exact else min(bound, lower + width + tol))
                if first_feasible or result.status != "optimal":
                    break
                if exact or value - lower <= width + tol:
                    return done("optimal", best.jobs, best_lower)
            elif result.status == "infeasible":
                if exact:
                    proven_infeasible = best is None
                    break
            else:  # the time limit stopped the core solve without a solution
                break
            size *= 2
        if best is None or best.jobs is None:
            return done("infeasible" if proven_infeasible else "no_solution", None, lower)
        exact_best = best.status == "optimal" and best_lower >= best.objective - tol
        status: Status = "optimal" if first_feasible or exact_best else "time_limit"
        return done(status, best.jobs, best_lower)

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
        return self._solve(c, integrality, lb, hi, rows, time_limit, k)[0]

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
        result, x, _ = self._solve(c, integrality, np.zeros(k + q), hi, rows, time_limit, k)
        if x is None:
            return result
        return SolveResult(result.status, result.jobs, result.objective, result.gap, result.seconds, x[k:])


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
            problem.add_variable(f"jobs_g{g}_o{o}", lowBound=0, upBound=float(u), cat=pulp.LpInteger)
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
        self, problem: pulp.LpProblem, n: list[pulp.LpVariable], time_limit: float | None, gap: float | None = None
    ) -> tuple[SolveResult, pulp.LpProblem]:
        new_highs()  # pulp.HiGHS makes its own highspy.Highs: keep the once-per-process banner off stdout
        start = time.perf_counter()
        solver = pulp.HiGHS(
            msg=False,
            threads=HIGHS_THREADS,  # one count per process: HiGHS's scheduler is global (costopt.highs)
            gapRel=self.mip_rel_gap if gap is None else gap,
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
        result_status: Status = "optimal" if status == highspy.HighsModelStatus.kOptimal else "time_limit"
        objective = float(pulp.value(problem.objective))
        bound = float(highs.getInfo().mip_dual_bound)
        gap = _relative_gap(objective, bound) if np.isfinite(bound) else 0.0
        return SolveResult(result_status, _round_jobs(x, len(n)), objective, gap, seconds), problem

    def min_cost(
        self, ub: FloatArray, budget: float | None, time_limit: float | None, *, first_feasible: bool = False
    ) -> SolveResult:
        problem, n = self._jobs_problem("collection_min_cost", ub)
        total = self._total_cost(n)
        problem += total
        if budget is not None:
            problem += total <= budget, "budget"
        return self._run(problem, n, time_limit, 1.0 if first_feasible else None)[0]

    def min_makespan(self, ub: FloatArray, budget: float | None, time_limit: float | None) -> SolveResult:
        problem, n = self._jobs_problem("collection_min_makespan", ub)
        makespan = problem.add_variable("makespan_hours", lowBound=0)
        problem += makespan
        for k, (jobs, hours, cap) in enumerate(zip(n, self.model.hours.tolist(), ub.tolist(), strict=True)):
            used = problem.add_variable(f"used_{k}", cat=pulp.LpBinary)
            problem += jobs <= float(cap) * used, f"jobs_only_on_used_pair_{k}"
            problem += makespan >= float(hours) * used, f"makespan_covers_pair_{k}"
        if budget is not None:
            problem += self._total_cost(n) <= budget, "budget"
        return self._run(problem, n, time_limit)[0]

    def min_quota_excess(self, ub: FloatArray, time_limit: float | None) -> SolveResult:
        m = self.model
        problem = pulp.LpProblem("collection_quota_excess", pulp.LpMinimize)
        n = [
            problem.add_variable(f"jobs_g{g}_o{o}", lowBound=0, upBound=float(u), cat=pulp.LpInteger)
            for g, o, u in zip(m.group.tolist(), m.offer.tolist(), ub.tolist(), strict=True)
        ]
        excess = [problem.add_variable(f"excess_gpus_quota_{q}", lowBound=0) for q in range(m.n_quotas)]
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
