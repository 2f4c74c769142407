"""``costopt throughput ...``: job types' speed per GPU, users' measurements, estimator error."""

from __future__ import annotations

import sys
from enum import StrEnum
from typing import Annotated

import typer

from api.cli.common import Exit, failures, settings_with
from api.cli.output import OutputFormat, emit, note
from costopt.domain import normalize_accelerator

app = typer.Typer(help="Training throughput (steps/s) per job type and GPU.", no_args_is_help=True)


class PrecisionChoice(StrEnum):
    """A job's precision on the command line (docs/throughput.md)."""

    fp32 = "fp32"
    tf32 = "tf32"
    amp = "amp"


@app.command("list")
def list_(
    job_type: Annotated[str | None, typer.Option("--job-type", help="Only this job type.")] = None,
    gpu: Annotated[str | None, typer.Option(help="Only this accelerator.")] = None,
    gpus: Annotated[int | None, typer.Option(help="Only this GPU count.")] = None,
    measured_only: Annotated[bool, typer.Option(help="Hide estimated cells.")] = False,
    precision: Annotated[
        PrecisionChoice,
        typer.Option(help="Jobs at this precision: fp32 (PyTorch's default), tf32 or amp (docs/throughput.md)."),
    ] = PrecisionChoice.fp32,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Every known cell at a precision: measured (file), user (registered or reported), or estimated."""
    from api.wiring import build_catalog, build_store
    from costopt.throughput.model import JobType

    settings = settings_with()
    with failures():
        store = build_store(settings)
        catalog = build_catalog(settings, store.engine, precision=precision.value)
    acc = normalize_accelerator(gpu) if gpu else None
    jt = JobType.parse(job_type) if job_type else None
    rows = []
    for key, cell in sorted(
        catalog.cells.items(), key=lambda kv: (kv[0].job_type.name, kv[0].accelerator, kv[0].gpu_count)
    ):
        if (jt and key.job_type != jt) or (acc and key.accelerator != acc) or (gpus and key.gpu_count != gpus):
            continue
        if measured_only and cell.is_estimate:
            continue
        rows.append(
            {
                "job_type": key.job_type.name,
                "accelerator": key.accelerator,
                "gpu_count": key.gpu_count,
                "placement": key.placement,
                "precision": precision.value,
                "steps_per_s": cell.steps_per_s,
                "provenance": cell.provenance,
                "estimator": cell.estimator,
                "n_measurements": cell.n_measurements,
            }
        )
    emit(
        rows,
        [
            ("job_type", "job type", None),
            ("accelerator", "GPU", None),
            ("gpu_count", "GPUs", "count"),
            ("placement", "placement", None),
            ("precision", "precision", None),
            ("steps_per_s", "speed", "steps/s"),
            ("provenance", "provenance", None),
            ("estimator", "estimator", None),
            ("n_measurements", "measurements", "count"),
        ],
        fmt,
        title="Throughput catalog",
    )
    if not rows:
        raise typer.Exit(Exit.NOT_FOUND)


@app.command("register")
def register(
    job_type: Annotated[str, typer.Option("--job-type", help='e.g. "MyModel (batch size 32)".')],
    gpu: Annotated[str, typer.Option(help="Accelerator, e.g. a100.")],
    steps_per_s: Annotated[float, typer.Option("--steps-per-s", min=0, help="Measured speed, steps/s.")],
    gpus: Annotated[int, typer.Option(help="GPU count of the measurement.")] = 1,
    spread: Annotated[bool, typer.Option(help="Measured across servers, not on one.")] = False,
    windows: Annotated[int, typer.Option(min=1, help="How many measurement windows this averages.")] = 1,
    source: Annotated[str, typer.Option(help="Who measured it.")] = "user",
    precision: Annotated[
        PrecisionChoice, typer.Option(help="The precision it ran at: fp32 (PyTorch's default), tf32 or amp.")
    ] = PrecisionChoice.fp32,
) -> None:
    """Register a measurement (a new job type, or one more measurement of a known cell)."""
    from api.planning import reset
    from api.wiring import build_store
    from costopt.throughput.model import JobType
    from costopt.throughput.registry import Measurement, MeasurementRegistry, with_precision

    settings = settings_with()
    with failures():
        store = build_store(settings)
        MeasurementRegistry(store.engine).add(
            Measurement(
                JobType.parse(job_type),
                normalize_accelerator(gpu),
                gpus,
                steps_per_s,
                "spread" if spread else "consolidated",
                windows,
                "user",
                with_precision(source, precision.value),
            )
        )
        reset()
    note(f"registered {job_type} on {gpus} x {gpu} at {precision.value}: {steps_per_s:g} steps/s")


@app.command("report")
def report(
    holdout: Annotated[
        bool, typer.Option("--holdout", help="Print the older hold-out error report on Gavel's data instead.")
    ] = False,
    fraction: Annotated[float, typer.Option(help="--holdout: fraction of cells hidden for the low-rank test.")] = 0.2,
    seed: Annotated[int, typer.Option(help="--holdout: random seed.")] = 0,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Measured vs estimated, per job type and GPU: what users and running jobs measured, what the catalog
    held for that cell from everything else (the prior), and how far off it was."""
    from costopt.throughput.catalog import ThroughputCatalog
    from costopt.throughput.estimate import load_accelerator_specs
    from costopt.throughput.loaders import load_throughput_file

    settings = settings_with()
    path = settings.resolved_throughput_file()
    if holdout:
        from costopt.throughput.report import estimator_error_report, render_markdown

        if path is None:
            raise typer.BadParameter("no throughput file: set COSTOPT_THROUGHPUT_FILE or COSTOPT_DATA_DIR")
        with failures():
            catalog = ThroughputCatalog.from_measurements(load_throughput_file(path))
            result = estimator_error_report(catalog, load_accelerator_specs(), holdout_fraction=fraction, seed=seed)
        sys.stdout.write(render_markdown(result) + "\n")
        return
    from api.wiring import build_store
    from costopt.throughput.registry import MeasurementRegistry
    from costopt.throughput.report import measured_vs_prior

    with failures():
        store = build_store(settings)
        base = ThroughputCatalog.from_measurements(load_throughput_file(path)) if path else ThroughputCatalog()
        rows = measured_vs_prior(base, MeasurementRegistry(store.engine).all(), load_accelerator_specs())
    out = [
        {
            "job_type": r.job_type,
            "accelerator": r.accelerator,
            "gpu_count": r.gpu_count,
            "precision": r.precision,
            "measured_steps_per_s": r.measured,
            "windows": r.n_measurements,
            "prior_steps_per_s": r.prior,
            "prior": r.prior_estimator or r.prior_provenance or "none",
            "prior_low": r.prior_interval[0] if r.prior_interval else None,
            "prior_high": r.prior_interval[1] if r.prior_interval else None,
            "measured_over_prior": round(r.ratio, 3) if r.ratio is not None else None,
        }
        for r in rows
    ]
    emit(
        out,
        [
            ("job_type", "job type", None),
            ("accelerator", "GPU", None),
            ("gpu_count", "GPUs", "count"),
            ("precision", "precision", None),
            ("measured_steps_per_s", "measured", "steps/s"),
            ("windows", "windows", "count"),
            ("prior_steps_per_s", "prior", "steps/s"),
            ("prior", "prior from", None),
            ("measured_over_prior", "measured / prior", "x"),
        ],
        fmt,
        title="Throughput measured by users and jobs vs the catalog's prior",
    )
    if not out:
        note("no measurement registered or reported yet")
        raise typer.Exit(Exit.NOT_FOUND)


class _Scheme(StrEnum):
    loo = "leave-one-gpu-out"
    new = "new-gpus"


class _Dataset(StrEnum):
    calibration = "calibration"
    gavel = "gavel"


@app.command("calibrate")
def calibrate(
    scheme: Annotated[
        _Scheme, typer.Option(help="leave-one-gpu-out, or new-gpus (a model known on pre-Ampere GPUs only).")
    ] = _Scheme.loo,
    dataset: Annotated[
        _Dataset, typer.Option(help="Score the published calibration cells or Gavel's own cells.")
    ] = _Dataset.calibration,
    by_gpu: Annotated[
        bool, typer.Option("--by-gpu/--by-family", help="One row per family and GPU, or per family.")
    ] = True,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
) -> None:
    """Cross-validated error factor of the family-calibrated estimator and the hardware-loglinear
    baseline, per model family and GPU (targets: median <= 1.3, max <= 2 per family with calibration data)."""
    from costopt.throughput.calibrated import ESTIMATOR_CALIBRATED
    from costopt.throughput.calibration import load_calibration
    from costopt.throughput.catalog import ThroughputCatalog
    from costopt.throughput.crossval import TARGET_MAX, TARGET_MEDIAN, cells_from, cross_validate
    from costopt.throughput.estimate import ESTIMATOR_HARDWARE, load_accelerator_specs
    from costopt.throughput.loaders import load_throughput_file

    settings = settings_with()
    path = settings.resolved_throughput_file()
    with failures():
        specs = load_accelerator_specs()
        gavel = ThroughputCatalog.from_measurements(load_throughput_file(path)) if path is not None else None
        cv = cross_validate(cells_from(load_calibration(specs=specs), gavel, specs), specs, scheme=scheme.value)
    rows = [
        {
            "family": r.family,
            "gpu": r.gpu or "all",
            "cells": r.n_cells,
            "calibrated_median": round(r.median[ESTIMATOR_CALIBRATED], 3),
            "calibrated_max": round(r.maximum[ESTIMATOR_CALIBRATED], 3),
            "baseline_median": round(r.median[ESTIMATOR_HARDWARE], 3),
            "baseline_max": round(r.maximum[ESTIMATOR_HARDWARE], 3),
            "meets_target": r.meets_target(),
        }
        for r in cv.summary(dataset=dataset.value, by_gpu=by_gpu)
    ]
    emit(
        rows,
        [
            ("family", "family", None),
            ("gpu", "GPU", None),
            ("cells", "cells", "count"),
            ("calibrated_median", "family-calibrated median", "x"),
            ("calibrated_max", "family-calibrated max", "x"),
            ("baseline_median", "hardware-loglinear median", "x"),
            ("baseline_max", "hardware-loglinear max", "x"),
            ("meets_target", "target met", None),
        ],
        fmt,
        title=f"Throughput estimator error factor ({scheme.value}, {dataset.value} cells)",
    )
    if gavel is None:
        note("no Gavel throughput file (COSTOPT_DATA_DIR): fitted on the calibration set alone")
    verdict = "met" if cv.meets_targets() else "NOT met"
    note(
        f"targets (median <= {TARGET_MEDIAN}, max <= {TARGET_MAX} per family with calibration data, "
        f"calibration cells): {verdict}"
    )
    if not rows:
        raise typer.Exit(Exit.NOT_FOUND)
