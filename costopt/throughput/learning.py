"""Learning throughput from running jobs: a job's own progress becomes a measurement of its job type.

The job engine looks at each running copy's progress (:func:`costopt.agent.progress.storage_epoch_progress`:
the copy's epoch, its last step and when it was reported) on every tick and hands each look to
:meth:`ThroughputLearner.observe`, with a way to read the epoch's progress log (``CopyLook.reports``).

**Windows come from the copy's log, not from the looks.** The copy (the epoch's latest run, as
:class:`~costopt.agent.progress.EpochProgress` takes it) logs ``step`` records with their times. Its first
step record is the baseline (the boot and the restore happen before it, so they are never counted); a window
runs from one step record to the first step record at least ``window_s`` seconds later, which starts the next
one; each window is one measurement (steps/s of the whole job, on its GPU count, consolidated) of the job's
type on the copy's accelerator, ``window`` = ``<source>|e<epoch>|<first step>@<its time>``. So the windows
are a function of the log alone: a service restarted (or killed) mid-window, or looking at other moments,
finds the same windows; the learner keeps in memory only where the next window ends, and reads the log again
when a look passes it (once per window per copy, and once per copy after a restart). A window is recorded once
(the registry's unique ``window``: a restarted service, or a second replica, that completes it again writes
nothing and announces nothing). A new epoch (a move, a recovery) or a new run starts from its own first
step record.

A measurement is written to the :class:`~costopt.throughput.registry.MeasurementRegistry` (``source``
``job:<job id>:<precision>``: a catalog built at another precision leaves it out) and passed to
``on_measurement`` (the service drops its cached catalogs there, so the next plan, placement or
rebalance reads it). The catalog folds it into the cell like any measurement (count-weighted mean with
a measured cell; it replaces an estimate, and the estimator then extends the job type to other GPUs).

A job given by its own ``throughput`` (steps/s per accelerator, no catalog job type) is learnt as its own
job type (:func:`~costopt.throughput.registry.own_job_type`); :func:`own_catalog` is what it is then
planned on: the user's figures, its measurements in their place, and the estimator's extension of its
measurements to the other GPUs (with intervals).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from costopt.agent.progress import runs_of
from costopt.domain import OfferKey, normalize_accelerator
from costopt.errors import CostoptError
from costopt.throughput.catalog import ThroughputCatalog
from costopt.throughput.model import DEFAULT_PRECISION, JobType, Precision, ThroughputKey, check_precision
from costopt.throughput.registry import Measurement, MeasurementRegistry, job_source, own_job_type
from costopt.throughput.specs import AcceleratorSpec

log = logging.getLogger(__name__)

DEFAULT_WINDOW_S = 900.0
MAX_WINDOWS = 4096
"""Open windows one learner keeps at most (one per job it looked at; far above the jobs one service runs at
once): past it the window that opened first is dropped (that job's next look reads its log and its recorded
windows again), so a long-running service does not keep a window for every job it ever ran (the engine does
not tell the learner when a job ends)."""


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
    reports: Callable[[], Sequence[Mapping[str, Any]]] = field(compare=False)
    """The epoch's progress records (:func:`costopt.agent.progress.read_records` of the epoch), read only
    when a window may have ended (module doc)."""


def run_steps(records: Sequence[Mapping[str, Any]], epoch: int) -> tuple[str, list[tuple[int, float]]] | None:
    """The epoch's latest run (the one started last, chosen as :class:`~costopt.agent.progress.EpochProgress`
    chooses it) and its step reports ``(step, t)`` in logging order; None: no run."""
    mine = [rec for rec in records if int(rec.get("epoch", -1)) == epoch]
    runs = runs_of(mine)  # type: ignore[arg-type]  # read only
    if not runs:
        return None
    latest = max(runs.values(), key=lambda r: r.started_at or 0.0).run_id  # the first of equal starts
    steps = [
        (int(rec["step"]), float(rec.get("t", 0.0)))
        for rec in mine
        if rec.get("event") == "step" and str(rec.get("run", "")) == latest
    ]
    return latest, steps


def log_windows(reports: Sequence[tuple[int, float]], window_s: float) -> list[tuple[int, float, int, float]]:
    """The complete windows of one run's step reports: ``(first step, its time, last step, its time)``, from
    the first report on, each ending at the first report at least ``window_s`` seconds after its start (a
    report whose step does not advance is passed over: a window needs steps). Deterministic in ``reports``."""
    return _cut(reports, window_s)[0]


def _cut(
    reports: Sequence[tuple[int, float]], window_s: float
) -> tuple[list[tuple[int, float, int, float]], tuple[int, float] | None]:
    """:func:`log_windows`, and where the open window after them starts (None: no report)."""
    out: list[tuple[int, float, int, float]] = []
    if not reports:
        return out, None
    s0, t0 = reports[0]
    for step, t in reports[1:]:
        if step <= s0:
            if step < s0:  # steps going back inside a run: start again from here
                s0, t0 = step, t
            continue
        if t - t0 >= window_s:
            out.append((s0, t0, step, t))
            s0, t0 = step, t
    return out, (s0, t0)


@dataclass(slots=True)
class _Logged:
    """Where a copy's open log window starts (the learner's only memory of a copy)."""

    epoch: int
    run: str
    start_step: int
    start_at: float
    recorded: set[str]
    """This copy's windows known to be recorded (read from the registry once, then kept)."""


class ThroughputLearner:
    """Turns successive looks at running copies into throughput measurements (see the module doc).
    Thread-safe; one per service."""

    def __init__(
        self,
        registry: MeasurementRegistry | None,
        *,
        window_s: float = DEFAULT_WINDOW_S,
        on_measurement: Callable[[Measurement], None] = lambda _m: None,
        max_windows: int = MAX_WINDOWS,
    ) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        if max_windows < 1:
            raise ValueError(f"max_windows must be >= 1, got {max_windows!r}")
        self.registry = registry
        self.window_s = window_s
        self.max_windows = max_windows
        self.on_measurement = on_measurement
        self._logged: dict[str, _Logged] = {}
        self._lock = threading.Lock()

    def observe(self, look: CopyLook) -> Measurement | None:
        """Fold one look in: the windows of the copy's log completed since its last reading, each recorded
        once and announced by whoever recorded it; returns the last of those recorded here, if any."""
        with self._lock:
            st = self._logged.get(look.job_id)
            if (
                st is not None
                and st.epoch == look.epoch
                and look.step >= st.start_step
                and look.reported_at < st.start_at + self.window_s
            ):
                return None  # the open window cannot have ended yet: nothing to read
        ran = run_steps(look.reports(), look.epoch)
        if ran is None:
            return None
        run, reports = ran
        source = job_source(look.job_id, look.precision)
        windows, open_at = _cut(reports, self.window_s)
        with self._lock:
            st = self._logged.get(look.job_id)
            known = st.recorded if st is not None and st.epoch == look.epoch and st.run == run else None
        if known is None:
            known = self.registry.windows(source) if self.registry is not None else set()
        out: list[Measurement] = []
        for s0, t0, s1, t1 in windows:
            key = f"{source}|e{look.epoch}|{s0}@{t0!r}"
            if key in known:
                continue
            m = self._measurement(look, (s1 - s0) / (t1 - t0), t1, key)
            fresh = self.registry.add(m) if self.registry is not None else True
            known.add(key)
            if fresh:  # recorded here: announced here (another replica, or this one before a restart, did the rest)
                self._announce(look, m)
                out.append(m)
        # the open window's start (where the last one ended, the baseline, or after steps went back); before
        # the first step report, this look
        start = open_at or (look.step, look.reported_at)
        mine = f"{source}|e{look.epoch}|"
        known = {k for k in known if k.startswith(mine)}  # this copy's only (bounded by its windows)
        with self._lock:
            if look.job_id not in self._logged and len(self._logged) >= self.max_windows:  # the stalest goes
                del self._logged[min(self._logged, key=lambda j: self._logged[j].start_at)]
            self._logged[look.job_id] = _Logged(look.epoch, run, start[0], start[1], known)
        return out[-1] if out else None

    def _measurement(self, look: CopyLook, rate: float, at: float, window: str) -> Measurement:
        return Measurement(
            job_type=look.job_type,
            accelerator=look.accelerator,
            gpu_count=look.gpu_count,
            steps_per_s=rate,
            provenance="user",
            source=job_source(look.job_id, look.precision),
            measured_at=datetime.fromtimestamp(at, UTC),
            window=window,
        )

    def _announce(self, look: CopyLook, m: Measurement) -> None:
        log.info(
            "job %s: %s on %d x %s measured at %.4g steps/s",
            look.job_id,
            look.job_type.name,
            look.gpu_count,
            look.accelerator,
            m.steps_per_s,
        )
        self.on_measurement(m)

    def forget(self, job_id: str) -> None:
        """Drop a job's open window (it ended)."""
        with self._lock:
            self._logged.pop(job_id, None)


def engine_observer(
    learner: ThroughputLearner, shape_of: Callable[[OfferKey], tuple[str, float] | None]
) -> Callable[[Any, Any, Any], None]:
    """The job engine's ``progress_observer``: each look at a catalog job's copy (the job record, its
    migrator record, the copy's :class:`~costopt.agent.progress.EpochProgress`) as a :class:`CopyLook`
    on the accelerator ``shape_of`` names for the copy's offer; a job given by its own ``throughput`` as its
    own job type (:func:`~costopt.throughput.registry.own_job_type`). Jobs with neither, copies on an offer
    of unknown shape, and looks without a report are skipped. Never raises (a failure is logged): learning
    must not stop the engine."""

    def observe(job: Any, mj: Any, prog: Any) -> None:
        try:
            spec = job.spec or {}
            name = spec.get("job_type")
            offer = getattr(mj, "offer", None)
            if not (name or spec.get("throughput")) or offer is None or prog is None or prog.last_report_at is None:
                return
            shape = shape_of(offer)
            if shape is None:
                return
            look = CopyLook(
                job_id=str(job.id),
                job_type=JobType.parse(str(name)) if name else own_job_type(str(job.id)),
                accelerator=normalize_accelerator(shape[0]),
                gpu_count=int(spec.get("gpus", 1)),
                precision=check_precision(spec.get("precision") or DEFAULT_PRECISION),
                epoch=int(prog.epoch),
                step=int(prog.last_step),
                reported_at=float(prog.last_report_at),
                reports=_epoch_records(str(mj.checkpoint_uri), int(prog.epoch)),
            )
            learner.observe(look)
        except (CostoptError, SQLAlchemyError, ValueError, LookupError, TypeError) as exc:
            log.warning("job %s: its throughput was not learnt from this look: %s", getattr(job, "id", "?"), exc)

    return observe


def _epoch_records(location: str, epoch: int) -> Callable[[], Sequence[Mapping[str, Any]]]:
    def read() -> Sequence[Mapping[str, Any]]:
        from costopt.agent.control import records

        return records(location, epoch)

    return read


def own_catalog(
    job_type: JobType,
    given: Mapping[str, float],
    learnt: Sequence[Measurement],
    *,
    gpus: int,
    precision: Precision,
    specs: Mapping[str, AcceleratorSpec] | None,
) -> ThroughputCatalog:
    """The catalog of a job given by its own throughput (steps/s of the whole job on ``gpus`` GPUs):

    - ``given``: the user's figures per accelerator (``user`` cells), planned on as they are;
    - ``learnt``: the job's measurements (of ``job_type``, on ``gpus`` GPUs, consolidated; others are
      ignored): their count-weighted mean *replaces* the user's figure on their accelerator (what the job
      did beats what was said);
    - ``specs`` (None: no extension): once anything is learnt, every other accelerator with specs gets the
      hardware estimator's value (``family-calibrated``: a model of unknown family, at ``precision``) from
      the learnt cells alone, with its interval, where the user gave nothing. The estimator sees the job's
      figures as 1-GPU values (the ratio between GPUs of an n-GPU job is taken to be the 1-GPU one), and
      its memory guard applies (no estimate on a GPU with less memory than the smallest it ran on).
    """
    from costopt.throughput.estimate import estimate_catalog

    catalog = ThroughputCatalog(job_type_order=(job_type,))
    for acc, steps_per_s in given.items():
        catalog = catalog.with_measurement(job_type, str(acc), gpus, float(steps_per_s))
    mine = [m for m in learnt if m.job_type == job_type and m.gpu_count == gpus and m.placement == "consolidated"]
    if not mine:
        return catalog
    one = ThroughputCatalog(job_type_order=(job_type,))
    for m in mine:
        one = one.with_measurement(job_type, m.accelerator, 1, m.steps_per_s, n_measurements=m.n_measurements)
    if specs is not None:
        one = estimate_catalog(one, specs, precision=precision)
    out = dict(catalog.cells)
    for key, cell in one.cells.items():
        if key.gpu_count != 1 or key.placement != "consolidated":
            continue
        at_n = ThroughputKey(job_type, key.accelerator, gpus)
        if not cell.is_estimate or at_n not in out:
            out[at_n] = cell
    return ThroughputCatalog(out, {}, (job_type,))


def scale_estimates(catalog: ThroughputCatalog, job_type: JobType, factor: float) -> ThroughputCatalog:
    """``catalog`` with every estimate of ``job_type`` (and its interval) times ``factor``. When the job
    type's only measured 1-GPU cell changes by ``factor``, this is what refitting gives it: the estimators
    (``family-calibrated``, ``hardware-loglinear``, ``v100-scaling``) are linear in the level of a job type
    measured on one accelerator."""
    if not (factor > 0 and math.isfinite(factor)):
        raise ValueError(f"factor must be a finite number > 0, got {factor!r}")
    cells = dict(catalog.cells)
    for key, cell in catalog.cells.items():
        if key.job_type == job_type and cell.is_estimate:
            lo_hi = None if cell.interval is None else (cell.interval[0] * factor, cell.interval[1] * factor)
            cells[key] = replace(cell, steps_per_s=cell.steps_per_s * factor, interval=lo_hi)
    return ThroughputCatalog(cells, catalog.pairs, catalog.job_type_order)
