"""Finish-time fairness (Themis-style) and minimum total duration (makespan).

Finish-time fairness minimizes ``max_m rho_m`` where
``rho_m = (e_m + R_m / tau_m) / (e_m + R_m / N_m)``: ``e_m`` seconds since arrival, ``R_m`` steps
remaining, ``tau_m`` effective throughput, ``N_m`` equal-share throughput (``rho = 1``: as good as an
isolated 1/n share). ``rho_m <= z`` is linear in the allocation for a fixed ``z``
(``tau_m >= R_m / (z D_m - e_m)``), so the minimum ``z`` is found by bisection over LPs that maximize
total normalized throughput ``sum_m tau_m / N_m`` under those targets (the last feasible one is also
the Pareto stage: no GPU left idle that a job could use). The achieved ``max rho`` of every solve
tightens the upper end. The lower end starts at the best any job could do alone
(``max_m (e_m + R_m / T_m) / D_m``, ``T_m`` its best throughput), which is the optimum in most
states: the first LP is solved just above it and usually ends the search.

Minimum total duration maximizes ``lambda`` s.t. ``tau_m >= lambda R_m``: every job finishes by
``1 / lambda`` seconds at its current rate, which is the makespan of the remaining work. A second
stage keeps that makespan and maximizes total normalized throughput.

Both depend on per-job state (steps remaining, elapsed time), so they solve the per-job formulation:

* aware: laid out in job slots and kept between calls (:class:`~costopt.gavel.lp.SlotModels`). The
  simulator's next state differs by a job or two and by the targets, so a call sends only that and
  re-solves from the last basis. Rows are scaled by per-job constants (``share_tput`` of
  :class:`~costopt.gavel.formulation.SlotColumns`) so that they do not change when other jobs come
  and go.
* agnostic: one column per job (its time with its fixed type mix), on which the target and time rows
  are bounds. Whether a ``z`` (or ``lambda``) is feasible is then a closed-form check, and one LP with
  a row per type, solved from scratch, is the Pareto stage.
* ``reference=True``, and space sharing (pair columns): a fresh per-job LP for every step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from costopt.gavel.errors import Infeasible
from costopt.gavel.formulation import (
    Columns,
    SlotColumns,
    base_constraints,
    columns_for,
    singleton_classes,
    slot_columns,
    throughput_matrix,
)
from costopt.gavel.lp import KeptModel, Triplets, assemble, slot_models, solve_lp
from costopt.gavel.policies.base import (
    PARETO_SLACK,
    Policy,
    class_allocation,
    empty_allocation,
    job_allocation,
    space_sharing_note,
)
from costopt.gavel.policies.fairness import max_level_lp, max_total_lp, normalizer
from costopt.gavel.state import Allocation, ClusterState, FloatArray, IntArray

log = logging.getLogger(__name__)

FTF_TOLERANCE = 1e-3
"""Relative gap between the bisection's bounds on the optimal max rho at which it stops."""
MAX_BISECTIONS = 40

BoolArray = npt.NDArray[np.bool_]


def _min_max_rho(test: Callable[[float], float | None], lo: float, name: str) -> tuple[float, float, int]:
    """Bisection for the least ``z`` such that every job can reach ``rho <= z``.

    ``test(z)``: None if ``z`` is infeasible, else the max rho its solution achieves (``<= z``, which
    tightens the upper end); ``lo``: a lower bound. The first ``z`` is ``lo (1 + tol / 2)``; if that
    fails, ``1`` (the equal share), doubled while infeasible; then halving ``[lo, hi]`` until
    ``hi - lo <= FTF_TOLERANCE * hi``. Returns (``hi``, the bound achieved by the last feasible test;
    ``lo``; tests)."""
    hi = 1.0
    found = False
    tests = 0
    z = lo * (1.0 + FTF_TOLERANCE / 2)
    if z < hi:
        r = test(z)
        tests += 1
        if r is None:
            lo = z
        else:
            hi, found = min(z, r), True
    if not found:
        r = test(hi)
        tests += 1
        while r is None and tests < MAX_BISECTIONS:  # the equal share may not fit (agnostic mixes)
            lo, hi = hi, hi * 2.0
            r = test(hi)
            tests += 1
        if r is None:
            raise Infeasible(name, "no finite rho", "no allocation lets every job progress")
        hi = min(hi, r)
    while hi - lo > FTF_TOLERANCE * hi and tests < MAX_BISECTIONS:
        z = 0.5 * (lo + hi)
        r = test(z)
        tests += 1
        if r is None:
            lo = z
        else:
            hi = min(z, r)
    return hi, min(lo, hi), tests


def _equal_share(state: ClusterState, sc: SlotColumns) -> FloatArray:
    """Each job's equal-share throughput ``N_m``: ``share_tput`` times ``min(1, C / (n scale_factor))``."""
    total = float(state.capacity.sum())
    if total <= 0:
        return np.zeros(state.n_jobs)
    out: FloatArray = np.minimum(1.0, total / (state.n_jobs * state.scale_factor)) * sc.share_tput
    return out


def _pareto_weight(state: ClusterState) -> FloatArray:
    """Per job, ``share_tput / N_m`` up to a common factor (so ``tput * weight / share_tput`` is the
    normalized throughput ``tput / N_m`` up to that factor): 1 for one GPU jobs while there are more
    jobs than GPUs."""
    r = float(state.capacity.sum()) / max(state.n_jobs, 1)
    out: FloatArray = np.maximum(r, state.scale_factor) / max(r, 1.0)
    return out


@dataclass(frozen=True, slots=True, eq=False)
class _SlotLP:
    """The per-job LP in slot layout: rows ``time`` (one per slot, ``<= 1``), ``target`` (one per slot:
    ``tput / share_tput`` of its columns, bounded below for ``act`` jobs and free otherwise) and
    ``capacity`` (one per type); columns of jobs not in ``act`` and of types a job cannot run on are
    fixed at 0."""

    sc: SlotColumns
    act: BoolArray
    matrix: Triplets
    row_lower: FloatArray
    row_upper: FloatArray
    col_upper: FloatArray
    target_rows: IntArray  # rows of the act jobs, ascending
    order: IntArray  # act job rows in the order of target_rows

    @staticmethod
    def build(state: ClusterState, sc: SlotColumns, act: BoolArray, target_lower: FloatArray) -> _SlotLP:
        """``target_lower``: per job (read for ``act`` jobs), the lower bound of its target row."""
        s = sc.n_slots
        inv_share = np.divide(1.0, sc.share_tput, out=np.zeros(state.n_jobs), where=act)
        matrix = assemble(
            [(0, 0, sc.time_rows()), (s, 0, sc.throughput_rows(inv_share)), (2 * s, 0, sc.capacity_rows())],
            2 * s + state.n_types,
            sc.n,
        )
        act_rows = np.nonzero(act)[0]
        order = act_rows[np.argsort(sc.slot[act_rows])]
        lower = np.full(s, -np.inf)
        lower[sc.slot[act_rows]] = target_lower[act_rows]
        row_lower = np.concatenate([np.full(s, -np.inf), lower, np.full(state.n_types, -np.inf)])
        row_upper = np.concatenate([np.ones(s), np.full(s, np.inf), state.capacity])
        act_slot = np.zeros(s, dtype=bool)
        act_slot[sc.slot[act_rows]] = True
        col_upper = np.where(sc.usable & act_slot[:, None], np.inf, 0.0).ravel()
        return _SlotLP(sc, act, matrix, row_lower, row_upper, col_upper, s + sc.slot[order], order)

    def load_pareto(self, model: KeptModel, state: ClusterState) -> None:
        """Load into ``model`` maximizing total normalized throughput ``sum_m tau_m / N_m``."""
        w = np.divide(_pareto_weight(state), self.sc.share_tput, out=np.zeros(state.n_jobs), where=self.act)
        cost = (self.sc.tput * self.sc.per_slot(w)[:, None]).ravel()
        model.load(cost, self.matrix, self.row_lower, self.row_upper, None, self.col_upper, maximize=True)

    def set_targets(self, model: KeptModel, lower: FloatArray) -> None:
        """Lower bounds of the target rows of ``act`` jobs from ``lower`` (per job row)."""
        model.set_row_bounds(self.target_rows, lower[self.order], np.inf)


def _agnostic_pareto(
    state: ClusterState, sc: SlotColumns, act: BoolArray, lower: FloatArray, what: str
) -> FloatArray | None:
    """Agnostic Pareto stage: per job (``sc`` has one slot per job row, in order), the time ``y_m`` with
    its type mix that maximizes total normalized throughput s.t. ``lower_m <= y_m <= 1`` for ``act``
    jobs (0 for the others) and capacity. Solved from scratch: the optimum is degenerate (spare time
    can go to many jobs) and a warm start would keep giving it to the same ones. None if solver
    tolerance makes it infeasible."""
    idx = np.nonzero(act)[0]
    held = (sc.type_mix[idx, 0, :] * state.scale_factor[idx, None]).T  # GPUs of each type per unit
    r, c = np.nonzero(held)
    a = Triplets(r.astype(np.int64), c.astype(np.int64), held[r, c], state.n_types, idx.size)
    try:
        sol = solve_lp(
            _pareto_weight(state)[idx],  # tput / N_m up to a common factor: tput = share_tput here
            a,
            -np.inf,
            state.capacity,
            lower[idx],
            1.0,
            maximize=True,
            what=what,
            warm=False,
        )
    except Infeasible:
        log.debug("%s: infeasible at solver tolerance", what)
        return None
    y = np.zeros(state.n_jobs)
    y[idx] = np.maximum(sol.x, 0.0)
    return y


def _agnostic_columns(state: ClusterState) -> tuple[SlotColumns, FloatArray]:
    """One mixed column per job (slot = job row) and each job's GPUs of each type per unit of it."""
    sc = slot_columns(state, np.arange(state.n_jobs, dtype=np.int64), state.n_jobs, aware=False)
    return sc, sc.type_mix[:, 0, :] * state.scale_factor[:, None].astype(np.float64)


def _best_alone(cols: Columns, n: int) -> FloatArray:
    """Per class of singleton classes: the largest steps/s it gets per unit of one of its columns."""
    out = np.zeros(n)
    np.maximum.at(out, cols.a, cols.tput_a)
    pair = cols.b >= 0
    np.maximum.at(out, cols.b[pair], cols.tput_b[pair])
    return out


@dataclass(frozen=True, slots=True)
class FinishTimeFairness(Policy):
    """Minimize the largest finish-time fairness ratio rho (objective: that ratio; 1.0 = equal share).
    Weights are not used (as in Themis). Jobs with no steps remaining get nothing. ``stats``:
    ``max_rho``, ``lower_bound_rho`` (the optimum lies between them), ``lp_solves``.

    The allocation maximizes total normalized throughput s.t. every job's rho <= ``max_rho``.
    ``reference``: a fresh per-job LP for every bisection step (see the module)."""

    name: str = "finish_time_fairness_perf"
    aware: bool = True
    reference: bool = False

    def allocate(self, state: ClusterState) -> Allocation:
        notes = space_sharing_note(state, self.aware)
        if state.n_jobs == 0:
            return empty_allocation(self.name, state, notes)
        if self.reference or (state.space_sharing and self.aware):
            return self._allocate_fresh(state, notes)
        if self.aware:
            return self._allocate_kept(state, notes)
        return self._allocate_agnostic(state, notes)

    def _allocate_fresh(self, state: ClusterState, notes: tuple[str, ...]) -> Allocation:
        classes = singleton_classes(state.n_jobs)
        cols = columns_for(state, classes, aware=self.aware)
        norm = normalizer(state, classes, cols, aware=self.aware)
        rem, el = state.steps_remaining, state.elapsed_s
        act = np.nonzero((rem > 0) & (norm > 0))[0]
        if act.size == 0 or cols.n == 0:
            return empty_allocation(self.name, state, notes)
        a_base, b_base = base_constraints(cols, classes, state.capacity)
        n_act, r_act, e_act = norm[act], rem[act], el[act]
        tmat = throughput_matrix(cols, classes.n).take_rows(act)
        tn = tmat.scaled_rows(1.0 / n_act)
        d = e_act + r_act / n_act  # finish time under the equal share (relative to arrival)
        n_base = a_base.n_rows
        target_rows = np.arange(n_base, n_base + act.size)

        def need(z: float) -> FloatArray:
            out: FloatArray = (r_act / np.maximum(z * d - e_act, 1e-300)) / n_act
            return out

        model = KeptModel(f"{self.name}: rho bound")
        model.load(
            tn.col_sums(),
            assemble([(0, 0, a_base), (n_base, 0, tn)], n_base + act.size, cols.n),
            np.concatenate([np.full(n_base, -np.inf), need(1.0)]),
            np.concatenate([b_base, np.full(act.size, np.inf)]),
            maximize=True,
        )
        best = np.zeros(cols.n)

        def solve(z: float) -> float | None:
            nonlocal best
            model.set_row_bounds(target_rows, need(z), np.inf)
            sol = model.solve()
            if sol is None:
                return None
            best = np.maximum(sol.x, 0.0)
            tau = tmat.dot(best)
            with np.errstate(divide="ignore"):
                return float(((e_act + np.where(tau > 0, r_act / tau, np.inf)) / d).max())

        best_alone = _best_alone(cols, classes.n)[act]
        hi, lo, solves = _min_max_rho(solve, float(((e_act + r_act / best_alone) / d).max()), self.name)
        stats = {"max_rho": hi, "lower_bound_rho": lo, "lp_solves": float(solves)}
        return class_allocation(self.name, state, classes, cols, best, hi, stats, notes)

    def _allocate_kept(self, state: ClusterState, notes: tuple[str, ...]) -> Allocation:
        models = slot_models(self.name)
        sc = slot_columns(state, models.assign(state.job_ids, state.now_s), models.n_slots, aware=True)
        norm = _equal_share(state, sc)
        rem, el = state.steps_remaining, state.elapsed_s
        act = (rem > 0) & (norm > 0)
        if not act.any():
            return empty_allocation(self.name, state, notes)
        d = el + rem / np.where(act, norm, 1.0)  # finish time under the equal share (relative to arrival)
        r_share = rem / np.where(act, sc.share_tput, 1.0)

        def target(z: float) -> FloatArray:
            """Per job: the lower bound of its target row (``tau / share_tput``) for ``rho <= z``."""
            out: FloatArray = r_share / np.maximum(z * d - el, 1e-300)
            return out

        lp = _SlotLP.build(state, sc, act, target(1.0))
        model = models.model("rho bound")
        lp.load_pareto(model, state)
        r_act, e_act, d_act = rem[act], el[act], d[act]
        best = np.zeros(sc.n)

        def solve(z: float) -> float | None:
            nonlocal best
            lp.set_targets(model, target(z))
            sol = model.solve()
            if sol is None:
                return None
            best = np.maximum(sol.x, 0.0)
            tau = sc.throughput(best)[act]
            with np.errstate(divide="ignore"):
                return float(((e_act + np.where(tau > 0, r_act / tau, np.inf)) / d_act).max())

        lo = float(((e_act + r_act / sc.best_throughput()[act]) / d_act).max())
        hi, lo, solves = _min_max_rho(solve, lo, self.name)
        stats = {"max_rho": hi, "lower_bound_rho": lo, "lp_solves": float(solves)}
        return job_allocation(self.name, state, sc.fractions(best), hi, stats, notes)

    def _allocate_agnostic(self, state: ClusterState, notes: tuple[str, ...]) -> Allocation:
        sc, gpus = _agnostic_columns(state)
        norm = _equal_share(state, sc)
        rem, el = state.steps_remaining, state.elapsed_s
        act = (rem > 0) & (norm > 0)
        if not act.any():
            return empty_allocation(self.name, state, notes)
        d = el + rem / np.where(act, norm, 1.0)
        r_share = rem / np.where(act, sc.share_tput, 1.0)
        r_act, e_act, d_act, gpus_act = rem[act], el[act], d[act], gpus[act]
        cap = state.capacity * (1 + 1e-9)

        def least(z: float) -> FloatArray:
            """Per job: the least time with its type mix for ``rho <= z``."""
            out: FloatArray = r_share / np.maximum(z * d - el, 1e-300)
            return out

        def fits(z: float) -> float | None:
            y = least(z)[act]
            return z if y.max() <= 1.0 and bool(np.all(y @ gpus_act <= cap)) else None

        hi, lo, _ = _min_max_rho(fits, float(((e_act + r_act / sc.share_tput[act]) / d_act).max()), self.name)
        y = _agnostic_pareto(state, sc, act, least(hi), f"{self.name}: Pareto stage")
        if y is None:
            return self._allocate_fresh(state, notes)
        tau = sc.share_tput[act] * y[act]
        with np.errstate(divide="ignore"):
            hi = min(hi, float(((e_act + np.where(tau > 0, r_act / tau, np.inf)) / d_act).max()))
        stats = {"max_rho": hi, "lower_bound_rho": min(lo, hi), "lp_solves": 1.0}
        return job_allocation(self.name, state, sc.fractions(y), hi, stats, notes)


@dataclass(frozen=True, slots=True)
class MinTotalDuration(Policy):
    """Minimize the time by which every job finishes its remaining steps at its allocated rate
    (objective: that makespan in seconds; inf if a job with steps left can run nowhere).
    ``reference`` as in :class:`FinishTimeFairness`."""

    name: str = "min_total_duration_perf"
    aware: bool = True
    pareto: bool = True
    reference: bool = False

    def allocate(self, state: ClusterState) -> Allocation:
        notes = space_sharing_note(state, self.aware)
        if state.n_jobs == 0:
            return empty_allocation(self.name, state, notes)
        if self.reference or (state.space_sharing and self.aware):
            return self._allocate_fresh(state, notes)
        if self.aware:
            models = slot_models(self.name)
            sc = slot_columns(state, models.assign(state.job_ids, state.now_s), models.n_slots, aware=True)
        else:
            sc, gpus = _agnostic_columns(state)
        norm = _equal_share(state, sc)
        rem = state.steps_remaining
        stuck = (rem > 0) & (norm <= 0)
        if stuck.any():
            notes = (*notes, "some jobs with steps left can run on no worker type; makespan is infinite")
        act = (rem > 0) & (norm > 0)
        if not act.any():
            return empty_allocation(self.name, state, notes)
        scale = float((rem[act] / norm[act]).max())  # seconds of equal-share time the longest job needs
        # tau_m >= lambda R_m / scale, divided by share_tput like the target rows
        need = np.divide(rem, scale * sc.share_tput, out=np.zeros(state.n_jobs), where=act)
        what = f"{self.name}: Pareto stage"
        if self.aware:
            lp = _SlotLP.build(state, sc, act, np.zeros(state.n_jobs))
            lam, y = self._makespan_lp(models.model("makespan"), lp, need)

            def pareto_stage(lower: FloatArray) -> FloatArray | None:
                model = models.model("Pareto stage")
                lp.load_pareto(model, state)
                lp.set_targets(model, lower)
                sol = model.solve()
                return None if sol is None else np.maximum(sol.x, 0.0)

        else:
            # need_m is job m's least time per unit of lambda: lambda stops at the first time (y_m <= 1)
            # or capacity limit.
            held = need @ gpus
            limits = np.divide(state.capacity, held, out=np.full(state.n_types, np.inf), where=held > 0)
            lam = float(min(1.0 / need.max(), limits.min()))
            y = lam * need

            def pareto_stage(lower: FloatArray) -> FloatArray | None:
                return _agnostic_pareto(state, sc, act, lower, what)

        if lam <= 0:
            raise Infeasible(self.name, "zero rate", "no allocation lets every job progress")
        if self.pareto:
            y2 = pareto_stage(need * lam * (1 - PARETO_SLACK))
            if y2 is None:
                log.debug("%s: infeasible at solver tolerance; keeping the first stage", what)
            else:
                y = y2
        makespan = float("inf") if stuck.any() else scale / lam
        return job_allocation(self.name, state, sc.fractions(y), makespan, {"makespan_s": makespan}, notes)

    @staticmethod
    def _makespan_lp(model: KeptModel, lp: _SlotLP, need: FloatArray) -> tuple[float, FloatArray]:
        """Maximize lambda s.t. the rows of ``lp`` with target rows ``>= lambda need`` (per job row)."""
        sc, s = lp.sc, lp.sc.n_slots
        lam_col = Triplets(
            np.arange(s, 2 * s, dtype=np.int64), np.zeros(s, dtype=np.int64), -sc.per_slot(need), lp.matrix.n_rows, 1
        )
        model.load(
            np.concatenate([np.zeros(sc.n), [1.0]]),
            assemble([(0, 0, lp.matrix), (0, sc.n, lam_col)], lp.matrix.n_rows, sc.n + 1),
            lp.row_lower,
            lp.row_upper,
            None,
            np.concatenate([lp.col_upper, [np.inf]]),
            maximize=True,
        )
        sol = model.solve()
        if sol is None:
            raise Infeasible(model.what, "Infeasible", model.dims)
        return float(sol.x[-1]), np.maximum(sol.x[:-1], 0.0)

    def _allocate_fresh(self, state: ClusterState, notes: tuple[str, ...]) -> Allocation:
        classes = singleton_classes(state.n_jobs)
        cols = columns_for(state, classes, aware=self.aware)
        norm = normalizer(state, classes, cols, aware=self.aware)
        rem = state.steps_remaining
        if np.any((rem > 0) & (norm <= 0)):
            notes = (*notes, "some jobs with steps left can run on no worker type; makespan is infinite")
        act = np.nonzero((rem > 0) & (norm > 0))[0]
        if act.size == 0 or cols.n == 0:
            return empty_allocation(self.name, state, notes)
        a_base, b_base = base_constraints(cols, classes, state.capacity)
        tn = throughput_matrix(cols, classes.n).take_rows(act).scaled_rows(1.0 / norm[act])
        q = rem[act] / norm[act]  # seconds of equal-share time each job needs
        scale = float(q.max())
        lam, y = max_level_lp(a_base, b_base, tn, q / scale, f"{self.name}: makespan")
        if lam <= 0:
            raise Infeasible(self.name, "zero rate", "no allocation lets every job progress")
        makespan = scale / lam
        if self.pareto:  # a fresh solve beats re-solving the first stage's basis with a new objective
            what = f"{self.name}: Pareto stage"
            try:
                y = max_total_lp(a_base, b_base, tn, (q / scale) * lam * (1 - PARETO_SLACK), what)
            except Infeasible:
                log.debug("%s: Pareto stage infeasible at solver tolerance; keeping the first stage", what)
        if len(act) < state.n_jobs and np.any((rem > 0) & (norm <= 0)):
            makespan = float("inf")
        return class_allocation(self.name, state, classes, cols, y, makespan, {"makespan_s": makespan}, notes)
