"""Re-planning many running jobs at once (the rebalancer's inner loop).

Jobs that differ only in how many steps remain share one evaluation: for a job of ``s`` steps the
expected cost on offer ``o`` is a line ``A_o * s + B_o`` (``A_o`` = price x hours per step,
``B_o`` = price x restart time + move cost), and its expected time ``u_o * s + r``. Only the lines
on the lower-left Pareto front (no other line is both flatter and lower) can ever win, so each
group is evaluated once, its front kept (a handful of lines), and every job picks its best line
from the front: O(offers + jobs x front) instead of O(offers x jobs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from costopt.planning.evaluate import OfferTable, evaluate, throughput_by_accelerator
from costopt.planning.model import Assumptions, JobSpec, Location, MinCost, MinTime
from costopt.throughput.catalog import ThroughputCatalog
from costopt.throughput.model import JobType


@dataclass(frozen=True, slots=True)
class BatchChoice:
    """The best offer of one job: its row in ``OfferTable.frame`` (-1: no offer can run it), and
    the job's expected hours and cost (USD, float: a ranking figure) there."""

    offer_index: int
    expected_hours: float
    expected_cost_usd: float


def _front(a: np.ndarray, b: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Indices (into ``idx``) of lines not dominated for s > 0: sorted by slope, keep a line only
    when its intercept is below every flatter line's."""
    order = np.lexsort((b[idx], a[idx]))
    sorted_idx = idx[order]
    bs = b[sorted_idx]
    prev_min = np.r_[np.inf, np.minimum.accumulate(bs)[:-1]]
    return np.asarray(sorted_idx[bs < prev_min])


def replan(
    jobs: Sequence[JobSpec],
    objective: MinCost | MinTime,
    table: OfferTable,
    catalog: ThroughputCatalog,
    assumptions: Assumptions | None = None,
) -> list[BatchChoice]:
    """The best offer of every job under ``objective`` (min-cost or min-time), in job order."""
    a = assumptions or Assumptions()
    groups: dict[tuple[JobType, int, Location | None, float], list[int]] = {}
    for i, job in enumerate(jobs):
        groups.setdefault((job.job_type, job.gpu_count, job.location, job.checkpoint_gb), []).append(i)
    out: list[BatchChoice | None] = [None] * len(jobs)
    tput_cache: dict[tuple[JobType, int], tuple[np.ndarray, np.ndarray]] = {}
    for (jt, gpus, _loc, _gb), members in groups.items():
        if (jt, gpus) not in tput_cache:
            tput_cache[(jt, gpus)] = throughput_by_accelerator(catalog, jt, gpus, table.accelerators)
        probe = jobs[members[0]]
        ev = evaluate(
            JobSpec(jt, 1.0, gpus, probe.checkpoint_gb, probe.location), table, catalog, a, tput_cache=tput_cache
        )
        feasible = np.flatnonzero(ev.feasible)
        steps = np.array([jobs[i].steps for i in members], dtype=np.float64)
        if len(feasible) == 0:
            for i in members:
                out[i] = BatchChoice(-1, float("nan"), float("nan"))
            continue
        hours_per_step = ev.expected_hours - a.restart_hours  # evaluated at 1 step: u_o
        slope_cost = ev.job_price * hours_per_step
        icpt_cost = ev.job_price * a.restart_hours + ev.move_cost
        if isinstance(objective, MinCost):
            slope, icpt = slope_cost, icpt_cost
        else:
            slope, icpt = hours_per_step, np.zeros_like(hours_per_step)
        front = _front(slope, icpt, feasible)
        values = steps[:, None] * slope[front][None, :] + icpt[front][None, :]
        best = front[np.argmin(values, axis=1)]
        hours = steps * hours_per_step[best] + a.restart_hours
        cost = steps * slope_cost[best] + icpt_cost[best]
        for k, i in enumerate(members):
            out[i] = BatchChoice(int(best[k]), float(hours[k]), float(cost[k]))
    return [c for c in out if c is not None]
