"""Synthetic job traces as in Gavel's evaluation, deterministic per seed.

* Job type: uniform over the workload's single-GPU entries (26 for Gavel's file). With ``multi_gpu``,
  the GPU count is drawn first (1, 2, 4, 8 GPUs with probability 0.70, 0.10, 0.15, 0.05), then the
  type uniformly among the entries measured at that count.
* Duration on a V100 (alone, consolidated): ``60 * 10**U(1.5, 3)`` s for 80% of jobs and
  ``60 * 10**U(3, 4)`` s for the other 20%; total steps = duration x the entry's V100 throughput.
* SLO (optional): duration x a factor drawn from {1.2, 2, 10}.
* Arrivals: Poisson at ``rate_per_hour`` (the first job at t = 0), or all at t = 0 (static trace).

Every attribute comes from its own random stream, so the first ``k`` jobs of a trace do not depend
on how many jobs are generated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costopt.gavel.errors import InvalidState
from costopt.gavel.state import FloatArray, IntArray
from costopt.gavel.workload import Workload

SHORT_LOG10_MINUTES = (1.5, 3.0)
LONG_LOG10_MINUTES = (3.0, 4.0)
LONG_FRACTION = 0.2
MULTI_GPU_MIX: tuple[tuple[int, float], ...] = ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05))
SLO_FACTORS: tuple[float, ...] = (1.2, 2.0, 10.0)


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """Jobs in arrival order (row = job id). ``entry``: workload row; ``duration_s``: time alone on
    a V100; ``steps``: total steps; ``slo_s``: time allowed from arrival (inf = none)."""

    entry: IntArray
    scale_factor: IntArray
    arrival_s: FloatArray
    duration_s: FloatArray
    steps: FloatArray
    slo_s: FloatArray

    @property
    def n_jobs(self) -> int:
        return int(self.entry.shape[0])


def generate_trace(
    workload: Workload,
    n_jobs: int,
    *,
    rate_per_hour: float | None,
    seed: int,
    multi_gpu: bool = False,
    slos: bool = False,
) -> Trace:
    """A trace of ``n_jobs`` jobs; ``rate_per_hour=None`` gives a static trace (all arrive at 0)."""
    if n_jobs < 0:
        raise InvalidState(f"n_jobs must be >= 0, got {n_jobs}")
    if rate_per_hour is not None and not rate_per_hour > 0:
        raise InvalidState(f"rate_per_hour must be > 0 jobs/hour (None for a static trace), got {rate_per_hour}")
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(7)]
    counts = np.array([c for c, _ in MULTI_GPU_MIX])
    if multi_gpu:
        probs = np.array([p for _, p in MULTI_GPU_MIX])
        sf = counts[np.searchsorted(np.cumsum(probs), streams[0].random(n_jobs), side="right").clip(0, len(counts) - 1)]
    else:
        sf = np.ones(n_jobs, dtype=np.int64)
    u_type = streams[1].random(n_jobs)
    entry = np.zeros(n_jobs, dtype=np.int64)
    for c in np.unique(sf).tolist():
        cands = workload.entries_with_scale_factor(int(c))
        if cands.size == 0:
            raise InvalidState(f"the workload has no job type measured at {c} GPUs")
        rows = sf == c
        entry[rows] = cands[np.minimum((u_type[rows] * cands.size).astype(np.int64), cands.size - 1)]
    long = streams[2].random(n_jobs) < LONG_FRACTION
    u = streams[3].random(n_jobs)
    lo = np.where(long, LONG_LOG10_MINUTES[0], SHORT_LOG10_MINUTES[0])
    hi = np.where(long, LONG_LOG10_MINUTES[1], SHORT_LOG10_MINUTES[1])
    duration = 60.0 * 10.0 ** (lo + (hi - lo) * u)
    steps = duration * workload.consolidated[entry, workload.reference_type()]
    if rate_per_hour is None:
        arrival = np.zeros(n_jobs)
    else:
        gaps = streams[4].exponential(3600.0 / rate_per_hour, n_jobs)
        arrival = np.concatenate([[0.0], np.cumsum(gaps[:-1])]) if n_jobs else np.zeros(0)
    factors = np.array(SLO_FACTORS)[streams[5].integers(0, len(SLO_FACTORS), n_jobs)]
    slo = duration * factors if slos else np.full(n_jobs, np.inf)
    return Trace(
        entry=entry, scale_factor=sf.astype(np.int64), arrival_s=arrival, duration_s=duration, steps=steps, slo_s=slo
    )
