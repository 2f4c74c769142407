"""Every policy, on random states: fractions >= 0, each job's time <= 1, capacity never exceeded."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costopt.gavel.formulation import runnable
from costopt.gavel.policies import POLICY_NAMES, get_policy
from costopt.gavel.state import ClusterState


@st.composite
def cluster_states(draw: st.DrawFn, space_sharing: bool = False) -> ClusterState:
    n = draw(st.integers(0, 10))
    j = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    n_kinds = 3
    kinds = rng.integers(0, n_kinds, n)
    base = rng.uniform(0.1, 10.0, (n_kinds, j)) * (rng.random((n_kinds, j)) > 0.15)
    tput = base[kinds]
    pair = rng.uniform(0.0, 1.0, (n_kinds, n_kinds, j)) * base[:, None, :] * (rng.random((n_kinds, n_kinds, j)) > 0.2)
    sf = rng.choice([1, 1, 2, 4], n)
    return ClusterState.create(
        tput,
        rng.integers(0, 5, j).astype(float),
        prices=rng.uniform(0.5, 3.0, j),
        scale_factor=sf,
        weight=rng.choice([1.0, 2.0, 0.5], n),
        steps_remaining=rng.uniform(0, 1e4, n) * (rng.random(n) > 0.1),
        arrival_s=rng.uniform(0, 5e3, n),
        slo_s=np.where(rng.random(n) < 0.5, rng.uniform(1e3, 1e5, n), np.inf),
        job_type=kinds,
        team=rng.integers(0, 2, n),
        team_weights=[1.0, 3.0],
        current_type=rng.integers(-1, j, n),
        now_s=5e3,
        pair_throughput=pair,
        space_sharing=space_sharing,
    )


def _check(name: str, state: ClusterState) -> None:
    alloc = get_policy(name).allocate(state)
    assert alloc.x.shape == (state.n_jobs, state.n_types)
    assert np.array_equal(alloc.job_ids, state.job_ids)
    alloc.check(state.capacity)
    assert np.all(alloc.x >= 0) and np.all(alloc.pair_x >= 0)
    assert np.all(alloc.time_fractions() <= 1 + 1e-6)
    assert np.all(alloc.gpus_used() <= state.capacity + 1e-6)
    # a job never gets time on a type where it cannot run (no throughput, or fewer GPUs than it needs)
    assert np.all(alloc.x[~runnable(state)] == 0)
    assert np.isfinite(alloc.objective) or name.startswith("min_total_duration")


@pytest.mark.parametrize("name", POLICY_NAMES)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=cluster_states())
def test_allocations_fit_the_cluster(name: str, state: ClusterState) -> None:
    _check(name, state)


@pytest.mark.parametrize("name", POLICY_NAMES)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=cluster_states(space_sharing=True))
def test_allocations_with_space_sharing_fit_the_cluster(name: str, state: ClusterState) -> None:
    _check(name, state)
