"""Fixtures of the throughput tests: the real Gavel files, loaded once per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from costopt.throughput import (
    GAVEL_ORACLE_FILE,
    GAVEL_SIMULATION_FILE,
    AcceleratorSpec,
    EstimatorConfig,
    ThroughputCatalog,
    ThroughputMeasurements,
    estimate_catalog,
    load_accelerator_specs,
    load_gavel_throughputs,
    load_oracle_throughputs,
)


@pytest.fixture(scope="session")
def gavel(shared_data: Path) -> ThroughputMeasurements:
    return load_gavel_throughputs(shared_data / GAVEL_SIMULATION_FILE)


@pytest.fixture(scope="session")
def oracle(shared_data: Path) -> ThroughputMeasurements:
    return load_oracle_throughputs(shared_data / GAVEL_ORACLE_FILE)


@pytest.fixture(scope="session")
def catalog(gavel: ThroughputMeasurements) -> ThroughputCatalog:
    return ThroughputCatalog.from_measurements(gavel)


@pytest.fixture(scope="session")
def specs() -> dict[str, AcceleratorSpec]:
    return load_accelerator_specs()


@pytest.fixture(scope="session")
def estimated(catalog: ThroughputCatalog, specs: dict[str, AcceleratorSpec]) -> ThroughputCatalog:
    """Gavel's catalog completed by the baseline hardware-loglinear estimator (its properties are tested)."""
    return estimate_catalog(catalog, specs, config=EstimatorConfig(hardware_estimator="hardware-loglinear"))


@pytest.fixture(scope="session")
def calibrated(catalog: ThroughputCatalog, specs: dict[str, AcceleratorSpec]) -> ThroughputCatalog:
    """Gavel's catalog completed by the default, family-calibrated estimator."""
    return estimate_catalog(catalog, specs)


@pytest.fixture
def fresh_planner() -> Iterator[None]:
    """The planner's catalogs are cached per process: start and end the test from the files and its database."""
    from api.planning import reset

    reset()
    yield
    reset()
