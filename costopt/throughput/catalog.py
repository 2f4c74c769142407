"""The immutable throughput catalog: (job type, accelerator, GPU count, placement) -> steps/s.

Every cell carries its provenance (measured / user / estimated + estimator name). Unknown cells are
absent (``get`` returns None, matrices hold NaN); a cell of 0 steps/s means *cannot run*.

Updates return a new catalog. :meth:`ThroughputCatalog.with_measurement` folds a new measurement
into a cell with a **count-weighted running mean** (each measurement weighs its ``n_measurements``;
a file value weighs 1). The mean, not an EWMA, because a cell describes one job type on one hardware
type, whose throughput is stationary; every measurement is itself an average over a window, and a
caller expecting drift can weigh recent windows more through ``n_measurements``. A measurement that
flips *can run* (0 vs > 0) replaces the cell instead: averaging a failure with a success means nothing.
Estimated cells are never averaged: a measurement replaces them. Estimates elsewhere in the catalog
are not refreshed; re-run :func:`costopt.throughput.estimate.estimate_catalog` on the result to refit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from costopt.domain import KNOWN_ACCELERATORS, normalize_accelerator
from costopt.throughput.errors import InvalidThroughput
from costopt.throughput.loaders import ThroughputMeasurements
from costopt.throughput.model import (
    JobType,
    PairKey,
    PairThroughput,
    Placement,
    Provenance,
    Throughput,
    ThroughputKey,
    as_job_type,
    check_steps_per_s,
)

log = logging.getLogger(__name__)


def accelerator_order(names: Iterable[str]) -> tuple[str, ...]:
    """Canonical accelerators in :data:`KNOWN_ACCELERATORS` order, then unknown ones alphabetically."""
    rank = {acc: i for i, acc in enumerate(KNOWN_ACCELERATORS)}
    return tuple(sorted(set(names), key=lambda a: (rank.get(a, len(rank)), a)))


def fold_measurement(
    old: Throughput | None, steps_per_s: float, n_measurements: int = 1, provenance: Provenance = "user"
) -> Throughput:
    """A cell after one more measurement (see :meth:`ThroughputCatalog.with_measurement`, which folds one;
    folding many into one dict of cells builds the catalog once). Raises InvalidThroughput for a bad value,
    count or an ``estimated`` provenance."""
    check_steps_per_s(steps_per_s)
    if provenance == "estimated":
        raise InvalidThroughput("with_measurement takes measurements; use with_estimates for estimates")
    if isinstance(n_measurements, bool) or not isinstance(n_measurements, int) or n_measurements < 1:
        raise InvalidThroughput(f"n_measurements must be an int >= 1, got {n_measurements!r}")
    new = Throughput(float(steps_per_s), provenance, n_measurements)
    if old is not None and not old.is_estimate and old.can_run == new.can_run:
        n = old.n_measurements + n_measurements
        mean = (old.steps_per_s * old.n_measurements + new.steps_per_s * n_measurements) / n
        merged: Provenance = "user" if "user" in (old.provenance, provenance) else "measured"
        new = Throughput(mean, merged, n)
    return new


@dataclass(frozen=True, slots=True, eq=False)
class ThroughputCatalog:
    """Throughputs (steps/s) with provenance, co-location pairs, and job types in registration order.

    Build it with :meth:`from_measurements` or :meth:`empty`; the constructor copies its arguments
    into read-only mappings. Accelerator names are canonical (:func:`costopt.domain.normalize_accelerator`).
    """

    cells: Mapping[ThroughputKey, Throughput] = field(default_factory=dict)
    pairs: Mapping[PairKey, PairThroughput] = field(default_factory=dict)
    job_type_order: tuple[JobType, ...] = ()

    def __post_init__(self) -> None:
        order = dict.fromkeys(self.job_type_order)
        for key in self.cells:
            order.setdefault(key.job_type, None)
        for pk in self.pairs:
            order.setdefault(pk.job_a, None)
            order.setdefault(pk.job_b, None)
        object.__setattr__(self, "cells", MappingProxyType(dict(self.cells)))
        object.__setattr__(self, "pairs", MappingProxyType(dict(self.pairs)))
        object.__setattr__(self, "job_type_order", tuple(order))

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def empty(cls) -> ThroughputCatalog:
        return cls()

    @classmethod
    def from_measurements(cls, *sources: ThroughputMeasurements) -> ThroughputCatalog:
        """A catalog of ``measured`` cells (1 measurement each). A later source overrides an earlier one
        cell by cell (the files disagree on shared cells; they are not averaged)."""
        cells: dict[ThroughputKey, Throughput] = {}
        pairs: dict[PairKey, PairThroughput] = {}
        order: list[JobType] = []
        for src in sources:
            overridden = sum(1 for k in src.isolated if k in cells)
            if overridden:
                log.info("%s overrides %d cells of earlier sources", src.source, overridden)
            cells.update({k: Throughput(v, "measured") for k, v in src.isolated.items()})
            pairs.update(src.pairs)
            order.extend(src.job_types)
        return cls(cells, pairs, tuple(order))

    # --- lookups ------------------------------------------------------------------------------

    def get(
        self,
        job_type: JobType | str,
        accelerator: str,
        gpu_count: int = 1,
        placement: Placement = "consolidated",
    ) -> Throughput | None:
        """The cell's throughput, or None when unknown. ``accelerator`` may be any vendor spelling."""
        return self.cells.get(
            ThroughputKey(as_job_type(job_type), normalize_accelerator(accelerator), gpu_count, placement)
        )

    def pair(
        self, job_a: JobType | str, job_b: JobType | str, accelerator: str, gpu_count: int = 1
    ) -> PairThroughput | None:
        """``(steps/s of job_a, steps/s of job_b)`` when co-located on the same GPU(s), or None if unknown."""
        key = PairKey(as_job_type(job_a), as_job_type(job_b), normalize_accelerator(accelerator), gpu_count)
        if key in self.pairs:
            return self.pairs[key]
        other = self.pairs.get(key.swapped())
        return None if other is None else (other[1], other[0])

    def job_types(self) -> tuple[JobType, ...]:
        """Every job type, in registration order (file order first)."""
        return self.job_type_order

    def accelerators(self) -> tuple[str, ...]:
        """Accelerators holding at least one cell (canonical order, see :func:`accelerator_order`)."""
        return accelerator_order(k.accelerator for k in self.cells)

    def gpu_counts(self) -> tuple[int, ...]:
        return tuple(sorted({k.gpu_count for k in self.cells}))

    def __len__(self) -> int:
        return len(self.cells)

    def __contains__(self, key: object) -> bool:
        return key in self.cells

    def matrix(
        self,
        gpu_count: int = 1,
        placement: Placement = "consolidated",
        *,
        accelerators: Sequence[str] | None = None,
        include_estimates: bool = True,
    ) -> tuple[tuple[str, ...], tuple[str, ...], npt.NDArray[np.float64]]:
        """(job type names, accelerators, steps/s matrix): NaN = unknown, 0 = cannot run.

        Rows are all job types (registration order); columns ``accelerators`` or :meth:`accelerators`.
        """
        cols = (
            tuple(normalize_accelerator(a) for a in accelerators) if accelerators is not None else self.accelerators()
        )
        rows = self.job_type_order
        out = np.full((len(rows), len(cols)), np.nan)
        for i, jt in enumerate(rows):
            for j, acc in enumerate(cols):
                cell = self.cells.get(ThroughputKey(jt, acc, gpu_count, placement))
                if cell is not None and (include_estimates or not cell.is_estimate):
                    out[i, j] = cell.steps_per_s
        return tuple(jt.name for jt in rows), cols, out

    # --- updates ------------------------------------------------------------------------------

    def with_measurement(
        self,
        job_type: JobType | str,
        accelerator: str,
        gpu_count: int,
        steps_per_s: float,
        *,
        placement: Placement = "consolidated",
        n_measurements: int = 1,
        provenance: Provenance = "user",
    ) -> ThroughputCatalog:
        """A catalog with one more measurement of a cell (steps/s; 0 = observed not to run).

        New job types and accelerators are registered. On a measured/user cell the value becomes the
        count-weighted mean (see the module docstring) and the provenance ``user`` if either side is;
        an estimated or absent cell is replaced. ``provenance`` is ``user`` (a user's registration or a
        running job's observation) or ``measured`` (a profiling run).
        """
        jt = as_job_type(job_type)
        key = ThroughputKey(jt, normalize_accelerator(accelerator), gpu_count, placement)
        cells = dict(self.cells)
        cells[key] = fold_measurement(cells.get(key), steps_per_s, n_measurements, provenance)
        return ThroughputCatalog(cells, self.pairs, (*self.job_type_order, jt))

    def with_pair_measurement(
        self,
        job_a: JobType | str,
        job_b: JobType | str,
        accelerator: str,
        steps_per_s_a: float,
        steps_per_s_b: float,
        gpu_count: int = 1,
    ) -> ThroughputCatalog:
        """A catalog where the co-location of ``job_a`` and ``job_b`` reads the given steps/s (replaced,
        both orders)."""
        check_steps_per_s(steps_per_s_a)
        check_steps_per_s(steps_per_s_b)
        key = PairKey(as_job_type(job_a), as_job_type(job_b), normalize_accelerator(accelerator), gpu_count)
        pairs = dict(self.pairs)
        if key.swapped() != key:
            pairs.pop(key.swapped(), None)
        pairs[key] = (float(steps_per_s_a), float(steps_per_s_b))
        return ThroughputCatalog(self.cells, pairs, (*self.job_type_order, key.job_a, key.job_b))

    def with_estimates(self, estimates: Mapping[ThroughputKey, Throughput]) -> ThroughputCatalog:
        """A catalog with ``estimates`` added where no measured/user value exists (existing estimates
        are replaced; measurements are never overwritten). Every value must be ``estimated``."""
        cells = dict(self.cells)
        for key, value in estimates.items():
            if not value.is_estimate:
                raise InvalidThroughput(f"with_estimates got a {value.provenance} value for {key}")
            current = cells.get(key)
            if current is None or current.is_estimate:
                cells[key] = value
        return ThroughputCatalog(cells, self.pairs, self.job_type_order)

    def measured_only(self) -> ThroughputCatalog:
        """This catalog without its estimated cells."""
        return ThroughputCatalog(
            {k: v for k, v in self.cells.items() if not v.is_estimate}, self.pairs, self.job_type_order
        )
