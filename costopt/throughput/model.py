"""Value types of the throughput catalog.

Unit: a throughput is training steps (iterations) per second of the whole job, as Gavel measured it
(for a multi-GPU job: the job's steps/s on all its GPUs together). ``0.0`` means the combination
*cannot run* (measured failure, e.g. out of memory); it is distinct from *unknown*, which is the
absence of a value (``None`` from lookups, NaN in matrices).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal, get_args

from costopt.throughput.errors import InvalidThroughput

Placement = Literal["consolidated", "spread"]
"""``consolidated``: all GPUs of the job in one server; ``spread``: over several servers (Gavel's
``*_unconsolidated`` worker types)."""

Provenance = Literal["measured", "estimated", "user"]
"""``measured``: from a profiling file; ``user``: registered by a user or observed on a running job
(possibly averaged with a file value); ``estimated``: produced by an estimator (named in the value)."""

Precision = Literal["fp32", "tf32", "amp"]
"""How a job computes: ``fp32`` float32 without autocast and with PyTorch's default math modes (since
PyTorch 1.12 matmuls run in strict FP32 -- ``torch.backends.cuda.matmul.allow_tf32`` defaults to False --
while cuDNN convolutions may use TF32 tensor cores, ``torch.backends.cudnn.allow_tf32`` defaults to True);
``tf32`` float32 with TF32 allowed for matmuls too (``torch.set_float32_matmul_precision("high")``);
``amp`` automatic mixed precision (FP16/BF16 autocast). On GPUs without TF32 (before Ampere) ``tf32``
computes exactly as ``fp32``."""

ModelFamily = Literal["convolutional", "transformer", "recurrent", "reinforcement_learning", "recommendation", "gan"]
"""The model families the calibrated estimator fits separately."""

PLACEMENTS: tuple[Placement, ...] = get_args(Placement)
PROVENANCES: tuple[Provenance, ...] = get_args(Provenance)
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
MODEL_FAMILIES: tuple[ModelFamily, ...] = get_args(ModelFamily)

DEFAULT_PRECISION: Precision = "fp32"
"""PyTorch's own default (no autocast, matmul TF32 off since 1.12); also what Gavel's jobs were measured in."""

CONV_DOMINATED_FAMILIES: frozenset[ModelFamily] = frozenset({"convolutional", "gan"})
"""Families whose arithmetic is mostly cuDNN convolutions: in PyTorch's default ``fp32`` they already run
on TF32 tensor cores where the GPU has them (cuDNN's ``allow_tf32`` default), so they compute as ``tf32``."""

_GAVEL_FAMILIES: dict[str, ModelFamily] = {
    "ResNet-18": "convolutional",
    "ResNet-50": "convolutional",
    "Transformer": "transformer",
    "LM": "recurrent",
    "A3C": "reinforcement_learning",
    "Recommendation": "recommendation",
    "CycleGAN": "gan",
}


def check_precision(value: object) -> Precision:
    """``value`` as a :data:`Precision`, or :class:`InvalidThroughput` naming the accepted values."""
    if value not in PRECISIONS:
        raise InvalidThroughput(f"precision must be one of {', '.join(PRECISIONS)}, got {value!r}")
    return value


def family_of(job_type: JobType | str) -> ModelFamily | None:
    """The model family of a Gavel job type (by its model name), or None for a model costopt does not know."""
    model = job_type.model if isinstance(job_type, JobType) else JobType.parse(job_type).model
    return _GAVEL_FAMILIES.get(model)


_BATCH_RE = re.compile(r"^(?P<model>.+?) \(batch size (?P<bs>\d+)\)$")


@dataclass(frozen=True, slots=True)
class JobType:
    """A model at a batch size, e.g. ``JobType("ResNet-50", 128)``, named "ResNet-50 (batch size 128)".

    ``batch_size`` is None for job types named without one (Gavel's "A3C", "CycleGAN").
    """

    model: str
    batch_size: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip() or self.model != self.model.strip():
            raise InvalidThroughput(f"job type model name must be a non-empty stripped string, got {self.model!r}")
        bs = self.batch_size
        if bs is not None and (isinstance(bs, bool) or not isinstance(bs, int) or bs <= 0):
            raise InvalidThroughput(f"batch size must be a positive int or None, got {bs!r}")
        if bs is None and _parse_name(self.model) is not None:
            raise InvalidThroughput(f"{self.model!r} carries a batch size: use JobType.parse or pass batch_size")

    @property
    def name(self) -> str:
        """Display name exactly as Gavel's files spell it: ``"<model> (batch size <B>)"`` or ``"<model>"``."""
        return self.model if self.batch_size is None else f"{self.model} (batch size {self.batch_size})"

    @classmethod
    def parse(cls, name: str) -> JobType:
        """Parse a display name; ``parse(jt.name) == jt`` for every job type.

        A name without a well-formed ``" (batch size N)"`` suffix is a model name with no batch size.
        """
        if not isinstance(name, str):
            raise InvalidThroughput(f"job type name must be a string, got {name!r}")
        parsed = _parse_name(name)
        return cls(name) if parsed is None else cls(*parsed)

    def __str__(self) -> str:
        return self.name


def _parse_name(name: str) -> tuple[str, int] | None:
    m = _BATCH_RE.match(name)
    if m is None or m.group("bs").startswith("0"):
        return None
    return m.group("model"), int(m.group("bs"))


def as_job_type(job_type: JobType | str) -> JobType:
    """A :class:`JobType` from itself or from its display name."""
    return job_type if isinstance(job_type, JobType) else JobType.parse(job_type)


def _check_gpu_count(gpu_count: int) -> None:
    if isinstance(gpu_count, bool) or not isinstance(gpu_count, int) or gpu_count < 1:
        raise InvalidThroughput(f"gpu_count must be an int >= 1, got {gpu_count!r}")


@dataclass(frozen=True, slots=True)
class ThroughputKey:
    """Where a throughput holds: job type, canonical accelerator name, GPU count and placement.

    A single GPU has no spread placement: ``gpu_count == 1`` is always stored as ``consolidated``.
    """

    job_type: JobType
    accelerator: str
    gpu_count: int = 1
    placement: Placement = "consolidated"

    def __post_init__(self) -> None:
        if not isinstance(self.accelerator, str) or not self.accelerator:
            raise InvalidThroughput(f"accelerator must be a non-empty string, got {self.accelerator!r}")
        _check_gpu_count(self.gpu_count)
        if self.placement not in PLACEMENTS:
            raise InvalidThroughput(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.gpu_count == 1 and self.placement != "consolidated":
            object.__setattr__(self, "placement", "consolidated")


@dataclass(frozen=True, slots=True)
class Throughput:
    """A job's throughput in steps/s (``0.0`` = cannot run) and where the number comes from.

    ``n_measurements`` is how many measurements stand behind the value (>= 1 for measured/user, 0 for
    estimated); ``estimator`` names the estimator, and is set exactly when ``provenance == "estimated"``.
    ``interval``: ``(low, high)`` steps/s an estimate is expected within (from the estimator's
    cross-validated error, :mod:`costopt.throughput.uncertainty`); None for a measurement or when the
    estimator's error is not known.
    """

    steps_per_s: float
    provenance: Provenance
    n_measurements: int = 1
    estimator: str | None = None
    interval: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        check_steps_per_s(self.steps_per_s)
        if self.provenance not in PROVENANCES:
            raise InvalidThroughput(f"provenance must be one of {PROVENANCES}, got {self.provenance!r}")
        n = self.n_measurements
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidThroughput(f"n_measurements must be an int >= 0, got {n!r}")
        if self.provenance == "estimated":
            if not self.estimator:
                raise InvalidThroughput("an estimated throughput must name its estimator")
            if n != 0:
                raise InvalidThroughput(f"an estimated throughput has no measurements, got n_measurements={n}")
            if self.interval is not None:
                low, high = self.interval
                check_steps_per_s(low)
                check_steps_per_s(high)
                if not low <= self.steps_per_s <= high:
                    raise InvalidThroughput(f"interval {self.interval} must hold the estimate {self.steps_per_s}")
        else:
            if self.interval is not None:
                raise InvalidThroughput(f"a {self.provenance} throughput has no interval")
            if self.estimator is not None:
                raise InvalidThroughput(f"a {self.provenance} throughput has no estimator, got {self.estimator!r}")
            if n < 1:
                raise InvalidThroughput(f"a {self.provenance} throughput needs n_measurements >= 1, got {n}")

    @property
    def can_run(self) -> bool:
        """False when the combination is known not to run (throughput 0)."""
        return self.steps_per_s > 0.0

    @property
    def is_estimate(self) -> bool:
        return self.provenance == "estimated"


def check_steps_per_s(value: float) -> None:
    """Raise :class:`InvalidThroughput` unless ``value`` is a finite number >= 0 (steps/s)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidThroughput(f"a throughput must be a finite number >= 0 steps/s, got {value!r}")


@dataclass(frozen=True, slots=True)
class PairKey:
    """Two job types space-sharing the same GPU(s) of one accelerator type (Gavel's co-location pairs).

    ``gpu_count`` is the scale factor of both jobs (Gavel pairs only jobs of equal scale factor).
    """

    job_a: JobType
    job_b: JobType
    accelerator: str
    gpu_count: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.accelerator, str) or not self.accelerator:
            raise InvalidThroughput(f"accelerator must be a non-empty string, got {self.accelerator!r}")
        _check_gpu_count(self.gpu_count)

    def swapped(self) -> PairKey:
        return PairKey(self.job_b, self.job_a, self.accelerator, self.gpu_count)


PairThroughput = tuple[float, float]
"""``(steps/s of job_a, steps/s of job_b)`` while co-located; ``(0.0, 0.0)`` = the pair cannot run together."""
