"""Learning throughput from running jobs: a job's own progress becomes a measurement of its job type.

The job engine looks at each running copy's progress (:func:`costopt.agent.progress.storage_epoch_progress`:
the copy's epoch, its last step and when it was reported) on every tick and hands each look to
:meth:`ThroughputLearner.observe`. The first look at an epoch is only a baseline: the boot and the restore
of the copy happen before it, so they are never counted. From then on the steps and seconds between
successive looks of the same epoch are summed; once ``window_s`` seconds of training are summed, their
ratio is one measurement (steps/s of the whole job, on its GPU count, consolidated) of the job's type on
the copy's accelerator. A look from a new epoch (a move, a recovery), a look without new steps, or a step
count going back starts a new baseline.

A measurement is written to the :class:`~costopt.throughput.registry.MeasurementRegistry` (``source``
``job:<job id>:<precision>``: a catalog built at another precision leaves it out) and passed to
``on_measurement`` (the service drops its cached catalogs there, so the next plan, placement or
rebalance reads it). The catalog folds it into the cell like any measurement (count-weighted mean with
a measured cell; it replaces an estimate, and the estimator then extends the job type to other GPUs).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from costopt.domain import OfferKey, normalize_accelerator
from costopt.errors import CostoptError
from costopt.throughput.model import DEFAULT_PRECISION, JobType, Precision, check_precision
from costopt.throughput.registry import Measurement, MeasurementRegistry, job_source

log = logging.getLogger(__name__)

DEFAULT_WINDOW_S = 900.0


@dataclass(frozen=True, slots=True)
class CopyLook:
    """One look at a running copy: what the engine knows of it."""

    job_id: str
    job_type: JobType
    accelerator: str
    gpu_count: int
    precision: Precision
    epoch: int
    step: int
    reported_at: float
    """Unix seconds of the copy's last progress report."""


@dataclass(slots=True)
class _Window:
    epoch: int
    step: int
    reported_at: float
    steps: int = 0
    seconds: float = 0.0


class ThroughputLearner:
    """Turns successive looks at running copies into throughput measurements (see the module doc).
    Thread-safe; one per service."""

    def __init__(
        self,
        registry: MeasurementRegistry | None,
        *,
        window_s: float = DEFAULT_WINDOW_S,
        on_measurement: Callable[[Measurement], None] = lambda _m: None,
    ) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        self.registry = registry
        self.window_s = window_s
        self.on_measurement = on_measurement
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()

    def observe(self, look: CopyLook) -> Measurement | None:
        """Fold one look in; the measurement it completes, if any (already recorded and announced)."""
        with self._lock:
            w = self._windows.get(look.job_id)
            if (
                w is None
                or w.epoch != look.epoch
                or look.step < w.step
                or (look.step > w.step and look.reported_at <= w.reported_at)
            ):
                self._windows[look.job_id] = _Window(look.epoch, look.step, look.reported_at)
                return None
            if look.step == w.step:
                return None  # nothing new since the last look (the window keeps going from the last report)
            w.steps += look.step - w.step
            w.seconds += look.reported_at - w.reported_at
            w.step, w.reported_at = look.step, look.reported_at
            if w.seconds < self.window_s:
                return None
            rate = w.steps / w.seconds
            w.steps, w.seconds = 0, 0.0
        m = Measurement(
            job_type=look.job_type,
            accelerator=look.accelerator,
            gpu_count=look.gpu_count,
            steps_per_s=rate,
            provenance="user",
            source=job_source(look.job_id, look.precision),
            measured_at=datetime.fromtimestamp(look.reported_at, UTC),
        )
        if self.registry is not None:
            self.registry.add(m)
        log.info(
            "job %s: %s on %d x %s measured at %.4g steps/s",
            look.job_id,
            look.job_type.name,
            look.gpu_count,
            look.accelerator,
            rate,
        )
        self.on_measurement(m)
        return m

    def forget(self, job_id: str) -> None:
        """Drop a job's open window (it ended)."""
        with self._lock:
            self._windows.pop(job_id, None)


def engine_observer(
    learner: ThroughputLearner, shape_of: Callable[[OfferKey], tuple[str, float] | None]
) -> Callable[[Any, Any, Any], None]:
    """The job engine's ``progress_observer``: each look at a catalog job's copy (the job record, its
    migrator record, the copy's :class:`~costopt.agent.progress.EpochProgress`) as a :class:`CopyLook`
    on the accelerator ``shape_of`` names for the copy's offer. Jobs given by their own throughput, copies
    on an offer of unknown shape, and looks without a report are skipped. Never raises (a failure is
    logged): learning must not stop the engine."""

    def observe(job: Any, mj: Any, prog: Any) -> None:
        try:
            name = (job.spec or {}).get("job_type")
            offer = getattr(mj, "offer", None)
            if not name or offer is None or prog is None or prog.last_report_at is None:
                return
            shape = shape_of(offer)
            if shape is None:
                return
            look = CopyLook(
                job_id=str(job.id),
                job_type=JobType.parse(str(name)),
                accelerator=normalize_accelerator(shape[0]),
                gpu_count=int(job.spec.get("gpus", 1)),
                precision=check_precision(job.spec.get("precision") or DEFAULT_PRECISION),
                epoch=int(prog.epoch),
                step=int(prog.last_step),
                reported_at=float(prog.last_report_at),
            )
            learner.observe(look)
        except (CostoptError, SQLAlchemyError, ValueError, LookupError, TypeError) as exc:
            log.warning("job %s: its throughput was not learnt from this look: %s", getattr(job, "id", "?"), exc)

    return observe
