"""Max-min fairness (least attained service), weighted, with space sharing, its Pareto second stage,
and hierarchical (team) fairness.

A job's *level* is its effective throughput normalized by its equal-share throughput and divided by
its weight: ``tau_m / (N_m * w_m)``. Max-min fairness maximizes the smallest level (the objective is
that level: 1.0 means every job does at least as well as under an equal split of every type).

The heterogeneity-agnostic variant (``max_min_fairness``) sees no throughput differences between
types: each job runs with the capacity-proportional type mix and only its total time is chosen, so the
level is its time share over its equal time share.

The max-min LP alone is not Pareto-efficient: once the poorest jobs are served it is indifferent to
the rest, so a vertex may leave GPUs idle. The second stage maximizes the total normalized throughput
``sum_m tau_m / N_m`` subject to every job keeping at least the max-min level.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import numpy as np

from costopt.gavel.formulation import (
    Classes,
    Columns,
    base_constraints,
    columns_for,
    interchangeable_classes,
    singleton_classes,
    throughput_matrix,
)
from costopt.gavel.lp import Triplets, assemble, solve_lp
from costopt.gavel.policies.base import (
    PARETO_SLACK,
    Policy,
    class_allocation,
    empty_allocation,
    job_allocation,
    space_sharing_note,
)
from costopt.gavel.policies.fifo import fifo_within_budgets
from costopt.gavel.state import Allocation, ClusterState, FloatArray

log = logging.getLogger(__name__)


def normalizer(state: ClusterState, classes: Classes, cols: Columns, *, aware: bool) -> FloatArray:
    """Per class: steps/s of one job under the equal share (agnostic: under its type mix)."""
    if aware:
        out: FloatArray = state.equal_share_throughput()[classes.rep]
        return out
    n, total = state.n_jobs, float(state.capacity.sum())
    frac = np.minimum(1.0, total / (n * state.scale_factor[classes.rep])) if total > 0 else np.zeros(classes.n)
    tbar = np.zeros(classes.n)
    tbar[cols.a] = cols.tput_a  # one mixed column per class that can run
    result: FloatArray = frac * tbar
    return result


@dataclass(frozen=True, slots=True, eq=False)
class MaxMinSolution:
    """Class-level column values, the max-min level and (second stage) the total normalized throughput."""

    y: FloatArray
    level: float
    total: float


def solve_max_min(
    classes: Classes,
    cols: Columns,
    capacity: FloatArray,
    norm: FloatArray,
    weight: FloatArray,
    *,
    pareto: bool,
    what: str,
) -> MaxMinSolution:
    """Maximize ``t`` s.t. every class with ``norm > 0`` reaches ``tau / (norm * weight) >= t`` per job;
    with ``pareto``, then maximize ``sum tau / norm`` keeping every job at ``t`` (up to PARETO_SLACK)."""
    a_base, b_base = base_constraints(cols, classes, capacity)
    fair = np.nonzero(norm > 0)[0]
    if fair.size == 0 or cols.n == 0:
        return MaxMinSolution(np.zeros(cols.n), 0.0, 0.0)
    inv_norm = np.zeros(classes.n)
    inv_norm[fair] = 1.0 / norm[fair]
    tn = throughput_matrix(cols, classes.n).scaled_rows(inv_norm).take_rows(fair)  # normalized, fair x columns
    need = (classes.count * weight)[fair].astype(np.float64)  # class total level per unit of t
    level, y = max_level_lp(a_base, b_base, tn, need, f"{what}: max-min level")
    if pareto:
        y = max_total_lp(a_base, b_base, tn, need * level * (1.0 - PARETO_SLACK), f"{what}: Pareto stage")
    return MaxMinSolution(y, level, float(tn.col_sums() @ y))


def max_level_lp(
    a_base: Triplets, b_base: FloatArray, tn: Triplets, need: FloatArray, what: str
) -> tuple[float, FloatArray]:
    """Maximize ``t`` s.t. ``a_base @ y <= b_base`` and ``tn @ y >= t * need`` (per row of ``tn``):
    (``t``, ``y``)."""
    nb, v = a_base.n_rows, a_base.n_cols
    a = assemble([(0, 0, a_base), (nb, 0, -tn), (nb, v, Triplets.column(need))], nb + tn.n_rows, v + 1)
    c = np.zeros(v + 1)
    c[-1] = 1.0
    sol = solve_lp(c, a, -np.inf, np.concatenate([b_base, np.zeros(tn.n_rows)]), maximize=True, what=what)
    return float(sol.x[-1]), np.maximum(sol.x[:-1], 0.0)


def max_total_lp(a_base: Triplets, b_base: FloatArray, tn: Triplets, lower: FloatArray, what: str) -> FloatArray:
    """The Pareto stage: maximize the sum of ``tn @ y`` s.t. ``a_base @ y <= b_base`` and
    ``tn @ y >= lower``; :class:`~costopt.gavel.errors.Infeasible` if solver tolerance makes it fail."""
    nb, v = a_base.n_rows, a_base.n_cols
    a = assemble([(0, 0, a_base), (nb, 0, -tn)], nb + tn.n_rows, v)
    sol = solve_lp(tn.col_sums(), a, -np.inf, np.concatenate([b_base, -lower]), maximize=True, what=what)
    return np.maximum(sol.x, 0.0)


@dataclass(frozen=True, slots=True)
class MaxMinFairness(Policy):
    """Weighted max-min fairness over normalized throughput (LAS). ``aware``: sees per-type
    throughputs; ``pareto``: adds the second stage; ``merge``: solves over classes of interchangeable
    jobs (exact; off only to check the per-job formulation). Space sharing when the state asks for it
    (aware only). Objective: the max-min level; ``stats['total_normalized_throughput']``."""

    name: str = "max_min_fairness_perf"
    aware: bool = True
    pareto: bool = False
    merge: bool = True

    def allocate(self, state: ClusterState) -> Allocation:
        return self.allocate_weighted(state, state.weight)

    def allocate_weighted(self, state: ClusterState, weight: FloatArray) -> Allocation:
        """Allocation with per-job weights ``weight`` in place of the state's (used by hierarchies)."""
        notes = space_sharing_note(state, self.aware)
        if state.n_jobs == 0:
            return empty_allocation(self.name, state, notes)
        classes = interchangeable_classes(state, weight) if self.merge else singleton_classes(state.n_jobs)
        cols = columns_for(state, classes, aware=self.aware)
        # A single-GPU job's equal share is capacity / max(n, capacity): scaling it by max(n, C) / C keeps
        # the LP's coefficients unchanged while jobs come and go (the kept model is re-solved after
        # few changes); the level scales back.
        total = float(state.capacity.sum())
        scale = max(float(state.n_jobs), total) / total if total > 0 else 1.0
        norm = normalizer(state, classes, cols, aware=self.aware) * scale
        sol = solve_max_min(
            classes, cols, state.capacity, norm, weight[classes.rep], pareto=self.pareto, what=self.name
        )
        return class_allocation(
            self.name,
            state,
            classes,
            cols,
            sol.y,
            sol.level * scale,
            {
                "max_min_level": sol.level * scale,
                "total_normalized_throughput": sol.total * scale,
                "lp_classes": classes.n,
                "lp_columns": cols.n,
            },
            notes,
        )


def team_job_weights(state: ClusterState) -> FloatArray:
    """Per-job weights that give each team its team weight in total, split by job weight inside it."""
    per_team = np.bincount(state.team, weights=state.weight, minlength=len(state.team_weights))
    out: FloatArray = state.team_weights[state.team] * state.weight / per_team[state.team]
    return out


@dataclass(frozen=True, slots=True)
class Hierarchical(Policy):
    """Teams share the cluster by weighted max-min fairness (each team's jobs together weigh the team's
    weight), then within a team: ``within="fairness"`` (max-min, Pareto-improved) or ``"fifo"``
    (the team's GPUs per type go to its jobs in arrival order, each to its fastest types first).
    Objective: the max-min level of the team stage."""

    name: str = "hierarchical_fairness_perf"
    within: str = "fairness"

    def allocate(self, state: ClusterState) -> Allocation:
        if state.n_jobs == 0:
            return empty_allocation(self.name, state)
        weights = team_job_weights(state)
        policy = MaxMinFairness(name=self.name, aware=True, pareto=True)
        if self.within == "fairness":
            return policy.allocate_weighted(state, weights)
        # FIFO teams run jobs alone: budgets come from a stage without co-location.
        fair = policy.allocate_weighted(replace(state, space_sharing=False), weights)
        budgets = np.zeros((len(state.team_weights), state.n_types))
        np.add.at(budgets, state.team, fair.type_fractions() * state.scale_factor[:, None])
        x = fifo_within_budgets(state, budgets)
        notes = ("space sharing ignored within FIFO teams",) if state.space_sharing else ()
        return job_allocation(self.name, state, x, fair.objective, fair.stats, notes)
