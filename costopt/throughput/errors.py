"""Typed errors of the throughput catalog. Each message names the file, the entry and what to fix."""

from __future__ import annotations

from pathlib import Path

from costopt.errors import BadRecord, CostoptError, MalformedInput


class ThroughputError(CostoptError):
    """Base of the throughput catalog's errors."""


class _FileEntryError(ThroughputError, MalformedInput):
    """A data file whose entry ``entry`` is wrong; ``path`` and ``entry`` are kept for callers."""

    def __init__(self, path: Path | str, entry: str, problem: str) -> None:
        self.path = Path(path)
        self.entry = entry
        self.problem = problem
        super().__init__(f"{self.path}: entry {entry}: {problem}")


class MalformedThroughputFile(_FileEntryError):
    """A throughput file (Gavel's JSON formats) whose structure or values are wrong."""


class MalformedAcceleratorSpecs(_FileEntryError):
    """The accelerator side-information CSV (``data/accelerators.csv``) is wrong."""


class MalformedCalibrationFile(_FileEntryError):
    """A calibration CSV (``data/calibration/*.csv``) row that cannot be used; the entry names the line,
    GPU and model."""


class InvalidThroughput(ThroughputError, BadRecord):
    """A throughput value or key given by a caller is invalid (negative, NaN, unknown placement...)."""
