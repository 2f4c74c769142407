"""First in, first out: jobs in arrival order take whole GPUs until the cluster is full.

Strict FIFO: the first job that fits nowhere stops the queue (no later job overtakes it). The aware
variant (``fifo_perf``) puts each job on its fastest type with room; the agnostic one (``fifo``)
keeps a job on the type it ran on last round if it still fits, else takes the type with the most
free GPUs. Objective: the number of jobs running.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costopt.gavel.formulation import runnable
from costopt.gavel.policies.base import Policy, empty_allocation, job_allocation
from costopt.gavel.state import Allocation, ClusterState, FloatArray

_EPS = 1e-12


def arrival_order(state: ClusterState) -> list[int]:
    """Job rows by arrival time, then job id."""
    order: list[int] = np.lexsort((state.job_ids, state.arrival_s)).tolist()
    return order


@dataclass(frozen=True, slots=True)
class Fifo(Policy):
    """Strict FIFO over whole jobs (fractions 0 or 1); see the module docstring."""

    name: str = "fifo_perf"
    aware: bool = True

    def allocate(self, state: ClusterState) -> Allocation:
        notes = ("space sharing ignored by FIFO",) if state.space_sharing else ()
        if state.n_jobs == 0:
            return empty_allocation(self.name, state, notes)
        # Plain Python lists: the loop visits about one job per GPU, and numpy's per-call cost would dominate.
        can = runnable(state)
        can_l: list[list[bool]] = can.tolist()
        any_l: list[bool] = [any(row) for row in can_l]
        sf_l: list[int] = state.scale_factor.tolist()
        cur_l: list[int] = state.current_type.tolist()
        # aware: each job's types fastest first (ties: lower index first)
        pref: list[list[int]] = np.argsort(-np.where(can, state.throughput, -1.0), axis=1, kind="stable").tolist()
        free: list[float] = state.capacity.astype(np.float64).tolist()
        n_types = state.n_types
        rows: list[int] = []
        cols: list[int] = []
        for m in arrival_order(state):
            if not any_l[m]:
                continue  # can run nowhere: must not block the queue forever
            need, ok_m, j = sf_l[m], can_l[m], -1
            if self.aware:
                for t in pref[m]:
                    if ok_m[t] and free[t] >= need:
                        j = t
                        break
            elif cur_l[m] >= 0 and ok_m[cur_l[m]] and free[cur_l[m]] >= need:
                j = cur_l[m]
            else:
                best = -1.0
                for t in range(n_types):
                    if ok_m[t] and free[t] >= need and free[t] > best:
                        best, j = free[t], t
            if j < 0:
                break
            rows.append(m)
            cols.append(j)
            free[j] -= need
            if max(free) < 1:
                break
        x = np.zeros((state.n_jobs, state.n_types))
        x[rows, cols] = 1.0
        return job_allocation(self.name, state, x, float(len(rows)), notes=notes)


def fifo_within_budgets(state: ClusterState, budgets: FloatArray) -> FloatArray:
    """(jobs x types) fractions giving each team's GPU budget per type (teams x types, GPUs on
    average) to its jobs in arrival order, each job filling its fastest types first."""
    left = budgets.astype(np.float64).copy()
    x = np.zeros((state.n_jobs, state.n_types))
    tput, sf, team = np.where(runnable(state), state.throughput, 0.0), state.scale_factor, state.team
    for m in arrival_order(state):
        t, rem = int(team[m]), 1.0
        if left[t].max() <= _EPS:
            continue
        for j in np.argsort(-tput[m], kind="stable").tolist():
            if tput[m, j] <= 0 or rem <= _EPS:
                break
            take = min(rem, left[t, j] / sf[m])
            if take > _EPS:
                x[m, j] = take
                left[t, j] -= take * sf[m]
                rem -= take
    return x
