"""Backtest one job with the simulated cloud, the migration decision rule and the ledger.

A job of ``steps`` steps starts at ``start`` on the best offer under its objective (the planner,
:func:`costopt.planning.single.plan_job`, over every offer priced then) and runs on the simulated cloud
until its steps are done or ``end`` comes:

- **rebalancing** every ``rebalance_every`` (default 24 h) after the start: ``dynamic_migration_cost``
  asks the decision rule (:func:`costopt.migration.decision.choose`: dwell, margin, the real cost of the
  move) whether to move to one of the planner's best candidates; ``dynamic`` moves to the planner's
  winner whenever it changes (ignoring what moving costs); ``static`` never moves;
- **a move**: the new instance is launched first (a launch that fails leaves the job where it is), the
  old one writes a checkpoint and stops, and is terminated when the checkpoint is durable; the new one
  restores it once booted. The two instances overlap only while the old one writes its checkpoint
  (``WorkloadTiming.checkpoint``, the documented checkpoint overlap), and no work is lost;
- **a preemption** (from the simulated cloud's hazards) loses the work since the job's last durable
  checkpoint; the job recovers at once: ``dynamic_migration_cost`` on the rule's choice for a preempted
  job (the cheapest place to finish, move costs included), ``dynamic`` on the planner's winner, both
  leaving the preempted offer out for ``avoid_preempted`` (default 1 h); ``static`` relaunches its own
  offer. A recovery on another offer counts as a move for the rule's dwell;
- **billing**: every instance interval (launch to terminate or preemption; boot, restore and
  checkpoint time included) goes to the ledger, integrated across price changes; a checkpoint moved to
  another place pays egress (GB x USD/GB, an additive charge); restart, overlap and lost work are memo
  charges that explain part of the interval costs.

The core does not import the providers: what the runner needs from the simulated cloud is
:class:`SimulatedCloud` (``providers.sim.SimCloud`` implements it); :class:`CloudFactory` builds one.
What a policy decides is a :class:`Placer`; :class:`PlannerPlacer` is the planner-and-rule one of
``costopt backtest job``; the preemption study (:mod:`costopt.backtest.preemption`) brings the paper's.

Units: steps, steps/s, USD per instance-hour (float prices), Decimal USD for money, tz-aware UTC times.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Context, Decimal
from enum import StrEnum
from typing import Any, Protocol

import pandas as pd

from costopt.cloud import CapacityError, CloudProvider, LaunchSpec, QuotaError
from costopt.domain import Cloud, Market, OfferKey, utc
from costopt.errors import CostoptError
from costopt.ledger.book import Ledger, MemoryLedger
from costopt.ledger.model import ChargeKind, ChargeRecord, CostReport, IntervalRecord
from costopt.ledger.prices import KEY_COLUMNS, PriceView, offer_label
from costopt.migration.decision import Action, MigrationRule, OfferQuote, RunningJob, choose
from costopt.planning.evaluate import OfferTable
from costopt.planning.model import (
    DEFAULT_EGRESS,
    Assumptions,
    Candidate,
    EgressRates,
    Infeasible,
    JobSpec,
    Location,
    MinCost,
    MinCostByDeadline,
    MinTime,
    MinTimeWithinBudget,
    Objective,
    Plan,
    to_cents,
)
from costopt.planning.single import plan_job
from costopt.risk.hazard import HazardModel
from costopt.throughput.catalog import ThroughputCatalog
from costopt.throughput.model import JobType

__all__ = [
    "DEFAULT_CHECKPOINT_GB",
    "JOB_POLICIES",
    "CloudFactory",
    "DecisionLogEntry",
    "JobBacktest",
    "JobBacktestError",
    "JobRun",
    "JobRunResult",
    "JobState",
    "Placement",
    "Placer",
    "PlannerPlacer",
    "SimEvent",
    "SimEventKind",
    "SimulatedCloud",
    "Verdict",
    "WorkloadProgress",
    "WorkloadTiming",
    "run_job",
    "run_job_backtest",
]

log = logging.getLogger(__name__)

JOB_POLICIES: tuple[str, ...] = ("static", "dynamic", "dynamic_migration_cost")
"""``static``: the planner's choice at the start, kept (relaunched on the same offer after a
preemption). ``dynamic``: re-planned every ``rebalance_every``, moving to the winner whenever it changes.
``dynamic_migration_cost``: re-planned every ``rebalance_every`` with the migration decision rule."""

DEFAULT_CHECKPOINT_GB = 1.0
"""Checkpoint size (GB) of a job type the paper's table does not size (an assumption)."""

_SHARE = Context(prec=28)


class JobBacktestError(CostoptError, ValueError):
    """A job backtest cannot run as asked (no offer at the start, bad parameters)."""


# --- what the runner needs from the simulated cloud ---------------------------------------------------


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
            raise JobBacktestError("boot, restore and checkpoint times must be >= 0")
        if self.checkpoint_interval <= timedelta(0):
            raise JobBacktestError("the checkpoint interval must be > 0")

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


class CloudFactory(Protocol):
    """Builds a simulated cloud on ``prices`` with ``hazards``, its clock at ``start``, seeded."""

    def __call__(
        self, prices: PriceView, hazards: HazardModel, *, start: datetime, seed: int | Sequence[int]
    ) -> SimulatedCloud: ...


# --- policies -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Placement:
    """An offer as a job would run on it: ``instance_gpus`` GPUs per instance, the job's throughput there,
    and the job's share of the instance price when chosen (USD/h, informative)."""

    key: OfferKey
    instance_gpus: float
    steps_per_s: float
    job_usd_per_hour: float

    @property
    def place(self) -> Location:
        return Location(self.key.cloud, self.key.region)

    def quote(self) -> OfferQuote:
        return OfferQuote(self.key, self.job_usd_per_hour, self.steps_per_s)


@dataclass(frozen=True, slots=True)
class JobState:
    """The job as a placer sees it at ``now``.

    ``remaining_steps``: steps left from the job's progress (on a recovery: from its last durable
    checkpoint). ``current``: where it runs (on a recovery: where it was preempted; None before the
    start). ``avoid``: offers preempted or failed to launch recently (left out by the dynamic policies).
    ``spent_usd``: what the ledger holds for the job so far (only when the placer asks for it).
    """

    now: datetime
    started_at: datetime
    remaining_steps: float
    current: Placement | None
    checkpoint_at: Location | None
    checkpoint_gb: float
    last_moved_at: datetime | None
    avoid: frozenset[OfferKey] = frozenset()
    spent_usd: Decimal | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    """A placer's rebalancing verdict: move to ``target`` (None: stay), and why."""

    target: Placement | None
    reason: str
    explanation: str


class Placer(Protocol):
    """A placement policy, as the runner asks it."""

    @property
    def rebalance_every(self) -> timedelta | None:
        """How often to rebalance after the start (None: never)."""
        ...

    @property
    def wants_spent(self) -> bool:
        """Whether :attr:`JobState.spent_usd` must be filled (it costs a ledger query)."""
        ...

    def place(self, state: JobState, exclude: Collection[OfferKey]) -> Placement | None:
        """Where to start (``exclude``: offers that just failed to launch). None: nowhere."""
        ...

    def recover(self, state: JobState, exclude: Collection[OfferKey]) -> Placement | None:
        """Where to go after a preemption of ``state.current``. None: nowhere now."""
        ...

    def rebalance(self, state: JobState) -> Verdict:
        """Stay or move (decided every :attr:`rebalance_every`)."""
        ...


def _share(job_gpus: int, instance_gpus: float) -> Decimal:
    share = _SHARE.divide(Decimal(job_gpus), Decimal(repr(float(instance_gpus))))
    if not Decimal(0) < share <= Decimal(1):
        raise JobBacktestError(f"a {job_gpus}-GPU job does not fit an instance of {instance_gpus} GPUs")
    return share


# --- the runner ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobRun:
    """One job to run: ``steps`` from ``start``, stopped at ``end`` if not done by then.

    ``gpus``: GPUs it trains on (one instance; it pays ``gpus / instance GPUs`` of the instance, the
    planner's per-GPU packing). ``checkpoint_gb``: moved with the job between places (egress).
    ``avoid_preempted``: how long the dynamic policies leave a preempted (or failed) offer out.
    ``launch_attempts``: offers tried per launch before giving up for ``retry_after``.
    """

    job_id: str
    steps: float
    start: datetime
    end: datetime
    gpus: int = 1
    checkpoint_gb: float = 0.0
    team: str = ""
    avoid_preempted: timedelta = timedelta(hours=1)
    launch_attempts: int = 5
    retry_after: timedelta = timedelta(minutes=10)
    egress: EgressRates = field(default_factory=lambda: DEFAULT_EGRESS)

    def __post_init__(self) -> None:
        if not self.steps > 0 or not math.isfinite(self.steps):
            raise JobBacktestError(f"steps must be > 0, got {self.steps}")
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise JobBacktestError("start and end must be tz-aware UTC")
        if self.end <= self.start:
            raise JobBacktestError(f"the run ends ({self.end}) before it starts ({self.start})")
        if self.gpus < 1 or self.checkpoint_gb < 0 or self.launch_attempts < 1:
            raise JobBacktestError("gpus and launch_attempts must be >= 1, checkpoint_gb >= 0")


@dataclass(frozen=True, slots=True)
class DecisionLogEntry:
    """What the runner decided at ``at``: ``event`` (start, rebalance, recover, move, launch_failed,
    stalled), the ``action`` taken, the target offer, and why."""

    at: datetime
    event: str
    action: str
    target: str | None
    reason: str
    explanation: str


@dataclass(frozen=True, eq=False)
class JobRunResult:
    """How a job ran. ``report``: the ledger's report of the job over its run (an interval still open at
    ``stopped_at`` is costed up to it). ``lost_steps``: trained but lost to preemptions."""

    job: JobRun
    provider: str
    finished: bool
    finished_at: datetime | None
    stopped_at: datetime
    steps_done: float
    lost_steps: float
    moves: int
    preemptions: int
    launch_failures: int
    decisions: tuple[DecisionLogEntry, ...]
    report: CostReport

    @property
    def hours(self) -> float:
        """Wall-clock hours from the start to the finish (or to ``stopped_at``)."""
        return ((self.finished_at or self.stopped_at) - self.job.start).total_seconds() / 3600.0

    @property
    def total_usd(self) -> Decimal:
        return self.report.total_usd


@dataclass(slots=True)
class _Running:
    instance_id: str
    placement: Placement
    launched_at: datetime
    epoch: int


class _Runner:
    """The mutable state of one run (see :func:`run_job`)."""

    def __init__(self, cloud: SimulatedCloud, ledger: Ledger, placer: Placer, job: JobRun) -> None:
        self.cloud, self.ledger, self.placer, self.job = cloud, ledger, placer, job
        self.epoch = 0
        self.durable = 0.0
        self.checkpoint_at: Location | None = None
        self.checkpoint_offer: OfferKey | None = None
        self.last_moved_at: datetime | None = None
        self.avoid: dict[OfferKey, datetime] = {}
        self.current: _Running | None = None
        self.last_placement: Placement | None = None
        self.moves = self.preemptions = self.launch_failures = 0
        self.lost_steps = 0.0
        self.decisions: list[DecisionLogEntry] = []
        self.finished_at: datetime | None = None

    # helpers -------------------------------------------------------------------------------------------

    def _log(self, event: str, action: str, target: Placement | None, reason: str, explanation: str = "") -> None:
        self.decisions.append(
            DecisionLogEntry(
                self.cloud.now(),
                event,
                action,
                None if target is None else offer_label(target.key),
                reason,
                explanation,
            )
        )

    def _avoided(self, now: datetime) -> frozenset[OfferKey]:
        return frozenset(k for k, until in self.avoid.items() if until > now)

    def _state(self, now: datetime, remaining: float, current: Placement | None) -> JobState:
        spent = self.ledger.costs(job_id=self.job.job_id, as_of=now).total_usd if self.placer.wants_spent else None
        return JobState(
            now=now,
            started_at=self.job.start,
            remaining_steps=max(remaining, 0.0),
            current=current,
            checkpoint_at=self.checkpoint_at,
            checkpoint_gb=self.job.checkpoint_gb,
            last_moved_at=self.last_moved_at,
            avoid=self._avoided(now),
            spent_usd=spent,
        )

    def _launch(self, choose_offer: Callable[[set[OfferKey]], Placement | None], event: str) -> _Running | None:
        tried: set[OfferKey] = set()
        for _ in range(self.job.launch_attempts):
            placement = choose_offer(tried)
            if placement is None:
                return None
            self.epoch += 1
            epoch = str(self.epoch)
            spec = LaunchSpec(
                offer=placement.key,
                env={"COSTOPT_JOB_ID": self.job.job_id, "COSTOPT_EPOCH": epoch},
                tags={"costopt:job": self.job.job_id, "costopt:epoch": epoch},
            )
            try:
                inst = self.cloud.launch(spec, f"{self.job.job_id}:{epoch}")
            except (CapacityError, QuotaError) as exc:
                self.launch_failures += 1
                tried.add(placement.key)
                self.avoid[placement.key] = self.cloud.now() + self.job.avoid_preempted
                self._log(event, "launch_failed", placement, type(exc).__name__, str(exc))
                continue
            run = _Running(inst.instance_id, placement, utc(inst.launched_at or self.cloud.now()), self.epoch)
            self._record(run, None, None)  # open from its launch: billed up to any time asked, even if we stop
            return run
        return None

    def _interval_key(self, run: _Running) -> str:
        return f"{self.cloud.name}:{run.instance_id}"

    def _record(self, run: _Running, end: datetime | None, reason: str | None) -> None:
        share = _share(self.job.gpus, run.placement.instance_gpus)
        self.ledger.record_interval(
            IntervalRecord(
                interval_key=self._interval_key(run),
                job_id=self.job.job_id,
                instance_id=run.instance_id,
                offer=run.placement.key,
                started_at=run.launched_at,
                ended_at=end,
                share=share,
                team=self.job.team,
                provider=self.cloud.name,
                end_reason=reason,
            )
        )
        if end is None:
            return
        prog = self.cloud.progress(run.instance_id)
        ready = prog.training_from if prog.training_from is not None and prog.training_from < end else end
        if ready > run.launched_at:
            self._memo(run, ChargeKind.RESTART, run.launched_at, ready, "boot and restore, no progress")

    def _memo(self, run: _Running, kind: ChargeKind, start: datetime, end: datetime, note: str) -> None:
        self.ledger.record_charge(
            ChargeRecord(
                charge_key=f"{self._interval_key(run)}:{kind.value}",
                job_id=self.job.job_id,
                kind=kind,
                at=end,
                team=self.job.team,
                offer=run.placement.key,
                interval_key=self._interval_key(run),
                span=(start, end),
                share=_share(self.job.gpus, run.placement.instance_gpus),
                note=note,
            )
        )

    def _start_workload(self, run: _Running) -> None:
        place = run.placement.place
        if self.durable > 0 and self.checkpoint_at is not None and self.checkpoint_at != place:
            rate = self.job.egress.rate(self.checkpoint_at.cloud, self.checkpoint_at.region, place.cloud, place.region)
            if rate > 0 and self.job.checkpoint_gb > 0:
                self.ledger.record_charge(
                    ChargeRecord(
                        charge_key=f"{self.job.job_id}:{run.epoch}:egress",
                        job_id=self.job.job_id,
                        kind=ChargeKind.EGRESS,
                        at=self.cloud.now(),
                        team=self.job.team,
                        quantity=Decimal(repr(self.job.checkpoint_gb)),
                        unit="GB",
                        rate_usd=Decimal(repr(rate)),
                        offer=self.checkpoint_offer,
                        note=f"checkpoint {self.checkpoint_at.cloud.value} {self.checkpoint_at.region} -> "
                        f"{place.cloud.value} {place.region}",
                    )
                )
        self.cloud.start_workload(
            run.instance_id,
            steps_per_s=run.placement.steps_per_s,
            target_steps=self.job.steps,
            start_step=self.durable,
            restore=self.durable > 0,
        )
        if self.last_placement is not None and self.last_placement.key != run.placement.key:
            self.last_moved_at = self.cloud.now()
        self.checkpoint_at, self.checkpoint_offer = place, run.placement.key
        self.last_placement = run.placement
        self.current = run

    def _lost(self, run: _Running, at: datetime) -> None:
        """Account for ``run`` preempted at ``at``: lost work, durable steps, its interval."""
        prog = self.cloud.progress(run.instance_id)
        self.durable = max(self.durable, prog.durable_steps)
        lost = prog.lost_steps
        self.lost_steps += lost
        start = prog.durable_at or prog.training_from
        if lost > 0 and start is not None and start < at:
            self._memo(run, ChargeKind.LOST_WORK, start, at, f"{lost:.0f} steps since the last checkpoint")
        self._record(run, at, "preempted")
        self.preemptions += 1
        self.avoid[run.placement.key] = at + self.job.avoid_preempted

    def _recover(self, lost: Placement | None) -> None:
        now = self.cloud.now()
        state = self._state(now, self.job.steps - self.durable, lost)
        new = self._launch(lambda tried: self.placer.recover(state, tried), "recover")
        if new is None:
            self.current = None
            self._log("recover", "stalled", None, "no offer could be launched", f"retry in {self.job.retry_after}")
            return
        self._log("recover", "relaunch", new.placement, "preempted")
        self._start_workload(new)

    def _move(self, target: Placement) -> None:
        old = self.current
        if old is None:  # pragma: no cover - only called with a running job
            return
        t = self.cloud.now()
        if self.cloud.progress(old.instance_id).steps_done >= self.job.steps:
            return  # writing its final checkpoint: done in a moment, nothing to move
        new = self._launch(lambda tried: None if target.key in tried else target, "move")
        if new is None:
            return
        durable_at = self.cloud.request_checkpoint(old.instance_id, then_stop=True)
        new_alive, old_preempted = True, False
        while self.cloud.now() < durable_at:
            watch = {old.instance_id} | ({new.instance_id} if new_alive else set())
            events = self.cloud.run_until(durable_at, watch=watch)
            last = events[-1] if events else None
            if last is None or last.kind is not SimEventKind.PREEMPTED:
                continue
            if last.instance_id == old.instance_id:
                old_preempted = True
                self._lost(old, last.at)
                break
            new_alive = False
            self._lost(new, last.at)
        now = self.cloud.now()
        if not old_preempted:
            self.durable = max(self.durable, self.cloud.progress(old.instance_id).durable_steps)
            self.cloud.terminate(old.instance_id)
            self._record(old, now, "moved")
            if now > t:
                self._memo(old, ChargeKind.OVERLAP, t, now, "checkpoint written while the new instance boots")
        self.moves += 1
        if new_alive:
            self._start_workload(new)
        else:
            self._recover(target)

    # the loop ----------------------------------------------------------------------------------------

    def run(self) -> JobRunResult:
        job, cloud = self.job, self.cloud
        if cloud.now() > job.start:
            raise JobBacktestError(f"the simulated clock ({cloud.now()}) is past the job's start ({job.start})")
        cloud.run_until(job.start, watch=())
        state = self._state(job.start, job.steps, None)
        first = self._launch(lambda tried: self.placer.place(state, tried), "start")
        if first is None:
            raise JobBacktestError(f"no offer can run job {job.job_id!r} at {job.start.isoformat()}")
        self._log("start", "place", first.placement, "the planner's best offer under the objective")
        self._start_workload(first)
        every = self.placer.rebalance_every
        next_decision = job.start + every if every is not None else None
        while True:
            now = cloud.now()
            if now >= job.end:
                break
            stop = job.end if next_decision is None else min(next_decision, job.end)
            run = self.current
            if run is None:  # stalled: no offer could be launched; try again later
                cloud.run_until(min(now + job.retry_after, job.end), watch=())
                if cloud.now() < job.end:
                    self._recover(self.last_placement)
                continue
            events = cloud.run_until(stop, watch={run.instance_id})
            last = events[-1] if events else None
            if last is not None and last.kind is SimEventKind.DONE:
                self.finished_at = last.at
                cloud.terminate(run.instance_id)
                self._record(run, last.at, "done")
                self.current = None
                break
            if last is not None and last.kind is SimEventKind.PREEMPTED:
                self._lost(run, last.at)
                self._recover(run.placement)
                continue
            if next_decision is not None and every is not None and cloud.now() >= next_decision:
                next_decision += every
                self._rebalance(run)
        stopped = cloud.now()
        if self.current is not None:  # not done by the end: its interval stays open (recorded at launch)
            steps_done = self.cloud.progress(self.current.instance_id).steps_done
        else:
            steps_done = job.steps if self.finished_at is not None else self.durable
        report = self.ledger.costs(job_id=job.job_id, as_of=stopped)
        return JobRunResult(
            job=job,
            provider=cloud.name,
            finished=self.finished_at is not None,
            finished_at=self.finished_at,
            stopped_at=stopped,
            steps_done=steps_done,
            lost_steps=self.lost_steps,
            moves=self.moves,
            preemptions=self.preemptions,
            launch_failures=self.launch_failures,
            decisions=tuple(self.decisions),
            report=report,
        )

    def _rebalance(self, run: _Running) -> None:
        now = self.cloud.now()
        remaining = self.job.steps - self.cloud.progress(run.instance_id).steps_done
        verdict = self.placer.rebalance(self._state(now, remaining, run.placement))
        moving = verdict.target is not None and verdict.target.key != run.placement.key
        self._log("rebalance", "move" if moving else "stay", verdict.target, verdict.reason, verdict.explanation)
        if moving and verdict.target is not None:
            self._move(verdict.target)


def run_job(cloud: SimulatedCloud, ledger: Ledger, placer: Placer, job: JobRun) -> JobRunResult:
    """Run ``job`` on ``cloud`` under ``placer``, billing into ``ledger`` (module docstring).

    The cloud's clock must not be past ``job.start``; it ends at the job's finish (or ``job.end``).
    Raises :class:`JobBacktestError` when no offer can run the job at its start."""
    return _Runner(cloud, ledger, placer, job).run()


# --- the planner's placer (``costopt backtest job``) -------------------------------------------------


class PlannerPlacer:
    """The planner and the decision rule over the offers a :class:`PriceView` has at each time.

    Every choice plans the job's remaining steps with :func:`~costopt.planning.single.plan_job` under
    the objective (a deadline shrinks with the time elapsed, a budget with what the ledger holds) over
    the offers priced at that time (optionally only some clouds, regions, markets), with the hazards
    (risk-aware expected cost). ``top`` of the planner's ranked alternatives are the candidates the
    rule judges. For min-time objectives only candidates at least as fast as the current offer are
    judged (the rule weighs cost only).
    """

    def __init__(
        self,
        prices: PriceView,
        catalog: ThroughputCatalog,
        *,
        job_type: JobType,
        objective: Objective,
        policy: str = "dynamic_migration_cost",
        gpus: int = 1,
        checkpoint_gb: float = 0.0,
        hazards: HazardModel | None = None,
        assumptions: Assumptions | None = None,
        rule: MigrationRule | None = None,
        every: timedelta | None = timedelta(hours=24),
        clouds: Collection[str] | None = None,
        regions: Collection[str] | None = None,
        markets: Collection[str] | None = None,
        top: int = 20,
    ) -> None:
        if policy not in JOB_POLICIES:
            raise JobBacktestError(f"unknown policy {policy!r}; choose from {', '.join(JOB_POLICIES)}")
        if every is not None and every <= timedelta(0):
            raise JobBacktestError("the rebalancing interval must be > 0")
        self.prices, self.catalog, self.job_type, self.objective = prices, catalog, job_type, objective
        self.policy, self.gpus, self.checkpoint_gb = policy, gpus, checkpoint_gb
        self.hazards = hazards or HazardModel()
        self.assumptions = assumptions or Assumptions(per_gpu_packing=True)
        self.rule = rule or MigrationRule()
        self._every = every
        self.filters = {"cloud": clouds, "region": regions, "market": markets}
        self.top = top

    @property
    def rebalance_every(self) -> timedelta | None:
        return None if self.policy == "static" else self._every

    @property
    def wants_spent(self) -> bool:
        return isinstance(self.objective, MinTimeWithinBudget)

    def _frame(self, now: datetime) -> pd.DataFrame:
        frame = self.prices.offers_at(now)
        for col, allowed in self.filters.items():
            if allowed is not None:
                frame = frame[frame[col].isin(list(allowed))]
        return frame.reset_index(drop=True)

    def _objective_now(self, state: JobState) -> Objective:
        o = self.objective
        elapsed = (state.now - state.started_at).total_seconds() / 3600.0
        if isinstance(o, MinCostByDeadline):
            left = o.deadline_hours - elapsed
            return MinCostByDeadline(left, o.confidence) if left > 0 else MinTime()
        if isinstance(o, MinTimeWithinBudget) and state.spent_usd is not None:
            left_usd = o.budget_usd - state.spent_usd
            return MinTimeWithinBudget(left_usd) if left_usd > 0 else MinCost()
        return o

    def _plan(self, state: JobState, exclude: Collection[OfferKey]) -> Plan | None:
        if state.remaining_steps <= 0:
            return None
        frame = self._frame(state.now)
        if exclude and len(frame):
            cols = [frame[c] for c in KEY_COLUMNS]
            keys = list(zip(*cols, strict=True))
            drop = {(k.cloud.value, k.region, k.zone, k.instance_type, k.market.value) for k in exclude}
            frame = frame[[k not in drop for k in keys]].reset_index(drop=True)
        job = JobSpec(
            self.job_type,
            state.remaining_steps,
            gpu_count=self.gpus,
            checkpoint_gb=self.checkpoint_gb,
            location=state.checkpoint_at,
        )
        table = OfferTable.from_frame(frame, self.hazards)
        try:
            return plan_job(job, self._objective_now(state), table, self.catalog, self.assumptions, top=self.top)
        except Infeasible as exc:
            log.info("no placement at %s: %s", state.now.isoformat(), exc)
            return None

    @staticmethod
    def _placement(c: Candidate) -> Placement:
        key = OfferKey(Cloud(c.cloud), c.region, c.zone, c.instance_type, Market(c.market))
        return Placement(key, c.gpu_count, c.steps_per_s, c.job_usd_per_hour)

    def _here(self, current: Placement, now: datetime) -> Placement:
        """The current offer priced now (the job's share)."""
        steps = self.prices.steps(current.key, now, now + timedelta(microseconds=1))
        price = steps[-1].usd_per_hour if steps else math.nan
        return Placement(
            current.key, current.instance_gpus, current.steps_per_s, price * self.gpus / current.instance_gpus
        )

    def place(self, state: JobState, exclude: Collection[OfferKey]) -> Placement | None:
        """The planner's winner (leaving out ``exclude`` and, except for ``static``, recent failures)."""
        avoid = set(exclude) | (set() if self.policy == "static" else set(state.avoid))
        plan = self._plan(state, avoid)
        return None if plan is None else self._placement(plan.winner)

    def recover(self, state: JobState, exclude: Collection[OfferKey]) -> Placement | None:
        if self.policy == "static" or state.current is None:
            if state.current is not None and state.current.key not in exclude:
                return state.current
            return self.place(state, exclude) if state.current is None else None
        if self.policy == "dynamic":
            return self.place(state, exclude)
        plan = self._plan(state, set(exclude) | set(state.avoid))
        if plan is None:
            return None
        cands = [self._placement(c) for c in plan.alternatives]
        decision = choose(self._running(state), [c.quote() for c in cands], state.now, self.rule, preempted=True)
        if decision.target is None:
            return None
        return next(c for c in cands if c.key == decision.target.key)

    def _running(self, state: JobState) -> RunningJob:
        if state.current is None:  # pragma: no cover - recover and rebalance are only asked with a current offer
            raise JobBacktestError("the rule needs the job's current offer")
        here = self._here(state.current, state.now)
        return RunningJob(
            remaining_steps=state.remaining_steps,
            current=here.quote(),
            checkpoint_at=state.checkpoint_at or here.place,
            checkpoint_gb=state.checkpoint_gb,
            last_moved_at=state.last_moved_at,
        )

    def rebalance(self, state: JobState) -> Verdict:
        if self.policy == "static" or state.current is None:
            return Verdict(None, "static", "a static policy keeps its offer")
        plan = self._plan(state, state.avoid)
        if plan is None:
            return Verdict(None, "no_candidate", "the planner found no placement for the remaining work")
        if self.policy == "dynamic":
            best = self._placement(plan.winner)
            if best.key == state.current.key:
                return Verdict(None, "best", "the current offer is still the planner's winner")
            return Verdict(best, "better", f"the planner's winner is now {offer_label(best.key)}: {plan.reason}")
        cands = [self._placement(c) for c in plan.alternatives]
        if isinstance(self.objective, MinTime | MinTimeWithinBudget):
            cands = [c for c in cands if c.steps_per_s >= state.current.steps_per_s]
        decision = choose(self._running(state), [c.quote() for c in cands], state.now, self.rule)
        if decision.action is Action.MOVE and decision.target is not None:
            target = next(c for c in cands if c.key == decision.target.key)
            return Verdict(target, decision.reason.name.lower(), decision.explanation)
        return Verdict(None, decision.reason.name.lower(), decision.explanation)


# --- ``costopt backtest job`` ---------------------------------------------------------------------------


def _money(value: Decimal) -> float:
    return float(to_cents(value))


@dataclass(frozen=True, eq=False)
class JobBacktest:
    """The result of :func:`run_job_backtest`: the run, the policy and objective, and the ledger lines."""

    result: JobRunResult
    job_type: str
    policy: str
    objective: str
    seed: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-able figures: money as floats rounded to the cent (``*_usd``) and exact Decimal text
        (``total_cost_usd_exact``); times ISO 8601 UTC; one entry per ledger interval and charge."""
        r = self.result
        rep = r.report
        quantize = Decimal("0.000001")
        return {
            "job_id": r.job.job_id,
            "job_type": self.job_type,
            "policy": self.policy,
            "objective": self.objective,
            "seed": self.seed,
            "provider": r.provider,
            "start": r.job.start.isoformat(),
            "end": r.job.end.isoformat(),
            "finished": r.finished,
            "finished_at": None if r.finished_at is None else r.finished_at.isoformat(),
            "hours": round(r.hours, 4),
            "steps_requested": r.job.steps,
            "steps_done": r.steps_done,
            "lost_steps": round(r.lost_steps, 3),
            "moves": r.moves,
            "preemptions": r.preemptions,
            "launch_failures": r.launch_failures,
            "total_cost_usd": _money(rep.total_usd),
            "total_cost_usd_exact": str(rep.total_usd.quantize(quantize, rounding=ROUND_HALF_EVEN)),
            "instance_cost_usd": _money(Decimal(rep.instances_micro_usd).scaleb(-6)),
            "egress_cost_usd": _money(rep.memo_usd(ChargeKind.EGRESS)),
            "memo_usd": {
                k.value: _money(rep.memo_usd(k)) for k in (ChargeKind.RESTART, ChargeKind.OVERLAP, ChargeKind.LOST_WORK)
            },
            "intervals": [
                {
                    "instance_id": ln.record.instance_id,
                    "cloud": ln.record.offer.cloud.value,
                    "region": ln.record.offer.region,
                    "zone": ln.record.offer.zone,
                    "instance_type": ln.record.offer.instance_type,
                    "market": ln.record.offer.market.value,
                    "share": str(ln.record.share),
                    "started_at": ln.starts_at.isoformat(),
                    "ended_at": ln.ends_at.isoformat(),
                    "open": ln.open,
                    "end_reason": ln.record.end_reason,
                    "hours": round(ln.hours, 4),
                    "cost_usd": _money(ln.amount_usd),
                }
                for ln in rep.lines
            ],
            "charges": [
                {
                    "kind": c.record.kind.value,
                    "additive": c.additive,
                    "at": c.record.at.isoformat(),
                    "cost_usd": _money(c.amount_usd),
                    "note": c.record.note,
                }
                for c in rep.charges
            ],
            "decisions": [
                {
                    "at": d.at.isoformat(),
                    "event": d.event,
                    "action": d.action,
                    "target": d.target,
                    "reason": d.reason,
                    "explanation": d.explanation,
                }
                for d in r.decisions
            ],
        }


def run_job_backtest(
    prices: PriceView,
    catalog: ThroughputCatalog,
    cloud_factory: CloudFactory,
    *,
    job_type: str,
    steps: float,
    start: datetime,
    end: datetime,
    objective: Objective | None = None,
    policy: str = "dynamic_migration_cost",
    hazards: HazardModel | None = None,
    gpus: int = 1,
    checkpoint_gb: float | None = None,
    rebalance_hours: float = 24.0,
    clouds: Collection[str] | None = None,
    regions: Collection[str] | None = None,
    markets: Collection[str] | None = None,
    seed: int = 0,
    ledger: Ledger | None = None,
    job_id: str = "backtest-job",
    team: str = "",
    rule: MigrationRule | None = None,
    checkpoint_sizes: Mapping[str, float] | None = None,
) -> JobBacktest:
    """Backtest one job (``costopt backtest job``): ``steps`` steps of ``job_type`` from ``start`` on the
    simulated cloud that ``cloud_factory`` builds on ``prices`` (seeded by ``seed``), under ``policy``
    (:data:`JOB_POLICIES`) and ``objective`` (default min-cost; ``costopt backtest job`` builds it as
    ``costopt plan`` does), re-planned every ``rebalance_hours``, billed into ``ledger``
    (default: in memory), stopped at ``end`` if not done.

    The decision rule's restart and overlap are the simulated cloud's boot + restore and checkpoint times
    (the real cost of a move there) unless ``rule`` is given; the planner's checkpoint interval and
    restart are the same. ``checkpoint_gb`` defaults to the paper's estimate for its six models
    (``checkpoint_sizes``, by default :data:`costopt.backtest.paper.PAPER_CHECKPOINT_GB`), else
    :data:`DEFAULT_CHECKPOINT_GB`. Raises :class:`JobBacktestError` (bad parameters, nothing to start on).
    """
    from costopt.backtest.paper import PAPER_CHECKPOINT_GB

    start, end = utc(start), utc(end)
    jt = JobType.parse(job_type)
    obj = objective if objective is not None else MinCost()
    hz = hazards or HazardModel()
    if not rebalance_hours > 0:
        raise JobBacktestError(f"rebalance_hours must be > 0, got {rebalance_hours}")
    sizes = PAPER_CHECKPOINT_GB if checkpoint_sizes is None else checkpoint_sizes
    gb = checkpoint_gb if checkpoint_gb is not None else float(sizes.get(jt.name, DEFAULT_CHECKPOINT_GB))
    cloud = cloud_factory(prices, hz, start=start, seed=seed)
    timing = cloud.timing
    r = rule or MigrationRule(restart_hours=timing.restart_hours, checkpoint_overlap_hours=timing.checkpoint_hours)
    assumptions = Assumptions(
        checkpoint_interval_hours=timing.checkpoint_interval_hours,
        restart_hours=timing.restart_hours,
        per_gpu_packing=True,  # the paper's assumption (the ledger bills the job's share too)
    )
    placer = PlannerPlacer(
        prices,
        catalog,
        job_type=jt,
        objective=obj,
        policy=policy,
        gpus=gpus,
        checkpoint_gb=gb,
        hazards=hz,
        assumptions=assumptions,
        rule=r,
        every=timedelta(hours=rebalance_hours),
        clouds=clouds,
        regions=regions,
        markets=markets,
    )
    job = JobRun(job_id=job_id, steps=float(steps), start=start, end=end, gpus=gpus, checkpoint_gb=gb, team=team)
    result = run_job(cloud, ledger if ledger is not None else MemoryLedger(prices), placer, job)
    return JobBacktest(result=result, job_type=jt.name, policy=policy, objective=obj.name, seed=seed)
