"""Persisted throughput measurements: users' registrations and running jobs' reports.

The catalog a planner uses is the measurement file's catalog with these folded in, in the order
they were recorded (:meth:`ThroughputCatalog.with_measurement`: a count-weighted mean per cell).
A measurement names its precision at the end of its source (``job:<id>:<precision>`` for a running
job's, :mod:`costopt.throughput.learning`; ``<who>:<precision>`` for a registration) and is folded only
into a catalog of that precision; a source naming none is taken to be at ``fp32``.

A job given by its own ``throughput`` (no catalog job type) is learnt as its own job type
(:func:`own_job_type`, ``job <id>``): those measurements belong to that one job's catalog
(:func:`costopt.throughput.learning.own_catalog`) and are left out of the shared one
(:meth:`MeasurementRegistry.apply`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError

from costopt.db.schema import throughput_measurements as t_meas
from costopt.domain import normalize_accelerator
from costopt.throughput.catalog import ThroughputCatalog, fold_measurement
from costopt.throughput.errors import InvalidThroughput
from costopt.throughput.model import (
    DEFAULT_PRECISION,
    JobType,
    Placement,
    Precision,
    Provenance,
    ThroughputKey,
    as_job_type,
    check_precision,
    check_steps_per_s,
)

JOB_SOURCE_PREFIX = "job:"
OWN_JOB_TYPE_PREFIX = "job "
"""The model name of a job given by its own throughput: ``job <job id>`` (:func:`own_job_type`)."""


def own_job_type(job_id: str) -> JobType:
    """The job type a job given by its own ``throughput`` is learnt as (one per job)."""
    return JobType(f"{OWN_JOB_TYPE_PREFIX}{job_id}")


def is_own_job_type(job_type: JobType) -> bool:
    """Whether ``job_type`` is one job's own (:func:`own_job_type`), not a catalog job type."""
    return job_type.batch_size is None and job_type.model.startswith(OWN_JOB_TYPE_PREFIX)


def job_source(job_id: str, precision: Precision) -> str:
    """The ``source`` of a running job's measurements."""
    return f"{JOB_SOURCE_PREFIX}{job_id}:{precision}"


def with_precision(source: str, precision: Precision) -> str:
    """``source`` naming the precision a measurement was taken at (unchanged for ``fp32``)."""
    return source if precision == DEFAULT_PRECISION else f"{source}:{precision}"


def source_precision(source: str) -> Precision:
    """The precision a measurement was taken at, from its source's last ``:``-separated part
    (``job:<id>:amp``, ``user:tf32``); ``fp32`` when it names none (users' registrations and profiling
    files are taken to be at PyTorch's default)."""
    if ":" not in source:
        return DEFAULT_PRECISION
    try:
        return check_precision(source.rsplit(":", 1)[-1])
    except InvalidThroughput:
        return DEFAULT_PRECISION


@dataclass(frozen=True, slots=True)
class Measurement:
    """One throughput observation (steps/s) of a job type on ``gpu_count`` GPUs of ``accelerator``;
    ``n_measurements`` is how many windows it averages (its weight)."""

    job_type: JobType
    accelerator: str
    gpu_count: int
    steps_per_s: float
    placement: Placement = "consolidated"
    n_measurements: int = 1
    provenance: Provenance = "user"
    source: str = "user"
    measured_at: datetime | None = None
    window: str | None = None
    """The progress window a running job's measurement covers (:mod:`costopt.throughput.learning`): a
    measurement with a window is recorded at most once (None: a registration, never deduplicated)."""


class MeasurementRegistry:
    """Throughput measurements in the database (table ``throughput_measurements``)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def add(self, m: Measurement) -> bool:
        """Record one measurement; False when it names a ``window`` already recorded (by this process before
        a restart, or by another replica: nothing written). Raises InvalidThroughput for a
        negative/NaN/infinite value."""
        check_steps_per_s(m.steps_per_s)
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    t_meas.insert().values(
                        job_type=m.job_type.name,
                        accelerator=normalize_accelerator(m.accelerator),
                        gpu_count=m.gpu_count,
                        placement=m.placement,
                        steps_per_s=m.steps_per_s,
                        n_measurements=m.n_measurements,
                        provenance=m.provenance,
                        source=m.source,
                        measured_at=m.measured_at or datetime.now(UTC),
                        window_key=m.window,
                    )
                )
        except IntegrityError:
            if m.window is None:
                raise
            return False
        return True

    def windows(self, source: str) -> set[str]:
        """The windows recorded for ``source`` (a running job's measurements, :func:`job_source`)."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(t_meas.c.window_key).where(t_meas.c.source == source, t_meas.c.window_key.is_not(None))
            ).fetchall()
        return {str(r[0]) for r in rows}

    def all(self) -> list[Measurement]:
        """Every measurement, oldest first."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(t_meas).order_by(t_meas.c.id)).fetchall()
        return [_measurement(r) for r in rows]

    def of_job_type(self, job_type: JobType, precision: Precision | None = None) -> list[Measurement]:
        """The measurements of ``job_type`` (taken at ``precision``; None: any), oldest first."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(t_meas).where(t_meas.c.job_type == job_type.name).order_by(t_meas.c.id)
            ).fetchall()
        out = [_measurement(r) for r in rows]
        return out if precision is None else [m for m in out if source_precision(m.source) == precision]

    def apply(self, catalog: ThroughputCatalog, precision: Precision = DEFAULT_PRECISION) -> ThroughputCatalog:
        """``catalog`` with every recorded measurement taken at ``precision`` folded in, oldest first. At a
        precision other than ``fp32`` a measurement replaces a file (``measured``, fp32) cell instead of
        being averaged with it. Jobs' own job types (:func:`is_own_job_type`) are left out."""
        return fold_measurements(catalog, self.all(), precision)


def fold_measurements(
    catalog: ThroughputCatalog, measurements: Iterable[Measurement], precision: Precision = DEFAULT_PRECISION
) -> ThroughputCatalog:
    """:meth:`MeasurementRegistry.apply` on ``measurements`` (oldest first) instead of the database's."""
    cells = dict(catalog.cells)
    order = list(catalog.job_type_order)
    for m in measurements:
        if source_precision(m.source) != precision or is_own_job_type(m.job_type):
            continue
        key = ThroughputKey(m.job_type, normalize_accelerator(m.accelerator), m.gpu_count, m.placement)
        old = cells.get(key)
        if precision != DEFAULT_PRECISION and old is not None and old.provenance == "measured":
            del cells[key]  # replaced, not averaged (and placed last, as a new cell)
            old = None
        cells[key] = fold_measurement(old, m.steps_per_s, m.n_measurements, m.provenance)
        order.append(m.job_type)
    # one catalog built at the end (a catalog per measurement copied every cell and pair each time)
    return ThroughputCatalog(cells, catalog.pairs, tuple(order))


def _measurement(r: Any) -> Measurement:
    return Measurement(
        job_type=as_job_type(r.job_type),
        accelerator=r.accelerator,
        gpu_count=r.gpu_count,
        steps_per_s=r.steps_per_s,
        placement=r.placement,
        n_measurements=r.n_measurements,
        provenance=r.provenance,
        source=r.source,
        measured_at=r.measured_at,
        window=r.window_key,
    )
