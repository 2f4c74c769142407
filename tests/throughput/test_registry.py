"""Registered measurements persist and fold into the catalog the planner uses (both backends)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from api.wiring import build_catalog
from costopt.domain import normalize_accelerator
from costopt.settings import Settings
from costopt.throughput.catalog import ThroughputCatalog
from costopt.throughput.errors import InvalidThroughput
from costopt.throughput.model import JobType, Precision, Throughput, ThroughputKey
from costopt.throughput.registry import Measurement, MeasurementRegistry, own_job_type

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


def test_the_catalog_is_built_once_per_process_while_its_file_and_registry_are_unchanged(
    engine: Engine, shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """build_catalog shares one catalog between callers while the throughput file (path, size, mtime) and the
    registered measurements are the same, and builds a new one when either changes."""
    import shutil

    import costopt.throughput.loaders as loaders

    loads: list[Path] = []
    real = loaders.load_throughput_file

    def counting(path: Path) -> object:
        loads.append(path)
        return real(path)

    monkeypatch.setattr(loaders, "load_throughput_file", counting)
    own = tmp_path / "throughputs.json"  # a file of this test's own: no other test's cached catalog
    shutil.copyfile(shared_data / "gavel" / "simulation_throughputs.json", own)
    settings = Settings(throughput_file=own, estimate_new_accelerators=False)
    first = build_catalog(settings, engine)
    assert build_catalog(settings, engine) is first and loads == [own]  # unchanged: built once
    MeasurementRegistry(engine).add(Measurement(R50, "v100", 1, 2.0, source="job-1"))
    measured = build_catalog(settings, engine)  # a new measurement: a new catalog with it folded in
    assert measured is not first and len(loads) == 2
    cell, base = measured.get(R50, "v100"), first.get(R50, "v100")
    assert cell is not None and base is not None and cell.n_measurements == base.n_measurements + 1
    with own.open("a", encoding="utf-8") as fh:
        fh.write("\n")  # the same content, a new size: read again
    assert build_catalog(settings, engine) is not measured and len(loads) == 3


def test_a_negative_measurement_is_refused_and_not_stored(engine: Engine) -> None:
    reg = MeasurementRegistry(engine)
    with pytest.raises(InvalidThroughput):
        reg.add(Measurement(R50, "v100", 1, -1.0))
    assert reg.all() == []


@pytest.mark.parametrize("precision", ["fp32", "amp"])
def test_apply_folds_like_one_with_measurement_per_measurement(
    engine: Engine, catalog: ThroughputCatalog, precision: Precision
) -> None:
    """apply builds the catalog once; the reference folds each measurement with with_measurement, oldest
    first, and at amp drops a file (measured) cell before its first measurement: the same cells, values,
    counts, provenance, cell order and job type order."""
    reg = MeasurementRegistry(engine)
    mynet = JobType("MyNet", 8)
    ms = [
        Measurement(R50, "v100", 1, 2.0, source=f"job:a:{precision}"),
        Measurement(R50, "v100", 1, 3.0, n_measurements=2, provenance="measured", source=f"x:{precision}"),
        Measurement(mynet, "A100", 2, 5.0, source=f"job:b:{precision}"),
        Measurement(mynet, "a100", 2, 0.0, source=f"job:b:{precision}"),  # observed not to run: replaces
        Measurement(R50, "k80", 1, 1.5, placement="spread", source=f"job:c:{precision}"),
        Measurement(R50, "p100", 1, 9.0, source="job:d:tf32"),  # another precision: left out
        Measurement(own_job_type("e"), "v100", 1, 4.0, source=f"job:e:{precision}"),  # a job's own: left out
    ]
    for m in ms:
        reg.add(m)
    expected = catalog
    for m in ms[:5]:
        key = ThroughputKey(m.job_type, normalize_accelerator(m.accelerator), m.gpu_count, m.placement)
        old = expected.cells.get(key)
        if precision != "fp32" and old is not None and old.provenance == "measured":
            cells = {k: v for k, v in expected.cells.items() if k != key}
            expected = ThroughputCatalog(cells, expected.pairs, expected.job_type_order)
        expected = expected.with_measurement(
            m.job_type,
            m.accelerator,
            m.gpu_count,
            m.steps_per_s,
            placement=m.placement,
            n_measurements=m.n_measurements,
            provenance=m.provenance,
        )
    got = reg.apply(catalog, precision)
    assert list(got.cells.items()) == list(expected.cells.items())
    assert got.job_type_order == expected.job_type_order and got.pairs == expected.pairs
    r50 = got.get(R50, "v100")
    assert r50 is not None and r50.n_measurements == (4 if precision == "fp32" else 3)
    assert got.get(mynet, "a100", 2) == Throughput(0.0, "user", 1)
