"""What the core needs from a simulated cloud (``providers.sim.SimCloud`` implements it).

:class:`SimulatedCloud` is a :class:`~costopt.cloud.CloudProvider` whose time the caller drives: offline
runs of the job service (:mod:`costopt.jobs.offline`) advance it to the next event and let the
:class:`~costopt.migration.Migrator` sleep on it (:meth:`SimulatedCloud.sleeper`). :class:`WorkloadTiming`
is how long booting, restoring and checkpointing take there; :class:`SimEvent` what happened to an
instance; :class:`WorkloadProgress` a workload's state (the sim's direct workload hooks).

Times are tz-aware UTC.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Protocol

from costopt.cloud import CloudProvider
from costopt.domain import OfferKey
from costopt.errors import CostoptError
from costopt.ledger.prices import PriceView
from costopt.risk.hazard import HazardModel

__all__ = [
    "CloudFactory",
    "SimEvent",
    "SimEventKind",
    "SimulatedCloud",
    "SimulationError",
    "WorkloadProgress",
    "WorkloadTiming",
]


class SimulationError(CostoptError, ValueError):
    """A simulated cloud's parameters are invalid."""


@dataclass(frozen=True, slots=True)
class WorkloadTiming:
    """How long the steps of running a job take on the simulated cloud (documented assumptions).

    ``boot`` (3 min): launch to running (EC2 reports 1-2 min to ``running`` for GPU instances, plus the
    image's boot). ``restore`` (2 min): download the checkpoint and warm up (CUDA, data loaders) before
    the first step. ``checkpoint`` (1 min): training pauses while a checkpoint is written (a few GB to
    object storage at ~100 MB/s is under a minute; the rest is the pause and the handshake).
    ``checkpoint_interval`` (1 h): training time between periodic checkpoints (the planner's default).
    """

    boot: timedelta = timedelta(minutes=3)
    restore: timedelta = timedelta(minutes=2)
    checkpoint: timedelta = timedelta(minutes=1)
    checkpoint_interval: timedelta = timedelta(hours=1)

    def __post_init__(self) -> None:
        if min(self.boot, self.restore, self.checkpoint) < timedelta(0):
            raise SimulationError("boot, restore and checkpoint times must be >= 0")
        if self.checkpoint_interval <= timedelta(0):
            raise SimulationError("the checkpoint interval must be > 0")

    @property
    def restart_hours(self) -> float:
        """Boot and restore on a new instance (hours): what the decision rule calls the restart."""
        return (self.boot + self.restore).total_seconds() / 3600.0

    @property
    def checkpoint_hours(self) -> float:
        return self.checkpoint.total_seconds() / 3600.0

    @property
    def checkpoint_interval_hours(self) -> float:
        return self.checkpoint_interval.total_seconds() / 3600.0


class SimEventKind(StrEnum):
    READY = "ready"  # booted: running
    NOTICE = "notice"  # preemption notice (the cloud's lead time before the preemption)
    PREEMPTED = "preempted"
    DONE = "done"  # the workload reached its target steps and wrote its final checkpoint


@dataclass(frozen=True, slots=True)
class SimEvent:
    """Something that happened to an instance at ``at``."""

    at: datetime
    instance_id: str
    kind: SimEventKind


@dataclass(frozen=True, slots=True)
class WorkloadProgress:
    """A workload on one instance, as of the simulated clock.

    ``steps_done``: steps trained (as a step count of the whole job, from ``start_step``), including
    work not yet checkpointed. ``durable_steps``: steps saved by the last completed checkpoint (or the
    restored ``start_step``). ``durable_at``: when this instance completed that checkpoint (None: it
    has written none). ``training_from``: when training (first) started on this instance, after boot
    and restore. ``done_at``: when the target will be (or was) reached and checkpointed, None when it
    will not be on this instance as things stand. ``stopped_at``: preemption, termination, or the end of
    a checkpoint the workload was asked to stop after.
    """

    instance_id: str
    start_step: float
    steps_done: float
    durable_steps: float
    durable_at: datetime | None
    target_steps: float
    training_from: datetime | None
    done_at: datetime | None
    stopped_at: datetime | None

    @property
    def lost_steps(self) -> float:
        """Steps trained but not checkpointed (lost if the instance is gone)."""
        return max(self.steps_done - self.durable_steps, 0.0)


class SimulatedCloud(CloudProvider, Protocol):
    """A cloud whose time the caller drives, which runs workloads (``providers.sim.SimCloud``)."""

    name: str

    @property
    def timing(self) -> WorkloadTiming: ...

    def now(self) -> datetime:
        """The simulated clock."""
        ...

    def run_until(self, until: datetime, *, watch: Collection[str] | None = None) -> list[SimEvent]:
        """Advance the clock to ``until``, reporting (once each, in time order) the events of the
        ``watch``ed instances (None: all); stop early at the first preemption or finished workload
        among them (the clock then stands at its time)."""
        ...

    def start_workload(
        self,
        instance_id: str,
        *,
        steps_per_s: float,
        target_steps: float,
        start_step: float = 0.0,
        restore: bool | None = None,
    ) -> WorkloadProgress:
        """Run a job on the instance from ``start_step`` towards ``target_steps`` at ``steps_per_s``,
        after boot and (``restore``, default: ``start_step > 0``) the restore time."""
        ...

    def progress(self, instance_id: str) -> WorkloadProgress: ...

    def request_checkpoint(self, instance_id: str, *, then_stop: bool = False) -> datetime:
        """Ask the workload to write a checkpoint now (``then_stop``: and stop training); returns when it
        will be durable."""
        ...

    def sleeper(self) -> Callable[[float], None]:
        """A ``sleep(seconds)`` that advances the simulated clock instead of waiting (the migrator's)."""
        ...

    def migrator_timeouts(self) -> dict[str, float]:
        """``checkpoint_timeout`` and ``verify_timeout`` (simulated seconds) for a migrator on this cloud."""
        ...

    def untouched(
        self, spans: Iterable[tuple[OfferKey, datetime, datetime]], *, slack: timedelta = timedelta(hours=1)
    ) -> bool:
        """Whether nothing this cloud draws at random (launch failures, reclaims: its seed's) would touch
        instances living over ``spans`` (``(offer, launched, ended)``), ``slack`` around each: a run whose
        copies lived over them would run alike on a cloud with no hazards."""
        ...


class CloudFactory(Protocol):
    """Builds a simulated cloud on ``prices`` with ``hazards``, its clock at ``start``, seeded; ``rate``:
    its simulated agents' throughput by (job type, instance GPUs, offer, precision) (None: only jobs that
    give their own steps/s run an agent)."""

    def __call__(
        self,
        prices: PriceView,
        hazards: HazardModel,
        *,
        start: datetime,
        seed: int | Sequence[int],
        rate: Callable[[str, int, OfferKey, str], float | None] | None = None,
    ) -> SimulatedCloud: ...
