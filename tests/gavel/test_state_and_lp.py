"""ClusterState validation, Allocation accounting and the LP wrapper's typed errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp

from costopt.errors import CostoptError
from costopt.gavel.errors import Infeasible, InvalidState, SolverFailed, UnknownPolicy
from costopt.gavel.lp import solve_lp
from costopt.gavel.policies import POLICY_NAMES, get_policy
from costopt.gavel.state import Allocation, ClusterState


def test_create_fills_defaults_per_job() -> None:
    st = ClusterState.create([[1.0, 2.0], [3.0, 0.0]], [1, 2])
    assert st.n_jobs == 2 and st.n_types == 2
    assert st.job_ids.tolist() == [0, 1] and st.scale_factor.tolist() == [1, 1]
    assert np.all(np.isinf(st.slo_s)) and st.current_type.tolist() == [-1, -1]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"throughput": [[-1.0]], "capacity": [1]}, "throughputs"),
        ({"throughput": [[np.nan]], "capacity": [1]}, "throughputs"),
        ({"throughput": [[1.0]], "capacity": [1, 2]}, "one distinct entry per type"),
        ({"throughput": [[1.0]], "capacity": [1], "scale_factor": [0]}, "scale_factor"),
        ({"throughput": [[1.0]], "capacity": [1], "weight": [0.0]}, "weights"),
        ({"throughput": [[1.0], [1.0]], "capacity": [1], "job_ids": [3, 3]}, "unique"),
        ({"throughput": [[1.0]], "capacity": [1], "space_sharing": True}, "pair_throughput"),
    ],
)
def test_invalid_states_are_refused_with_a_typed_error(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(InvalidState, match=fragment):
        ClusterState.create(**kwargs)  # type: ignore[arg-type]


def test_states_are_read_only() -> None:
    st = ClusterState.create([[1.0]], [1])
    with pytest.raises(ValueError, match="read-only"):
        st.throughput[0, 0] = 5.0


def test_equal_share_gives_each_job_one_nth_of_every_type() -> None:
    st = ClusterState.create([[4.0, 1.0], [2.0, 2.0]], [1, 1])
    # n = 2, 2 GPUs: each job gets half of each type's GPU -> time 1/2 on each type
    assert np.allclose(st.equal_share_throughput(), [2.5, 2.0])


def test_allocation_counts_a_pair_once_for_gpus_and_once_per_member_for_time() -> None:
    alloc = Allocation(
        policy="p",
        job_ids=np.array([7, 8, 9]),
        worker_types=("a",),
        scale_factor=np.array([2, 2, 1]),
        x=np.array([[0.25], [0.0], [0.5]]),
        pairs=np.array([[0, 1]]),
        pair_x=np.array([[0.5]]),
    )
    assert np.allclose(alloc.time_fractions(), [0.75, 0.5, 0.5])
    assert np.allclose(alloc.gpus_used(), [2 * 0.25 + 0.5 + 2 * 0.5])
    alloc.check([2.0])
    with pytest.raises(InvalidState, match="capacity"):
        alloc.check([1.9])
    json.dumps(alloc.as_dict())


def test_allocation_check_refuses_overcommitted_jobs_and_negative_fractions() -> None:
    over = Allocation(
        policy="p", job_ids=np.array([0]), worker_types=("a", "b"), scale_factor=np.array([1]), x=np.array([[0.7, 0.7]])
    )
    with pytest.raises(InvalidState, match="> 1"):
        over.check([5.0, 5.0])
    neg = Allocation(
        policy="p", job_ids=np.array([0]), worker_types=("a",), scale_factor=np.array([1]), x=np.array([[-0.1]])
    )
    with pytest.raises(InvalidState, match="negative"):
        neg.check([5.0])


def test_solver_infeasibility_is_a_typed_error_with_the_reason() -> None:
    a = sp.csr_matrix(np.array([[1.0], [1.0]]))
    with pytest.raises(Infeasible, match="toy: solver returned Infeasible") as info:
        solve_lp([1.0], a, [2.0, -np.inf], [np.inf, 1.0], what="toy")
    assert isinstance(info.value, CostoptError)


def test_an_unbounded_lp_is_a_solver_failure_not_an_optimum() -> None:
    a = sp.csr_matrix(np.array([[1.0]]))
    with pytest.raises(SolverFailed) as info:
        solve_lp([1.0], a, [0.0], [np.inf], maximize=True, what="toy")
    assert not isinstance(info.value, Infeasible)


def test_every_registered_name_builds_a_policy_of_that_name() -> None:
    for name in POLICY_NAMES:
        assert get_policy(name).name == name
    for gavel_name in (
        "max_min_fairness",
        "max_min_fairness_perf",
        "finish_time_fairness",
        "finish_time_fairness_perf",
        "min_total_duration",
        "min_total_duration_perf",
        "fifo",
        "fifo_perf",
        "max_sum_throughput_perf",
        "max_sum_throughput_normalized_by_cost_perf",
        "max_sum_throughput_normalized_by_cost_perf_SLOs",
    ):
        assert gavel_name in POLICY_NAMES


def test_an_unknown_policy_name_lists_the_known_ones() -> None:
    with pytest.raises(UnknownPolicy, match="max_min_fairness_perf"):
        get_policy("lottery")
