"""What a policy sees (:class:`ClusterState`) and what it returns (:class:`Allocation`).

Both are frozen, struct-of-arrays (one row per job, one column per worker type) so that policies
build their LPs without a Python loop per job. Units: throughputs in steps/s (of the whole job on
its ``scale_factor`` GPUs; 0 = cannot run), times in seconds, prices in USD per GPU-hour.

An allocation is a time fraction per (job, worker type) for jobs running alone, and per (job pair,
worker type) for pairs space-sharing the same GPU(s). Its contract (checked by :meth:`Allocation.check`):
fractions are >= 0, each job's fractions (alone and in pairs) sum to <= 1, and the GPUs used on
average (``scale_factor`` x fraction, a pair counting once) fit in each type's capacity.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import numpy.typing as npt

from costopt.gavel.errors import InvalidState

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

TOLERANCE = 1e-6
"""Slack allowed by :meth:`Allocation.check` (LP solvers satisfy constraints to about 1e-7)."""


def _finite_at_least(a: npt.NDArray[Any], low: float) -> bool:
    """All entries finite and >= ``low`` (NaN fails; empty passes)."""
    return a.size == 0 or bool(a.min() >= low and a.max() < np.inf)


def _frozen(a: npt.ArrayLike, dtype: type[np.float64] | type[np.int64]) -> Any:
    out = np.array(a, dtype=dtype, copy=True)
    out.setflags(write=False)
    return out


@dataclass(frozen=True, slots=True, eq=False)
class ClusterState:
    """Jobs and cluster at time ``now_s``. Build it with :meth:`create`, which fills the defaults.

    Per job (``n`` rows): ``job_ids`` (unique), ``throughput`` (n x J, steps/s alone on each type, for
    the job's own scale factor, GPUs in one server), ``scale_factor`` (GPUs the job needs), ``weight``
    (priority weight > 0), ``steps_remaining``, ``arrival_s``, ``slo_s`` (time allowed from arrival to
    completion; inf = no SLO), ``job_type`` (row of ``pair_throughput``; -1 = unknown), ``team``
    (index into ``team_weights``), ``current_type`` (type the job ran on in the last round, -1 = none).
    Per type (J columns): ``worker_types``, ``capacity`` (GPUs), ``prices`` (USD per GPU-hour).
    ``pair_throughput[a, b, j]`` is the steps/s of a job of type ``a`` co-located with one of type
    ``b`` on type ``j`` (0 = the pair cannot run); used only when ``space_sharing`` is true.
    """

    worker_types: tuple[str, ...]
    capacity: FloatArray
    prices: FloatArray
    job_ids: IntArray
    throughput: FloatArray
    scale_factor: IntArray
    weight: FloatArray
    steps_remaining: FloatArray
    arrival_s: FloatArray
    slo_s: FloatArray
    job_type: IntArray
    team: IntArray
    team_weights: FloatArray
    current_type: IntArray
    now_s: float = 0.0
    pair_throughput: FloatArray | None = None
    space_sharing: bool = False
    _runnable: npt.NDArray[np.bool_] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        n, j = self.n_jobs, self.n_types
        if len(set(self.worker_types)) != j or self.capacity.shape != (j,) or self.prices.shape != (j,):
            raise InvalidState(f"worker_types, capacity and prices must have one distinct entry per type ({j})")
        if self.throughput.shape != (n, j):
            raise InvalidState(f"throughput must be (jobs, types) = ({n}, {j}), got {self.throughput.shape}")
        per_job = {
            "scale_factor": self.scale_factor,
            "weight": self.weight,
            "steps_remaining": self.steps_remaining,
            "arrival_s": self.arrival_s,
            "slo_s": self.slo_s,
            "job_type": self.job_type,
            "team": self.team,
            "current_type": self.current_type,
        }
        for name, arr in per_job.items():
            if arr.shape != (n,):
                raise InvalidState(f"{name} must have one entry per job ({n}), got shape {arr.shape}")
        if n > 1 and not (np.all(self.job_ids[1:] > self.job_ids[:-1]) or np.unique(self.job_ids).shape[0] == n):
            raise InvalidState("job_ids must be unique")
        if not _finite_at_least(self.capacity, 0.0):
            raise InvalidState("capacity must be finite GPU counts >= 0")
        if not _finite_at_least(self.prices, 0.0):
            raise InvalidState("prices must be finite USD/h >= 0")
        if not _finite_at_least(self.throughput, 0.0):
            raise InvalidState("throughputs must be finite steps/s >= 0")
        if n:
            if self.scale_factor.min() < 1:
                raise InvalidState("scale_factor must be >= 1 GPU")
            if not _finite_at_least(self.weight, 0.0) or self.weight.min() <= 0:
                raise InvalidState("weights must be finite and > 0")
            if not _finite_at_least(self.steps_remaining, 0.0):
                raise InvalidState("steps_remaining must be finite and >= 0")
            if not _finite_at_least(self.arrival_s, -np.inf) or not self.slo_s.min() > 0:
                raise InvalidState("arrival_s must be finite and slo_s > 0 (inf = no SLO)")
            if self.current_type.min() < -1 or self.current_type.max() >= j:
                raise InvalidState("current_type must be -1 or a worker type index")
            if self.team.min() < 0 or self.team.max() >= len(self.team_weights):
                raise InvalidState("team must index team_weights")
        if len(self.team_weights) and not (_finite_at_least(self.team_weights, 0.0) and self.team_weights.min() > 0):
            raise InvalidState("team_weights must be finite and > 0")
        if not np.isfinite(self.now_s):
            raise InvalidState("now_s must be finite")
        if self.space_sharing:
            pt = self.pair_throughput
            if pt is None or pt.ndim != 3 or pt.shape[0] != pt.shape[1] or pt.shape[2] != j:
                raise InvalidState("space sharing needs pair_throughput of shape (job types, job types, types)")
            if not _finite_at_least(pt, 0.0):
                raise InvalidState("pair throughputs must be finite steps/s >= 0")
            if n and (self.job_type.min() < 0 or self.job_type.max() >= pt.shape[0]):
                raise InvalidState("space sharing needs every job's job_type to index pair_throughput")
        can = (self.throughput > 0) & (self.capacity[None, :] >= self.scale_factor[:, None])
        can.setflags(write=False)
        object.__setattr__(self, "_runnable", can)

    @classmethod
    def create(
        cls,
        throughput: npt.ArrayLike,
        capacity: npt.ArrayLike,
        *,
        worker_types: Sequence[str] | None = None,
        prices: npt.ArrayLike | None = None,
        job_ids: npt.ArrayLike | None = None,
        scale_factor: npt.ArrayLike | None = None,
        weight: npt.ArrayLike | None = None,
        steps_remaining: npt.ArrayLike | None = None,
        arrival_s: npt.ArrayLike | None = None,
        slo_s: npt.ArrayLike | None = None,
        job_type: npt.ArrayLike | None = None,
        team: npt.ArrayLike | None = None,
        team_weights: npt.ArrayLike | None = None,
        current_type: npt.ArrayLike | None = None,
        now_s: float = 0.0,
        pair_throughput: npt.ArrayLike | None = None,
        space_sharing: bool = False,
    ) -> ClusterState:
        """A state from array-likes; omitted per-job columns default to: ids 0..n-1, 1 GPU, weight 1,
        1 step remaining, arrival 0, no SLO, unknown job type, team 0, not running; prices 0."""
        tput = np.array(throughput, dtype=np.float64)
        if tput.ndim != 2:
            raise InvalidState(f"throughput must be a (jobs, types) matrix, got {tput.ndim} dimensions")
        n, j = tput.shape
        cap = np.array(capacity, dtype=np.float64).reshape(-1)

        def col(v: npt.ArrayLike | None, default: float, dtype: type[np.float64] | type[np.int64]) -> Any:
            return _frozen(np.full(n, default) if v is None else np.asarray(v).reshape(-1), dtype)

        teams = col(team, 0, np.int64)
        n_teams = int(teams.max()) + 1 if n else 1
        return cls(
            worker_types=tuple(worker_types) if worker_types is not None else tuple(f"type{i}" for i in range(j)),
            capacity=_frozen(cap, np.float64),
            prices=_frozen(np.zeros(j) if prices is None else np.asarray(prices).reshape(-1), np.float64),
            job_ids=col(job_ids, 0, np.int64) if job_ids is not None else _frozen(np.arange(n), np.int64),
            throughput=_frozen(tput, np.float64),
            scale_factor=col(scale_factor, 1, np.int64),
            weight=col(weight, 1.0, np.float64),
            steps_remaining=col(steps_remaining, 1.0, np.float64),
            arrival_s=col(arrival_s, 0.0, np.float64),
            slo_s=col(slo_s, np.inf, np.float64),
            job_type=col(job_type, -1, np.int64),
            team=teams,
            team_weights=_frozen(
                np.ones(n_teams) if team_weights is None else np.asarray(team_weights).reshape(-1), np.float64
            ),
            current_type=col(current_type, -1, np.int64),
            now_s=float(now_s),
            pair_throughput=None if pair_throughput is None else _frozen(pair_throughput, np.float64),
            space_sharing=space_sharing,
        )

    @property
    def n_jobs(self) -> int:
        return int(self.job_ids.shape[0])

    @property
    def n_types(self) -> int:
        return len(self.worker_types)

    @property
    def elapsed_s(self) -> FloatArray:
        """Seconds since each job arrived (>= 0)."""
        out: FloatArray = np.maximum(self.now_s - self.arrival_s, 0.0)
        return out

    def runnable(self) -> npt.NDArray[np.bool_]:
        """(jobs x types): the job can run there (throughput > 0 and at least ``scale_factor`` GPUs of
        the type; a fraction of a too-small type could meet an average but never a round)."""
        return self._runnable

    def equal_share_throughput(self) -> FloatArray:
        """Steps/s of each job under the equal share: every job gets 1/n of every type's GPUs (as a
        time fraction ``capacity[j] / (n * scale_factor)``, scaled down to sum to at most 1); types
        the job cannot run on contribute nothing.

        This is the normalizer of max-min fairness and the isolated share of finish-time fairness.
        """
        n = self.n_jobs
        total = float(self.capacity.sum())
        if n == 0 or total <= 0:
            return np.zeros(n)
        frac = np.minimum(1.0, total / (n * self.scale_factor))
        out: FloatArray = frac * (np.where(self.runnable(), self.throughput, 0.0) @ self.capacity) / total
        return out


@dataclass(frozen=True, slots=True, eq=False)
class Allocation:
    """Time fractions per (job, worker type) alone (``x``) and per (pair, worker type) co-located
    (``pairs`` holds row indices into ``job_ids``, lower first; ``pair_x`` their fractions).

    ``objective`` is the policy's primary objective value (its meaning is documented by each policy);
    ``stats`` holds further plain floats (e.g. the Pareto stage's total), ``notes`` human-readable
    remarks (e.g. SLOs relaxed).
    """

    policy: str
    job_ids: IntArray
    worker_types: tuple[str, ...]
    scale_factor: IntArray
    x: FloatArray
    pairs: IntArray = field(default_factory=lambda: np.zeros((0, 2), dtype=np.int64))
    pair_x: FloatArray = field(default_factory=lambda: np.zeros((0, 0)))
    objective: float = 0.0
    stats: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n, j = self.x.shape
        if self.pair_x.size == 0:
            object.__setattr__(self, "pair_x", np.zeros((self.pairs.shape[0], j)))
        if self.job_ids.shape != (n,) or self.scale_factor.shape != (n,) or len(self.worker_types) != j:
            raise InvalidState("allocation arrays disagree on the number of jobs or types")
        if self.pairs.ndim != 2 or self.pairs.shape[1] != 2 or self.pair_x.shape != (self.pairs.shape[0], j):
            raise InvalidState("pairs must be (p, 2) and pair_x (p, types)")
        object.__setattr__(self, "stats", MappingProxyType({k: float(v) for k, v in self.stats.items()}))

    @property
    def n_jobs(self) -> int:
        return int(self.x.shape[0])

    def time_fractions(self) -> FloatArray:
        """Each job's total time fraction (alone and in pairs), in [0, 1] for a valid allocation."""
        out: FloatArray = self.x.sum(axis=1)
        if self.pairs.shape[0]:
            per_pair = self.pair_x.sum(axis=1)
            out = out + np.bincount(self.pairs.ravel(), weights=np.repeat(per_pair, 2), minlength=self.n_jobs)
        return out

    def type_fractions(self) -> FloatArray:
        """(jobs x types): each job's time fraction on each type, alone or co-located."""
        out: FloatArray = self.x.copy()
        if self.pairs.shape[0]:
            np.add.at(out, self.pairs[:, 0], self.pair_x)
            np.add.at(out, self.pairs[:, 1], self.pair_x)
        return out

    def gpus_used(self) -> FloatArray:
        """Average GPUs used per type (a co-located pair occupies its scale factor once)."""
        out: FloatArray = self.scale_factor.astype(np.float64) @ self.x
        if self.pairs.shape[0]:
            out = out + self.scale_factor[self.pairs[:, 0]].astype(np.float64) @ self.pair_x
        return out

    def effective_throughput(self, state: ClusterState) -> FloatArray:
        """Each job's steps/s under this allocation (time-weighted, pairs at co-located throughput)."""
        out: FloatArray = (self.x * state.throughput).sum(axis=1)
        if self.pairs.shape[0]:
            if state.pair_throughput is None:
                raise InvalidState("allocation has co-located pairs but the state has no pair throughputs")
            ta, tb = state.job_type[self.pairs[:, 0]], state.job_type[self.pairs[:, 1]]
            pt = state.pair_throughput
            out = out + np.bincount(self.pairs[:, 0], (self.pair_x * pt[ta, tb]).sum(axis=1), minlength=self.n_jobs)
            out = out + np.bincount(self.pairs[:, 1], (self.pair_x * pt[tb, ta]).sum(axis=1), minlength=self.n_jobs)
        return out

    def check(self, capacity: npt.ArrayLike, tol: float = TOLERANCE) -> None:
        """Raise :class:`InvalidState` unless fractions are >= 0, per-job sums <= 1 and GPUs fit."""
        if (self.x.size and self.x.min() < -tol) or (self.pair_x.size and self.pair_x.min() < -tol):
            raise InvalidState(f"{self.policy}: negative time fraction")
        worst = float(self.time_fractions().max()) if self.n_jobs else 0.0
        if worst > 1 + tol:
            raise InvalidState(f"{self.policy}: a job is allocated {worst:.9f} > 1 of its time")
        over = self.gpus_used() - np.asarray(capacity, dtype=np.float64)
        if over.size and over.max() > tol * max(1.0, float(np.max(capacity))):
            raise InvalidState(f"{self.policy}: capacity exceeded by {over.max():.9f} GPUs")

    def as_dict(self) -> dict[str, Any]:
        """JSON-able summary: policy, objective, stats, notes and per-job fractions (pairs listed by id)."""
        jobs = {
            int(jid): {wt: float(v) for wt, v in zip(self.worker_types, row, strict=True) if v > 0}
            for jid, row in zip(self.job_ids.tolist(), self.x, strict=True)
        }
        pairs = [
            {
                "jobs": [int(self.job_ids[a]), int(self.job_ids[b])],
                "fractions": {wt: float(v) for wt, v in zip(self.worker_types, row, strict=True) if v > 0},
            }
            for (a, b), row in zip(self.pairs.tolist(), self.pair_x, strict=True)
        ]
        return {
            "policy": self.policy,
            "objective": float(self.objective),
            "stats": dict(self.stats),
            "notes": list(self.notes),
            "jobs": jobs,
            "pairs": pairs,
        }
