"""The immutable catalog: lookups, matrices, pairs, user registrations and measurement updates."""

from __future__ import annotations

import math

import numpy as np
import pytest

from costopt.throughput import (
    InvalidThroughput,
    JobType,
    Throughput,
    ThroughputCatalog,
    ThroughputKey,
    ThroughputMeasurements,
)

REC_8192 = JobType("Recommendation", 8192)
R50_128 = JobType("ResNet-50", 128)


def test_get_returns_measured_throughput_with_provenance(catalog: ThroughputCatalog) -> None:
    cell = catalog.get(REC_8192, "k80")
    assert cell == Throughput(2.698783123478088, "measured", 1)
    assert catalog.get("Recommendation (batch size 8192)", "Tesla K80") == cell  # names and vendor spellings


def test_get_distinguishes_cannot_run_from_unknown(catalog: ThroughputCatalog) -> None:
    cannot = catalog.get(R50_128, "k80", 4)
    assert cannot is not None
    assert cannot.steps_per_s == 0.0
    assert not cannot.can_run
    assert catalog.get(R50_128, "k80", 4, "spread") is None  # never measured
    assert catalog.get(REC_8192, "h100") is None
    assert catalog.get(JobType("A3C"), "v100", 2) is None  # A3C is not distributed


def test_job_types_and_accelerators(catalog: ThroughputCatalog) -> None:
    assert len(catalog.job_types()) == 26
    assert catalog.accelerators() == ("k80", "p100", "v100")
    assert catalog.gpu_counts() == (1, 2, 4, 8)


def test_matrix_has_nan_for_unknown_and_zero_for_cannot_run(catalog: ThroughputCatalog) -> None:
    names, accs, m = catalog.matrix(1)
    assert m.shape == (26, 3)
    assert accs == ("k80", "p100", "v100")
    assert not np.isnan(m).any()
    assert m[names.index(REC_8192.name), 0] == pytest.approx(2.698783123478088)

    names, accs, m4 = catalog.matrix(4)
    assert np.isnan(m4).sum() == 7 * 3  # the 7 single-GPU-only job types
    assert m4[names.index(R50_128.name), accs.index("k80")] == 0.0

    _, cols, sub = catalog.matrix(1, accelerators=["V100", "h100"])
    assert cols == ("v100", "h100")
    assert np.isnan(sub[:, 1]).all()


def test_pair_lookup_works_in_both_orders(catalog: ThroughputCatalog) -> None:
    a, b = JobType("ResNet-18", 64), JobType("ResNet-18", 16)
    assert catalog.pair(a, b, "v100") == pytest.approx((24.093231895382736, 32.353384328946916))
    only_one_order = ThroughputCatalog(pairs={k: v for k, v in catalog.pairs.items() if k.job_a == a})
    assert only_one_order.pair(b, a, "v100") == pytest.approx((32.353384328946916, 24.093231895382736))
    assert catalog.pair(a, b, "h100") is None


def test_catalog_is_immutable(catalog: ThroughputCatalog) -> None:
    with pytest.raises(TypeError):
        catalog.cells[ThroughputKey(REC_8192, "h100")] = Throughput(1.0, "user")  # type: ignore[index]
    with pytest.raises(AttributeError):
        catalog.cells = {}  # type: ignore[misc]


def test_user_can_register_a_brand_new_job_type(catalog: ThroughputCatalog) -> None:
    updated = catalog.with_measurement("Llama-3-8B (batch size 4)", "H100", 8, 3.5, placement="spread")
    jt = JobType("Llama-3-8B", 4)
    assert updated.job_types()[-1] == jt
    assert len(updated.job_types()) == 27
    assert updated.get(jt, "h100", 8, "spread") == Throughput(3.5, "user", 1)
    assert "h100" in updated.accelerators()
    assert catalog.get(jt, "h100", 8, "spread") is None  # the original is unchanged


def test_running_job_measurements_update_a_cell_by_count_weighted_mean(catalog: ThroughputCatalog) -> None:
    base = catalog.get(REC_8192, "k80")
    assert base is not None
    c1 = catalog.with_measurement(REC_8192, "k80", 1, 3.0)
    cell = c1.get(REC_8192, "k80")
    assert cell is not None
    assert cell.provenance == "user"
    assert cell.n_measurements == 2
    assert cell.steps_per_s == pytest.approx((base.steps_per_s + 3.0) / 2)
    c2 = c1.with_measurement(REC_8192, "k80", 1, 4.0, n_measurements=2)
    cell2 = c2.get(REC_8192, "k80")
    assert cell2 is not None
    assert cell2.n_measurements == 4
    assert cell2.steps_per_s == pytest.approx((base.steps_per_s + 3.0 + 2 * 4.0) / 4)


def test_profiling_measurements_keep_measured_provenance(catalog: ThroughputCatalog) -> None:
    cell = catalog.with_measurement(REC_8192, "k80", 1, 3.0, provenance="measured").get(REC_8192, "k80")
    assert cell is not None
    assert cell.provenance == "measured"
    assert cell.n_measurements == 2


def test_a_measurement_that_flips_can_run_replaces_the_cell(catalog: ThroughputCatalog) -> None:
    ran = catalog.with_measurement(R50_128, "k80", 4, 1.2).get(R50_128, "k80", 4)
    assert ran == Throughput(1.2, "user", 1)
    failed = catalog.with_measurement(REC_8192, "k80", 1, 0.0).get(REC_8192, "k80")
    assert failed == Throughput(0.0, "user", 1)


def test_a_measurement_replaces_an_estimate(estimated: ThroughputCatalog) -> None:
    est = estimated.get(REC_8192, "h100")
    assert est is not None
    assert est.is_estimate
    cell = estimated.with_measurement(REC_8192, "h100", 1, 9.0).get(REC_8192, "h100")
    assert cell == Throughput(9.0, "user", 1)


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_invalid_measurements_are_refused(catalog: ThroughputCatalog, value: float) -> None:
    with pytest.raises(InvalidThroughput):
        catalog.with_measurement(REC_8192, "k80", 1, value)


def test_measurement_options_are_validated(catalog: ThroughputCatalog) -> None:
    with pytest.raises(InvalidThroughput):
        catalog.with_measurement(REC_8192, "k80", 1, 1.0, n_measurements=0)
    with pytest.raises(InvalidThroughput):
        catalog.with_measurement(REC_8192, "k80", 1, 1.0, provenance="estimated")
    with pytest.raises(InvalidThroughput):
        catalog.with_measurement(REC_8192, "k80", 0, 1.0)


def test_pair_measurements_replace_both_orders(catalog: ThroughputCatalog) -> None:
    a, b = JobType("ResNet-18", 64), JobType("ResNet-18", 16)
    updated = catalog.with_pair_measurement(b, a, "v100", 1.0, 2.0)
    assert updated.pair(a, b, "v100") == (2.0, 1.0)
    assert updated.pair(b, a, "v100") == (1.0, 2.0)


def test_with_estimates_never_overwrites_measurements(catalog: ThroughputCatalog) -> None:
    key = ThroughputKey(REC_8192, "k80")
    est = Throughput(99.0, "estimated", 0, "test")
    out = catalog.with_estimates({key: est, ThroughputKey(REC_8192, "t4"): est})
    assert out.cells[key].provenance == "measured"
    assert out.get(REC_8192, "t4") == est
    assert ThroughputKey(REC_8192, "t4") not in out.measured_only()
    with pytest.raises(InvalidThroughput):
        catalog.with_estimates({key: Throughput(1.0, "user")})


def test_later_sources_override_earlier_ones(gavel: ThroughputMeasurements, oracle: ThroughputMeasurements) -> None:
    both = ThroughputCatalog.from_measurements(gavel, oracle)
    cell = both.get(REC_8192, "k80")
    assert cell is not None
    assert cell.steps_per_s == pytest.approx(0.21463224402531245)
    assert len(both.job_types()) == 26
