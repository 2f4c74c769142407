"""Finish-time fairness, makespan, FIFO, throughput, cost with SLOs and hierarchies: hand-computed
optima, and agreement with brute force over a grid of allocations on tiny instances."""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt
import pytest

from costopt.gavel.bench import benchmark_state
from costopt.gavel.policies import get_policy
from costopt.gavel.state import ClusterState
from costopt.gavel.workload import Workload

GRID = 24  # grid steps per time fraction in brute-force searches


def _grid(n_jobs: int, n_types: int, capacity: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Every allocation (k, n_jobs, n_types) with fractions on a 1/GRID grid that fits."""
    steps = np.linspace(0.0, 1.0, GRID + 1)
    pts = np.array(list(itertools.product(steps, repeat=n_jobs * n_types))).reshape(-1, n_jobs, n_types)
    ok = (pts.sum(axis=2) <= 1 + 1e-12).all(axis=1) & (pts.sum(axis=1) <= capacity + 1e-12).all(axis=1)
    out: npt.NDArray[np.float64] = pts[ok]
    return out


def _tiny(seed: int) -> ClusterState:
    rng = np.random.default_rng(seed)
    return ClusterState.create(
        rng.uniform(0.5, 4.0, (2, 2)),
        [1, 1],
        steps_remaining=rng.uniform(100, 1000, 2),
        arrival_s=[0.0, 0.0],
        now_s=rng.uniform(0, 500),
        prices=[3.0, 1.0],
    )


@pytest.mark.parametrize("seed", range(4))
def test_max_min_fairness_matches_brute_force(seed: int) -> None:
    st = _tiny(seed)
    grid = _grid(2, 2, st.capacity)
    levels = (grid * st.throughput).sum(axis=2) / st.equal_share_throughput()
    best = levels.min(axis=1).max()
    got = get_policy("max_min_fairness_perf").allocate(st).objective
    assert best <= got + 1e-9  # nothing on the grid beats the LP
    assert got - best < 0.1  # and the grid comes close to it


@pytest.mark.parametrize("seed", range(4))
def test_finish_time_fairness_matches_brute_force(seed: int) -> None:
    st = _tiny(seed)
    grid = _grid(2, 2, st.capacity)
    tau = (grid * st.throughput).sum(axis=2)
    e, r, n = st.elapsed_s, st.steps_remaining, st.equal_share_throughput()
    with np.errstate(divide="ignore"):
        rho = (e + r / tau) / (e + r / n)
    best = rho.max(axis=1).min()
    got = get_policy("finish_time_fairness_perf").allocate(st)
    assert got.objective <= best + 1e-6
    assert best - got.objective < 0.1
    achieved = (e + r / got.effective_throughput(st)) / (e + r / n)
    assert achieved.max() == pytest.approx(got.objective, rel=1e-3)


@pytest.mark.parametrize("seed", range(4))
def test_min_total_duration_matches_brute_force(seed: int) -> None:
    st = _tiny(seed)
    grid = _grid(2, 2, st.capacity)
    tau = (grid * st.throughput).sum(axis=2)
    with np.errstate(divide="ignore"):
        best = (st.steps_remaining / tau).max(axis=1).min()
    got = get_policy("min_total_duration_perf").allocate(st)
    assert got.objective <= best * (1 + 1e-6)
    assert (best - got.objective) / best < 0.1
    assert (st.steps_remaining / got.effective_throughput(st)).max() <= got.objective * (1 + 1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_max_sum_throughput_matches_brute_force(seed: int) -> None:
    st = _tiny(seed)
    grid = _grid(2, 2, st.capacity)
    speed = ((grid * st.throughput).sum(axis=2) / st.throughput.max(axis=1)).sum(axis=1)
    got = get_policy("max_sum_throughput_perf").allocate(st).objective
    assert speed.max() <= got + 1e-9
    assert got - speed.max() < 0.1


@pytest.mark.parametrize("seed", range(4))
def test_throughput_per_dollar_matches_brute_force(seed: int) -> None:
    st = _tiny(seed)
    grid = _grid(2, 2, st.capacity)[1:]  # the all-zero allocation has no ratio
    speed = ((grid * st.throughput).sum(axis=2) / st.throughput.max(axis=1)).sum(axis=1)
    cost = (grid.sum(axis=1) * st.prices).sum(axis=1)
    got = get_policy("max_sum_throughput_normalized_by_cost_perf").allocate(st)
    assert (speed / cost).max() <= got.objective + 1e-9
    alloc_speed = (got.effective_throughput(st) / st.throughput.max(axis=1)).sum()
    assert alloc_speed / got.stats["cost_usd_per_h"] == pytest.approx(got.objective, rel=1e-5)


def test_makespan_of_two_equal_jobs_on_one_gpu_is_their_total_work() -> None:
    st = ClusterState.create([[1.0], [1.0]], [1], steps_remaining=[100.0, 300.0])
    alloc = get_policy("min_total_duration_perf").allocate(st)
    assert alloc.objective == pytest.approx(400.0)
    assert np.allclose(alloc.x, [[0.25], [0.75]])


def test_makespan_aware_puts_the_long_job_on_the_fast_type() -> None:
    st = ClusterState.create([[2.0, 1.0], [2.0, 1.0]], [1, 1], steps_remaining=[1000.0, 100.0])
    aware = get_policy("min_total_duration_perf").allocate(st)
    agnostic = get_policy("min_total_duration").allocate(st)
    # all of the fast GPU to the long job: it needs 1000 / (2 x + 1 (1 - x)) ... equalized with the short one
    assert aware.objective < agnostic.objective
    assert aware.x[0, 0] > aware.x[1, 0]


def test_finish_time_fairness_of_fresh_jobs_is_the_inverse_of_the_max_min_level() -> None:
    # with no time elapsed, rho_m = N_m / tau_m: minimizing the largest rho is max-min fairness
    st = ClusterState.create([[4.0, 1.0], [1.0, 2.0]], [1, 1], steps_remaining=[100.0, 900.0])
    alloc = get_policy("finish_time_fairness_perf").allocate(st)
    assert alloc.objective == pytest.approx(0.75, rel=1e-4)
    assert alloc.x[1].tolist() == pytest.approx([0.0, 1.0], abs=1e-6)


def test_finish_time_fairness_favours_the_job_furthest_behind_its_isolated_finish() -> None:
    # job 0 waited 900 s without progress and has 1000 steps left: rho counts that wait
    st = ClusterState.create(
        [[1.0], [1.0]], [1], steps_remaining=[1000.0, 1000.0], arrival_s=[0.0, 900.0], now_s=1000.0
    )
    alloc = get_policy("finish_time_fairness_perf").allocate(st)
    e, r, n = st.elapsed_s, st.steps_remaining, st.equal_share_throughput()
    rho = (e + r / alloc.effective_throughput(st)) / (e + r / n)
    assert rho.max() == pytest.approx(alloc.objective, rel=1e-4)
    assert rho[0] == pytest.approx(rho[1], rel=1e-3)  # both bind at the optimum


def test_fifo_runs_the_earliest_jobs_whole_and_stops_at_the_first_that_does_not_fit() -> None:
    st = ClusterState.create([[1.0, 1.0]] * 4, [2, 1], scale_factor=[1, 2, 1, 1], arrival_s=[0, 1, 2, 3])
    alloc = get_policy("fifo_perf").allocate(st)
    # job 0 takes one GPU of a; job 1 (2 GPUs) fits nowhere now -> jobs 2 and 3 must wait behind it
    assert alloc.x.tolist() == [[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]
    assert alloc.objective == 1


def test_fifo_perf_picks_the_fastest_free_type_and_fifo_keeps_the_current_one() -> None:
    st = ClusterState.create([[1.0, 3.0], [1.0, 3.0]], [1, 1], arrival_s=[0, 1], current_type=[0, -1])
    perf = get_policy("fifo_perf").allocate(st)
    assert perf.x.tolist() == [[0.0, 1.0], [1.0, 0.0]]
    agnostic = get_policy("fifo").allocate(st)
    assert agnostic.x.tolist() == [[1.0, 0.0], [0.0, 1.0]]


def test_cost_policy_takes_the_cheapest_throughput_without_slos() -> None:
    # type a: 2 steps/s at 3 $/h, type b: 1 step/s at 1 $/h -> b gives more speed per dollar
    st = ClusterState.create([[2.0, 1.0]], [1, 1], prices=[3.0, 1.0], steps_remaining=[1000.0])
    alloc = get_policy("max_sum_throughput_normalized_by_cost_perf").allocate(st)
    assert np.allclose(alloc.x, [[0.0, 1.0]], atol=1e-6)
    assert alloc.objective == pytest.approx(0.5)


def test_cost_policy_meets_an_slo_at_the_lowest_cost_per_step() -> None:
    # 1.5 steps/s needed: half a, half b is the cheapest mix that reaches it
    st = ClusterState.create([[2.0, 1.0]], [1, 1], prices=[3.0, 1.0], steps_remaining=[1500.0], slo_s=[1000.0])
    alloc = get_policy("max_sum_throughput_normalized_by_cost_perf_SLOs").allocate(st)
    assert np.allclose(alloc.x, [[0.5, 0.5]], atol=1e-6)
    assert alloc.objective == pytest.approx(0.375)
    assert alloc.stats["slo_relaxed"] == 0.0 and alloc.notes == ()


def test_infeasible_slos_are_dropped_and_reported() -> None:
    st = ClusterState.create([[2.0, 1.0]], [1, 1], prices=[3.0, 1.0], steps_remaining=[3000.0], slo_s=[1000.0])
    alloc = get_policy("max_sum_throughput_normalized_by_cost_perf_SLOs").allocate(st)
    assert alloc.stats["slo_relaxed"] == 1.0
    assert "SLOs infeasible" in alloc.notes[0]
    assert np.allclose(alloc.x, [[0.0, 1.0]], atol=1e-6)


def test_a_passed_deadline_is_reported_not_divided_by_zero() -> None:
    st = ClusterState.create([[2.0, 1.0]], [1, 1], prices=[3.0, 1.0], steps_remaining=[10.0], slo_s=[5.0], now_s=10.0)
    alloc = get_policy("max_sum_throughput_normalized_by_cost_perf_SLOs").allocate(st)
    assert alloc.stats["slo_relaxed"] == 1.0 and "past due" in alloc.notes[0]


def test_teams_share_by_weight_then_their_jobs_share_equally() -> None:
    st = ClusterState.create([[1.0]] * 3, [1], team=[0, 0, 1], team_weights=[1.0, 1.0])
    alloc = get_policy("hierarchical_fairness_perf").allocate(st)
    assert np.allclose(alloc.x.ravel(), [0.25, 0.25, 0.5])
    heavy = ClusterState.create([[1.0]] * 3, [1], team=[0, 0, 1], team_weights=[3.0, 1.0])
    alloc = get_policy("hierarchical_fairness_perf").allocate(heavy)
    assert np.allclose(alloc.x.ravel(), [0.375, 0.375, 0.25])


def test_fifo_within_a_team_gives_its_share_to_its_oldest_job() -> None:
    st = ClusterState.create([[1.0]] * 3, [1], team=[0, 0, 1], team_weights=[1.0, 1.0], arrival_s=[5.0, 1.0, 0.0])
    alloc = get_policy("hierarchical_fifo_perf").allocate(st)
    assert np.allclose(alloc.x.ravel(), [0.0, 0.5, 0.5])


def test_state_dependent_policies_handle_2048_jobs(workload: Workload) -> None:
    # 2048 single-GPU jobs on 3 x 512 GPUs: more jobs than GPUs, so a policy that leaves GPUs idle or a
    # job without progress is visible (an empty allocation would pass ``check`` alone)
    st = benchmark_state(workload, 2048, seed=1)
    assert st.n_jobs == 2048 and st.capacity.tolist() == [512.0] * 3

    ftf = get_policy("finish_time_fairness_perf").allocate(st)
    ftf.check(st.capacity)
    e, r, n = st.elapsed_s, st.steps_remaining, st.equal_share_throughput()
    tau = ftf.effective_throughput(st)
    assert (tau > 0).all()  # every job progresses
    rho = (e + r / tau) / (e + r / n)
    assert rho.max() == pytest.approx(ftf.objective, rel=1e-3)
    assert ftf.objective <= 1 + 1e-6  # the equal share is feasible (rho = 1), so the optimum is no worse
    assert ftf.gpus_used() == pytest.approx(st.capacity, rel=1e-6)  # no GPU left idle

    fifo = get_policy("fifo_perf").allocate(st)
    fifo.check(st.capacity)
    assert fifo.objective == 1536  # jobs running = GPUs
    assert fifo.gpus_used().tolist() == [512.0] * 3
    whole = fifo.x.max(axis=1)
    assert sorted(set(whole.tolist())) == [0.0, 1.0] and ((fifo.x > 0).sum(axis=1) <= 1).all()
    running = np.flatnonzero(whole == 1.0)
    earliest = np.argsort(st.arrival_s, kind="stable")[:1536]
    assert set(running.tolist()) == set(earliest.tolist())  # first come, first served
    first = int(earliest[0])  # the first job finds every GPU free and takes its fastest type
    assert int(fifo.x[first].argmax()) == int(st.throughput[first].argmax())
