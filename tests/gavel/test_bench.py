"""bench_policy: Gavel's benchmark setting and its JSON-able result."""

from __future__ import annotations

import json

import numpy as np

from costopt.gavel.bench import bench_policy, benchmark_state
from costopt.gavel.workload import Workload


def test_benchmark_state_is_gavels_setting(workload: Workload) -> None:
    st = benchmark_state(workload, 64, seed=1)
    assert st.n_jobs == 64 and np.all(st.capacity == 16)
    assert np.all(st.weight == 1) and np.all(st.scale_factor == 1)
    assert set(st.job_type.tolist()) <= set(workload.entries_with_scale_factor(1).tolist())


def test_bench_result_has_the_cli_keys(workload: Workload) -> None:
    res = bench_policy("max_min_fairness_perf", 64, space_sharing=True, workload=workload, repeats=2)
    out = json.loads(json.dumps(res.as_dict()))
    assert set(out) == {"policy", "jobs", "space_sharing", "solve_s", "peak_mem_mb", "objective"}
    assert out["jobs"] == 64 and out["space_sharing"] is True
    assert out["solve_s"] > 0 and out["peak_mem_mb"] > 0 and out["objective"] > 1.0
