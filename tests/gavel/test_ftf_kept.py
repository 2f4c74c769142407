"""Per-job LPs kept between calls (slot layout, :class:`SlotModels`, :class:`KeptModel`): a sequence of
allocations with jobs arriving, progressing and leaving agrees with fresh solves at every step, and a
simulation stays deterministic per seed."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pytest
import scipy.sparse as sp

from costopt.gavel.formulation import agnostic_mix
from costopt.gavel.lp import KeptModel, SlotModels, forget_kept_models, slot_models, solve_lp
from costopt.gavel.policies import FinishTimeFairness, MaxThroughputPerDollar, MinTotalDuration, Policy
from costopt.gavel.policies.finish_time import FTF_TOLERANCE
from costopt.gavel.simulator import simulate
from costopt.gavel.state import Allocation, ClusterState
from costopt.gavel.workload import Workload

HOUR = 3600.0


def _states(workload: Workload, *, seed: int, multi_gpu: bool, steps: int = 30) -> Iterator[ClusterState]:
    """States of a cluster over time: a few arrivals and departures per step, a burst of arrivals
    (the slots double) and a mass departure (the slots are renumbered); the jobs progress and wait.
    A third of the jobs have an SLO."""
    rng = np.random.default_rng(seed)
    sfs = (1, 2, 4) if multi_gpu else (1,)
    cap = np.array([8.0, 8.0, 8.0])
    jobs: dict[int, tuple[int, float, float, float]] = {}  # id -> (entry, steps left, arrival, SLO)
    next_id = 0
    now = 0.0
    for step in range(steps):
        arrivals = 40 if step == 6 else int(rng.integers(0, 4))
        for _ in range(arrivals):
            entry = int(rng.choice(workload.entries_with_scale_factor(int(rng.choice(sfs)))))
            work = float(rng.uniform(1e3, 1e5))
            slo = float(rng.uniform(0.1, 20) * HOUR) if rng.random() < 1 / 3 else np.inf
            jobs[next_id] = (entry, work, now - float(rng.uniform(0, 600)), slo)
            next_id += 1
        leaving = list(jobs)[: len(jobs) - 4] if step == 18 else [j for j in jobs if rng.random() < 0.08]
        for j in leaving:
            del jobs[j]
        for j, (entry, work, arrival, slo) in list(jobs.items()):  # progress, some of it
            jobs[j] = (entry, work * float(rng.uniform(0.7, 1.0)), arrival, slo)
        if not jobs:
            continue
        ids = np.array(sorted(jobs))
        entries = np.array([jobs[j][0] for j in ids])
        yield ClusterState.create(
            workload.consolidated[entries],
            cap,
            worker_types=workload.worker_types,
            prices=[2.48, 1.46, 0.45],
            job_ids=ids,
            scale_factor=workload.scale_factor[entries],
            steps_remaining=[jobs[j][1] for j in ids],
            arrival_s=[jobs[j][2] for j in ids],
            slo_s=[jobs[j][3] for j in ids],
            job_type=entries,
            now_s=now,
        )
        now += 360.0


def _rho(state: ClusterState, alloc: Allocation, norm: np.ndarray) -> float:
    e, r = state.elapsed_s, state.steps_remaining
    tau = alloc.effective_throughput(state)
    act = (r > 0) & (norm > 0)
    with np.errstate(divide="ignore"):
        return float(((e + np.where(tau > 0, r / tau, np.inf)) / (e + r / np.where(act, norm, 1.0)))[act].max())


def _warm_then_cold(policy: Policy, states: list[ClusterState]) -> tuple[list[Allocation], list[Allocation]]:
    """Allocations of ``states`` in sequence (kept LPs), then each one again from a cold start."""
    forget_kept_models()
    warm = [policy.allocate(s) for s in states]
    cold = []
    for s in states:
        forget_kept_models()
        cold.append(policy.allocate(s))
    return warm, cold


@pytest.mark.parametrize("aware", [True, False])
@pytest.mark.parametrize("multi_gpu", [False, True])
def test_kept_finish_time_fairness_agrees_with_fresh_solves(workload: Workload, aware: bool, multi_gpu: bool) -> None:
    states = list(_states(workload, seed=1 if multi_gpu else 0, multi_gpu=multi_gpu))
    name = "finish_time_fairness_perf" if aware else "finish_time_fairness"
    kept = FinishTimeFairness(name=name, aware=aware)
    warm, cold = _warm_then_cold(kept, states)
    reference = FinishTimeFairness(name=name, aware=aware, reference=True)
    assert max(s.n_jobs for s in states) > 32  # the slots doubled ...
    assert any(a.n_jobs > 4 * b.n_jobs for a, b in itertools.pairwise(states))  # ... and shrank
    for state, w, c in zip(states, warm, cold, strict=True):
        ref = reference.allocate(state)
        w.check(state.capacity)
        assert np.all(w.x[~state.runnable()] == 0)
        for other in (c, ref):  # each is within the tolerance above the optimum
            assert abs(w.objective - other.objective) <= FTF_TOLERANCE * max(w.objective, other.objective)
        assert w.stats["lower_bound_rho"] <= ref.objective * (1 + 1e-9)
        # the reported max rho is the allocation's
        norm = state.equal_share_throughput() if aware else _agnostic_norm(state)
        assert _rho(state, w, norm) == pytest.approx(w.objective, rel=1e-6)


def _agnostic_norm(state: ClusterState) -> np.ndarray:
    total = state.capacity.sum()
    frac = np.minimum(1.0, total / (state.n_jobs * state.scale_factor))
    out: np.ndarray = frac * (agnostic_mix(state) * state.throughput).sum(axis=1)
    return out


@pytest.mark.parametrize("aware", [True, False])
@pytest.mark.parametrize("multi_gpu", [False, True])
def test_kept_min_total_duration_agrees_with_fresh_solves(workload: Workload, aware: bool, multi_gpu: bool) -> None:
    states = list(_states(workload, seed=3, multi_gpu=multi_gpu))
    name = "min_total_duration_perf" if aware else "min_total_duration"
    warm, cold = _warm_then_cold(MinTotalDuration(name=name, aware=aware), states)
    reference = MinTotalDuration(name=name, aware=aware, reference=True)
    for state, w, c in zip(states, warm, cold, strict=True):
        w.check(state.capacity)
        ref = reference.allocate(state)
        assert w.objective == pytest.approx(ref.objective, rel=1e-6)
        assert c.objective == pytest.approx(ref.objective, rel=1e-6)
        finish = state.steps_remaining / w.effective_throughput(state)
        assert finish.max() <= w.objective * (1 + 1e-5)
        # the Pareto stage: no less total normalized throughput than the fresh LP's
        n = state.equal_share_throughput() if aware else _agnostic_norm(state)
        assert (w.effective_throughput(state) / n).sum() >= (ref.effective_throughput(state) / n).sum() * (1 - 1e-6)


@pytest.mark.parametrize("multi_gpu", [False, True])
def test_kept_cost_policy_with_slos_agrees_with_fresh_solves(workload: Workload, multi_gpu: bool) -> None:
    states = list(_states(workload, seed=4, multi_gpu=multi_gpu))
    name = "max_sum_throughput_normalized_by_cost_perf_SLOs"
    warm, cold = _warm_then_cold(MaxThroughputPerDollar(name=name, slos=True), states)
    reference = MaxThroughputPerDollar(name=name, slos=True, reference=True)
    relaxed = []
    for state, w, c in zip(states, warm, cold, strict=True):
        w.check(state.capacity)
        ref = reference.allocate(state)
        relaxed.append(ref.stats["slo_relaxed"])
        assert w.stats["slo_relaxed"] == ref.stats["slo_relaxed"] == c.stats["slo_relaxed"]
        assert w.objective == pytest.approx(ref.objective, rel=1e-6)
        assert c.objective == pytest.approx(ref.objective, rel=1e-6)
        assert w.stats["total_speed"] == pytest.approx(ref.stats["total_speed"], rel=1e-5)
    assert 0 < np.mean(relaxed) < 1, relaxed  # both kinds of steps were seen


@pytest.mark.parametrize(
    "name", ["finish_time_fairness_perf", "min_total_duration_perf", "max_sum_throughput_normalized_by_cost_perf_SLOs"]
)
def test_a_simulation_with_kept_lps_is_deterministic_per_seed(workload: Workload, name: str) -> None:
    def run(seed: int) -> dict[str, object]:
        res = simulate(name, "4:4:4", rate=2.0, seed=seed, window=(5, 25), workload=workload, round_s=HOUR, slos=True)
        return {k: v for k, v in res.as_dict().items() if k not in ("wall_s", "solve_s")}

    first = run(3)
    other = run(4)  # leaves its kept models behind
    assert run(3) == first
    assert other != first


def test_slots_keep_their_jobs_and_double_when_full() -> None:
    slots = SlotModels("toy")
    assert slots.assign([5, 6, 7], 1.0).tolist() == [0, 1, 2]
    assert slots.n_slots == 16
    assert slots.assign([6, 7, 8, 9], 2.0).tolist() == [1, 2, 0, 3]  # 8 takes 5's slot
    model = slots.model("stage")
    big = slots.assign([6, 7, 8, 9, *range(100, 120)], 3.0)
    assert slots.n_slots == 32 and big[:4].tolist() == [1, 2, 0, 3] and sorted(big[4:].tolist()) == list(range(4, 24))
    assert slots.model("stage") is model
    # cold starts (models dropped, slots numbered anew): at most a quarter of the slots used, ...
    assert slots.assign([101, 100], 4.0).tolist() == [0, 1] and slots.n_slots == 16
    assert slots.model("stage") is not model
    model = slots.model("stage")
    slots.assign([100, 101], 4.0)  # ... a clock not later than the last call's, ...
    assert slots.model("stage") is not model
    model = slots.model("stage")
    assert slots.assign([7], 5.0).tolist() == [0]  # ... no job staying
    assert slots.model("stage") is not model


def test_forget_kept_models_drops_slot_models() -> None:
    first = slot_models("toy")
    assert slot_models("toy") is first
    forget_kept_models()
    assert slot_models("toy") is not first


def test_a_kept_model_re_solves_changed_lps_like_fresh_ones() -> None:
    rng = np.random.default_rng(0)
    model = KeptModel("toy")
    for _ in range(30):
        a = sp.csr_matrix(rng.uniform(0.5, 2.0, (4, 6)))
        c = rng.uniform(0.0, 1.0, 6)
        upper = np.where(rng.random(6) < 0.3, 0.0, np.inf)  # fixed columns: their entries are not sent
        row_upper = np.where(rng.random(4) < 0.3, np.inf, rng.uniform(1.0, 3.0, 4))  # free rows: not sent
        row_upper[0] = 2.0  # keeps the LP bounded
        row_lower = np.full(4, -np.inf)
        model.load(c, a, row_lower, row_upper, None, upper, maximize=True)
        got = model.solve()
        fresh = solve_lp(c, a, row_lower, row_upper, None, upper, maximize=True, what="toy", warm=False)
        assert got is not None and got.objective == pytest.approx(fresh.objective, rel=1e-9, abs=1e-12)


def test_a_row_free_at_load_cannot_be_bounded_later() -> None:
    model = KeptModel("toy")
    model.load([1.0], sp.csr_matrix([[1.0], [1.0]]), [-np.inf, -np.inf], [1.0, np.inf], maximize=True)
    model.set_row_bounds([0], -np.inf, 0.5)
    sol = model.solve()
    assert sol is not None and sol.objective == pytest.approx(0.5)
    with pytest.raises(ValueError, match="free"):
        model.set_row_bounds([1], 0.0, np.inf)
