"""Trace generation: Gavel's distributions, deterministic per seed, prefix-stable."""

from __future__ import annotations

import numpy as np
import pytest

from costopt.gavel.errors import InvalidState
from costopt.gavel.trace import generate_trace
from costopt.gavel.workload import Workload


def test_the_same_seed_gives_the_same_trace_and_another_seed_another(workload: Workload) -> None:
    a = generate_trace(workload, 300, rate_per_hour=5.0, seed=7, multi_gpu=True, slos=True)
    b = generate_trace(workload, 300, rate_per_hour=5.0, seed=7, multi_gpu=True, slos=True)
    c = generate_trace(workload, 300, rate_per_hour=5.0, seed=8, multi_gpu=True, slos=True)
    for field in ("entry", "scale_factor", "arrival_s", "duration_s", "steps", "slo_s"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
    assert not np.array_equal(a.duration_s, c.duration_s)


def test_a_longer_trace_starts_with_the_shorter_one(workload: Workload) -> None:
    short = generate_trace(workload, 100, rate_per_hour=3.0, seed=1, multi_gpu=True)
    long = generate_trace(workload, 1000, rate_per_hour=3.0, seed=1, multi_gpu=True)
    assert np.array_equal(short.entry, long.entry[:100])
    assert np.allclose(short.arrival_s, long.arrival_s[:100])
    assert np.allclose(short.steps, long.steps[:100])


def test_durations_follow_the_80_20_log_uniform_mix(workload: Workload) -> None:
    tr = generate_trace(workload, 20_000, rate_per_hour=5.0, seed=0)
    minutes = tr.duration_s / 60.0
    assert minutes.min() >= 10**1.5 and minutes.max() <= 10**4
    long = minutes > 10**3
    assert long.mean() == pytest.approx(0.2, abs=0.01)
    # log-uniform within each part: the median of the short part is 10**2.25 minutes
    assert np.median(np.log10(minutes[~long])) == pytest.approx(2.25, abs=0.03)


def test_steps_are_the_v100_duration_times_the_v100_throughput(workload: Workload) -> None:
    tr = generate_trace(workload, 500, rate_per_hour=5.0, seed=3, multi_gpu=True)
    v100 = workload.worker_types.index("v100")
    assert np.allclose(tr.steps, tr.duration_s * workload.consolidated[tr.entry, v100])


def test_job_types_are_uniform_over_the_26_single_gpu_types(workload: Workload) -> None:
    tr = generate_trace(workload, 26_000, rate_per_hour=5.0, seed=2)
    assert set(tr.scale_factor.tolist()) == {1}
    counts = np.bincount(tr.entry, minlength=workload.n_entries)[workload.entries_with_scale_factor(1)]
    assert counts.size == 26 and counts.min() > 850 and counts.max() < 1150


def test_multi_gpu_traces_draw_the_gpu_count_first_then_a_type_measured_at_it(workload: Workload) -> None:
    tr = generate_trace(workload, 20_000, rate_per_hour=5.0, seed=4, multi_gpu=True)
    shares = {c: float((tr.scale_factor == c).mean()) for c in (1, 2, 4, 8)}
    assert shares == pytest.approx({1: 0.70, 2: 0.10, 4: 0.15, 8: 0.05}, abs=0.01)
    assert np.array_equal(workload.scale_factor[tr.entry], tr.scale_factor)
    assert len(np.unique(tr.entry[tr.scale_factor == 8])) == len(workload.entries_with_scale_factor(8)) == 19


def test_poisson_arrivals_have_the_requested_rate_and_static_traces_start_together(workload: Workload) -> None:
    tr = generate_trace(workload, 20_000, rate_per_hour=4.0, seed=5)
    assert tr.arrival_s[0] == 0.0 and np.all(np.diff(tr.arrival_s) >= 0)
    assert np.diff(tr.arrival_s).mean() == pytest.approx(900.0, rel=0.03)
    static = generate_trace(workload, 50, rate_per_hour=None, seed=5)
    assert np.all(static.arrival_s == 0.0)


def test_slos_are_the_duration_times_one_of_three_factors(workload: Workload) -> None:
    tr = generate_trace(workload, 3000, rate_per_hour=5.0, seed=6, slos=True)
    factors = np.round(tr.slo_s / tr.duration_s, 6)
    assert set(factors.tolist()) == {1.2, 2.0, 10.0}
    assert np.all(np.isinf(generate_trace(workload, 10, rate_per_hour=5.0, seed=6).slo_s))


def test_a_non_positive_rate_is_refused(workload: Workload) -> None:
    with pytest.raises(InvalidState, match="rate_per_hour"):
        generate_trace(workload, 10, rate_per_hour=0.0, seed=0)
