"""Estimators: side information, the hardware model, low-rank completion and multi-GPU scaling."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from costopt.domain import KNOWN_ACCELERATORS
from costopt.throughput import (
    ESTIMATOR_HARDWARE,
    ESTIMATOR_LOWRANK,
    ESTIMATOR_SCALING,
    AcceleratorSpec,
    EstimatorConfig,
    InvalidThroughput,
    JobType,
    MalformedAcceleratorSpecs,
    ThroughputCatalog,
    ThroughputKey,
    complete_low_rank,
    estimate_catalog,
    load_accelerator_specs,
)
from costopt.throughput.estimate import SPEC_COLUMNS, fit_slopes

NEW_ACCELERATORS = ("t4", "a10g", "a10", "l4", "l40s", "a100", "a100-80gb", "h100", "h200", "b200", "rtx-pro-6000")
MEASURED = ("k80", "p100", "v100")


# --- side information --------------------------------------------------------------------------


def test_specs_cover_measured_and_new_accelerators_with_a_source_each(specs: dict[str, AcceleratorSpec]) -> None:
    assert set(MEASURED + NEW_ACCELERATORS) <= set(specs)
    assert set(KNOWN_ACCELERATORS) <= set(specs)
    for spec in specs.values():
        assert spec.source.strip()
        assert spec.fp16_tensor_tflops >= spec.fp32_tflops > 0
        assert spec.tf32_tensor_tflops == 0 or spec.tf32_tensor_tflops >= spec.fp32_tflops
    assert not specs["v100"].has_tf32 and specs["a100"].has_tf32 and specs["rtx-4090"].has_tf32
    assert specs["v100"].rate_tflops("tf32") == specs["v100"].fp32_tflops
    assert specs["h100"].rate_tflops("tf32") == specs["h100"].tf32_tensor_tflops
    k80 = specs["k80"]  # one die of a two-GPU board, as clouds expose it
    assert (k80.fp32_tflops, k80.memory_bandwidth_gbps, k80.memory_gb) == (4.37, 240, 12)
    assert "2 GPUs" in k80.note
    assert (
        specs["h100"].memory_bandwidth_gbps
        > specs["a100-80gb"].memory_bandwidth_gbps
        > specs["v100"].memory_bandwidth_gbps
    )


def _spec_file(tmp_path: Path, rows: list[str], header: str = ",".join(SPEC_COLUMNS)) -> Path:
    path = tmp_path / "accelerators.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


GOOD_ROW = "v100,V100,15.7,0,125,900,16,NVIDIA V100 datasheet,"


@pytest.mark.parametrize(
    ("rows", "header", "fragment"),
    [
        ([GOOD_ROW], "accelerator,fp32", "expected columns"),
        ([GOOD_ROW, GOOD_ROW], None, "listed twice"),
        (["Tesla V100,V100,15.7,0,125,900,16,src,"], None, "canonical"),
        (["v100,V100,-1,0,125,900,16,src,"], None, "positive number"),
        (["v100,V100,fast,0,125,900,16,src,"], None, "positive number"),
        (["v100,V100,15.7,-3,125,900,16,src,"], None, "0 = no TF32"),
        (["v100,V100,15.7,0,125,900,16, ,"], None, "source"),
        (["v100,V100,15.7,0,125,900"], None, "fields"),
        ([], None, "no accelerator rows"),
    ],
)
def test_malformed_specs_raise_a_typed_error_naming_the_line(
    tmp_path: Path, rows: list[str], header: str | None, fragment: str
) -> None:
    path = _spec_file(tmp_path, rows, *([header] if header else []))
    with pytest.raises(MalformedAcceleratorSpecs, match=fragment) as info:
        load_accelerator_specs(path)
    assert str(path) in str(info.value)


# --- the hardware model on the real data ---------------------------------------------------------


def test_every_single_gpu_cell_of_new_accelerators_is_filled_and_marked_estimated(
    estimated: ThroughputCatalog,
) -> None:
    for acc in NEW_ACCELERATORS:
        for jt in estimated.job_types():
            cell = estimated.get(jt, acc)
            assert cell is not None, (jt, acc)
            assert cell.provenance == "estimated"
            assert cell.estimator == ESTIMATOR_HARDWARE
            assert cell.n_measurements == 0
            assert math.isfinite(cell.steps_per_s)
            assert cell.steps_per_s > 0


def test_measured_cells_stay_measured(catalog: ThroughputCatalog, estimated: ThroughputCatalog) -> None:
    for key, cell in catalog.cells.items():
        assert estimated.cells[key] == cell
    assert all(
        c.estimator in (ESTIMATOR_HARDWARE, ESTIMATOR_SCALING) for c in estimated.cells.values() if c.is_estimate
    )


def test_estimates_for_gpus_faster_in_both_features_lie_between_v100_and_the_roofline_bound(
    estimated: ThroughputCatalog, specs: dict[str, AcceleratorSpec]
) -> None:
    # By construction: slopes b, c >= 0 with b + c <= 1, anchored on the nearest measured accelerator,
    # which is V100 for any GPU at least as fast as V100 in bandwidth and FP32.
    v100 = specs["v100"]
    faster = [
        a
        for a, s in specs.items()
        if s.memory_bandwidth_gbps >= v100.memory_bandwidth_gbps and s.fp32_tflops >= v100.fp32_tflops
    ]
    assert {"h100", "a100", "a100-80gb", "h200", "b200"} <= set(faster)
    for acc in faster:
        bound = max(
            specs[acc].memory_bandwidth_gbps / v100.memory_bandwidth_gbps, specs[acc].fp32_tflops / v100.fp32_tflops
        )
        for jt in estimated.job_types():
            est, meas = estimated.get(jt, acc), estimated.get(jt, "v100")
            assert est is not None
            assert meas is not None
            assert meas.provenance == "measured"
            if acc in MEASURED:
                continue
            assert meas.steps_per_s <= est.steps_per_s <= meas.steps_per_s * bound * (1 + 1e-9), (jt, acc)


def test_estimates_are_anchored_on_the_nearest_measured_accelerator(
    estimated: ThroughputCatalog, specs: dict[str, AcceleratorSpec]
) -> None:
    # T4 (320 GB/s, 8.1 TFLOPS) is nearest to K80 in (log bandwidth, log FP32) and faster in both:
    # its estimate lies between the K80 measurement and the K80 measurement times the larger ratio.
    t4, k80 = specs["t4"], specs["k80"]
    bound = max(t4.memory_bandwidth_gbps / k80.memory_bandwidth_gbps, t4.fp32_tflops / k80.fp32_tflops)
    for jt in estimated.job_types():
        est, anchor = estimated.get(jt, "t4"), estimated.get(jt, "k80")
        assert est is not None
        assert anchor is not None
        assert anchor.steps_per_s <= est.steps_per_s <= anchor.steps_per_s * bound * (1 + 1e-9)


def test_fitted_slopes_respect_the_constraints(catalog: ThroughputCatalog, specs: dict[str, AcceleratorSpec]) -> None:
    _, accs, m = catalog.matrix(1)
    y = np.where(m > 0, np.log(np.where(m > 0, m, 1.0)), np.nan)
    fit = fit_slopes(y, np.array([specs[a].features() for a in accs]), EstimatorConfig())
    slopes = np.vstack([fit.per_job, np.array(fit.pooled)[None, :]])
    assert (slopes >= 0).all()
    assert (slopes.sum(axis=1) <= 1 + 1e-9).all()
    assert 0.3 < fit.pooled[0] < 0.7
    assert 0.3 < fit.pooled[1] < 0.7


def test_accelerators_with_too_little_memory_are_left_unknown(estimated: ThroughputCatalog) -> None:
    # M60 and P4 have 8 GB per GPU, less than any accelerator Gavel's jobs were measured on (K80: 12 GB)
    for acc in ("m60", "p4"):
        assert all(estimated.get(jt, acc) is None for jt in estimated.job_types())


def test_estimation_is_deterministic_and_refits_from_measurements_only(
    estimated: ThroughputCatalog, calibrated: ThroughputCatalog, specs: dict[str, AcceleratorSpec]
) -> None:
    again = estimate_catalog(estimated, specs, config=EstimatorConfig(hardware_estimator="hardware-loglinear"))
    assert dict(again.cells) == dict(estimated.cells)
    assert dict(estimate_catalog(estimated, specs).cells) == dict(calibrated.cells)


def test_targets_can_be_restricted(catalog: ThroughputCatalog, specs: dict[str, AcceleratorSpec]) -> None:
    out = estimate_catalog(catalog, specs, accelerators=["H100"])
    assert out.accelerators() == ("k80", "p100", "v100", "h100")


# --- multi-GPU cells ----------------------------------------------------------------------------


def test_multi_gpu_cells_of_new_accelerators_scale_by_the_v100_ratio_capped_at_linear(
    estimated: ThroughputCatalog,
) -> None:
    lm = JobType("LM", 5)
    for acc in NEW_ACCELERATORS:
        one = estimated.get(lm, acc)
        assert one is not None
        for n in (2, 4, 8):
            for placement in ("consolidated", "spread"):
                cell = estimated.get(lm, acc, n, placement)
                ref_n, ref_1 = estimated.get(lm, "v100", n, placement), estimated.get(lm, "v100")
                assert cell is not None
                assert ref_n is not None
                assert ref_1 is not None
                assert cell.estimator == ESTIMATOR_SCALING
                ratio = min(ref_n.steps_per_s / ref_1.steps_per_s, n)
                assert cell.steps_per_s == pytest.approx(one.steps_per_s * ratio)
    # V100 ResNet-18 bs 16 scales super-linearly at 2 GPUs (1.55x per GPU): capped at 2x for others
    r18 = JobType("ResNet-18", 16)
    h2, h1 = estimated.get(r18, "h100", 2), estimated.get(r18, "h100")
    assert h2 is not None
    assert h1 is not None
    assert h2.steps_per_s == pytest.approx(2 * h1.steps_per_s)


def test_job_types_never_measured_on_several_gpus_get_no_multi_gpu_estimate(estimated: ThroughputCatalog) -> None:
    for jt in (JobType("A3C"), JobType("CycleGAN"), JobType("Recommendation", 512)):
        assert estimated.get(jt, "h100", 2) is None


def test_missing_spread_cells_of_measured_accelerators_are_estimated_unless_they_cannot_run(
    estimated: ThroughputCatalog,
) -> None:
    r50_64, r50_128 = JobType("ResNet-50", 64), JobType("ResNet-50", 128)
    cell = estimated.get(r50_64, "k80", 2, "spread")  # absent from k80_unconsolidated
    assert cell is not None
    assert cell.estimator == ESTIMATOR_SCALING
    for n in (2, 4, 8):  # consolidated K80 cannot run it: spread is left unknown, not guessed
        assert estimated.get(r50_128, "k80", n, "spread") is None
        assert estimated.get(r50_128, "k80", n).steps_per_s == 0.0  # type: ignore[union-attr]


# --- low-rank completion ------------------------------------------------------------------------


def test_low_rank_completion_recovers_an_exact_rank_2_matrix_with_20_percent_hidden() -> None:
    rng = np.random.default_rng(7)
    truth = rng.normal(size=(30, 2)) @ rng.normal(size=(2, 8))
    hidden = rng.random(truth.shape) < 0.2
    assert hidden.any()
    assert (~hidden).any(axis=0).all()
    assert (~hidden).any(axis=1).all()
    filled = complete_low_rank(np.where(hidden, np.nan, truth), 2)
    error = np.linalg.norm(filled[hidden] - truth[hidden]) / np.linalg.norm(truth[hidden])
    assert error < 1e-3


def test_low_rank_completion_with_effects_recovers_an_additive_matrix() -> None:
    rng = np.random.default_rng(3)
    truth = rng.normal(size=(12, 1)) + rng.normal(size=(1, 5))
    hidden = np.zeros(truth.shape, dtype=bool)
    hidden[rng.integers(0, 12, 10), rng.integers(0, 5, 10)] = True
    hidden[:, 0] = False
    filled = complete_low_rank(np.where(hidden, np.nan, truth), 0, biases=True)
    assert np.allclose(filled[hidden], truth[hidden], atol=1e-6)


def test_low_rank_completion_leaves_unobserved_rows_and_columns_unknown() -> None:
    m = np.array([[1.0, np.nan, 2.0], [np.nan, np.nan, np.nan], [3.0, np.nan, 4.0]])
    out = complete_low_rank(m, 1, reg=0.1, biases=True)
    assert np.isnan(out[1]).all()
    assert np.isnan(out[:, 1]).all()
    assert np.isfinite(out[[0, 2]][:, [0, 2]]).all()
    with pytest.raises(InvalidThroughput):
        complete_low_rank(np.full((2, 2), np.nan), 1)


def test_partially_measured_job_types_are_completed_on_the_measured_generations(
    catalog: ThroughputCatalog, specs: dict[str, AcceleratorSpec]
) -> None:
    lm = JobType("LM", 20)
    hidden = {ThroughputKey(lm, "k80"), ThroughputKey(lm, "p100")}
    partial = ThroughputCatalog({k: v for k, v in catalog.cells.items() if k not in hidden}, catalog.pairs)
    out = estimate_catalog(partial, specs)
    for key in hidden:
        cell, truth = out.cells[key], catalog.cells[key]
        assert cell.estimator == ESTIMATOR_LOWRANK
        assert truth.steps_per_s / 2 < cell.steps_per_s < truth.steps_per_s * 2


def test_a_new_job_type_measured_only_on_h100_is_estimated_where_it_surely_fits(
    catalog: ThroughputCatalog, specs: dict[str, AcceleratorSpec]
) -> None:
    jt = JobType("ViT-B", 256)
    registered = catalog.with_measurement(jt, "h100", 1, 10.0)
    baseline = EstimatorConfig(hardware_estimator="hardware-loglinear")
    out = estimate_catalog(registered, specs, config=baseline)
    h100 = out.get(jt, "h100")
    assert h100 is not None
    assert h100.provenance == "user"
    big = out.get(jt, "a100-80gb")  # 80 GB, slower than H100 in both features
    assert big is not None
    assert big.estimator == ESTIMATOR_HARDWARE
    assert 0 < big.steps_per_s <= 10.0
    assert out.get(jt, "v100") is None  # 16 GB: it might not fit, so unknown

    unguarded = estimate_catalog(
        registered, specs, config=EstimatorConfig(memory_guard=False, hardware_estimator="hardware-loglinear")
    )
    for acc in ("k80", "p100", "v100", "t4", "a100"):
        cell = unguarded.get(jt, acc)
        assert cell is not None
        assert cell.estimator == ESTIMATOR_HARDWARE
        assert 0 < cell.steps_per_s <= 10.0  # every one is slower than an H100 in both features


def test_estimator_config_is_validated() -> None:
    for bad in [
        {"prior_slopes": (0.8, 0.8)},
        {"prior_slopes": (-0.1, 0.5)},
        {"job_shrinkage": 0.0},
        {"pooled_prior_weight": -1.0},
        {"completion_min_coverage": 0.0},
        {"completion_rank": -1},
    ]:
        with pytest.raises(InvalidThroughput):
            EstimatorConfig(**bad)  # type: ignore[arg-type]
