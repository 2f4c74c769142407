"""The simulator's first-start charge: a job's first round loses ``start_overhead_s`` before its first step.

Hand-built traces on one worker type, so the completion times are known: a job of 10 s of work alone on one
GPU in 6-s rounds finishes 10 s after its round-aligned arrival, 11 s with a 1-s first start.
"""

from __future__ import annotations

import numpy as np
import pytest

from costopt.gavel.errors import InvalidState
from costopt.gavel.policies import get_policy
from costopt.gavel.simulator import SimResult, simulate_trace
from costopt.gavel.trace import Trace
from costopt.gavel.workload import Workload


def _run(
    work_s: list[float], gpus: int, *, restart_overhead_s: float = 0.0, start_overhead_s: float = 0.0
) -> SimResult:
    n = len(work_s)
    rate = 5.0  # steps/s
    rates = np.full((n, 1), rate)
    workload = Workload(
        names=tuple(f"j{i}" for i in range(n)),
        scale_factor=np.ones(n, dtype=np.int64),
        worker_types=("v100",),
        consolidated=rates,
        spread=rates.copy(),
        pair=np.zeros((n, n, 1)),
    )
    steps = np.array(work_s) * rate
    trace = Trace(
        entry=np.arange(n, dtype=np.int64),
        scale_factor=np.ones(n, dtype=np.int64),
        arrival_s=np.zeros(n),
        duration_s=np.array(work_s, dtype=np.float64),
        steps=steps,
        slo_s=np.full(n, np.inf),
        job_id=np.arange(n, dtype=np.int64),
    )
    return simulate_trace(
        get_policy("max_min_fairness"),
        trace,
        workload,
        (gpus,),
        round_s=6.0,
        gpus_per_server=1,
        restart_overhead_s=restart_overhead_s,
        start_overhead_s=start_overhead_s,
    )


def test_a_lone_job_pays_its_first_start_once() -> None:
    free = _run([10.0], 1)
    paid = _run([10.0], 1, start_overhead_s=1.0)
    assert free.avg_jct_s == pytest.approx(10.0)
    assert paid.avg_jct_s == pytest.approx(11.0)
    assert paid.moves_per_job == 0.0
    assert paid.start_overhead_s == 1.0 and free.start_overhead_s == 0.0


def test_a_job_that_waits_pays_its_first_start_in_its_first_round_run_not_at_arrival() -> None:
    # two jobs, one GPU: the agnostic max-min mechanism alternates them round by round
    free = _run([3.0, 3.0], 1)
    paid = _run([3.0, 3.0], 1, start_overhead_s=1.0)
    free_done = sorted(j.completion_s for j in free.jobs if j.completion_s is not None)
    paid_done = sorted(j.completion_s for j in paid.jobs if j.completion_s is not None)
    # each finishes within its first round run: 1 s later with the charge, whichever round that is
    assert free_done == pytest.approx([3.0, 9.0])
    assert paid_done == pytest.approx([4.0, 10.0])


def test_the_first_start_and_a_move_are_charged_apart() -> None:
    moved = _run([30.0, 30.0, 30.0], 2, restart_overhead_s=1.0)
    both = _run([30.0, 30.0, 30.0], 2, restart_overhead_s=1.0, start_overhead_s=0.5)
    assert moved.moves_per_job > 0  # three jobs on two GPUs: the jobs take turns
    assert both.moves_per_job == moved.moves_per_job
    # every job pays 0.5 s more in its first round; nothing else changes where the mechanism decides alike
    assert both.avg_jct_s > moved.avg_jct_s


@pytest.mark.parametrize("bad", [-0.1, 6.0, 7.0])
def test_a_start_overhead_outside_a_round_is_refused(bad: float) -> None:
    with pytest.raises(InvalidState, match="start_overhead_s"):
        _run([10.0], 1, start_overhead_s=bad)
