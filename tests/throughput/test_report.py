"""The estimator error report: leave-one-accelerator-out and random-holdout figures."""

from __future__ import annotations

import math

import pytest

from costopt.throughput import AcceleratorSpec, InvalidThroughput, ThroughputCatalog, ThroughputMeasurements
from costopt.throughput.report import EstimatorReport, estimator_error_report, render_markdown


@pytest.fixture(scope="module")
def report(catalog: ThroughputCatalog, specs: dict[str, AcceleratorSpec]) -> EstimatorReport:
    return estimator_error_report(catalog, specs)


def test_leave_one_accelerator_out_reports_finite_errors_per_accelerator_and_overall(report: EstimatorReport) -> None:
    labels = [r.label for r in report.hardware_loao]
    assert labels == ["k80", "p100", "v100", "overall"]
    for row in report.hardware_loao:
        assert row.n_cells == (78 if row.label == "overall" else 26)
        assert math.isfinite(row.median_ape_pct)
        assert math.isfinite(row.p90_ape_pct)
        assert 0 <= row.median_ape_pct <= row.p90_ape_pct


def test_baselines_are_reported_for_comparison(report: EstimatorReport) -> None:
    names = [name for name, _ in report.baselines]
    assert names == ["same-as-anchor", "bandwidth-ratio", "fp32-ratio"]
    for _, rows in report.baselines:
        # the same rows as the estimator's, so ``all`` below cannot pass over an empty list
        assert [r.label for r in rows] == ["k80", "p100", "v100", "overall"]
        assert [r.n_cells for r in rows] == [r.n_cells for r in report.hardware_loao]
        assert all(math.isfinite(r.median_ape_pct) and 0 <= r.median_ape_pct <= r.p90_ape_pct for r in rows)


def test_low_rank_completion_holdout_hides_20_percent_per_repeat(report: EstimatorReport) -> None:
    assert report.completion.n_cells == report.repeats * round(0.2 * 78)
    assert math.isfinite(report.completion.median_ape_pct)
    assert math.isfinite(report.completion.p90_ape_pct)


def test_report_is_reproducible_with_a_seed(
    catalog: ThroughputCatalog, specs: dict[str, AcceleratorSpec], report: EstimatorReport
) -> None:
    first = estimator_error_report(catalog, specs, seed=1, repeats=2)
    assert estimator_error_report(catalog, specs, seed=1, repeats=2) == first
    assert first.hardware_loao == report.hardware_loao  # no randomness in leave-one-out
    assert first.completion.n_cells == 2 * 16


def test_report_works_on_the_older_file(oracle: ThroughputMeasurements, specs: dict[str, AcceleratorSpec]) -> None:
    rep = estimator_error_report(ThroughputCatalog.from_measurements(oracle), specs, repeats=2)
    assert [r.label for r in rep.hardware_loao][-1] == "overall" and len(rep.hardware_loao) >= 3
    assert all(r.n_cells > 0 and math.isfinite(r.median_ape_pct) for r in rep.hardware_loao)
    assert rep.completion.n_cells > 0 and math.isfinite(rep.completion.median_ape_pct)


def test_markdown_lists_every_figure(report: EstimatorReport) -> None:
    text = render_markdown(report)
    assert text.startswith("# Throughput estimator error")
    for row in report.hardware_loao:
        assert f"| {row.label} | {row.n_cells} | {row.median_ape_pct:.1f} | {row.p90_ape_pct:.1f} |" in text
    assert "extrapolations" in text
    assert "random 20% of cells" in text


def test_report_needs_specs_and_two_accelerators(catalog: ThroughputCatalog, specs: dict[str, AcceleratorSpec]) -> None:
    with pytest.raises(InvalidThroughput):
        estimator_error_report(catalog, specs, accelerators=["v100"])
    with pytest.raises(InvalidThroughput):
        estimator_error_report(catalog, {k: v for k, v in specs.items() if k != "k80"})
