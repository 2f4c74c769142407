"""Throughput and cost policies.

Throughputs of different models are not comparable in steps/s, so these policies count each job's
throughput as a fraction of its own best isolated throughput (``tau_m / max_j T_mj``, 1.0 = the job
running alone on its fastest type all the time).

* ``max_sum_throughput_perf``: maximize the sum of those fractions.
* ``max_sum_throughput_normalized_by_cost_perf``: maximize that sum per dollar, a linear-fractional
  program solved exactly by the Charnes-Cooper transformation; the ratio alone does not fix the
  scale (any multiple of an optimal allocation is optimal), so a second stage maximizes throughput
  among allocations at the optimal ratio. Prices are USD per GPU-hour; they must be > 0.
* ``..._SLOs``: every job with a finite SLO must reach ``steps_remaining / (deadline - now)`` steps/s
  (deadline = arrival + SLO). When no allocation meets them all (or a deadline has passed), the LP is
  re-solved without SLO constraints and the allocation says so (``notes``, ``stats['slo_relaxed']``).
  Its per-job LPs are laid out in job slots and kept between calls, as those of
  :mod:`~costopt.gavel.policies.finish_time`; without SLO rows the best ratio is that of the best
  single column, so only the second stage is solved.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from costopt.gavel.errors import Infeasible, InvalidState
from costopt.gavel.formulation import (
    Classes,
    Columns,
    SlotColumns,
    base_constraints,
    columns_for,
    interchangeable_classes,
    singleton_classes,
    slot_columns,
    throughput_matrix,
)
from costopt.gavel.lp import SlotModels, Triplets, assemble, slot_models, solve_lp
from costopt.gavel.policies.base import PARETO_SLACK, Policy, class_allocation, empty_allocation, job_allocation
from costopt.gavel.state import Allocation, ClusterState, FloatArray, IntArray

log = logging.getLogger(__name__)


def _speed(state: ClusterState, classes: Classes, cols: Columns) -> FloatArray:
    """Per column: the total, over its jobs, of throughput as a fraction of each job's best."""
    best = state.throughput[classes.rep].max(axis=1)
    inv = np.divide(1.0, best, out=np.zeros_like(best), where=best > 0)
    return throughput_matrix(cols, classes.n).scaled_rows(inv).col_sums()


@dataclass(frozen=True, slots=True)
class MaxSumThroughput(Policy):
    """Maximize the total of each job's throughput as a fraction of its best (objective: that total)."""

    name: str = "max_sum_throughput_perf"

    def allocate(self, state: ClusterState) -> Allocation:
        if state.n_jobs == 0:
            return empty_allocation(self.name, state)
        classes = interchangeable_classes(state)
        cols = columns_for(state, classes, aware=True)
        if cols.n == 0:
            return empty_allocation(self.name, state)
        a, b = base_constraints(cols, classes, state.capacity)
        obj = _speed(state, classes, cols)
        sol = solve_lp(obj, a, -np.inf, b, maximize=True, what=self.name)
        return class_allocation(
            self.name, state, classes, cols, np.maximum(sol.x, 0.0), sol.objective, {"total_speed": sol.objective}
        )


def slo_rates(state: ClusterState) -> tuple[IntArray, FloatArray]:
    """(job rows with a finite SLO and steps left, steps/s each must reach); inf rate if past due."""
    rows: IntArray = np.nonzero(np.isfinite(state.slo_s) & (state.steps_remaining > 0))[0].astype(np.int64)
    left = state.arrival_s[rows] + state.slo_s[rows] - state.now_s
    with np.errstate(divide="ignore"):
        rate: FloatArray = np.where(left > 0, state.steps_remaining[rows] / np.maximum(left, 1e-300), np.inf)
    return rows, rate


@dataclass(frozen=True, slots=True)
class MaxThroughputPerDollar(Policy):
    """Maximize total speed (see module) per USD/h, optionally under SLO rates; objective: the ratio
    (speed per USD/h); ``stats``: ``cost_usd_per_h``, ``total_speed``, ``slo_relaxed``.
    ``reference``: with SLOs, fresh per-job LPs for every call (as under space sharing) instead of the
    kept slot layout."""

    name: str = "max_sum_throughput_normalized_by_cost_perf"
    slos: bool = False
    reference: bool = False

    def allocate(self, state: ClusterState) -> Allocation:
        if state.n_jobs == 0:
            return empty_allocation(self.name, state)
        if np.any((state.prices <= 0) & (state.capacity > 0)):
            raise InvalidState(f"{self.name} needs a price > 0 USD/h for every worker type with GPUs")
        if self.slos and not self.reference and not state.space_sharing:
            return self._allocate_in_slots(state)
        classes = singleton_classes(state.n_jobs) if self.slos else interchangeable_classes(state)
        cols = columns_for(state, classes, aware=True)
        if cols.n == 0:
            return empty_allocation(self.name, state)
        rows, rate = slo_rates(state) if self.slos else (np.zeros(0, np.int64), np.zeros(0))
        y, ratio, rows, notes = self._relaxing(lambda r, q: self._solve(state, classes, cols, r, q), rows, rate)
        cost = self._cost(state, cols)
        speed = _speed(state, classes, cols)
        return class_allocation(
            self.name,
            state,
            classes,
            cols,
            y,
            ratio,
            {
                "cost_usd_per_h": float(cost @ y),
                "total_speed": float(speed @ y),
                "slo_relaxed": float(bool(notes)),
                "slo_jobs": float(rows.size),
            },
            notes,
        )

    def _relaxing(
        self, solve: Callable[[IntArray, FloatArray], tuple[FloatArray, float]], rows: IntArray, rate: FloatArray
    ) -> tuple[FloatArray, float, IntArray, tuple[str, ...]]:
        """``solve(rows, rate)`` under the SLO rates of job ``rows``, else without SLOs: (column values,
        ratio, the rows kept, notes: empty unless the SLOs were dropped)."""
        try:
            if np.any(~np.isfinite(rate)):
                raise Infeasible(self.name, "deadline passed", f"{int(np.sum(~np.isfinite(rate)))} jobs past due")
            y, ratio = solve(rows, rate)
            return y, ratio, rows, ()
        except Infeasible as exc:
            if rows.size == 0:
                raise
            log.info("%s: SLOs cannot all be met (%s); re-solving without them", self.name, exc)
            none = np.zeros(0, np.int64)
            y, ratio = solve(none, np.zeros(0))
            return y, ratio, none, (f"SLOs infeasible ({exc}); re-solved without SLO constraints",)

    def _allocate_in_slots(self, state: ClusterState) -> Allocation:
        """The per-job formulation laid out in slots and kept between calls (see
        :mod:`costopt.gavel.policies.finish_time`); SLO rows are scaled by each job's ``share_tput``."""
        models = slot_models(self.name)
        slot = models.assign(state.job_ids, state.now_s)
        sc = slot_columns(state, slot, models.n_slots, aware=True)
        if not sc.usable.any():
            return empty_allocation(self.name, state)
        best = state.throughput.max(axis=1)
        speed = (sc.tput * sc.per_slot(np.divide(1.0, best, out=np.zeros_like(best), where=best > 0))[:, None]).ravel()
        cost = ((sc.type_mix * sc.scale_factor[:, None, None]) @ state.prices).ravel()
        rows, rate = slo_rates(state)
        y, ratio, rows, notes = self._relaxing(
            lambda r, q: self._solve_in_slots(state, models, sc, speed, cost, r, q), rows, rate
        )
        stats = {
            "cost_usd_per_h": float(cost @ y),
            "total_speed": float(speed @ y),
            "slo_relaxed": float(bool(notes)),
            "slo_jobs": float(rows.size),
        }
        return job_allocation(self.name, state, sc.fractions(y), ratio, stats, notes)

    def _solve_in_slots(
        self,
        state: ClusterState,
        models: SlotModels,
        sc: SlotColumns,
        speed: FloatArray,
        cost: FloatArray,
        rows: IntArray,
        rate: FloatArray,
    ) -> tuple[FloatArray, float]:
        """:meth:`_solve` over slot columns: time rows, SLO rows (``tput / share_tput`` of the job's
        columns; free for jobs without one), capacity rows, then each stage's own rows."""
        s, n, nj = sc.n_slots, sc.n, state.n_types
        per_job = np.divide(1.0, sc.share_tput, out=np.ones(state.n_jobs), where=sc.share_tput > 0)
        need = np.zeros(state.n_jobs)
        need[rows] = rate * per_job[rows]
        has_slo = np.zeros(state.n_jobs, dtype=bool)
        has_slo[rows] = True
        slo_slot = sc.per_slot(has_slo.astype(np.float64)) > 0
        base = [(0, 0, sc.time_rows()), (s, 0, sc.throughput_rows(per_job)), (2 * s, 0, sc.capacity_rows())]
        col_upper = np.concatenate([np.where(sc.usable, np.inf, 0.0).ravel(), [np.inf]])  # one extra column
        every_slot = np.arange(s, dtype=np.int64)
        m = 2 * s + nj  # rows of ``base``

        def dense_row(values: FloatArray) -> Triplets:
            return Triplets(np.zeros(n, dtype=np.int64), np.arange(n, dtype=np.int64), values, 1, n)

        if rows.size == 0:
            # No SLO rows: no mix beats the best column's ratio (a mediant never exceeds its largest
            # term), and a little time on that column alone reaches it.
            ratios = np.divide(speed, cost, out=np.zeros(n), where=sc.usable.ravel() & (cost > 0))
            best = int(np.argmax(ratios))
            ratio = float(ratios[best])
            first_stage = np.zeros(n)
            first_stage[best] = 1.0
        else:
            # Stage 1 (Charnes-Cooper): Y = t * X, t = 1 / cost(X); maximize speed(Y) s.t. cost(Y) = 1.
            t_col = Triplets(
                np.concatenate([every_slot, s + every_slot, 2 * s + np.arange(nj)]),
                np.zeros(2 * s + nj, dtype=np.int64),
                np.concatenate([-np.ones(s), -sc.per_slot(need), -state.capacity]),
                m + 1,
                1,
            )
            first = models.model("best ratio")
            first.load(
                np.concatenate([speed, [0.0]]),
                assemble([*base, (m, 0, dense_row(cost)), (0, n, t_col)], m + 1, n + 1),
                np.concatenate([np.full(s, -np.inf), np.where(slo_slot, 0.0, -np.inf), np.full(nj, -np.inf), [1.0]]),
                np.concatenate([np.zeros(s), np.full(s, np.inf), np.zeros(nj), [1.0]]),
                None,
                col_upper,
                maximize=True,
            )
            s1 = first.solve()
            if s1 is None:
                raise Infeasible(first.what, "Infeasible", first.dims)
            ratio = s1.objective
            t = s1.x[-1]
            first_stage = s1.x[:n] / t if t > 0 else s1.x[:n]
        # Stage 2: the most throughput at (nearly) that ratio; column C = cost(X), speed(X) >= ratio * C.
        c_col = Triplets(
            np.array([m, m + 1]), np.zeros(2, dtype=np.int64), np.array([-1.0, -ratio * (1 - PARETO_SLACK)]), m + 2, 1
        )
        second = models.model("throughput at best ratio")
        second.load(
            np.concatenate([speed, [0.0]]),
            assemble([*base, (m, 0, dense_row(cost)), (m + 1, 0, dense_row(speed)), (0, n, c_col)], m + 2, n + 1),
            np.concatenate(
                [np.full(s, -np.inf), np.where(slo_slot, sc.per_slot(need), -np.inf), np.full(nj, -np.inf), [0.0, 0.0]]
            ),
            np.concatenate([np.ones(s), np.full(s, np.inf), state.capacity, [0.0, np.inf]]),
            None,
            col_upper,
            maximize=True,
        )
        s2 = second.solve()
        return np.maximum(first_stage if s2 is None else s2.x[:n], 0.0), ratio

    @staticmethod
    def _cost(state: ClusterState, cols: Columns) -> FloatArray:
        out: FloatArray = cols.gpus * (cols.mix @ state.prices)  # USD/h per unit of each column
        return out

    def _solve(
        self, state: ClusterState, classes: Classes, cols: Columns, rows: np.ndarray, rate: FloatArray
    ) -> tuple[FloatArray, float]:
        a_base, b_base = base_constraints(cols, classes, state.capacity)
        speed = _speed(state, classes, cols)
        cost = self._cost(state, cols)
        norm = state.equal_share_throughput()[rows]
        norm = np.where(norm > 0, norm, 1.0)
        tn = throughput_matrix(cols, classes.n).take_rows(rows).scaled_rows(1.0 / norm)  # singleton classes
        need = rate / norm
        nb, v, ns = a_base.n_rows, cols.n, rows.size
        # Stage 1 (Charnes-Cooper): Y = t * X, t = 1 / cost(X); maximize speed(Y) s.t. cost(Y) = 1.
        a1 = assemble(
            [
                (0, 0, a_base),
                (0, v, Triplets.column(-b_base)),
                (nb, 0, -tn),
                (nb, v, Triplets.column(need)),
                (nb + ns, 0, Triplets.row(cost)),
            ],
            nb + ns + 1,
            v + 1,
        )
        lower = np.concatenate([np.full(nb + ns, -np.inf), [1.0]])
        upper = np.concatenate([np.zeros(nb + ns), [1.0]])
        c1 = np.concatenate([speed, [0.0]])
        s1 = solve_lp(c1, a1, lower, upper, maximize=True, what=f"{self.name}: best ratio")
        ratio = s1.objective
        # Stage 2: the most throughput at (nearly) that ratio.
        a2 = assemble(
            [(0, 0, a_base), (nb, 0, -tn), (nb + ns, 0, Triplets.row(speed - ratio * (1 - PARETO_SLACK) * cost))],
            nb + ns + 1,
            v,
        )
        lower2 = np.concatenate([np.full(nb + ns, -np.inf), [0.0]])
        upper2 = np.concatenate([b_base, -need, [np.inf]])
        try:
            s2 = solve_lp(speed, a2, lower2, upper2, maximize=True, what=f"{self.name}: throughput at best ratio")
            y = s2.x
        except Infeasible:
            t = s1.x[-1]
            y = s1.x[:-1] / t if t > 0 else s1.x[:-1]
        return np.maximum(y, 0.0), ratio
