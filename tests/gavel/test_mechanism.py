"""The round mechanism: shares converge to the allocation, GPUs are never oversubscribed, jobs stay
on their GPUs when they can, multi-GPU jobs are consolidated, and moves are counted."""

from __future__ import annotations

import numpy as np
import pytest

from costopt.gavel.errors import InvalidState
from costopt.gavel.mechanism import RoundMechanism, RoundPlan, fastest_first


def _alloc(
    mech: RoundMechanism,
    x: list[list[float]],
    sf: list[int] | None = None,
    pairs: list[list[int]] | None = None,
    pair_x: list[list[float]] | None = None,
) -> None:
    xa = np.array(x, dtype=float)
    n, j = xa.shape
    p = np.array(pairs if pairs else np.zeros((0, 2)), dtype=np.int64).reshape(-1, 2)
    px = np.array(pair_x if pair_x else np.zeros((0, j)), dtype=float).reshape(-1, j)
    mech.set_allocation(np.arange(n), np.array(sf or [1] * n), np.ones((n, j), dtype=bool), xa, p, px, np.zeros(n))


def _run(mech: RoundMechanism, rounds: int, round_s: float = 360.0) -> list[RoundPlan]:
    plans = []
    for r in range(rounds):
        plan = mech.plan(r * round_s)
        mech.record(plan, round_s)
        plans.append(plan)
    return plans


def test_time_shares_converge_to_the_allocation() -> None:
    mech = RoundMechanism([2, 1], [4, 4], 4)
    _alloc(mech, [[0.5, 0.25], [0.5, 0.25], [0.75, 0.0], [0.25, 0.5]])
    _run(mech, 400)
    share = mech.received / (400 * 360.0)
    assert np.allclose(share, [[0.5, 0.25], [0.5, 0.25], [0.75, 0.0], [0.25, 0.5]], atol=0.02)


def test_a_round_never_oversubscribes_a_type_nor_runs_a_job_twice() -> None:
    rng = np.random.default_rng(0)
    mech = RoundMechanism([3, 2, 4], [2, 2, 4], 12)
    x = rng.dirichlet(np.ones(3), 12) * 0.6
    _alloc(mech, x.tolist(), sf=rng.choice([1, 2], 12).tolist())
    for plan in _run(mech, 50):
        used = np.bincount(plan.wtype, weights=plan.gpus, minlength=3)
        assert np.all(used <= [3, 2, 4])
        jobs = plan.members[plan.members >= 0]
        assert len(jobs) == len(set(jobs.tolist()))


def test_a_job_allocated_all_of_a_gpu_stays_on_it_and_never_moves() -> None:
    mech = RoundMechanism([1], [1], 1)
    _alloc(mech, [[1.0]])
    plans = _run(mech, 20)
    assert all(p.n_units == 1 for p in plans)
    assert not any(p.moved.any() for p in plans)


def test_two_jobs_sharing_one_gpu_alternate_and_each_resumption_is_a_move() -> None:
    mech = RoundMechanism([1], [1], 2)
    _alloc(mech, [[0.5], [0.5]])
    plans = _run(mech, 10)
    runners = [int(p.members[0, 0]) for p in plans]
    assert runners.count(0) == runners.count(1) == 5
    moves = sum(int(p.moved.sum()) for p in plans)
    assert moves == 8  # every start after each job's first one


def test_idle_gpus_go_to_jobs_with_no_allocation_there() -> None:
    mech = RoundMechanism([2], [2], 2)
    _alloc(mech, [[1.0], [0.0]])
    plan = _run(mech, 1)[0]
    assert sorted(plan.members[:, 0].tolist()) == [0, 1]
    strict = RoundMechanism([2], [2], 2, fill_idle=False)
    _alloc(strict, [[1.0], [0.0]])
    assert _run(strict, 1)[0].members[:, 0].tolist() == [0]


def test_a_multi_gpu_job_is_consolidated_on_one_server_when_one_has_room() -> None:
    mech = RoundMechanism([8], [4], 3)
    # two single-GPU jobs first: they must not split both servers
    _alloc(mech, [[1.0], [1.0], [1.0]], sf=[1, 1, 4])
    plan = _run(mech, 1)[0]
    big = int(np.nonzero(plan.members[:, 0] == 2)[0][0])
    assert plan.consolidated[big]


def test_a_multi_gpu_job_spread_over_servers_is_reported_unconsolidated() -> None:
    mech = RoundMechanism([8], [4], 3)
    _alloc(mech, [[1.0], [1.0], [1.0]], sf=[3, 3, 2])
    plan = _run(mech, 1)[0]
    by_job = {int(m): bool(c) for m, c in zip(plan.members[:, 0], plan.consolidated, strict=True)}
    assert by_job[0] and by_job[1] and not by_job[2]  # 3 + 3 on two servers leave 1 + 1 for the 2-GPU job


def test_a_co_located_pair_runs_as_one_unit_on_shared_gpus() -> None:
    mech = RoundMechanism([1], [1], 2)
    _alloc(mech, [[0.0], [0.0]], pairs=[[0, 1]], pair_x=[[1.0]])
    plans = _run(mech, 3)
    assert all(p.members.tolist() == [[0, 1]] for p in plans)
    assert not any(p.moved.any() for p in plans)


@pytest.mark.parametrize("seed", range(3))
def test_planning_is_deterministic(seed: int) -> None:
    def run() -> list[list[list[int]]]:
        rng = np.random.default_rng(seed)
        mech = RoundMechanism([4, 4], [2, 2], 10)
        _alloc(mech, (rng.dirichlet(np.ones(2), 10) * 0.7).tolist())
        return [p.members.tolist() for p in _run(mech, 20)]

    assert run() == run()


def test_a_finished_job_is_never_planned_again_even_if_the_allocation_still_names_it() -> None:
    mech = RoundMechanism([1], [1], 2)
    _alloc(mech, [[1.0], [0.0]])
    mech.forget(np.array([0]))
    assert _run(mech, 3)[0].members[:, 0].tolist() == [1]


def test_fastest_first_orders_types_by_the_jobs_relative_speed() -> None:
    tput = np.array([[1.0, 4.0, 2.0], [2.0, 6.0, 3.0], [0.0, 0.0, 0.0], [1.0, 1.0, 5.0]])
    # relative speeds: [.25, 1, .5], [.33, 1, .5], (runs nowhere), [.2, .2, 1] -> type 1, then 2, then 0
    assert fastest_first(tput) == (1, 2, 0)
    assert fastest_first(np.ones((3, 2))) == (0, 1)  # ties: lower index first


def test_per_type_queues_serve_the_fast_type_first() -> None:
    # job 0 is due on both types (its slow-type priority is the higher), job 1 only on the fast type.
    x = [[0.4, 0.6], [0.3, 0.0]]
    one_queue = RoundMechanism([1, 1], [1, 1], 2)
    _alloc(one_queue, x)
    plan = one_queue.plan(0.0)
    assert dict(zip(plan.members[:, 0].tolist(), plan.wtype.tolist(), strict=True)) == {0: 1, 1: 0}
    per_type = RoundMechanism([1, 1], [1, 1], 2, type_order=(0, 1))
    _alloc(per_type, x)
    plan = per_type.plan(0.0)
    # the fast GPU goes to the higher fast-type priority; the slow one is filled with the job left idle
    assert dict(zip(plan.members[:, 0].tolist(), plan.wtype.tolist(), strict=True)) == {0: 0, 1: 1}


def test_per_type_queues_still_converge_to_the_allocation() -> None:
    x = [[0.5, 0.25], [0.5, 0.25], [0.75, 0.0], [0.25, 0.5]]
    mech = RoundMechanism([2, 1], [4, 4], 4, type_order=(0, 1), fill_idle=False)
    _alloc(mech, x)
    _run(mech, 400)
    assert np.allclose(mech.received / (400 * 360.0), x, atol=0.02)


def test_a_type_order_must_name_each_type_once() -> None:
    with pytest.raises(InvalidState, match="type_order"):
        RoundMechanism([1, 1], [1, 1], 2, type_order=(0, 0))


def _rounds_of_job_0_after_a_long_solo(memory_s: float | None) -> int:
    """Job 0 runs alone on the one GPU for 100 rounds, then job 1 arrives and the allocation gives each
    half of it: how many of the next 20 rounds job 0 runs."""
    mech = RoundMechanism([1], [1], 2, memory_s=memory_s)
    one = np.ones((1, 1), dtype=bool)
    no_pairs = np.zeros((0, 2), dtype=np.int64)
    mech.set_allocation(np.array([0]), np.array([1]), one, np.array([[1.0]]), no_pairs, np.zeros((0, 1)), np.zeros(1))
    _run(mech, 100)
    mech.set_allocation(
        np.array([0, 1]),
        np.array([1, 1]),
        np.ones((2, 1), dtype=bool),
        np.array([[0.5], [0.5]]),
        no_pairs,
        np.zeros((0, 1)),
        np.array([0.0, 36000.0]),
    )
    return _rounds_of_job_0(mech, range(100, 120))


def _rounds_of_job_0(mech: RoundMechanism, rounds: range) -> int:
    """How many of ``rounds`` (360 s each, planned and recorded) job 0 runs in (alone on GPU 0)."""
    runs = 0
    for r in rounds:
        plan = mech.plan(r * 360.0)
        mech.record(plan, 360.0)
        runs += int(plan.members[0, 0] == 0)
    return runs


def test_with_a_memory_a_surplus_received_under_an_old_allocation_is_forgotten() -> None:
    # since arrival, job 0's share stays near 1 and job 1 takes (almost) every round; with a memory of
    # 5 rounds the old surplus fades and the two share the GPU about as the allocation says
    assert _rounds_of_job_0_after_a_long_solo(None) <= 3
    assert _rounds_of_job_0_after_a_long_solo(1800.0) >= 8
    # the total received is still the true one (the decayed shares are internal)
    mech = RoundMechanism([1], [1], 1, memory_s=1800.0)
    _alloc(mech, [[1.0]])
    _run(mech, 10)
    assert mech.received[0, 0] == 3600.0


def test_with_hysteresis_a_running_job_keeps_its_gpu_longer_and_shares_still_converge() -> None:
    plain = RoundMechanism([1], [1], 2)
    held = RoundMechanism([1], [1], 2, hysteresis=1.0)
    moves = []
    for mech in (plain, held):
        _alloc(mech, [[0.5], [0.5]])
        moves.append(sum(int(p.moved.sum()) for p in _run(mech, 40)))
    assert moves[0] == 38  # alternating every round
    assert moves[1] <= 10  # 4: each job keeps the GPU for several rounds
    assert np.allclose(held.received[:, 0] / (40 * 360.0), [0.5, 0.5], atol=0.1)


def test_memory_and_hysteresis_are_validated() -> None:
    with pytest.raises(InvalidState, match="memory_s"):
        RoundMechanism([1], [1], 1, memory_s=0.0)
    with pytest.raises(InvalidState, match="hysteresis"):
        RoundMechanism([1], [1], 1, hysteresis=-0.1)


def _rounds_of_job_0_after_its_allocation_drops(allocation_integral: bool) -> int:
    """Jobs 0 and 1 share one GPU, 0.8 / 0.2 for 20 rounds, then 0.2 / 0.8: how many of the next 20
    rounds job 0 runs."""
    mech = RoundMechanism([1], [1], 2, allocation_integral=allocation_integral)
    _alloc(mech, [[0.8], [0.2]])
    _run(mech, 20)
    assert mech.received[0, 0] == 16 * 360.0  # both rules realize the first allocation
    _alloc(mech, [[0.2], [0.8]])
    return _rounds_of_job_0(mech, range(20, 40))


def test_with_the_allocation_integral_a_job_is_charged_only_what_it_was_owed_when_it_ran() -> None:
    # the share rule compares job 0's 16 rounds with the new 0.2 x its age (4 rounds): it is starved until
    # job 1 catches up with 0.8 of its whole life; with the integral of the allocations in force, both jobs
    # got what they were owed, and the next rounds follow the new allocation (4 of 20 for job 0)
    assert _rounds_of_job_0_after_its_allocation_drops(False) == 0
    assert _rounds_of_job_0_after_its_allocation_drops(True) == 4


def test_the_allocation_integral_still_converges_with_a_memory_and_pairs_keep_theirs() -> None:
    mech = RoundMechanism([2, 1], [4, 4], 4, memory_s=7200.0, allocation_integral=True, type_order=[0, 1])
    x = [[0.5, 0.25], [0.5, 0.25], [0.75, 0.0], [0.25, 0.5]]
    _alloc(mech, x)
    _run(mech, 400)
    assert np.allclose(mech.received / (400 * 360.0), x, atol=0.02)
    pair = RoundMechanism([1], [1], 3, allocation_integral=True)
    _alloc(pair, [[0.0], [0.0], [0.5]], pairs=[[0, 1]], pair_x=[[0.5]])
    _run(pair, 40)
    _alloc(pair, [[0.0], [0.0], [0.5]], pairs=[[0, 1]], pair_x=[[0.5]])  # a re-solve: the pair keeps its count
    plans = _run(pair, 40)
    assert sum(int(p.members[0, 1] >= 0) for p in plans) == 20


def test_resuming_with_the_allocation_integral_needs_the_seconds_owed() -> None:
    mech = RoundMechanism([1], [1], 2, allocation_integral=True)
    with pytest.raises(InvalidState, match="owed"):
        mech.resume(np.zeros((2, 1)), np.zeros(2, dtype=bool), now_s=0.0)
    mech.resume(np.array([[3600.0], [0.0]]), np.array([True, False]), now_s=3600.0, owed=np.array([[1800.0], [1800.0]]))
    _alloc(mech, [[0.5], [0.5]])
    # job 0 ran 3600 s of the 1800 it was owed, job 1 none of its 1800: job 1 runs first
    assert mech.plan(3600.0).members[0, 0] == 1
    with pytest.raises(InvalidState, match="round_s"):
        RoundMechanism([1], [1], 1, round_s=0.0)
