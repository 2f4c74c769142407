"""Finish-time fairness (Themis-style) and minimum total duration (makespan).

Finish-time fairness minimizes ``max_m rho_m`` where
``rho_m = (e_m + R_m / tau_m) / (e_m + R_m / N_m)``: ``e_m`` seconds since arrival, ``R_m`` steps
remaining, ``tau_m`` effective throughput, ``N_m`` equal-share throughput (``rho = 1``: as good as an
isolated 1/n share). ``rho_m <= z`` is linear in the allocation for a fixed ``z``
(``tau_m >= R_m / (z D_m - e_m)``), so the minimum ``z`` is found by bisection over LPs, each
maximizing a common scale ``lambda`` of those throughput targets (``lambda >= 1``: ``z`` is feasible);
the achieved ``max rho`` of every solve tightens the upper end. A last LP maximizes total normalized
throughput at the optimal ``z`` (no GPU left idle that a job could use).

Minimum total duration maximizes ``lambda`` s.t. ``tau_m >= lambda R_m``: every job finishes by
``1 / lambda`` seconds at its current rate, which is the makespan of the remaining work. A second
stage keeps that makespan and maximizes total normalized throughput.

Both depend on per-job state (steps remaining, elapsed time), so they solve the per-job formulation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from costopt.gavel.errors import Infeasible
from costopt.gavel.formulation import base_constraints, columns_for, singleton_classes, throughput_matrix
from costopt.gavel.lp import IncrementalLP, Triplets, assemble, solve_lp
from costopt.gavel.policies.base import PARETO_SLACK, Policy, class_allocation, empty_allocation, space_sharing_note
from costopt.gavel.policies.fairness import normalizer
from costopt.gavel.state import Allocation, ClusterState, FloatArray

log = logging.getLogger(__name__)

FTF_TOLERANCE = 1e-3
"""Relative gap between the bisection's bounds on the optimal max rho at which it stops."""
MAX_BISECTIONS = 40


def _target_lp(
    a_base: Triplets, b_base: FloatArray, tn: Triplets, need: FloatArray, what: str
) -> tuple[float, FloatArray]:
    """Maximize lambda s.t. base rows and ``tn @ y >= lambda * need`` (rows of ``tn``)."""
    nb, v = a_base.n_rows, a_base.n_cols
    a = assemble([(0, 0, a_base), (nb, 0, -tn), (nb, v, Triplets.column(need))], nb + tn.n_rows, v + 1)
    c = np.zeros(v + 1)
    c[-1] = 1.0
    sol = solve_lp(c, a, -np.inf, np.concatenate([b_base, np.zeros(tn.n_rows)]), maximize=True, what=what)
    return float(sol.x[-1]), np.maximum(sol.x[:-1], 0.0)


def _pareto(a_base: Triplets, b_base: FloatArray, tn: Triplets, need: FloatArray, what: str) -> FloatArray | None:
    """Maximize total normalized throughput s.t. ``tn @ y >= need``; None if tolerance makes it fail."""
    nb, v = a_base.n_rows, a_base.n_cols
    a = assemble([(0, 0, a_base), (nb, 0, -tn)], nb + tn.n_rows, v)
    try:
        sol = solve_lp(tn.col_sums(), a, -np.inf, np.concatenate([b_base, -need]), maximize=True, what=what)
    except Infeasible:
        log.debug("%s: Pareto stage infeasible at solver tolerance; keeping the first stage", what)
        return None
    return np.maximum(sol.x, 0.0)


@dataclass(frozen=True, slots=True)
class FinishTimeFairness(Policy):
    """Minimize the largest finish-time fairness ratio rho (objective: that ratio; 1.0 = equal share).
    Weights are not used (as in Themis). Jobs with no steps remaining get nothing.

    Each bisection step is the same LP with new lower bounds on the jobs' throughputs (maximizing
    total normalized throughput, so the last feasible step is also the Pareto stage), re-solved
    from the previous basis."""

    name: str = "finish_time_fairness_perf"
    aware: bool = True

    def allocate(self, state: ClusterState) -> Allocation:
        notes = space_sharing_note(state, self.aware)
        if state.n_jobs == 0:
            return empty_allocation(self.name, state, notes)
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
        inf_up = np.full(act.size, np.inf)

        def need(z: float) -> FloatArray:
            out: FloatArray = (r_act / np.maximum(z * d - e_act, 1e-300)) / n_act
            return out

        model = IncrementalLP(
            tn.col_sums(),
            assemble([(0, 0, a_base), (n_base, 0, tn)], n_base + act.size, cols.n),
            np.concatenate([np.full(n_base, -np.inf), need(1.0)]),
            np.concatenate([b_base, inf_up]),
            maximize=True,
            what=f"{self.name}: rho bound",
        )

        def achieved(y: FloatArray) -> float:
            tau = tmat.dot(y)
            with np.errstate(divide="ignore"):
                return float(((e_act + np.where(tau > 0, r_act / tau, np.inf)) / d).max())

        lo = float((e_act / d).max())
        hi = 1.0
        sol = model.solve()
        solves = 1
        while sol is None and solves < MAX_BISECTIONS:  # the equal share may not fit (agnostic mixes)
            lo, hi = hi, hi * 2.0
            model.set_row_bounds(target_rows, need(hi), inf_up)
            sol = model.solve()
            solves += 1
        if sol is None:
            raise Infeasible(self.name, "no finite rho", "no allocation lets every job progress")
        best = np.maximum(sol.x, 0.0)
        hi = min(hi, achieved(best))
        while hi - lo > FTF_TOLERANCE * hi and solves < MAX_BISECTIONS:
            z = 0.5 * (lo + hi)
            model.set_row_bounds(target_rows, need(z), inf_up)
            sol = model.solve()
            solves += 1
            if sol is None:
                lo = z
            else:
                best = np.maximum(sol.x, 0.0)
                hi = min(z, achieved(best))
        return class_allocation(
            self.name,
            state,
            classes,
            cols,
            best,
            hi,
            {"max_rho": hi, "lower_bound_rho": lo, "lp_solves": solves},
            notes,
        )


@dataclass(frozen=True, slots=True)
class MinTotalDuration(Policy):
    """Minimize the time by which every job finishes its remaining steps at its allocated rate
    (objective: that makespan in seconds; inf if a job with steps left can run nowhere)."""

    name: str = "min_total_duration_perf"
    aware: bool = True
    pareto: bool = True

    def allocate(self, state: ClusterState) -> Allocation:
        notes = space_sharing_note(state, self.aware)
        if state.n_jobs == 0:
            return empty_allocation(self.name, state, notes)
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
        lam, y = _target_lp(a_base, b_base, tn, q / scale, f"{self.name}: makespan")
        if lam <= 0:
            raise Infeasible(self.name, "zero rate", "no allocation lets every job progress")
        makespan = scale / lam
        if self.pareto:  # a fresh solve beats re-solving the first stage's basis with a new objective
            y2 = _pareto(a_base, b_base, tn, (q / scale) * lam * (1 - PARETO_SLACK), f"{self.name}: Pareto stage")
            if y2 is not None:
                y = y2
        if len(act) < state.n_jobs and np.any((rem > 0) & (norm <= 0)):
            makespan = float("inf")
        return class_allocation(self.name, state, classes, cols, y, makespan, {"makespan_s": makespan}, notes)
