"""Leave-one-GPU-out cross-validation of the throughput estimators on Gavel's measurements plus the
published calibration set (1 GPU).

A *cell* is one series on one GPU at one table precision: a Gavel job type's steps/s on K80/P100/V100
(FP32), or a published model's throughput in one source's table (duplicates of a cell, e.g. two
systems with the same GPU, are averaged in log space). For each GPU ``h`` every cell on ``h`` is hidden,
each estimator is fitted on all other cells and predicts the hidden ones, as if ``h`` were a GPU never
measured. Only cells both estimators can predict are scored (their series has a cell on another GPU).

* ``family-calibrated`` (:mod:`costopt.throughput.calibrated`): fitted on the training cells.
* ``hardware-loglinear`` (the baseline, :mod:`costopt.throughput.estimate`): per-series slopes on
  (log bandwidth, log FP32 TFLOPS) shrunk toward pooled ones, anchored on the series' nearest measured
  GPU, fitted on the same training cells; it knows nothing of precision or family, as in production.

Error factor of a cell: ``max(estimate / measured, measured / estimate)`` (1 = exact; 2 = off by 2x
either way). Figures are reported per family and held-out GPU, and per family (median and max).
The estimators' hyper-parameters are their defaults; they were chosen while looking at these figures,
so the figures are somewhat optimistic.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from costopt.throughput.calibrated import ESTIMATOR_CALIBRATED, CalibratedConfig, Observation, fit_calibrated
from costopt.throughput.calibration import GAVEL_SOURCE as GAVEL_SOURCE
from costopt.throughput.calibration import Cell as Cell
from costopt.throughput.calibration import cells_from as cells_from
from costopt.throughput.catalog import accelerator_order
from costopt.throughput.errors import InvalidThroughput
from costopt.throughput.estimate import (
    ESTIMATOR_HARDWARE,
    AcceleratorSpec,
    EstimatorConfig,
    fit_slopes,
    predict_from_anchor,
)

ESTIMATORS = (ESTIMATOR_CALIBRATED, ESTIMATOR_HARDWARE)
TARGET_MEDIAN = 1.3
TARGET_MAX = 2.0


@dataclass(frozen=True, slots=True)
class CellError:
    """A held-out cell and each estimator's error factor on it."""

    cell: Cell
    factors: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class ErrorRow:
    """Error factors of one group of held-out cells (``gpu`` empty for a family's summary)."""

    family: str
    gpu: str
    n_cells: int
    median: Mapping[str, float]
    maximum: Mapping[str, float]

    def meets_target(self, estimator: str = ESTIMATOR_CALIBRATED) -> bool:
        return self.median[estimator] <= TARGET_MEDIAN and self.maximum[estimator] <= TARGET_MAX


@dataclass(frozen=True, slots=True)
class CrossValidation:
    """Every held-out cell of one scheme with its errors; summaries per family (and GPU) of either the
    published calibration cells or Gavel's cells."""

    scheme: str
    errors: tuple[CellError, ...]
    calibrated_families: frozenset[str]
    """Families with at least one calibration (published) cell: the ones the targets apply to."""

    def summary(self, *, dataset: str = "calibration", by_gpu: bool = True) -> tuple[ErrorRow, ...]:
        """Error rows of the held-out cells of ``dataset`` (``calibration`` or ``gavel``)."""
        gavel = dataset == "gavel"
        return _summarise([e for e in self.errors if (e.cell.source == GAVEL_SOURCE) == gavel], by_gpu=by_gpu)

    def meets_targets(self) -> bool:
        """Median <= 1.3 and max <= 2 for every family with calibration cells (calibrated estimator)."""
        rows = self.summary(by_gpu=False)
        return bool(rows) and all(r.meets_target() for r in rows if r.family in self.calibrated_families)


def _observations(cells: Iterable[Cell]) -> list[Observation]:
    return [Observation(c.series, c.family, c.precision, c.gpu, c.log_throughput) for c in cells]


def _baseline_predictions(
    train: Sequence[Cell], test: Sequence[Cell], specs: Mapping[str, AcceleratorSpec], gpu: str
) -> dict[Cell, float]:
    tables = sorted({c.table for c in train} | {c.table for c in test})
    gpus = list(accelerator_order({c.gpu for c in train} - {gpu}))
    if not gpus:
        return {}
    row = {t: i for i, t in enumerate(tables)}
    col = {g: j for j, g in enumerate(gpus)}
    y = np.full((len(tables), len(gpus)), np.nan)
    for c in train:
        if c.gpu in col:
            y[row[c.table], col[c.gpu]] = c.log_throughput
    x = np.array([specs[g].features() for g in gpus])
    slopes = fit_slopes(y, x, EstimatorConfig()).per_job
    pred, _ = predict_from_anchor(y, x, slopes, np.array(specs[gpu].features()))
    return {c: float(pred[row[c.table]]) for c in test if math.isfinite(pred[row[c.table]])}


SCHEMES = ("leave-one-gpu-out", "new-gpus")
"""``leave-one-gpu-out``: every cell of one GPU hidden at a time. ``new-gpus``: for each published series in
turn, its cells on GPUs with TF32 (Ampere and newer) hidden, the rest of the data kept: a model known only
on Volta/Turing-era GPUs (as Gavel's job types are) estimated on today's GPUs."""


def _folds(cells: Sequence[Cell], scheme: str, specs: Mapping[str, AcceleratorSpec]) -> list[tuple[str, list[Cell]]]:
    if scheme == "leave-one-gpu-out":
        return [(gpu, [c for c in cells if c.gpu == gpu]) for gpu in accelerator_order({c.gpu for c in cells})]
    if scheme == "new-gpus":
        series = sorted({c.series for c in cells if c.source != GAVEL_SOURCE})
        return [(s, [c for c in cells if c.series == s and specs[c.gpu].has_tf32]) for s in series]
    raise InvalidThroughput(f"unknown cross-validation scheme {scheme!r}; known: {', '.join(SCHEMES)}")


def cross_validate(
    cells: Sequence[Cell],
    specs: Mapping[str, AcceleratorSpec],
    *,
    scheme: str = "leave-one-gpu-out",
    config: CalibratedConfig | None = None,
) -> CrossValidation:
    """Hide each fold of ``scheme`` in turn (see :data:`SCHEMES`), fit both estimators on the rest,
    score the hidden cells both can predict, and summarise the error factors."""
    errors: list[CellError] = []
    for _, hidden in _folds(cells, scheme, specs):
        hidden_set = set(hidden)
        train = [c for c in cells if c not in hidden_set]
        train_series = {c.series for c in train}
        train_tables = {c.table for c in train}
        test = [c for c in hidden if c.series in train_series and c.table in train_tables]
        if not test:
            continue
        model = fit_calibrated(_observations(train), specs, config)
        base: dict[Cell, float] = {}
        for gpu in {c.gpu for c in test}:
            base.update(_baseline_predictions(train, [c for c in test if c.gpu == gpu], specs, gpu))
        for c in test:
            new = model.predict_log(c.series, c.precision, specs[c.gpu], c.family)
            old = base.get(c)
            if new is None or old is None:
                continue
            factors = {
                ESTIMATOR_CALIBRATED: math.exp(abs(new - c.log_throughput)),
                ESTIMATOR_HARDWARE: math.exp(abs(old - c.log_throughput)),
            }
            errors.append(CellError(c, factors))
    calibrated = frozenset(c.family or "unknown" for c in cells if c.source != GAVEL_SOURCE)
    return CrossValidation(scheme, tuple(errors), calibrated)


def error_factor_rows(cv: CrossValidation, quantile: float = 0.9) -> list[dict[str, str]]:
    """Rows of ``data/calibration/error_factors.csv``: the ``quantile`` of each estimator's error factor
    over the calibration cells, per family and over all families (``all``)."""
    cells = [e for e in cv.errors if e.cell.source != GAVEL_SOURCE]
    groups: dict[str, list[CellError]] = defaultdict(list)
    for e in cells:
        groups[e.cell.family or "unknown"].append(e)
    groups["all"] = cells
    rows = []
    for name in ESTIMATORS:
        for family in sorted(groups):
            values = [e.factors[name] for e in groups[family]]
            rows.append(
                {
                    "estimator": name,
                    "family": family,
                    "scheme": cv.scheme,
                    "quantile": f"{quantile:g}",
                    "factor": f"{float(np.quantile(values, quantile)):.3f}",
                    "n_cells": str(len(values)),
                }
            )
    return rows


def _summarise(errors: Sequence[CellError], *, by_gpu: bool) -> tuple[ErrorRow, ...]:
    groups: dict[tuple[str, str], list[CellError]] = defaultdict(list)
    for e in errors:
        groups[(e.cell.family or "unknown", e.cell.gpu if by_gpu else "")].append(e)
    family_rank = {f: i for i, f in enumerate(sorted({k[0] for k in groups}))}
    gpu_rank = {g: i for i, g in enumerate(accelerator_order({k[1] for k in groups if k[1]}))}
    out = []
    for (fam, gpu), items in sorted(groups.items(), key=lambda kv: (family_rank[kv[0][0]], gpu_rank.get(kv[0][1], -1))):
        med = {name: float(np.median([e.factors[name] for e in items])) for name in ESTIMATORS}
        mx = {name: float(max(e.factors[name] for e in items)) for name in ESTIMATORS}
        out.append(ErrorRow(fam, gpu, len(items), med, mx))
    return tuple(out)
