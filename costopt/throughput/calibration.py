"""Published training throughputs (``data/calibration/*.csv``): the calibrated estimator's second data set.

Each row is one published figure: a model trained on ``gpu_count`` GPUs of one type at one precision,
in samples of its own unit per second (images/s, sequences/s, tokens/s, ...), with its source. Figures
of one model on different GPUs are comparable as ratios only: the estimator uses them to learn how
speed moves from GPU to GPU per model family and precision, never as steps/s of a costopt job type.

The loader is strict: a row with an unknown unit, precision or family, a throughput that is not a
positive number, a GPU without specs in ``data/accelerators.csv``, or a missing source is refused with
:class:`MalformedCalibrationFile` naming the file, the line, the GPU and model, and the reason.

:func:`cells_from` turns the rows (and a catalog's measured cells) into the single-GPU log-throughput
cells the calibrated estimator fits on and the cross-validation scores.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from costopt.domain import normalize_accelerator
from costopt.settings import PROJECT_ROOT
from costopt.throughput.catalog import ThroughputCatalog
from costopt.throughput.errors import MalformedCalibrationFile
from costopt.throughput.model import MODEL_FAMILIES, PRECISIONS, ModelFamily, Precision, family_of
from costopt.throughput.specs import AcceleratorSpec, load_accelerator_specs

DEFAULT_CALIBRATION_FILE = PROJECT_ROOT / "data" / "calibration" / "throughputs.csv"
"""The calibration set shipped with the project (sources in ``data/calibration/README.md``)."""

CALIBRATION_COLUMNS = (
    "gpu",
    "gpu_count",
    "model",
    "model_family",
    "precision",
    "batch_size",
    "throughput",
    "unit",
    "source",
    "notes",
)

GAVEL_SOURCE = "gavel"
"""The ``source`` of Gavel's measured cells among the cross-validation cells."""

UNITS = frozenset({"images/s", "sequences/s", "tokens/s", "samples/s", "frames/s"})
"""Units the loader knows: samples of the model's own kind per second, summed over all GPUs of the row."""


@dataclass(frozen=True, slots=True)
class CalibrationRow:
    """One published training throughput. ``batch_size`` is per GPU unless ``notes`` says global; None
    when the source does not state it. ``line`` is the row's line in its file (1 = header)."""

    gpu: str
    gpu_count: int
    model: str
    family: ModelFamily
    precision: Precision
    batch_size: int | None
    throughput: float
    unit: str
    source: str
    notes: str
    line: int

    @property
    def series(self) -> tuple[str, str]:
        """Rows of one series are one model as one source ran it (``(source, model)``); its throughputs
        on different GPUs and precisions are compared with each other only."""
        return self.source, self.model


def load_calibration(
    path: Path | None = None, specs: Mapping[str, AcceleratorSpec] | None = None
) -> tuple[CalibrationRow, ...]:
    """Read a calibration CSV (default :data:`DEFAULT_CALIBRATION_FILE`) and check every row against
    ``specs`` (default: ``data/accelerators.csv``). Raises :class:`MalformedCalibrationFile`."""
    path = DEFAULT_CALIBRATION_FILE if path is None else Path(path)
    known = load_accelerator_specs() if specs is None else specs
    rows: list[CalibrationRow] = []
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or tuple(header) != CALIBRATION_COLUMNS:
            raise MalformedCalibrationFile(
                path, "header", f"expected columns {','.join(CALIBRATION_COLUMNS)}, got {header}"
            )
        for line, raw in enumerate(reader, start=2):
            if not raw:
                continue
            rows.append(_row(path, line, raw, known))
    if not rows:
        raise MalformedCalibrationFile(path, "<file>", "no calibration rows")
    return tuple(rows)


def _row(path: Path, line: int, raw: list[str], specs: Mapping[str, AcceleratorSpec]) -> CalibrationRow:
    if len(raw) != len(CALIBRATION_COLUMNS):
        problem = f"expected {len(CALIBRATION_COLUMNS)} fields, got {len(raw)}"
        raise MalformedCalibrationFile(path, f"line {line}", problem)
    rec = dict(zip(CALIBRATION_COLUMNS, (v.strip() for v in raw), strict=True))
    entry = f"line {line} ({rec['gpu'] or '?'}, {rec['model'] or '?'})"

    def bad(problem: str) -> MalformedCalibrationFile:
        return MalformedCalibrationFile(path, entry, problem)

    gpu = normalize_accelerator(rec["gpu"]) if rec["gpu"] else ""
    if not gpu:
        raise bad("gpu is empty")
    if gpu not in specs:
        raise bad(f"GPU {gpu!r} has no specs in data/accelerators.csv: add a row with its datasheet source")
    if not rec["model"]:
        raise bad("model is empty")
    if rec["model_family"] not in MODEL_FAMILIES:
        raise bad(f"unknown model_family {rec['model_family']!r}; known: {', '.join(MODEL_FAMILIES)}")
    if rec["precision"] not in PRECISIONS:
        raise bad(f"unknown precision {rec['precision']!r}; known: {', '.join(PRECISIONS)}")
    if rec["unit"] not in UNITS:
        raise bad(f"unknown unit {rec['unit']!r}; known: {', '.join(sorted(UNITS))}")
    try:
        throughput = float(rec["throughput"])
    except ValueError:
        raise bad(f"throughput {rec['throughput']!r} is not a number") from None
    if not math.isfinite(throughput) or throughput <= 0:
        raise bad(f"throughput must be a positive finite number, got {rec['throughput']!r}")
    gpu_count = _positive_int(rec["gpu_count"])
    if gpu_count is None:
        raise bad(f"gpu_count must be an integer >= 1, got {rec['gpu_count']!r}")
    batch_size: int | None = None
    if rec["batch_size"]:
        batch_size = _positive_int(rec["batch_size"])
        if batch_size is None:
            raise bad(f"batch_size must be an integer >= 1 or empty (not stated), got {rec['batch_size']!r}")
    if not rec["source"]:
        raise bad("every row must name its source")
    return CalibrationRow(
        gpu=gpu,
        gpu_count=gpu_count,
        model=rec["model"],
        family=rec["model_family"],  # checked against MODEL_FAMILIES above
        precision=rec["precision"],  # checked against PRECISIONS above
        batch_size=batch_size,
        throughput=throughput,
        unit=rec["unit"],
        source=rec["source"],
        notes=rec["notes"],
        line=line,
    )


def _positive_int(text: str) -> int | None:
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 1 else None


@dataclass(frozen=True, slots=True)
class Cell:
    """One series' mean log throughput on one GPU at one precision (``source``: where it comes from)."""

    source: str
    model: str
    family: ModelFamily | None
    precision: Precision
    gpu: str
    log_throughput: float

    @property
    def series(self) -> str:
        return f"{self.source}|{self.model}"

    @property
    def table(self) -> str:
        """The baseline's series: one source's table of one model (float32 tables and AMP tables apart)."""
        return f"{self.series}|{'amp' if self.precision == 'amp' else 'float32'}"


def cells_from(
    calibration: Iterable[CalibrationRow],
    gavel: ThroughputCatalog | None,
    specs: Mapping[str, AcceleratorSpec],
) -> tuple[Cell, ...]:
    """Single-GPU cells of the calibration rows and of the catalog's measured 1-GPU cells (precision
    ``fp32``: Gavel's jobs ran in FP32), on GPUs with specs; duplicates averaged in log space."""
    sums: dict[tuple[str, str, ModelFamily | None, Precision, str], list[float]] = defaultdict(list)
    for r in calibration:
        if r.gpu_count == 1 and r.gpu in specs:
            sums[(r.source, r.model, r.family, r.precision, r.gpu)].append(math.log(r.throughput))
    if gavel is not None:
        for key, cell in gavel.measured_only().cells.items():
            if key.gpu_count == 1 and key.accelerator in specs and cell.can_run:
                jt = key.job_type
                sums[(GAVEL_SOURCE, jt.name, family_of(jt), "fp32", key.accelerator)].append(math.log(cell.steps_per_s))
    return tuple(
        Cell(src, model, fam, prec, gpu, float(np.mean(v))) for (src, model, fam, prec, gpu), v in sums.items()
    )
