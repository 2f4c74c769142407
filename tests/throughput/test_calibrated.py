"""The family-calibrated estimator: compute classes, the fit, the catalog it completes, and its
cross-validated error on the shipped calibration set."""

from __future__ import annotations

import math

import pytest

from costopt.throughput import EstimatorConfig, ThroughputCatalog, estimate_catalog
from costopt.throughput.calibrated import (
    ESTIMATOR_CALIBRATED,
    CalibratedModel,
    Observation,
    compute_class,
    features,
    fit_calibrated,
)
from costopt.throughput.calibration import load_calibration
from costopt.throughput.crossval import TARGET_MAX, TARGET_MEDIAN, cells_from, cross_validate
from costopt.throughput.estimate import ESTIMATOR_HARDWARE, AcceleratorSpec
from costopt.throughput.model import JobType, ModelFamily, Precision


@pytest.mark.parametrize(
    ("precision", "family", "gpu", "expected"),
    [
        ("amp", "transformer", "v100", "amp"),
        ("tf32", "transformer", "v100", "fp32"),  # no TF32 before Ampere
        ("fp32", "transformer", "a100", "fp32"),  # PyTorch's default: matmuls in strict FP32
        ("fp32", "convolutional", "a100", "tf32"),  # ... but cuDNN convolutions in TF32
        ("fp32", "gan", "h100", "tf32"),
        ("tf32", "recurrent", "h100", "tf32"),
        ("fp32", None, "h100", "fp32"),
    ],
)
def test_compute_class(
    specs: dict[str, AcceleratorSpec], precision: Precision, family: ModelFamily | None, gpu: str, expected: str
) -> None:
    assert compute_class(precision, family, specs[gpu]) == expected


def _synthetic(specs: dict[str, AcceleratorSpec]) -> tuple[list[Observation], dict[str, float]]:
    """Noise-free observations from known parameters: transformer fp32 (b, c) = (0.3, 0.5), amp offset
    0.9 with (b, c, e) = (0.2, 0.6, 0.1); levels per series."""
    levels = {"s1": 1.0, "s2": 3.0, "s3": -2.0}
    obs = []
    for series, level in levels.items():
        for gpu in ("v100", "t4", "quadro-rtx-8000", "p100", "k80"):
            spec = specs[gpu]
            bw, rate, _ = features(spec, "fp32")
            obs.append(Observation(series, "transformer", "fp32", gpu, level + 0.3 * bw + 0.5 * rate))
            bw, rate, f32 = features(spec, "amp")
            obs.append(Observation(series, "transformer", "amp", gpu, level + 0.9 + 0.2 * bw + 0.6 * rate + 0.1 * f32))
    return obs, levels


def test_the_fit_recovers_known_parameters_closely(specs: dict[str, AcceleratorSpec]) -> None:
    obs, levels = _synthetic(specs)
    model = fit_calibrated(obs, specs)
    assert isinstance(model, CalibratedModel)
    for o in obs:  # ridge pulls a little toward the priors: close, not exact
        predicted = model.predict_log(o.series, o.precision, specs[o.gpu])
        assert predicted is not None
        assert abs(predicted - o.log_throughput) < 0.1
    assert model.predict_log("unknown series", "fp32", specs["v100"]) is None
    # a new GPU: H100 in amp, from Volta/Turing/Pascal/Kepler data only
    bw, rate, f32 = features(specs["h100"], "amp")
    truth = levels["s2"] + 0.9 + 0.2 * bw + 0.6 * rate + 0.1 * f32
    predicted = model.predict_log("s2", "amp", specs["h100"])
    assert predicted is not None
    assert math.exp(abs(predicted - truth)) < 1.3


def test_the_default_catalog_is_completed_by_the_calibrated_estimator(
    catalog: ThroughputCatalog,
    calibrated: ThroughputCatalog,
    estimated: ThroughputCatalog,
    specs: dict[str, AcceleratorSpec],
) -> None:
    for jt in calibrated.job_types():
        for acc in ("a100", "h100", "l4", "rtx-pro-6000"):
            cell = calibrated.get(jt, acc)
            assert cell is not None and cell.estimator == ESTIMATOR_CALIBRATED, (jt, acc)
    # the bias: the baseline's H100/V100 ratio is too low for convolutional nets (TF32 convolutions
    # under PyTorch's default) and, once TF32 is on, for transformer and recurrent ones as well
    tf32 = estimate_catalog(catalog, specs, precision="tf32")
    for jt, new_catalog in (
        (JobType("ResNet-50", 64), calibrated),
        (JobType("Transformer", 64), tf32),
        (JobType("LM", 20), tf32),
    ):
        v100 = calibrated.get(jt, "v100")
        new, old = new_catalog.get(jt, "h100"), estimated.get(jt, "h100")
        assert v100 is not None and new is not None and old is not None
        assert old.estimator == ESTIMATOR_HARDWARE
        assert new.steps_per_s > 1.4 * old.steps_per_s > 1.4 * v100.steps_per_s, jt


def test_precision_changes_what_is_measured_and_what_is_estimated(
    catalog: ThroughputCatalog, calibrated: ThroughputCatalog, specs: dict[str, AcceleratorSpec]
) -> None:
    jt = JobType("Transformer", 64)
    amp = estimate_catalog(catalog, specs, precision="amp")
    tf32 = estimate_catalog(catalog, specs, precision="tf32")
    measured = catalog.get(jt, "v100")
    assert measured is not None
    # tf32 on a V100 computes as fp32: Gavel's measurement stands; amp does not: estimated, faster
    assert tf32.get(jt, "v100") == measured
    amp_v100 = amp.get(jt, "v100")
    assert amp_v100 is not None and amp_v100.estimator == ESTIMATOR_CALIBRATED
    assert amp_v100.steps_per_s > measured.steps_per_s
    for acc in ("a100", "h100"):
        cells = [c.get(jt, acc) for c in (calibrated, tf32, amp)]
        assert all(c is not None for c in cells)
        fp32_v, tf32_v, amp_v = (c.steps_per_s for c in cells if c is not None)
        assert fp32_v < tf32_v < amp_v, acc
    # the baseline knows no precision: its estimates are the same at every precision
    base = EstimatorConfig(hardware_estimator="hardware-loglinear")
    a = estimate_catalog(catalog, specs, config=base).get(jt, "h100")
    b = estimate_catalog(catalog, specs, config=base, precision="tf32").get(jt, "h100")
    assert a == b


def test_leave_one_gpu_out_meets_the_targets_on_the_shipped_calibration_set(
    catalog: ThroughputCatalog, specs: dict[str, AcceleratorSpec]
) -> None:
    cells = cells_from(load_calibration(specs=specs), catalog, specs)
    cv = cross_validate(cells, specs)
    summary = {r.family: r for r in cv.summary(by_gpu=False)}
    assert set(summary) == {"convolutional", "transformer", "recurrent", "recommendation"} == cv.calibrated_families
    for row in summary.values():
        assert row.median[ESTIMATOR_CALIBRATED] <= TARGET_MEDIAN, row
        assert row.maximum[ESTIMATOR_CALIBRATED] <= TARGET_MAX, row
    assert cv.meets_targets()
    # every scored cell is scored for both estimators, and Gavel's cells are reported apart
    assert cv.errors and all(set(e.factors) == {ESTIMATOR_CALIBRATED, ESTIMATOR_HARDWARE} for e in cv.errors)
    assert {r.family for r in cv.summary(dataset="gavel", by_gpu=False)} >= {"gan", "reinforcement_learning"}


def test_bounded_lstsq_agrees_with_scipys_bounded_solver() -> None:
    import numpy as np
    from scipy.optimize import lsq_linear

    from costopt.throughput.calibrated import bounded_lstsq

    rng = np.random.default_rng(7)
    for _ in range(20):
        a = rng.normal(size=(40, 12))
        b = rng.normal(size=40) * 3
        lower = np.where(rng.random(12) < 0.5, 0.0, -np.inf)
        upper = np.where(rng.random(12) < 0.5, 1.0, np.inf)
        ours = bounded_lstsq(a, b, lower, upper)
        ref = lsq_linear(a, b, bounds=(lower, upper), method="bvls").x
        assert np.all(ours >= lower - 1e-9) and np.all(ours <= upper + 1e-9)
        assert np.sum((a @ ours - b) ** 2) == pytest.approx(np.sum((a @ ref - b) ** 2), rel=1e-9, abs=1e-9)
