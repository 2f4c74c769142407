"""The one policy interface and the helpers policies share."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

import numpy as np

from costopt.gavel.formulation import Classes, Columns, expand
from costopt.gavel.state import Allocation, ClusterState, FloatArray

PARETO_SLACK = 1e-7
"""Relative slack on a first-stage optimum when a second stage must keep it (solver tolerance)."""


class Policy(ABC):
    """``allocate(state) -> Allocation``: a time fraction per (job, worker type), and per (job pair,
    worker type) under space sharing, that fits the cluster (see :class:`Allocation`).

    Policies hold no state of their own: the same state gives the same optimum (objective). The
    per-job LP policies keep their solver models between calls (a warm start from the last basis); when
    the optimum is not unique the allocation chosen may depend on the calls since the last cold start,
    which a simulation makes deterministic per seed (it starts cold). Solver failure raises
    :class:`costopt.gavel.errors.SolverFailed` (or :class:`~costopt.gavel.errors.Infeasible`).
    """

    name: str

    @abstractmethod
    def allocate(self, state: ClusterState) -> Allocation:
        """The policy's allocation for ``state``."""

    @property
    def heterogeneity_aware(self) -> bool:
        """Whether the policy sees per-type throughputs (the ``_perf`` names): policies with an ``aware``
        switch say so through it, the others are aware."""
        return bool(getattr(self, "aware", True))


def job_allocation(
    name: str,
    state: ClusterState,
    x: FloatArray,
    objective: float = 0.0,
    stats: Mapping[str, float] | None = None,
    notes: tuple[str, ...] = (),
) -> Allocation:
    """The allocation of per-job fractions ``x`` (jobs x types) for ``state``'s jobs, without pairs."""
    return Allocation(
        policy=name,
        job_ids=state.job_ids,
        worker_types=state.worker_types,
        scale_factor=state.scale_factor,
        x=x,
        objective=float(objective),
        stats=dict(stats or {}),
        notes=notes,
    )


def empty_allocation(name: str, state: ClusterState, notes: tuple[str, ...] = ()) -> Allocation:
    """All-zero allocation (no job runs): for an empty state or jobs that can run nowhere."""
    return job_allocation(name, state, np.zeros((state.n_jobs, state.n_types)), notes=notes)


def class_allocation(
    name: str,
    state: ClusterState,
    classes: Classes,
    cols: Columns,
    y: FloatArray,
    objective: float,
    stats: Mapping[str, float] | None = None,
    notes: tuple[str, ...] = (),
) -> Allocation:
    """The per-job allocation of class-level column values ``y`` (see :func:`expand`)."""
    x, pairs, pair_x = expand(state, classes, cols, y)
    return Allocation(
        policy=name,
        job_ids=state.job_ids,
        worker_types=state.worker_types,
        scale_factor=state.scale_factor,
        x=x,
        pairs=pairs,
        pair_x=pair_x,
        objective=float(objective),
        stats=dict(stats or {}),
        notes=notes,
    )


def space_sharing_note(state: ClusterState, aware: bool) -> tuple[str, ...]:
    if state.space_sharing and not aware:
        return ("space sharing ignored: a heterogeneity-agnostic policy does not see co-location throughputs",)
    return ()
