"""Fixtures of the Gavel tests: the real Gavel workload and random cluster states."""

from __future__ import annotations

from pathlib import Path

import pytest

from costopt.gavel.bench import benchmark_state
from costopt.gavel.state import ClusterState
from costopt.gavel.workload import Workload, load_workload
from costopt.throughput import GAVEL_SIMULATION_FILE


@pytest.fixture(scope="session")
def workload(shared_data: Path) -> Workload:
    return load_workload(shared_data / GAVEL_SIMULATION_FILE)


def gavel_state(
    workload: Workload, n: int, *, seed: int = 0, space_sharing: bool = False, gpus_per_type: float | None = None
) -> ClusterState:
    """Gavel's benchmark setting: n single-GPU jobs drawn from the 26 types, n/4 GPUs of each type."""
    return benchmark_state(workload, n, seed=seed, space_sharing=space_sharing, gpus_per_type=gpus_per_type)
