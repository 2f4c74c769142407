"""Solver benchmark in Gavel's setting: ``n`` jobs drawn uniformly from the single-GPU job types,
equal weights, ``n / 4`` GPUs of each worker type (``bench_policy``); results are plain JSON-able
values. Per-job state (steps left, arrival, SLO) is drawn too, for the policies that use it."""

from __future__ import annotations

import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from costopt.gavel.lp import forget_kept_models
from costopt.gavel.policies import get_policy
from costopt.gavel.state import ClusterState
from costopt.gavel.workload import Workload

BENCH_PRICES_USD_PER_H = (2.48, 1.46, 0.45)


def benchmark_state(
    workload: Workload, n_jobs: int, *, seed: int = 0, space_sharing: bool = False, gpus_per_type: float | None = None
) -> ClusterState:
    """``n_jobs`` single-GPU jobs of uniformly drawn types on ``n_jobs / 4`` GPUs of each type; steps
    left uniform in [1e3, 1e5], arrivals up to an hour ago, a third of the jobs with an SLO."""
    rng = np.random.default_rng(seed)
    entries = rng.choice(workload.entries_with_scale_factor(1), size=n_jobs)
    cap = gpus_per_type if gpus_per_type is not None else n_jobs / 4
    steps = rng.uniform(1e3, 1e5, n_jobs)
    return ClusterState.create(
        workload.consolidated[entries],
        [cap] * len(workload.worker_types),
        worker_types=workload.worker_types,
        job_type=entries,
        pair_throughput=workload.pair,
        space_sharing=space_sharing,
        prices=BENCH_PRICES_USD_PER_H[: len(workload.worker_types)],
        steps_remaining=steps,
        arrival_s=-rng.uniform(0, 3600, n_jobs),
        slo_s=np.where(rng.random(n_jobs) < 1 / 3, 3600 + steps / workload.consolidated[entries].min(axis=1), np.inf),
    )


@dataclass(frozen=True, slots=True)
class BenchResult:
    """Median wall seconds of ``allocate`` over the repeats (cold: no kept LP), the process's peak
    resident memory in MB after them, and the policy's objective on the first state."""

    policy: str
    jobs: int
    space_sharing: bool
    solve_s: float
    peak_mem_mb: float
    objective: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0


def bench_policy(
    policy_name: str, n_jobs: int, space_sharing: bool = False, *, workload: Workload, repeats: int = 3, seed: int = 0
) -> BenchResult:
    """Time ``allocate`` on ``repeats`` benchmark states (seeds ``seed``, ``seed + 1``, ...)."""
    policy = get_policy(policy_name)
    times: list[float] = []
    objective = 0.0
    for r in range(max(1, repeats)):
        state = benchmark_state(workload, n_jobs, seed=seed + r, space_sharing=space_sharing)
        forget_kept_models()
        t0 = time.perf_counter()
        alloc = policy.allocate(state)
        times.append(time.perf_counter() - t0)
        if r == 0:
            objective = float(alloc.objective)
    return BenchResult(
        policy=policy_name,
        jobs=n_jobs,
        space_sharing=space_sharing,
        solve_s=float(statistics.median(times)),
        peak_mem_mb=_peak_rss_mb(),
        objective=objective,
    )
