"""Registered measurements persist and fold into the catalog the planner uses (both backends)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from api.wiring import build_catalog
from costopt.settings import Settings
from costopt.throughput.errors import InvalidThroughput
from costopt.throughput.model import JobType
from costopt.throughput.registry import Measurement, MeasurementRegistry

R50 = JobType.parse("ResNet-50 (batch size 128)")


def test_a_new_job_type_registered_by_a_user_is_planned_with(engine: Engine, shared_data: Path) -> None:
    reg = MeasurementRegistry(engine)
    llama = JobType.parse("Llama-8B (batch size 4)")
    reg.add(Measurement(llama, "h100", 8, 3.2))
    catalog = build_catalog(Settings(data_dir=shared_data, estimate_new_accelerators=False), engine)
    cell = catalog.get(llama, "h100", 8)
    assert cell is not None
    assert (cell.steps_per_s, cell.provenance) == (3.2, "user")


def test_later_measurements_update_the_estimate_as_a_weighted_mean(engine: Engine, shared_data: Path) -> None:
    settings = Settings(data_dir=shared_data, estimate_new_accelerators=False)
    base = build_catalog(settings).get(R50, "v100")
    assert base is not None
    reg = MeasurementRegistry(engine)
    reg.add(Measurement(R50, "v100", 1, 2.0, n_measurements=3, provenance="measured", source="job-42"))
    cell = build_catalog(settings, engine).get(R50, "v100")
    assert cell is not None
    assert cell.steps_per_s == pytest.approx((base.steps_per_s + 3 * 2.0) / 4)
    assert cell.n_measurements == 4
    assert [m.source for m in reg.all()] == ["job-42"]


def test_a_negative_measurement_is_refused_and_not_stored(engine: Engine) -> None:
    reg = MeasurementRegistry(engine)
    with pytest.raises(InvalidThroughput):
        reg.add(Measurement(R50, "v100", 1, -1.0))
    assert reg.all() == []
