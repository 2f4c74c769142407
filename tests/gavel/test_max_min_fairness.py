"""Max-min fairness: hand-computed optima, the merged formulation equals the per-job one, and the
Pareto second stage."""

from __future__ import annotations

import numpy as np
import pytest

from costopt.gavel.bench import benchmark_state
from costopt.gavel.policies import MaxMinFairness, get_policy
from costopt.gavel.state import ClusterState
from costopt.gavel.workload import Workload


def test_two_jobs_on_one_gpu_share_it_equally() -> None:
    st = ClusterState.create([[1.0], [3.0]], [1])
    alloc = get_policy("max_min_fairness_perf").allocate(st)
    assert np.allclose(alloc.x, [[0.5], [0.5]])
    assert alloc.objective == pytest.approx(1.0)


def test_weights_scale_the_share_a_job_is_owed() -> None:
    st = ClusterState.create([[1.0], [1.0]], [1], weight=[1.0, 3.0])
    alloc = get_policy("max_min_fairness_perf").allocate(st)
    assert np.allclose(alloc.x, [[0.25], [0.75]])
    assert alloc.objective == pytest.approx(0.5)


def test_aware_policy_gives_each_job_the_type_it_is_relatively_fastest_on() -> None:
    # job 0 is 4x faster on type a, job 1 2x faster on type b: swapping raises both above equal share.
    st = ClusterState.create([[4.0, 1.0], [1.0, 2.0]], [1, 1])
    aware = MaxMinFairness(pareto=False).allocate(st)  # the max-min LP alone
    agnostic = get_policy("max_min_fairness").allocate(st)
    assert np.allclose(aware.x[1], [0.0, 1.0], atol=1e-7) and aware.x[0, 1] == pytest.approx(0.0, abs=1e-7)
    assert aware.objective == pytest.approx(4.0 / 3.0)  # job 1: 2 steps/s over its equal share 1.5
    # max-min stops at job 0's level 4/3 (x = 5/6 of type a); the Pareto stage (the registry's aware
    # LAS) gives it all of a
    pareto = get_policy("max_min_fairness_perf").allocate(st)
    assert pareto.objective == pytest.approx(4.0 / 3.0)
    assert np.allclose(pareto.x, [[1.0, 0.0], [0.0, 1.0]], atol=1e-6)
    assert agnostic.objective == pytest.approx(1.0)
    assert np.allclose(agnostic.x, [[0.5, 0.5], [0.5, 0.5]])


def test_a_multi_gpu_job_gets_less_time_for_the_same_share_of_gpus() -> None:
    st = ClusterState.create([[1.0], [1.0]], [2], scale_factor=[2, 1])
    alloc = get_policy("max_min_fairness_perf").allocate(st)
    assert np.allclose(alloc.x, [[0.5], [1.0]])
    assert np.allclose(alloc.gpus_used(), [2.0])


def test_space_sharing_runs_a_compatible_pair_together_all_the_time() -> None:
    # alone 1 step/s each; together 0.8 each: co-location beats time-slicing (0.5 each).
    pair = np.full((1, 1, 1), 0.8)
    st = ClusterState.create([[1.0], [1.0]], [1], job_type=[0, 0], pair_throughput=pair, space_sharing=True)
    alloc = get_policy("max_min_fairness_perf").allocate(st)
    assert alloc.objective == pytest.approx(1.6)
    assert alloc.pairs.tolist() == [[0, 1]]
    assert np.allclose(alloc.pair_x, [[1.0]])
    assert np.allclose(alloc.effective_throughput(st), [0.8, 0.8])


def test_pareto_stage_uses_the_gpu_time_max_min_is_indifferent_to() -> None:
    # job 1 runs at 1 step/s anywhere, so its level is capped at 1 whatever job 0 gets; job 0 is 4x
    # faster on type a. Max-min fixes the level at 1; only the second stage must put job 0 on a.
    st = ClusterState.create([[4.0, 1.0], [1.0, 1.0]], [1, 1])
    first = MaxMinFairness(pareto=False).allocate(st)
    second = get_policy("max_min_fairness_perf").allocate(st)
    assert first.objective == pytest.approx(1.0) and second.objective == pytest.approx(1.0)
    assert second.stats["total_normalized_throughput"] == pytest.approx(4.0 / 2.5 + 1.0, rel=1e-6)
    assert np.allclose(second.x, [[1.0, 0.0], [0.0, 1.0]], atol=1e-6)
    levels = second.effective_throughput(st) / st.equal_share_throughput()
    assert levels.min() >= 1.0 - 1e-6


def test_pareto_stage_fills_gpus_a_lone_capped_job_leaves_idle(workload: Workload) -> None:
    # Few jobs, many GPUs: every job can run all the time; the first stage need not pick fast types.
    st = benchmark_state(workload, 6, gpus_per_type=4, seed=3)
    first = MaxMinFairness(pareto=False).allocate(st)
    second = get_policy("max_min_fairness_perf").allocate(st)
    t1, t2 = first.effective_throughput(st), second.effective_throughput(st)
    assert np.all(t2 >= second.objective * st.equal_share_throughput() - 1e-6)
    assert (t2 / st.equal_share_throughput()).sum() >= (t1 / st.equal_share_throughput()).sum() - 1e-6
    assert np.allclose(second.time_fractions(), 1.0)


def test_the_pareto_name_is_an_alias_of_the_aware_las() -> None:
    """Fleets stored with the old name get the same policy (the aware LAS takes the Pareto stage)."""
    from costopt.gavel.policies import POLICIES

    assert POLICIES.canonical("max_min_fairness_pareto_perf") == "max_min_fairness_perf"
    old, new = get_policy("max_min_fairness_pareto_perf"), get_policy("max_min_fairness_perf")
    assert isinstance(old, MaxMinFairness) and old == new and old.pareto and old.aware
    agnostic = get_policy("max_min_fairness")
    assert isinstance(agnostic, MaxMinFairness) and not agnostic.pareto  # the agnostic baseline: one LP


@pytest.mark.parametrize(("n", "space_sharing"), [(24, False), (200, False), (16, True), (48, True), (96, True)])
def test_merging_interchangeable_jobs_matches_the_per_job_optimum(
    workload: Workload, n: int, space_sharing: bool
) -> None:
    st = benchmark_state(workload, n, seed=n, space_sharing=space_sharing)
    merged = MaxMinFairness(merge=True).allocate(st)
    per_job = MaxMinFairness(merge=False).allocate(st)
    assert merged.stats["lp_classes"] < per_job.stats["lp_classes"]
    assert merged.objective == pytest.approx(per_job.objective, abs=1e-6)
    merged.check(st.capacity)
    levels = merged.effective_throughput(st) / st.equal_share_throughput()
    assert levels.min() == pytest.approx(merged.objective, abs=1e-6)


@pytest.mark.parametrize("space_sharing", [False, True])
def test_merged_pareto_stage_matches_the_per_job_one(workload: Workload, space_sharing: bool) -> None:
    st = benchmark_state(workload, 40, seed=5, space_sharing=space_sharing)
    merged = MaxMinFairness(pareto=True, merge=True).allocate(st)
    per_job = MaxMinFairness(pareto=True, merge=False).allocate(st)
    assert merged.objective == pytest.approx(per_job.objective, abs=1e-6)
    a, b = merged.stats["total_normalized_throughput"], per_job.stats["total_normalized_throughput"]
    assert a == pytest.approx(b, rel=1e-6)


def test_weighted_classes_are_merged_only_with_equal_weights(workload: Workload) -> None:
    base = benchmark_state(workload, 30, seed=9)
    weights = np.where(np.arange(30) % 3 == 0, 2.0, 1.0)
    st = ClusterState.create(base.throughput, base.capacity, weight=weights, job_type=base.job_type)
    merged = MaxMinFairness(merge=True).allocate(st)
    per_job = MaxMinFairness(merge=False).allocate(st)
    assert merged.objective == pytest.approx(per_job.objective, abs=1e-6)
    levels = merged.effective_throughput(st) / st.equal_share_throughput() / weights
    assert levels.min() == pytest.approx(merged.objective, abs=1e-6)


def test_aware_max_min_is_never_below_agnostic(workload: Workload) -> None:
    for seed in range(5):
        st = benchmark_state(workload, 30, seed=seed, gpus_per_type=5)
        aware = get_policy("max_min_fairness_perf").allocate(st)
        agnostic = get_policy("max_min_fairness").allocate(st)
        assert aware.objective >= agnostic.objective - 1e-9
        assert aware.objective > 1.05  # heterogeneity pays on Gavel's measured throughputs
