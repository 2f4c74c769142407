"""Cross-validated error of the throughput estimators: docs/figures/throughput_calibration.png and the
markdown tables of docs/throughput.md. Run: COSTOPT_DATA_DIR=/path/to/data .venv/bin/python
experiments/throughput/calibration_report.py (the data folder holds gavel/simulation_throughputs.json)."""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from costopt.throughput.calibrated import ESTIMATOR_CALIBRATED
from costopt.throughput.calibration import load_calibration
from costopt.throughput.catalog import ThroughputCatalog
from costopt.throughput.crossval import (
    SCHEMES,
    TARGET_MAX,
    TARGET_MEDIAN,
    CrossValidation,
    cells_from,
    cross_validate,
    error_factor_rows,
)
from costopt.throughput.estimate import ESTIMATOR_HARDWARE, load_accelerator_specs
from costopt.throughput.loaders import GAVEL_SIMULATION_FILE, load_throughput_file
from costopt.throughput.uncertainty import (
    DEFAULT_ERROR_FACTORS,
    ERROR_FACTOR_COLUMNS,
    INTERVAL_QUANTILE,
    INTERVAL_SCHEME,
)

ROOT = Path(__file__).resolve().parents[2]
FIGURE = ROOT / "docs" / "figures" / "throughput_calibration.png"
NAMES = {ESTIMATOR_CALIBRATED: "family-calibrated", ESTIMATOR_HARDWARE: "hardware-loglinear (baseline)"}


def table(cv: CrossValidation, *, dataset: str, by_gpu: bool) -> str:
    lines = [
        "| family | GPU | cells | calibrated median | calibrated max | baseline median | baseline max |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in cv.summary(dataset=dataset, by_gpu=by_gpu):
        c, b = ESTIMATOR_CALIBRATED, ESTIMATOR_HARDWARE
        lines.append(
            f"| {r.family} | {r.gpu or 'all'} | {r.n_cells} | {r.median[c]:.2f} | {r.maximum[c]:.2f} "
            f"| {r.median[b]:.2f} | {r.maximum[b]:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    data_dir = Path(os.environ.get("COSTOPT_DATA_DIR", "/work/shared/data"))
    specs = load_accelerator_specs()
    gavel = ThroughputCatalog.from_measurements(load_throughput_file(data_dir / GAVEL_SIMULATION_FILE))
    cells = cells_from(load_calibration(specs=specs), gavel, specs)
    results = {scheme: cross_validate(cells, specs, scheme=scheme) for scheme in SCHEMES}

    fig, axes = plt.subplots(1, len(SCHEMES), figsize=(12, 4.5), sharey=True)
    for ax, (scheme, cv) in zip(axes, results.items(), strict=True):
        errors = [e for e in cv.errors if e.cell.source != "gavel"]
        families = sorted({e.cell.family or "unknown" for e in errors})
        for i, fam in enumerate(families):
            for j, (est, colour) in enumerate(((ESTIMATOR_CALIBRATED, "tab:blue"), (ESTIMATOR_HARDWARE, "tab:gray"))):
                values = np.array([e.factors[est] for e in errors if (e.cell.family or "unknown") == fam])
                x = i + (j - 0.5) * 0.35
                jitter = np.random.default_rng(i * 10 + j).uniform(-0.08, 0.08, values.size)
                ax.scatter(x + jitter, values, s=9, alpha=0.5, color=colour, label=NAMES[est] if i == 0 else None)
                ax.hlines(np.median(values), x - 0.15, x + 0.15, color="black", linewidth=2)
        ax.axhline(TARGET_MEDIAN, color="tab:green", linestyle="--", linewidth=1, label=f"median {TARGET_MEDIAN}")
        ax.axhline(TARGET_MAX, color="tab:red", linestyle="--", linewidth=1, label=f"max {TARGET_MAX}")
        ax.set_xticks(range(len(families)), families, rotation=15)
        ax.set_yscale("log")
        ax.set_yticks([1, 1.3, 2, 3, 4], ["1", "1.3", "2", "3", "4"])
        ax.minorticks_off()
        ax.set_title(f"{scheme} ({len(errors)} published cells)")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("error factor (estimate vs published, either way)")
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle("Throughput estimators, cross-validated on the calibration set (black bar: median)")
    fig.tight_layout()
    FIGURE.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(FIGURE, dpi=110)
    print(f"wrote {FIGURE}", file=sys.stderr)

    rows = error_factor_rows(results[INTERVAL_SCHEME], INTERVAL_QUANTILE)
    with DEFAULT_ERROR_FACTORS.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, ERROR_FACTOR_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {DEFAULT_ERROR_FACTORS}", file=sys.stderr)

    for scheme, cv in results.items():
        print(f"\n### {scheme}: per family (calibration cells; targets met: {cv.meets_targets()})\n")
        print(table(cv, dataset="calibration", by_gpu=False))
        print(f"\n### {scheme}: per family and GPU (calibration cells)\n")
        print(table(cv, dataset="calibration", by_gpu=True))
        print(f"\n### {scheme}: Gavel's cells, per family\n")
        print(table(cv, dataset="gavel", by_gpu=False))


if __name__ == "__main__":
    main()
