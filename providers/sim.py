"""The simulated cloud (``sim``): the embedded default cloud of the service, and the backtests' cloud.

:class:`SimCloud` implements :class:`costopt.cloud.CloudProvider` (and the workload hooks of
:class:`costopt.simulated.SimulatedCloud`) over any :class:`costopt.ledger.prices.PriceView`:

- **Time** is a :class:`SimClock` that moves only when the caller moves it (``advance``, or
  :meth:`SimCloud.run_until`), so a month runs in well under a second. Everything is deterministic per
  ``seed``.
- **Offers and prices** are the price view's as of the clock: launching an offer with no price in effect
  then raises :class:`~costopt.cloud.CapacityError` (it is not sold then).
- **Launch** takes ``timing.boot`` (default 3 min) from ``pending`` to ``running``; the instance is billed
  from its launch. A second launch with the same idempotency token returns the same instance, never a
  second one; instance ids derive from the token (``sim-`` + 12 hex digits of its hash), so runs that
  share a ledger do not collide as long as their tokens differ. Optional capacity failures: a
  per-(cloud, accelerator, GPU count) probability that a launch fails
  (:meth:`SimConfig.from_launch_stats` takes them from the 2020 availability logs).
- **Preemptions** (spot offers): each offer has its own Poisson process of capacity reclaims at the
  hazard model's rate (exponential times between them; a stream seeded by the sim's seed and the offer's
  key, so two policies on the same offer at the same time meet the same preemptions). An instance is
  preempted at its offer's first reclaim after its launch. A notice precedes it by the cloud's lead time
  (AWS 2 min, GCP and Azure 30 s; never before the launch). On-demand offers are never preempted.
  :meth:`SimCloud.preempt` forces one (tests, drills) through the same notice and preemption path.
- **Workloads**: a job registered on an instance (:meth:`SimCloud.start_workload`) waits for the boot,
  restores for ``timing.restore`` (when it resumes from a checkpoint), then trains at the throughput
  given, pausing ``timing.checkpoint`` after every ``timing.checkpoint_interval`` of training to write a
  checkpoint; when it reaches its target it writes a final checkpoint and is done. A preemption or a
  termination loses what was trained since the last completed checkpoint. A checkpoint can be requested
  (before a move) and the workload stopped after it. With ``checkpoint_on_notice`` the workload writes
  one when noticed, if it fits in the lead time.

- **Listing** follows the rule of :mod:`costopt.cloud`: every instance that has not ended, and ended
  ones (terminated or preempted: a simulated instance is released when it ends) until
  :data:`~costopt.cloud.ENDED_RETENTION` of simulated time after their end. ``terminate`` of an unknown
  id does nothing, as on a real cloud. There is no STOPPED state.

Times are tz-aware UTC, held internally as integer microseconds from the clock's start (exact).
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import heapq
import logging
import math
import os
import pickle
import tempfile
import threading
from bisect import bisect_right
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Concatenate, ParamSpec, TypeVar

import numpy as np

from costopt.agent.worker import WORKER_VARIABLES, WorkerConfig, WorkerError
from costopt.cloud import (
    ENDED_RETENTION,
    CapacityError,
    CloudError,
    Instance,
    InstanceState,
    Interruption,
    LaunchSpec,
    NotFoundError,
    QuotaError,
    tags_match,
)
from costopt.domain import Cloud, Market, OfferKey, utc
from costopt.ledger.prices import PriceView
from costopt.risk.availability import LaunchStats
from costopt.risk.hazard import HazardModel
from costopt.settings import Settings
from costopt.simulated import SimEvent, SimEventKind, WorkloadProgress, WorkloadTiming
from providers.sim_agent import UNDO, AgentEnv, AgentEnvError, SimAgent, ThroughputFn
from providers.sim_worker import FleetTransport, SimWorker

__all__ = [
    "DEFAULT_NOTICE_LEAD",
    "ClockError",
    "SimClock",
    "SimCloud",
    "SimConfig",
    "SimError",
    "SimServiceClock",
    "sim_factory",
]

_P = ParamSpec("_P")
_R = TypeVar("_R")

_US_PER_S = 1_000_000
_US = timedelta(microseconds=1)

log = logging.getLogger("costopt.sim")

_STATE_FIELDS = (
    "clock",
    "_seed",
    "_instances",
    "_tokens",
    "_live",
    "_processes",
    "_failure_rngs",
    "_rates",
    "launch_failures",
    "saves",
    "_agenda",
    "_scheduled",
    "_agents",
    "_seq",
    "_generation",
)

DEFAULT_NOTICE_LEAD: Mapping[Cloud, timedelta] = MappingProxyType(
    {
        Cloud.AWS: timedelta(minutes=2),  # EC2 Spot Instance Interruption Warning
        Cloud.GCP: timedelta(seconds=30),  # preemption/Spot: ACPI soft-off 30 s before
        Cloud.AZURE: timedelta(seconds=30),  # Scheduled Events "Preempt", at least 30 s
        Cloud.SIM: timedelta(minutes=2),
    }
)


class SimError(CloudError):
    """A request the simulated cloud cannot serve (workload on a gone instance, and the like)."""


class ClockError(SimError):
    """The simulated clock was asked to go backwards."""


class SimClock:
    """Simulated time: tz-aware UTC, moved only by the caller, never backwards."""

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ClockError(f"the clock needs a tz-aware UTC start, got {start}")
        self._start = utc(start)
        self._now_us = 0

    @property
    def start(self) -> datetime:
        return self._start

    def now(self) -> datetime:
        return self._start + timedelta(microseconds=self._now_us)

    def micros(self) -> int:
        """Microseconds since :attr:`start`."""
        return self._now_us

    def unix_seconds(self, micros: int) -> float:
        """Unix seconds of ``micros`` microseconds after :attr:`start` (the start's computed once)."""
        base = self.__dict__.get("_start_s")  # absent from a clock saved before it was kept
        if base is None:
            base = self._start_s = self._start.timestamp()
        return base + micros / _US_PER_S

    def advance(self, delta: timedelta) -> datetime:
        """Move forward by ``delta`` (>= 0)."""
        if delta < timedelta(0):
            raise ClockError(f"the clock does not go backwards (advance by {delta})")
        self._now_us += delta // _US
        return self.now()

    def advance_to(self, at: datetime) -> datetime:
        """Move forward to ``at`` (not before now)."""
        self.advance_to_micros((utc(at) - self._start) // _US)
        return self.now()

    def advance_to_micros(self, micros: int) -> None:
        """Move forward to ``micros`` microseconds after :attr:`start` (not before now)."""
        if micros < self._now_us:
            raise ClockError(f"the clock does not go backwards (from {self._now_us} to {micros} µs)")
        self._now_us = micros


@dataclass(frozen=True, slots=True)
class SimConfig:
    """How the simulated cloud behaves (documented defaults).

    ``timing``: boot, restore, checkpoint and checkpoint interval (:class:`WorkloadTiming`).
    ``notice_lead``: preemption notice per cloud. ``launch_failure``: probability that a launch fails
    for lack of capacity, per (cloud, accelerator, GPU count); ``default_launch_failure`` elsewhere (0).
    ``max_instances``: instances alive at once (beyond: :class:`~costopt.cloud.QuotaError`; None: no
    quota). ``checkpoint_on_notice``: the workload writes a checkpoint on a notice when it fits.
    ``report_every``: the longest stretch of simulated time between two progress records of a simulated
    agent (:mod:`providers.sim_agent`; records are also written at every checkpoint). ``worker_poll``: the
    simulated fleet workers' heartbeat (:mod:`providers.sim_worker`: a sync at least this often, besides
    those at round ends and exits; under the fleet executor's dead-after). ``forget_ended_after``: how long
    after its end an instance whose agent has stopped is kept (None: for ever); past it the cloud forgets
    it (record, agent, console, launch token): ``describe`` raises :class:`~costopt.cloud.NotFoundError`, as
    GCP and Azure do at once and EC2 after about an hour, and a launch with its token launches anew. At
    least :data:`~costopt.cloud.ENDED_RETENTION` (``list`` shows ended instances that long). It bounds the
    cloud's memory in a long-running service (each ended instance kept ~11 KiB with its agent, more with a
    longer console, for ever; docs/reliability.md "Soak").
    """

    timing: WorkloadTiming = field(default_factory=WorkloadTiming)
    notice_lead: Mapping[Cloud, timedelta] = field(default_factory=lambda: dict(DEFAULT_NOTICE_LEAD))
    launch_failure: Mapping[tuple[str, str, int], float] = field(default_factory=dict)
    default_launch_failure: float = 0.0
    max_instances: int | None = None
    checkpoint_on_notice: bool = False
    report_every: timedelta = timedelta(minutes=10)
    worker_poll: timedelta = timedelta(seconds=60)
    forget_ended_after: timedelta | None = None

    def __post_init__(self) -> None:
        if self.forget_ended_after is not None and self.forget_ended_after < ENDED_RETENTION:
            raise SimError(
                f"forget_ended_after must be >= ENDED_RETENTION ({ENDED_RETENTION}), got {self.forget_ended_after}"
            )
        if self.report_every <= timedelta(0):
            raise SimError(f"report_every must be > 0, got {self.report_every}")
        if self.worker_poll <= timedelta(0):
            raise SimError(f"worker_poll must be > 0, got {self.worker_poll}")
        for p in (*self.launch_failure.values(), self.default_launch_failure):
            if not 0.0 <= p <= 1.0:
                raise SimError(f"a launch-failure probability must be in [0, 1], got {p}")
        if any(v < timedelta(0) for v in self.notice_lead.values()):
            raise SimError("notice lead times must be >= 0")

    @classmethod
    def from_launch_stats(cls, stats: Iterable[LaunchStats], **kwargs: object) -> SimConfig:
        """Launch-failure probabilities ``failures / attempts`` per (cloud, accelerator, GPU count) from
        the availability logs (:func:`costopt.risk.availability.load_availability_logs`). The logs are
        two short 2020 samples; shapes they never tried keep ``default_launch_failure``."""
        table = {(s.cloud.value, s.accelerator, s.gpu_count): s.failures / s.attempts for s in stats if s.attempts}
        return cls(launch_failure=table, **kwargs)  # type: ignore[arg-type]

    def failure_probability(self, cloud: Cloud, accelerator: str | None, gpus: float | None) -> float:
        key = (cloud.value, accelerator or "", int(gpus) if gpus else 0)
        return float(self.launch_failure.get(key, self.default_launch_failure))


def _stable_hash(key: OfferKey) -> int:
    text = "\x1f".join((key.cloud.value, key.region, key.zone, key.instance_type, key.market.value))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class _Process:
    """One offer's reclaim times (µs from the clock's start), drawn lazily from its own stream."""

    __slots__ = ("mean_us", "rng", "times")

    def __init__(self, rng: np.random.Generator, rate_per_hour: float) -> None:
        self.rng = rng
        self.mean_us = 3600.0 * _US_PER_S / rate_per_hour
        self.times: list[int] = []

    def first_after(self, t_us: int) -> int:
        while not self.times or self.times[-1] <= t_us:
            gaps = self.rng.exponential(self.mean_us, size=64)
            last = self.times[-1] if self.times else 0
            for g in gaps:
                last += max(1, math.ceil(g))
                self.times.append(last)
        return self.times[bisect_right(self.times, t_us)]


@dataclass(slots=True)
class _Phase:
    """A stretch of a workload with one training schedule (see ``_Workload.at``).

    From ``valid_from`` the workload holds ``base`` steps, durable at ``durable_at`` (before it,
    ``durable_prev``); it trains from ``t0`` (None: never) with periodic checkpoints."""

    valid_from: int
    t0: int | None
    base: float
    durable_prev: float
    durable_prev_at: int | None
    durable_at: int
    written_here: bool


@dataclass(slots=True)
class _Workload:
    steps_per_s: float
    target: float
    start_step: float
    interval_us: int
    checkpoint_us: int
    phases: list[_Phase]
    training_from: int | None

    def _need_us(self, base: float) -> int:
        if base >= self.target:
            return 0
        return math.ceil((self.target - base) / self.steps_per_s * _US_PER_S)

    def done_at(self, ph: _Phase) -> int | None:
        if ph.t0 is None:
            return ph.durable_at if ph.base >= self.target else None
        need = self._need_us(ph.base)
        return ph.t0 + need + math.ceil(need / self.interval_us) * self.checkpoint_us

    def phase(self, t: int) -> _Phase:
        for ph in reversed(self.phases):
            if ph.valid_from <= t:
                return ph
        return self.phases[0]

    def at(self, t: int) -> tuple[float, float, int | None]:
        """(steps done, durable steps, when this instance completed that checkpoint) at ``t`` µs."""
        ph = self.phase(t)
        if ph.t0 is None or t < ph.t0:
            if t >= ph.durable_at:
                return ph.base, ph.base, ph.durable_at if ph.written_here else ph.durable_prev_at
            return ph.base, ph.durable_prev, ph.durable_prev_at
        done = self.done_at(ph)
        if done is not None and t >= done:
            return self.target, self.target, done
        c, k = self.interval_us, self.checkpoint_us
        need = self._need_us(ph.base)
        n, r = divmod(t - ph.t0, c + k)
        trained = min(n * c + min(r, c), need)
        steps = min(self.target, ph.base + self.steps_per_s * trained / _US_PER_S)
        if n >= 1:
            return steps, ph.base + self.steps_per_s * n * c / _US_PER_S, ph.t0 + n * (c + k)
        return steps, ph.base, ph.durable_at if ph.written_here else ph.durable_prev_at

    def checkpoint(self, t: int, then_stop: bool) -> int:
        """Write a checkpoint from ``t`` (or let the one in progress finish); returns when it is durable."""
        ph = self.phase(t)
        steps, durable, durable_at = self.at(t)
        done = self.done_at(ph)
        if done is not None and t >= done:
            return t
        if ph.t0 is None or t < ph.t0:  # paused (booting, restoring, or writing a checkpoint)
            w = max(ph.durable_at, t)
            if then_stop:
                self.phases.append(
                    _Phase(t, None, ph.base, ph.durable_prev, ph.durable_prev_at, ph.durable_at, ph.written_here)
                )
            return w
        c, k = self.interval_us, self.checkpoint_us
        need = self._need_us(ph.base)
        n, r = divmod(t - ph.t0, c + k)
        if done is not None and n * c + min(r, c) >= need:  # the final checkpoint is being written
            w, s = done, self.target
        elif r >= c:  # a periodic checkpoint is being written: it completes at the end of its window
            w, s = ph.t0 + (n + 1) * (c + k), ph.base + self.steps_per_s * (n + 1) * c / _US_PER_S
        else:
            w, s = t + k, steps
        self.phases.append(_Phase(t, None if then_stop else w, s, durable, durable_at, w, True))
        return w


@dataclass(slots=True)
class _Inst:
    instance_id: str
    spec: LaunchSpec
    token: str
    launched: int
    ready: int
    preempt: int | None
    notice: int | None
    terminated: int | None = None
    workload: _Workload | None = None
    notice_checkpointed: bool = False
    reported: set[tuple[str, int]] = field(default_factory=set)
    agent: SimAgent | SimWorker | None = None
    exit_code: int | None = None
    exited: int | None = None

    def end(self) -> int | None:
        """When it stopped existing (preemption or termination, whichever came first)."""
        p, t = self.preempt, self.terminated
        if p is None or (t is not None and t < p):
            return t
        return p

    def preempted_by(self, t: int) -> bool:
        return (
            self.preempt is not None
            and self.preempt <= t
            and (self.terminated is None or self.preempt < self.terminated)
        )


def _locked(method: Callable[Concatenate[SimCloud, _P], _R]) -> Callable[Concatenate[SimCloud, _P], _R]:
    """Run the method under the cloud's lock (the clock driver's thread and the service's jobs share it); with
    a state file (:meth:`SimCloud.persist_to`), the outermost call saves the state before it returns when
    it changed it (a caller never sees a change the cloud would forget in a crash)."""

    @functools.wraps(method)
    def wrapper(self: SimCloud, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._lock:
            self._depth += 1
            outer = self._depth == 1 and self._state_file is not None
            if outer:
                UNDO.journal = self._journal
                UNDO.commit = self._commit
            try:
                return method(self, *args, **kwargs)
            finally:
                self._depth -= 1
                if outer:
                    try:
                        self._save_if_changed()
                    finally:
                        UNDO.journal = None
                        UNDO.commit = None

    return wrapper


class SimCloud:
    """The simulated cloud (module docstring). ``start`` sets a new :class:`SimClock` unless ``clock``
    is given (shared with the caller). ``seed``: an int or a sequence of ints. ``rate``: the throughput of
    the simulated agents' jobs by type (:data:`providers.sim_agent.ThroughputFn`; None: only jobs that give
    ``COSTOPT_STEPS_PER_SECOND`` can run an agent). Thread-safe: every public method holds one lock."""

    name = "sim"

    def __init__(
        self,
        prices: PriceView,
        hazards: HazardModel | None = None,
        *,
        clock: SimClock | None = None,
        start: datetime | None = None,
        seed: int | Sequence[int] = 0,
        config: SimConfig | None = None,
        rate: ThroughputFn | None = None,
    ) -> None:
        if clock is None:
            if start is None:
                raise SimError("give the simulated cloud a clock or a start time")
            clock = SimClock(start)
        self.prices = prices
        self.hazards = hazards or HazardModel()
        self.clock = clock
        self.config = config or SimConfig()
        self._seed = [int(seed)] if isinstance(seed, int) else [int(s) for s in seed]
        self._instances: dict[str, _Inst] = {}
        self._tokens: dict[str, str] = {}
        self._live: set[str] = set()
        self._processes: dict[OfferKey, _Process] = {}
        self._failure_rngs: dict[OfferKey, np.random.Generator] = {}
        self._rates: dict[OfferKey, tuple[float, str | None, float | None]] = {}
        self.launch_failures = 0
        self.saves = 0  # state files written (persist_to)
        self.rate = rate
        self._lock = threading.RLock()
        self._agenda: list[tuple[int, int, str]] = []  # (time, sequence, instance id): agents' next events
        self._scheduled: dict[str, int] = {}  # instance id -> the time its agent is scheduled at
        self._agents: set[str] = set()  # instances whose agent still runs
        self._seq = 0
        self.fleet_transport: FleetTransport | None = None
        self._depth = 0  # nesting of locked calls (the outermost one saves)
        self._state_file: Path | None = None
        self._mutations = 0  # changes that move neither the clock nor the agenda's sequence
        self._saved: tuple[int, int, int, int] | None = None
        self._generation = 0  # saves of the state file so far (the undo journal's entries are tagged with it)
        self._journaled = 0  # agents' writes recorded in the undo journal since the last save
        self._next_forget = 0  # the simulated time (us) of the next sweep for ended instances to forget

    # --- durable state -------------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, object]:
        """What a real cloud keeps on its side: the clock, the instances (with their agents and what was
        reported), the idempotency tokens, the offers' reclaim draws and random streams, the agenda. Not
        the caller's parts (prices, hazards, config, throughput, fleet transport: given again at
        :meth:`restore`)."""
        return {k: self.__dict__[k] for k in _STATE_FIELDS}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self._depth = 0
        self._state_file = None
        self._mutations = 0
        self._saved = None
        self._journaled = 0
        self._next_forget = 0
        self.fleet_transport = None

    def persist_to(self, path: Path) -> None:
        """Keep this cloud's state in ``path`` from now on: written now, then after every locked call
        that changed it (a pickle written to a temporary file and renamed over ``path``: a reader finds
        the old state or the new one, never half of one). It survives the death of the process (kill -9);
        it is not fsynced, so a power loss may take the last writes. :meth:`restore` reads it back."""
        with self._lock:
            self._state_file = Path(path)
            self._state_file.parent.mkdir(parents=True, exist_ok=True)
            self._save()

    def _mark(self) -> tuple[int, int, int, int]:
        return (self.clock.micros(), self._seq, self._mutations, len(self._instances))

    def _save_if_changed(self) -> None:
        if self._saved != self._mark():
            self._save()

    def _save(self) -> None:
        path = self._state_file
        assert path is not None
        self._generation += 1
        try:
            data = pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise SimError(
                f"the simulated cloud cannot save its state to {path}: {exc} (unset COSTOPT_SIM_STATE_FILE to run "
                "without a durable simulated cloud)"
            ) from exc
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        self._undo_path().write_bytes(b"")  # what it recorded is in the saved state now
        self._journaled = 0
        self._saved = self._mark()
        self.saves += 1

    def _undo_path(self) -> Path:
        assert self._state_file is not None
        return self._state_file.with_name(self._state_file.name + ".undo")

    def _journal(self, path: Path, old: bytes | int | None) -> None:
        """Record, before an agent's write to ``path``, how to undo it (``providers.sim_agent.UNDO``), tagged
        with the generation the next save writes."""
        entry = pickle.dumps((self._generation + 1, os.fspath(path), old), protocol=pickle.HIGHEST_PROTOCOL)
        fd = os.open(self._undo_path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, len(entry).to_bytes(8, "big") + entry)
        finally:
            os.close(fd)
        self._journaled += 1

    def _commit(self) -> None:
        """Make what the agents wrote so far in this call durable now, before the service can see it: save
        the state (and empty the undo journal) when an agent wrote since the last save. Called, inside a
        locked call of a durable cloud, where the state is whole: before a fleet worker's sync leaves the
        cloud (``providers.sim_worker``: the service records what the sync reports, and a kill must not undo
        it) and after an agent's exit (its final checkpoint and ``done``, which the service reads in the
        checkpoint location). A no-op without a state file or without writes since the last save."""
        if self._state_file is not None and self._journaled:
            self._save()

    @staticmethod
    def _undo(journal: Path, generation: int) -> int:
        """Undo, newest first, the agents' writes recorded in ``journal`` after the save of ``generation``
        (the state file does not hold them: the process died before its next save); returns how many."""
        try:
            raw = journal.read_bytes()
        except FileNotFoundError:
            return 0
        entries: list[tuple[int, str, bytes | int | None]] = []
        at = 0
        while at + 8 <= len(raw):
            n = int.from_bytes(raw[at : at + 8], "big")
            if at + 8 + n > len(raw):
                break  # torn last entry: its write never happened
            entries.append(pickle.loads(raw[at + 8 : at + 8 + n]))
            at += 8 + n
        undone = 0
        for gen, name, old in reversed(entries):
            if gen <= generation:
                continue
            target = Path(name)
            if old is None:
                target.unlink(missing_ok=True)
            elif isinstance(old, int):
                if target.exists():
                    os.truncate(target, old)
            else:
                tmp = target.with_name(target.name + ".undo-tmp")
                tmp.write_bytes(old)
                os.replace(tmp, target)
            undone += 1
        return undone

    @classmethod
    def restore(
        cls,
        path: Path,
        prices: PriceView,
        hazards: HazardModel | None = None,
        *,
        config: SimConfig | None = None,
        rate: ThroughputFn | None = None,
    ) -> SimCloud:
        """The cloud saved in ``path`` (:meth:`persist_to`), as it was at its last change: its clock, its
        instances (their agents resume from where they were), its tokens and draws; over ``prices``,
        ``hazards``, ``config`` and ``rate`` given now (a restarted service's). It keeps saving to
        ``path``. :class:`SimError` when the file cannot be read as a simulated cloud's state."""
        try:
            with open(path, "rb") as f:
                cloud = pickle.load(f)  # the service's own state file
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError) as exc:
            raise SimError(
                f"cannot read the simulated cloud's state from {path}: {exc} (delete the file to start an empty "
                "simulated cloud)"
            ) from exc
        if not isinstance(cloud, cls):
            raise SimError(f"{path} does not hold a simulated cloud's state")
        undone = cls._undo(path.with_name(path.name + ".undo"), cloud._generation)
        if undone:
            log.info("simulated cloud: %d agent writes after its last save undone", undone)
        cloud.prices = prices
        cloud.hazards = hazards or HazardModel()
        cloud.config = config or SimConfig()
        cloud.rate = rate
        log.info(
            "simulated cloud restored from %s: %d instances (%d alive) at %s",
            path,
            len(cloud._instances),
            len(cloud._live),
            cloud.now(),
        )
        cloud.persist_to(path)
        return cloud

    def attach_fleet(self, transport: FleetTransport | None) -> None:
        """Let this cloud's instances run fleet workers (:mod:`providers.sim_worker`), each syncing through
        ``transport`` (the service's: ``api.fleet_service``); None: launching a fleet worker is refused.
        The workers already running (a restored cloud's: their transport is not saved) sync through it
        from now on."""
        with self._lock:
            self.fleet_transport = transport
            if transport is not None:
                for inst in self._instances.values():
                    if isinstance(inst.agent, SimWorker) and inst.agent.running:
                        inst.agent.protocol.transport = transport(inst.agent.config)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        prices: PriceView,
        hazards: HazardModel | None = None,
        start: datetime | None = None,
        clock: SimClock | None = None,
        seed: int | Sequence[int] | None = None,
        config: SimConfig | None = None,
        rate: ThroughputFn | None = None,
    ) -> SimCloud:
        """The service's simulated cloud over ``prices`` (the composition root passes the price store's
        view) and ``hazards`` (None: the model's documented defaults), its clock starting at ``start``
        (None: ``COSTOPT_SIM_START``) unless ``clock`` is given; ``seed`` None: ``COSTOPT_SIM_SEED``;
        ``config`` None: :class:`SimConfig`'s documented defaults. The caller
        moves the clock (:meth:`run_until`, :meth:`run_to`, the service's ``api.sim_clock`` driver). ``rate``:
        the agents' throughput by job type (``api.wiring.build_sim_throughput``)."""
        if clock is None and start is None:
            start = settings.sim_start
        if seed is None:
            seed = settings.sim_seed
        return cls(prices, hazards, clock=clock, start=start, seed=seed, config=config, rate=rate)

    # --- time -----------------------------------------------------------------------------------------

    @property
    def timing(self) -> WorkloadTiming:
        return self.config.timing

    def now(self) -> datetime:
        return self.clock.now()

    def _us(self, at: datetime) -> int:
        return (utc(at) - self.clock.start) // _US

    def _dt(self, us: int) -> datetime:
        return self.clock.start + timedelta(microseconds=us)

    # --- CloudProvider ----------------------------------------------------------------------------------

    def _offer_info(self, key: OfferKey) -> tuple[float, str | None, float | None]:
        info = self._rates.get(key)
        if info is None:
            shape = self.prices.shape(key)
            acc, gpus = (shape[0], shape[1]) if shape is not None else (None, None)
            rate = self.hazards.rate(key.cloud, key.region, key.zone, acc, gpus, key.market)
            info = (rate, acc, gpus)
            self._rates[key] = info
        return info

    def _rng(self, key: OfferKey, stream: int) -> np.random.Generator:
        return np.random.default_rng(np.random.SeedSequence([*self._seed, _stable_hash(key), stream]))

    def _reclaims(self, key: OfferKey, rate: float) -> _Process:
        """The spot offer's reclaim stream (created on first use; its times are the same whenever drawn)."""
        proc = self._processes.get(key)
        if proc is None:
            proc = self._processes[key] = _Process(self._rng(key, 0), rate)
        return proc

    def _notice_lead(self, cloud: Cloud) -> timedelta:
        return self.config.notice_lead.get(cloud, DEFAULT_NOTICE_LEAD[Cloud.SIM])

    @_locked
    def launch(self, spec: LaunchSpec, idempotency_token: str) -> Instance:
        """Launch ``spec.offer`` now, once per token (module docstring). Raises CapacityError (no price
        now, or a drawn capacity failure), QuotaError (``max_instances`` alive), and
        :class:`~providers.sim_agent.AgentEnvError` for a spec whose job variables are invalid or whose
        throughput is unknown. A spec carrying the job contract and ``COSTOPT_JOB_STEPS`` runs a simulated
        agent (:mod:`providers.sim_agent`)."""
        if not idempotency_token:
            raise SimError("an idempotency token is required")
        self._catch_up()
        self._forget_ended()
        known = self._tokens.get(idempotency_token)
        if known is not None:
            return self._describe(self._instances[known])
        key = spec.offer
        job = AgentEnv.parse(spec.env)
        worker = None if job is not None else self._worker_config(spec.env)
        now_dt = self.clock.now()
        now = self.clock.micros()
        steps = self.prices.steps(key, now_dt, now_dt + _US)
        if not steps or steps[0].valid_from > now_dt:
            raise CapacityError(
                f"{key.instance_type} in {key.region} {key.zone} ({key.market.value}) has no price at {now_dt}"
            )
        limit = self.config.max_instances
        if limit is not None and sum(1 for i in self._live if self._alive(self._instances[i], now)) >= limit:
            raise QuotaError(f"the simulated account allows {limit} instances at once")
        rate, acc, gpus = self._offer_info(key)
        steps_per_s = None if job is None else job.resolve_rate(self.rate, max(1, int(gpus or 1)), key)
        p_fail = self.config.failure_probability(key.cloud, acc, gpus)
        if p_fail > 0:
            rng = self._failure_rngs.get(key)
            if rng is None:
                rng = self._failure_rngs[key] = self._rng(key, 1)
            self._mutations += 1  # a draw: the stream moved
            if rng.random() < p_fail:
                self.launch_failures += 1
                raise CapacityError(f"no capacity for {key.instance_type} in {key.zone or key.region} now (simulated)")
        preempt = None
        notice = None
        if key.market is Market.SPOT and rate > 0:
            preempt = self._reclaims(key, rate).first_after(now)
            lead = self._notice_lead(key.cloud) // _US
            notice = max(now, preempt - lead)
        iid = self._instance_id(idempotency_token)
        inst = _Inst(iid, spec, idempotency_token, now, now + self.timing.boot // _US, preempt, notice)
        self._instances[iid] = inst
        self._tokens[idempotency_token] = iid
        self._live.add(iid)
        if job is not None and steps_per_s is not None:
            timing = self.timing
            inst.agent = SimAgent(
                job,
                instance_id=iid,
                steps_per_s=steps_per_s,
                launched=now,
                ready=inst.ready,
                notice=notice,
                deadline=preempt,
                restore_us=timing.restore // _US,
                checkpoint_us=timing.checkpoint // _US,
                interval_us=timing.checkpoint_interval // _US,
                report_every_us=self.config.report_every // _US,
                to_seconds=self._unix_seconds,
                to_datetime=self._dt,
                notice_source=key.cloud.value,
            )
            self._agents.add(iid)
            self._schedule(inst)
        elif worker is not None:
            assert self.fleet_transport is not None
            inst.agent = SimWorker(
                worker,
                transport=self.fleet_transport(worker),
                launched=now,
                ready=inst.ready,
                notice=notice,
                deadline=preempt,
                poll_us=self.config.worker_poll // _US,
                make_agent=self._copy_agent(inst),
                to_seconds=self._unix_seconds,
                to_datetime=self._dt,
            )
            self._agents.add(iid)
            self._schedule(inst)
        return self._describe(inst)

    def _forget_ended(self) -> None:
        """Forget the instances that ended ``config.forget_ended_after`` ago or more and run no agent any
        more (:class:`SimConfig`); one sweep over the instances per tenth of that time at most (so a
        launch costs O(1) amortized), run at launches: the cloud then holds the instances launched within
        about that time of simulated time, whatever its age."""
        keep = self.config.forget_ended_after
        now = self.clock.micros()
        if keep is None or now < self._next_forget:
            return
        keep_us = keep // _US
        self._next_forget = now + max(1, keep_us // 10)
        cutoff = now - keep_us
        gone = [
            iid
            for iid, inst in self._instances.items()
            if (end := inst.end()) is not None
            and end <= cutoff
            and iid not in self._agents
            and iid not in self._scheduled
        ]
        for iid in gone:
            inst = self._instances.pop(iid)
            self._live.discard(iid)
            if self._tokens.get(inst.token) == iid:
                del self._tokens[inst.token]
        if gone:
            self._mutations += 1

    def _worker_config(self, env: Mapping[str, str]) -> WorkerConfig | None:
        """The fleet worker a spec's env describes (None: it carries no worker variable). Raises
        :class:`SimError` when this cloud cannot run it (no fleet service attached, a bad variable)."""
        if not any(env.get(v) for v in WORKER_VARIABLES):
            return None
        if self.fleet_transport is None:
            raise SimError(
                "this simulated cloud has no fleet service attached: its instances cannot run a fleet worker "
                "(the service attaches one when it runs on the simulated clock: COSTOPT_PROVIDER=sim)"
            )
        try:
            config = WorkerConfig.from_env(env)
        except WorkerError as exc:
            raise AgentEnvError(str(exc)) from exc
        return replace(config, workdir=Path(tempfile.gettempdir()))  # no process, no output files

    def _copy_agent(self, inst: _Inst) -> Callable[[AgentEnv, int, int], SimAgent]:
        """How the instance's worker starts a copy (:meth:`copy_agent`); a picklable callable, so the
        worker is saved with the cloud (:meth:`persist_to`)."""
        return _CopyAgents(self, inst.instance_id)

    def copy_agent(self, instance_id: str, job: AgentEnv, gpus: int, t: int) -> SimAgent:
        """A copy of ``job`` started by the fleet worker of ``instance_id`` at ``t`` on ``gpus`` GPUs: a
        simulated agent at the job's throughput (its env's, else this cloud's rate for its type there), ready
        at once (no boot)."""
        inst = self._get(instance_id)
        timing = self.timing
        return SimAgent(
            job,
            instance_id=instance_id,
            steps_per_s=job.resolve_rate(self.rate, gpus, inst.spec.offer),
            launched=t,
            ready=t,
            notice=None,
            deadline=None,
            restore_us=timing.restore // _US,
            checkpoint_us=timing.checkpoint // _US,
            interval_us=timing.checkpoint_interval // _US,
            report_every_us=self.config.report_every // _US,
            to_seconds=self._unix_seconds,
            to_datetime=self._dt,
            notice_source=inst.spec.offer.cloud.value,
        )

    def _instance_id(self, token: str) -> str:
        """``sim-`` and 12 hex digits of the token's hash: deterministic, and distinct across simulated
        clouds that share a ledger as long as their tokens differ (the job runner's are ``<job>:<epoch>``)."""
        base = "sim-" + hashlib.blake2b(token.encode(), digest_size=6).hexdigest()
        iid, n = base, 1
        while iid in self._instances:  # a hash collision within this cloud
            n += 1
            iid = f"{base}-{n}"
        return iid

    def _alive(self, inst: _Inst, t: int) -> bool:
        end = inst.end()
        return end is None or end > t

    def _state(self, inst: _Inst, t: int) -> InstanceState:
        if inst.preempted_by(t):
            return InstanceState.PREEMPTED
        if inst.terminated is not None and inst.terminated <= t:
            return InstanceState.TERMINATED
        return InstanceState.PENDING if t < inst.ready else InstanceState.RUNNING

    def _describe(self, inst: _Inst) -> Instance:
        t = self.clock.micros()
        state = self._state(inst, t)
        end = inst.end()
        return Instance(
            instance_id=inst.instance_id,
            offer=inst.spec.offer,
            state=state,
            tags=dict(inst.spec.tags),
            launched_at=self._dt(inst.launched),
            terminated_at=self._dt(end) if end is not None and end <= t else None,
            exit_code=inst.exit_code if inst.exited is not None and inst.exited <= t else None,
        )

    def _get(self, instance_id: str) -> _Inst:
        inst = self._instances.get(instance_id)
        if inst is None:
            raise NotFoundError(f"no simulated instance {instance_id!r}")
        return inst

    @_locked
    def describe(self, instance_id: str) -> Instance:
        """The instance now; ``exit_code`` 0 once its agent finished (then TERMINATED), 75 when it stopped
        (fenced out, or after a notice's checkpoint), 1 when it failed; None while it runs, and for an
        instance killed (terminated, preempted) or running no agent."""
        self._catch_up()
        return self._describe(self._get(instance_id))

    @_locked
    def terminate(self, instance_id: str) -> None:
        """Terminate now (its agent is killed: work since its last checkpoint is lost); a gone (terminated
        or preempted) or unknown instance is left as it is."""
        inst = self._instances.get(instance_id)
        if inst is None:
            return
        self._catch_up()
        t = self.clock.micros()
        if self._alive(inst, t):
            inst.terminated = t
            self._live.discard(instance_id)
            self._kill_agent(inst, t)
            self._mutations += 1

    @_locked
    def preempt(self, instance_id: str, *, notice: timedelta | None = None) -> Interruption:
        """Reclaim the instance now, whatever its market (a test's or a drill's forced preemption), through
        the same path as a drawn one: a notice now, the instance taken ``notice`` later (None: the cloud's
        lead time, ``SimConfig.notice_lead``; zero: at once), seen by :meth:`run_until`,
        :meth:`interruptions`, the instance's state and its agent (which checkpoints on the notice, as for a
        drawn preemption). A drawn (or earlier forced) preemption that comes first stays. Returns the
        notice (the preemption when it is taken at once). :class:`~costopt.cloud.NotFoundError` for an
        unknown id, :class:`SimError` for an instance that has already ended."""
        inst = self._get(instance_id)
        self._catch_up()
        now = self.clock.micros()
        if not self._alive(inst, now):
            raise SimError(f"{instance_id} has ended: it cannot be preempted")
        lead = self._notice_lead(inst.spec.offer.cloud) if notice is None else notice
        if lead < timedelta(0):
            raise ValueError(f"the notice must be >= 0, got {lead}")
        deadline = now + lead // _US
        self._mutations += 1
        if inst.preempt is None or deadline < inst.preempt:
            noticed = inst.notice if inst.notice is not None and inst.notice <= now else now  # one notice only
            inst.preempt, inst.notice = deadline, noticed
            if inst.agent is not None and inst.agent.running:
                inst.agent.set_notice(noticed, deadline)
                self._schedule(inst)
        assert inst.preempt is not None and inst.notice is not None
        if inst.preempt <= now:  # taken at once (the drawn path does this when run_until reaches it)
            self._live.discard(instance_id)
            self._kill_agent(inst, now)
            return Interruption(instance_id, self._dt(now), None, "preempted")
        return Interruption(instance_id, self._dt(inst.notice), self._dt(inst.preempt), "notice")

    @_locked
    def launch_spec(self, instance_id: str) -> LaunchSpec:
        """What the instance was launched with (offer, command, environment, tags, image), as a cloud's
        console shows it. :class:`~costopt.cloud.NotFoundError` for an unknown id."""
        return self._get(instance_id).spec

    @_locked
    def output(self, instance_id: str, *, tail: int | None = None) -> str:
        """The simulated agent's console: one human-readable line per progress record (boot, start, steps,
        checkpoints, notice, fencing, exit), the last ``tail`` lines (None: all it keeps, the latest
        ``providers.sim_agent.CONSOLE_LINES`` of an agent); "" for an instance that runs no agent.
        :class:`~costopt.cloud.NotFoundError` for an unknown id."""
        if tail is not None and tail < 0:
            raise ValueError(f"tail must be >= 0 lines, got {tail}")
        inst = self._get(instance_id)
        self._catch_up()
        lines = inst.agent.lines() if inst.agent is not None else []
        if tail is not None:
            lines = lines[len(lines) - tail :] if tail else []
        return "".join(line + "\n" for line in lines)

    @_locked
    def list(self, tags: Mapping[str, str]) -> builtins.list[Instance]:
        """Every instance whose tags include ``tags`` exactly, in launch order: all that have not ended, and
        ended ones until :data:`~costopt.cloud.ENDED_RETENTION` after their end."""
        self._catch_up()
        now = self.clock.micros()
        horizon = now - ENDED_RETENTION // _US
        out = []
        for inst in self._instances.values():
            end = inst.end()
            if end is not None and end <= now and end < horizon:
                continue
            if tags_match(inst.spec.tags, tags):
                out.append(self._describe(inst))
        return out

    def acknowledge(self, interruptions: Sequence[Interruption]) -> None:
        """Nothing to do: the simulated cloud keeps no queue of notices (see ``CloudProvider.acknowledge``)."""

    @_locked
    def interruptions(self, since: datetime) -> builtins.list[Interruption]:
        """Notices and preemptions that happened in ``[since, now]``, in time order."""
        self._catch_up()
        lo, now = self._us(since), self.clock.micros()
        out: list[tuple[int, int, Interruption]] = []
        for inst in self._instances.values():
            if inst.preempt is None or inst.notice is None:
                continue
            gone = inst.terminated
            if lo <= inst.notice <= now and (gone is None or inst.notice < gone):
                out.append(
                    (
                        inst.notice,
                        0,
                        Interruption(inst.instance_id, self._dt(inst.notice), self._dt(inst.preempt), "notice"),
                    )
                )
            if lo <= inst.preempt <= now and inst.preempted_by(now):
                out.append((inst.preempt, 1, Interruption(inst.instance_id, self._dt(inst.preempt), None, "preempted")))
        return [i for _, _, i in sorted(out, key=lambda e: (e[0], e[1], e[2].instance_id))]

    # --- workloads ------------------------------------------------------------------------------------------

    def start_workload(
        self,
        instance_id: str,
        *,
        steps_per_s: float,
        target_steps: float,
        start_step: float = 0.0,
        restore: bool | None = None,
    ) -> WorkloadProgress:
        """Run a job on the instance (module docstring): after its boot (and, when ``restore``, default
        ``start_step > 0``, the restore time) it trains from ``start_step`` towards ``target_steps``."""
        inst = self._get(instance_id)
        t = self.clock.micros()
        if not self._alive(inst, t):
            raise SimError(f"{instance_id} is gone: it cannot run a workload")
        if inst.agent is not None:
            raise SimError(f"{instance_id} runs a simulated agent: its job progresses at its checkpoint location")
        if inst.workload is not None:
            raise SimError(f"{instance_id} already runs a workload")
        if not (steps_per_s > 0 and math.isfinite(steps_per_s)):
            raise SimError(f"steps_per_s must be > 0, got {steps_per_s}")
        if not (0 <= start_step <= target_steps):
            raise SimError(f"need 0 <= start_step <= target_steps, got {start_step} and {target_steps}")
        timing = self.timing
        restoring = start_step > 0 if restore is None else restore
        t0 = max(inst.ready, t) + (timing.restore // _US if restoring else 0)
        inst.workload = _Workload(
            steps_per_s=steps_per_s,
            target=float(target_steps),
            start_step=float(start_step),
            interval_us=timing.checkpoint_interval // _US,
            checkpoint_us=timing.checkpoint // _US,
            phases=[_Phase(t, t0, float(start_step), float(start_step), None, t, False)],
            training_from=t0,
        )
        return self.progress(instance_id)

    def progress(self, instance_id: str) -> WorkloadProgress:
        """The instance's workload as of now (zeros when it runs none)."""
        inst = self._get(instance_id)
        now = self.clock.micros()
        wl = inst.workload
        end = inst.end()
        if wl is None:
            gone = None if end is None or end > now else self._dt(end)
            return WorkloadProgress(instance_id, 0.0, 0.0, 0.0, None, 0.0, None, None, gone)
        t = now if end is None else min(now, end)
        steps, durable, durable_at = wl.at(t)
        last = wl.phases[-1]
        done = wl.done_at(last)
        if done is not None and end is not None and done > end:
            done = None
        stopped: int | None = end if end is not None and end <= now else None
        if stopped is None and last.t0 is None and (done is None or done > now) and now >= last.durable_at:
            stopped = last.durable_at  # stopped after the checkpoint it was asked for
        return WorkloadProgress(
            instance_id=instance_id,
            start_step=wl.start_step,
            steps_done=steps,
            durable_steps=durable,
            durable_at=None if durable_at is None else self._dt(durable_at),
            target_steps=wl.target,
            training_from=None if wl.training_from is None else self._dt(wl.training_from),
            done_at=None if done is None else self._dt(done),
            stopped_at=None if stopped is None else self._dt(stopped),
        )

    def request_checkpoint(self, instance_id: str, *, then_stop: bool = False) -> datetime:
        """Write a checkpoint now (or let the one being written finish), and with ``then_stop`` stop
        training after it. Returns when it is durable (it is lost if the instance goes before)."""
        inst = self._get(instance_id)
        t = self.clock.micros()
        if inst.workload is None:
            raise SimError(f"{instance_id} runs no workload")
        if not self._alive(inst, t):
            raise SimError(f"{instance_id} is gone: it cannot write a checkpoint")
        return self._dt(inst.workload.checkpoint(t, then_stop))

    # --- events -----------------------------------------------------------------------------------------

    def _events(self, inst: _Inst, lo: int, hi: int) -> builtins.list[tuple[int, int, SimEventKind]]:
        """Unreported events of ``inst`` in ``[lo, hi]`` as (time, order, kind)."""
        out: list[tuple[int, int, SimEventKind]] = []
        gone = inst.end()

        def add(t: int | None, order: int, kind: SimEventKind, alive_needed: bool = True) -> None:
            if t is None or not lo <= t <= hi or (kind.value, t) in inst.reported:
                return
            if alive_needed and gone is not None and gone < t:
                return
            out.append((t, order, kind))

        add(inst.ready, 0, SimEventKind.READY)
        if inst.preempt is not None and (inst.terminated is None or inst.preempt < inst.terminated):
            if inst.notice is not None and (inst.terminated is None or inst.notice < inst.terminated):
                add(inst.notice, 1, SimEventKind.NOTICE)
            add(inst.preempt, 3, SimEventKind.PREEMPTED, alive_needed=False)
        if inst.workload is not None:
            done = inst.workload.done_at(inst.workload.phases[-1])
            if done is not None and (gone is None or done <= gone):
                add(done, 2, SimEventKind.DONE, alive_needed=False)
        if inst.exit_code == 0 and inst.exited is not None:  # its agent finished the job
            add(inst.exited, 2, SimEventKind.DONE, alive_needed=False)
        return out

    @_locked
    def run_until(self, until: datetime, *, watch: Collection[str] | None = None) -> builtins.list[SimEvent]:
        """Advance the clock to ``until`` (not before now), reporting each event of the watched
        instances (None: all) once, in time order; stop at the first preemption or finished workload (or
        agent) among them, the clock then standing at its time. Notices trigger ``checkpoint_on_notice``.
        Simulated agents (of every instance, watched or not) act at their own times on the way, after
        looking at their checkpoint locations at the start (a request or a claim made since the last call)."""
        target = self._us(until)
        if target < self.clock.micros():
            raise ClockError(f"run_until({until}) is before now ({self.clock.now()})")
        self._catch_up()
        self._sync_agents(self.clock.micros())
        if watch is None:  # every instance that may still have an event (each event is at or before its end)
            start = self.clock.micros()
            ids = {iid for iid, inst in self._instances.items() if (end := inst.end()) is None or end >= start}
        else:
            ids = set(watch)
        reported: list[SimEvent] = []
        best: tuple[int, int, str, SimEventKind] | None = None
        stale = True  # the watched instances' next event must be looked for again
        while True:
            now = self.clock.micros()
            if stale:
                best, stale = None, False
                for iid in ids:
                    inst = self._instances.get(iid)
                    if inst is None:
                        raise NotFoundError(f"no simulated instance {iid!r}")
                    for t, order, kind in self._events(inst, now, target):
                        cand = (t, order, iid, kind)
                        if best is None or cand < best:
                            best = cand
            agent_t = self._next_agent_event()
            if agent_t is not None and agent_t <= target and (best is None or agent_t < best[0]):
                self.clock.advance_to_micros(max(agent_t, now))
                # An agent event before the next watched event leaves that event the next one, unless the
                # agent's exit ended its (watched) instance: only then is it looked for again.
                agent_iid = self._agenda[0][2]
                agent_inst = self._instances[agent_iid]
                ended = (agent_inst.terminated, agent_inst.exited, agent_inst.exit_code)
                self._run_agent_event()
                stale = agent_iid in ids and ended != (agent_inst.terminated, agent_inst.exited, agent_inst.exit_code)
                continue
            if best is None:
                self.clock.advance_to_micros(target)
                return reported
            t, _, iid, kind = best
            stale = True
            self.clock.advance_to_micros(t)
            inst = self._instances[iid]
            inst.reported.add((kind.value, t))
            self._mutations += 1
            reported.append(SimEvent(self._dt(t), iid, kind))
            if kind is SimEventKind.NOTICE:
                self._on_notice(inst, t)
            if kind in (SimEventKind.PREEMPTED, SimEventKind.DONE):
                if kind is SimEventKind.PREEMPTED:
                    self._live.discard(iid)
                    self._kill_agent(inst, t)
                return reported

    @_locked
    def run_to(self, at: datetime) -> builtins.list[SimEvent]:
        """Advance the clock to ``at`` through every event on the way (:meth:`run_until` stops at each
        preemption or finish); returns them all."""
        target = self._us(at)
        events: list[SimEvent] = []
        while True:
            events.extend(self.run_until(at))
            if self.clock.micros() >= target:
                return events

    def sleeper(self) -> Callable[[float], None]:
        """A ``sleep(seconds)`` that advances this cloud's clock by ``seconds`` of simulated time instead of
        waiting (:meth:`run_to`): the :class:`~costopt.migration.Migrator`'s ``sleep`` offline, so a whole
        move runs in milliseconds of wall time."""

        def sleep(seconds: float) -> None:
            if not seconds >= 0:
                raise ValueError(f"cannot sleep {seconds} s")
            self.run_to(self.now() + timedelta(seconds=seconds))

        return sleep

    def service_clock(self) -> SimServiceClock:
        """This cloud's clock as a :class:`costopt.clock.ServiceClock` for offline runs: ``now`` is the
        simulated time, ``sleep`` advances it (:meth:`sleeper`)."""
        return SimServiceClock(self)

    @_locked
    def untouched(
        self, spans: Iterable[tuple[OfferKey, datetime, datetime]], *, slack: timedelta = timedelta(hours=1)
    ) -> bool:
        """Whether nothing this cloud draws at random would touch instances living over ``spans``
        (``(offer, launched, ended)``): no launch can fail by a draw (no failure probability configured),
        and no reclaim of a span's offer falls from ``slack`` before its launch to ``slack`` after its end
        plus the notice lead, so an instance launched and ended then would meet no notice and no preemption.
        Draws each offer's reclaim stream as far as needed, which changes nothing a later launch meets (the
        stream's times are the same whenever they are drawn). The preemption study's test of whether a run
        with hazards would run as the same run without them (:mod:`costopt.backtest.preemption`)."""
        if self.config.launch_failure or self.config.default_launch_failure > 0:
            return False
        pad = slack // _US
        for key, launched, ended in spans:
            rate = self._offer_info(key)[0]
            if key.market is not Market.SPOT or rate <= 0:
                continue
            lead = self._notice_lead(key.cloud) // _US
            if self._reclaims(key, rate).first_after(self._us(launched) - pad) <= self._us(ended) + lead + pad:
                return False
        return True

    def migrator_timeouts(self) -> dict[str, float]:
        """``checkpoint_timeout`` and ``verify_timeout`` (seconds of simulated time) for a
        :class:`~costopt.migration.Migrator` on this cloud: a copy still booting and restoring has to answer
        a request (boot + restore + checkpoint + 1 min), and a new copy boots, restores and reports its
        first step (boot + restore + ``report_every`` + 1 min)."""
        t = self.timing
        boot_restore = (t.boot + t.restore).total_seconds()
        return {
            "checkpoint_timeout": boot_restore + t.checkpoint.total_seconds() + 60.0,
            "verify_timeout": boot_restore + self.config.report_every.total_seconds() + 60.0,
        }

    # --- simulated agents ------------------------------------------------------------------------------

    def _unix_seconds(self, us: int) -> float:
        return self.clock.unix_seconds(us)

    def _schedule(self, inst: _Inst) -> None:
        """Put the instance's agent's next event on the agenda (once per time)."""
        agent = inst.agent
        t = agent.next_event() if agent is not None and agent.running else None
        if t is None:
            self._scheduled.pop(inst.instance_id, None)
            return
        if self._scheduled.get(inst.instance_id) == t:
            return
        self._scheduled[inst.instance_id] = t
        self._seq += 1
        heapq.heappush(self._agenda, (t, self._seq, inst.instance_id))

    def _next_agent_event(self) -> int | None:
        """The time of the earliest agent event on the agenda (stale entries dropped)."""
        while self._agenda:
            t, _, iid = self._agenda[0]
            if self._scheduled.get(iid) == t:
                return t
            heapq.heappop(self._agenda)
        return None

    def _run_agent_event(self) -> None:
        """Run the earliest agent event (:meth:`_next_agent_event` said there is one)."""
        t, _, iid = heapq.heappop(self._agenda)
        del self._scheduled[iid]
        inst = self._instances[iid]
        agent = inst.agent
        assert agent is not None
        end = inst.end()
        if end is not None and end <= t:
            self._kill_agent(inst, end)
            return
        agent.on_event(t)
        self._after_agent(inst, t)

    def _after_agent(self, inst: _Inst, t: int) -> None:
        """Apply what the agent did at ``t``: its exit ends the instance (exit 0 always; another code
        unless a preemption notice is running: the cloud then takes the instance at its deadline)."""
        agent = inst.agent
        assert agent is not None
        self._mutations += 1
        if isinstance(agent, SimWorker) and agent.handed_over:
            agent.handed_over = False
            self._poke_fleet(agent, t)
        if not agent.running:
            self._agents.discard(inst.instance_id)
            if agent.exit_code is not None and inst.exited is None:
                inst.exit_code = agent.exit_code
                inst.exited = t
                noticed = inst.notice is not None and inst.notice <= t and inst.preempt is not None
                if (agent.exit_code == 0 or not noticed) and self._alive(inst, t):
                    inst.terminated = t
                    self._live.discard(inst.instance_id)
                self._schedule(inst)
                self._commit()  # its last writes (final checkpoint, done) before the service reads them
                return
        self._schedule(inst)

    def _poke_fleet(self, worker: SimWorker, t: int) -> None:
        """A worker had a copy's exit acknowledged at ``t``: the other workers of its fleet that wait for a
        copy elsewhere to stop sync now (one of them may take the job over)."""
        for iid in sorted(self._agents):
            other = self._instances[iid]
            peer = other.agent
            if peer is worker or not isinstance(peer, SimWorker) or peer.fleet_id != worker.fleet_id:
                continue
            if peer.poke(t):
                self._schedule(other)

    def _kill_agent(self, inst: _Inst, t: int) -> None:
        self._mutations += 1
        if inst.agent is not None and inst.agent.running:
            inst.agent.kill(t)
        self._agents.discard(inst.instance_id)
        self._scheduled.pop(inst.instance_id, None)

    def _catch_up(self) -> None:
        """Run every agent event up to now (when the clock was moved without :meth:`run_until`)."""
        now = self.clock.micros()
        while (t := self._next_agent_event()) is not None and t <= now:
            self._run_agent_event()

    def _sync_agents(self, t: int) -> None:
        """Every running agent looks at its checkpoint location now (requests, claims)."""
        for iid in sorted(self._agents):
            inst = self._instances[iid]
            end = inst.end()
            if end is not None and end <= t:
                self._kill_agent(inst, end)
                continue
            agent = inst.agent
            assert agent is not None
            agent.sync(t, force=False)
            self._after_agent(inst, t)

    def _on_notice(self, inst: _Inst, t: int) -> None:
        if not self.config.checkpoint_on_notice or inst.workload is None or inst.notice_checkpointed:
            return
        if inst.preempt is None or self.timing.checkpoint // _US > inst.preempt - t:
            return
        inst.notice_checkpointed = True
        inst.workload.checkpoint(t, then_stop=True)


class SimServiceClock:
    """A :class:`costopt.clock.ServiceClock` on a simulated cloud, offline: ``now`` is its simulated time and
    ``sleep(seconds)`` advances it by that much (its agents and events run on the way)."""

    def __init__(self, cloud: SimCloud) -> None:
        self.cloud = cloud

    def now(self) -> datetime:
        return self.cloud.now()

    def sleep(self, seconds: float) -> None:
        self.cloud.sleeper()(seconds)


@dataclass(frozen=True, slots=True)
class _CopyAgents:
    """The fleet worker's way to start a copy on its instance (:meth:`SimCloud.copy_agent`), picklable."""

    cloud: SimCloud
    instance_id: str

    def __call__(self, job: AgentEnv, gpus: int, t: int) -> SimAgent:
        return self.cloud.copy_agent(self.instance_id, job, gpus, t)


def sim_factory(config: SimConfig | None = None) -> _Factory:
    """A :class:`costopt.simulated.CloudFactory` building :class:`SimCloud` with ``config``."""
    return _Factory(config or SimConfig())


@dataclass(frozen=True, slots=True)
class _Factory:
    config: SimConfig

    def __call__(
        self,
        prices: PriceView,
        hazards: HazardModel,
        *,
        start: datetime,
        seed: int | Sequence[int],
        rate: ThroughputFn | None = None,
    ) -> SimCloud:
        return SimCloud(prices, hazards, start=start, seed=seed, config=self.config, rate=rate)
