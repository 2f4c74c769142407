"""Fixtures of the Gavel tests: the real Gavel workload (states: :func:`costopt.gavel.bench.benchmark_state`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from costopt.gavel.workload import Workload, load_workload
from costopt.throughput import GAVEL_SIMULATION_FILE


@pytest.fixture(scope="session")
def workload(shared_data: Path) -> Workload:
    return load_workload(shared_data / GAVEL_SIMULATION_FILE)
