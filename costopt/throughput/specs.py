"""Published peak figures of the accelerators (``data/accelerators.csv``): the side information every
throughput estimator reads. Each row names its vendor datasheet; the loader is strict."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from costopt.domain import normalize_accelerator
from costopt.settings import PROJECT_ROOT
from costopt.throughput.errors import MalformedAcceleratorSpecs
from costopt.throughput.model import Precision

DEFAULT_ACCELERATOR_SPECS = PROJECT_ROOT / "data" / "accelerators.csv"
"""The curated side information shipped with the project."""

SPEC_COLUMNS = (
    "accelerator",
    "variant",
    "fp32_tflops",
    "tf32_tensor_tflops",
    "fp16_tensor_tflops",
    "memory_bandwidth_gbps",
    "memory_gb",
    "source",
    "note",
)


@dataclass(frozen=True, slots=True)
class AcceleratorSpec:
    """Published peak figures of one accelerator (per GPU as a cloud exposes it).

    ``tf32_tensor_tflops`` is the dense TF32 tensor rate, 0 on GPUs without TF32 (before Ampere), where
    ``tf32`` computes as ``fp32``; ``fp16_tensor_tflops`` is the dense FP16/BF16 tensor rate with FP32
    accumulation, what mixed precision uses (the FP16 or FP32 vector rate on GPUs without tensor
    cores); ``source`` names the vendor datasheet.
    """

    accelerator: str
    variant: str
    fp32_tflops: float
    tf32_tensor_tflops: float
    fp16_tensor_tflops: float
    memory_bandwidth_gbps: float
    memory_gb: float
    source: str
    note: str = ""

    def features(self) -> tuple[float, float]:
        """``(log memory bandwidth, log FP32 TFLOPS)``: the estimator's regressors."""
        return math.log(self.memory_bandwidth_gbps), math.log(self.fp32_tflops)

    @property
    def has_tf32(self) -> bool:
        """True when the GPU has TF32 tensor cores (Ampere and newer)."""
        return self.tf32_tensor_tflops > 0

    def rate_tflops(self, compute: Precision) -> float:
        """Peak dense TFLOPS of the arithmetic ``compute`` runs on (see :func:`compute_class`)."""
        if compute == "amp":
            return self.fp16_tensor_tflops
        if compute == "tf32" and self.has_tf32:
            return self.tf32_tensor_tflops
        return self.fp32_tflops


def load_accelerator_specs(path: Path | None = None) -> dict[str, AcceleratorSpec]:
    """Read the side-information CSV (default :data:`DEFAULT_ACCELERATOR_SPECS`), strictly.

    Raises :class:`MalformedAcceleratorSpecs` on a wrong header, a non-canonical or repeated
    accelerator name, a non-positive or non-numeric figure, or an empty source.
    """
    path = DEFAULT_ACCELERATOR_SPECS if path is None else Path(path)
    specs: dict[str, AcceleratorSpec] = {}
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or tuple(header) != SPEC_COLUMNS:
            raise MalformedAcceleratorSpecs(path, "header", f"expected columns {','.join(SPEC_COLUMNS)}, got {header}")
        for line, row in enumerate(reader, start=2):
            entry = f"line {line}"
            if not row:
                continue
            if len(row) != len(SPEC_COLUMNS):
                raise MalformedAcceleratorSpecs(path, entry, f"expected {len(SPEC_COLUMNS)} fields, got {len(row)}")
            rec = dict(zip(SPEC_COLUMNS, row, strict=True))
            acc = rec["accelerator"]
            if not acc or normalize_accelerator(acc) != acc:
                raise MalformedAcceleratorSpecs(path, entry, f"accelerator {acc!r} is not a canonical name")
            if acc in specs:
                raise MalformedAcceleratorSpecs(path, entry, f"accelerator {acc!r} is listed twice")
            if not rec["source"].strip():
                raise MalformedAcceleratorSpecs(path, entry, "every row must name its source")
            nums: dict[str, float] = {}
            for col in SPEC_COLUMNS[2:7]:
                try:
                    value = float(rec[col])
                except ValueError:
                    value = math.nan
                if col == "tf32_tensor_tflops" and value == 0:
                    nums[col] = 0.0  # no TF32 on this GPU
                    continue
                if not math.isfinite(value) or value <= 0:
                    what = "a positive number (0 = no TF32)" if col == "tf32_tensor_tflops" else "a positive number"
                    raise MalformedAcceleratorSpecs(path, entry, f"{col} must be {what}, got {rec[col]!r}")
                nums[col] = value
            specs[acc] = AcceleratorSpec(
                accelerator=acc,
                variant=rec["variant"],
                fp32_tflops=nums["fp32_tflops"],
                tf32_tensor_tflops=nums["tf32_tensor_tflops"],
                fp16_tensor_tflops=nums["fp16_tensor_tflops"],
                memory_bandwidth_gbps=nums["memory_bandwidth_gbps"],
                memory_gb=nums["memory_gb"],
                source=rec["source"],
                note=rec["note"],
            )
    if not specs:
        raise MalformedAcceleratorSpecs(path, "<file>", "no accelerator rows")
    return specs
