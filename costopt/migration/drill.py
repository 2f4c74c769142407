"""The engine of ``costopt drill``: run a user's training script through moves and preemptions.

:func:`run_drill` registers the script as a job and runs it for real, as processes on this machine (only
running the script can tell whether its checkpointing is sound), on a :class:`ProcessCloud` (a cloud
whose instances are local processes it can preempt), either directly or behind a
:class:`SimulatedMarket`:

- without a market: forced events, each once the current copy is progressing, alternating migrations
  (:meth:`Migrator.move`: checkpoint request, launch of a new epoch, fencing, verification,
  termination of the old copy) and preemptions (:meth:`ProcessCloud.preempt`: a notice, then a kill at
  its deadline);
- with a :class:`SimulatedMarket`: a simulated cloud's market decides, on a compressed clock
  (``time_scale`` simulated seconds per second), *when* each copy is preempted (at any moment:
  booting, restoring, mid-checkpoint, mid-migration), the notice each cloud gives first, and which
  launches fail for lack of capacity (the migrator must go on to the next offer). Forced moves happen
  as without a market, until ``preemptions`` copies have been preempted.

In both, every recovery after a preemption goes through the :class:`~.watch.InterruptionWatcher` (the
loop the service runs): the drill never calls ``recover`` itself. It waits for the job to finish,
reconciles (orphans are counted and terminated), and audits the progress logs
(:func:`costopt.agent.control.audit_job`): exactly the steps asked for, none lost, none counted twice?
It also checks that every copy given a notice checkpointed and stopped before it was taken, and that
every copy ran with the epoch it was launched with (``COSTOPT_EPOCH``: the fencing).

This module works on protocols only; :mod:`api.drill` builds the clouds (``providers.local``'s
``LocalProvider``, ``providers.sim``'s ``SimCloud`` under the market), the database and the working
directory, and is what the CLI (``costopt drill --command ... --moves 5 --preemptions 5
[--provider local|sim] [--seed N] [--format json]``) calls; it prints :meth:`DrillReport.to_dict`.
"""

from __future__ import annotations

import builtins
import logging
import shlex
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import Engine

from costopt.agent import control
from costopt.cloud import CapacityError, CloudProvider, Instance, Interruption, LaunchSpec
from costopt.domain import Cloud, Market, OfferKey
from costopt.migration.machine import Migrator
from costopt.migration.reconcile import reconcile
from costopt.migration.records import ALIVE_STATES, TAG_EPOCH, TAG_JOB, TAG_MANAGED, JobStatus, State
from costopt.migration.unavailable import DEFAULT_TTL, UnavailableOffers
from costopt.migration.watch import InterruptionWatcher, WatchReport

log = logging.getLogger("costopt.migration.drill")

DEFAULT_COMMAND = "python examples/train.py --steps 2000 --checkpoint-every 50 --step-seconds 0.01"
PROVIDERS = ("local", "sim")
LOCAL_POLL_SECONDS = 0.05
"""How often the drill's migrator looks again while waiting: its copies are processes on this machine."""
NOTICE_REACTION_SECONDS = 1.0
"""A copy whose agent never recorded a notice is blamed only if the notice came this long ahead and it
kept training past that (a shorter notice may simply have been too short to see)."""

LOCAL_OFFERS = (
    OfferKey(Cloud.LOCAL, "local", "local-a", "cpu-1", Market.SPOT),
    OfferKey(Cloud.LOCAL, "local", "local-b", "cpu-1", Market.SPOT),
    OfferKey(Cloud.LOCAL, "local", "local-c", "cpu-1", Market.SPOT),
)
SIM_OFFERS = (
    OfferKey(Cloud.AWS, "us-east-1", "us-east-1a", "p3.2xlarge", Market.SPOT),
    OfferKey(Cloud.GCP, "us-central1", "us-central1-a", "n1-standard-8", Market.SPOT),
    OfferKey(Cloud.AZURE, "eastus", "", "Standard_NC6s_v3", Market.SPOT),
    OfferKey(Cloud.AWS, "us-west-2", "us-west-2b", "p3.2xlarge", Market.SPOT),
)
"""Spot offers of three clouds, so notices of both lengths (AWS 2 min, GCP and Azure 30 s) occur."""


class DrillError(ValueError):
    """The drill cannot run as asked (unknown provider, empty command, a parameter out of range)."""


class ProcessStatus(Protocol):
    """What the drill reads of an instance's process."""

    @property
    def pid(self) -> int | None:
        """The job's process id (None: not started, or not known)."""
        ...

    @property
    def exit_code(self) -> int | None:
        """The command's own exit code (negative: the signal that ended it); None while it runs, or when
        it was killed from outside (terminated, preempted)."""
        ...

    @property
    def stderr(self) -> Path:
        """The file the command's standard error went to."""
        ...


class ProcessCloud(CloudProvider, Protocol):
    """A cloud whose instances are processes on this machine (``providers.local.LocalProvider``): what
    the drill needs beyond :class:`~costopt.cloud.CloudProvider`."""

    def preempt(self, instance_id: str, notice_seconds: float = 30.0) -> Interruption | None:
        """Post a preemption notice, then kill the job ``notice_seconds`` (wall seconds) later
        (``<= 0``: at once, without notice). None when the instance is not running."""
        ...

    def status(self, instance_id: str) -> ProcessStatus:
        """The instance's process."""
        ...

    def wait(self, instance_id: str, timeout: float) -> Instance:
        """Wait until the instance is no longer pending or running, at most ``timeout`` seconds."""
        ...


class MarketClock(Protocol):
    """The simulated cloud's clock as the market drives it (``providers.sim.SimClock``)."""

    @property
    def start(self) -> datetime:
        """When the clock started (tz-aware UTC)."""
        ...

    def now(self) -> datetime:
        """The simulated now (tz-aware UTC)."""
        ...

    def advance_to(self, at: datetime) -> datetime:
        """Move the clock forward to ``at``."""
        ...


@dataclass(frozen=True, slots=True)
class DrillReport:
    """The verdict. ``ok``: exactly ``steps_requested`` steps, none lost or repeated, every move and
    preemption asked for happened, no orphan, every notice honoured, every copy on its own epoch.
    ``problems`` say what was wrong; ``notes`` what happened that is not wrong (a move interrupted by
    a preemption and tried again, launches refused for capacity)."""

    steps_requested: int | None
    steps_done: int
    lost_steps: int
    repeated_steps: int
    moves: int
    preemptions: int
    orphans: int
    ok: bool
    wasted_steps: int = 0
    finished: bool = False
    seconds: float = 0.0
    problems: tuple[str, ...] = field(default_factory=tuple)
    provider: str = "local"
    seed: int = 0
    notices: int = 0
    recoveries: int = 0
    launch_failures: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["problems"] = list(self.problems)
        doc["notes"] = list(self.notes)
        return doc


def parse_command(command: str | Sequence[str]) -> list[str]:
    """Split a command line; a leading ``python``/``python3`` runs this interpreter (its packages)."""
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if not argv:
        raise DrillError(
            "the command is empty: give the training command, e.g. --command 'python train.py --steps 500'"
        )
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def steps_in(argv: Sequence[str]) -> int | None:
    """The ``--steps N`` of a command line, if any."""
    for i, arg in enumerate(argv):
        if arg == "--steps" and i + 1 < len(argv):
            return int(argv[i + 1])
        if arg.startswith("--steps="):
            return int(arg.split("=", 1)[1])
    return None


# -- the simulated market over real processes --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MarketEvent:
    """A preemption the market applied to a copy: ``lead`` seconds of notice (0: none)."""

    instance_id: str
    offer: OfferKey
    at: datetime
    lead: float


def check_market(time_scale: float, preemption_every: float, launch_failure: float) -> None:
    """Raise :class:`DrillError` unless ``time_scale`` (simulated seconds per second) and
    ``preemption_every`` (mean wall seconds between reclaims of one offer) are > 0 and
    ``launch_failure`` is a probability in [0, 1)."""
    if time_scale <= 0 or preemption_every <= 0:
        raise DrillError(f"time_scale and preemption_every must be > 0, got {time_scale} and {preemption_every}")
    if not 0.0 <= launch_failure < 1.0:
        raise DrillError(f"launch_failure is a probability in [0, 1), got {launch_failure}")


class SimulatedMarket:
    """A :class:`~costopt.cloud.CloudProvider` whose instances are real processes (``local``) and whose
    market is a simulated cloud's (``sim``, e.g. ``providers.sim.SimCloud``) on a compressed clock
    (``clock``, the one ``sim`` runs on). :func:`api.drill.build_market` builds one.

    - Time: simulated time = ``clock.start`` + (wall time since ``clock.start``) x ``time_scale``: the
      clock must start at the wall time the market is made.
    - Launch: the simulated cloud launches first and may refuse for lack of capacity
      (:class:`~costopt.cloud.CapacityError`); then the local provider starts the process with the same
      idempotency token.
    - Preemption: a copy is taken when its simulated instance is: the simulated cloud's notice (its
      lead scaled down by ``time_scale``) is applied to the process (:meth:`ProcessCloud.preempt`) by a
      background thread when it comes due, whatever the copy is doing. After ``max_preemptions`` applied
      preemptions the market spares every copy.
    - ``describe``, ``list``, ``interruptions`` are the processes' (what the job really went through);
      ``terminate`` stops the process and the simulated instance.
    """

    name = "sim"

    def __init__(
        self,
        local: ProcessCloud,
        sim: CloudProvider,
        clock: MarketClock,
        *,
        time_scale: float = 60.0,
        max_preemptions: int | None = None,
        tick_seconds: float = 0.02,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if time_scale <= 0:
            raise DrillError(f"time_scale must be > 0, got {time_scale}")
        self.local = local
        self.sim = sim
        self.clock = clock
        self.time_scale = float(time_scale)
        self.max_preemptions = max_preemptions
        self.wall = wall
        self._wall0 = clock.start.timestamp()
        self._lock = threading.RLock()
        self._local_of: dict[str, str] = {}  # simulated id -> local id
        self._sim_of: dict[str, str] = {}  # local id -> simulated id
        self._offer_of: dict[str, OfferKey] = {}  # local id -> offer
        self._handled: set[str] = set()  # simulated ids whose notice was applied (or spared)
        self.applied: list[MarketEvent] = []
        self.spared = 0
        self.launch_failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(tick_seconds,), name="sim-market", daemon=True)
        self._thread.start()

    @property
    def preemptions(self) -> int:
        return len(self.applied)

    @property
    def notices(self) -> int:
        return sum(1 for e in self.applied if e.lead > 0)

    def _advance(self) -> None:
        target = self.clock.start + timedelta(seconds=(self.wall() - self._wall0) * self.time_scale)
        if target > self.clock.now():
            self.clock.advance_to(target)

    def _run(self, tick_seconds: float) -> None:
        while not self._stop.wait(tick_seconds):
            try:
                self.tick()
            except Exception:  # a background thread has nobody to raise to: log, keep the market going
                log.exception("simulated market: a tick failed")

    def tick(self) -> list[MarketEvent]:
        """Move the simulated clock to now and apply the notices that came due to their processes."""
        out: list[MarketEvent] = []
        with self._lock:
            self._advance()
            now = self.clock.now()
            for ev in self.sim.interruptions(self.clock.start):
                if ev.kind != "notice" or ev.instance_id in self._handled:
                    continue
                local_id = self._local_of.get(ev.instance_id)
                if local_id is None:
                    continue  # launched but not mapped yet: the next tick applies it
                self._handled.add(ev.instance_id)
                if self.max_preemptions is not None and len(self.applied) >= self.max_preemptions:
                    self.spared += 1
                    continue
                deadline = ev.deadline or now
                lead = max(0.0, (deadline - now).total_seconds() / self.time_scale)
                taken = self.local.preempt(local_id, lead if lead >= 0.001 else 0.0)
                if taken is None:
                    continue  # the process had already ended
                event = MarketEvent(local_id, self._offer_of[local_id], datetime.fromtimestamp(self.wall(), UTC), lead)
                self.applied.append(event)
                out.append(event)
                log.info("simulated market: preempting %s (%s), %.3f s of notice", local_id, event.offer, lead)
        return out

    # -- CloudProvider ---------------------------------------------------------------------------

    def launch(self, spec: LaunchSpec, idempotency_token: str) -> Instance:
        with self._lock:
            self._advance()
            try:
                sim_inst = self.sim.launch(LaunchSpec(offer=spec.offer, tags=dict(spec.tags)), idempotency_token)
            except CapacityError:
                self.launch_failures += 1
                raise
        try:
            inst = self.local.launch(spec, idempotency_token)
        except Exception:
            with self._lock:
                self.sim.terminate(sim_inst.instance_id)
            raise
        with self._lock:
            self._local_of[sim_inst.instance_id] = inst.instance_id
            self._sim_of[inst.instance_id] = sim_inst.instance_id
            self._offer_of[inst.instance_id] = spec.offer
        return inst

    def terminate(self, instance_id: str) -> None:
        with self._lock:
            sim_id = self._sim_of.get(instance_id)
            if sim_id is not None:
                self._advance()
                self.sim.terminate(sim_id)
                self._handled.add(sim_id)  # a notice not applied yet never will be
        self.local.terminate(instance_id)

    def describe(self, instance_id: str) -> Instance:
        return self.local.describe(instance_id)

    def list(self, tags: Mapping[str, str]) -> builtins.list[Instance]:
        return self.local.list(tags)

    def interruptions(self, since: datetime) -> builtins.list[Interruption]:
        return self.local.interruptions(since)

    def acknowledge(self, interruptions: Sequence[Interruption]) -> None:
        self.local.acknowledge(interruptions)

    def output(self, instance_id: str, *, tail: int | None = None) -> str:
        return self.local.output(instance_id, tail=tail)

    def close(self) -> None:
        """Stop the market's thread (the local provider is closed by its owner)."""
        self._stop.set()
        self._thread.join(timeout=5.0)


# -- checks on the progress logs ---------------------------------------------------------------------


@dataclass(slots=True)
class _Run:
    run_id: str
    epoch: int
    first_at: float
    pid: int | None = None
    restored: int = 0
    steps: list[tuple[int, float]] = field(default_factory=list)
    checkpoints: list[tuple[int, float]] = field(default_factory=list)
    noticed_at: float | None = None  # when its agent first saw a preemption notice
    done: bool = False


def _runs(records: Sequence[Mapping[str, Any]]) -> list[_Run]:
    runs: dict[str, _Run] = {}
    for rec in records:
        rid = str(rec.get("run", ""))
        t = float(rec.get("t", 0.0))
        run = runs.get(rid)
        if run is None:
            run = runs[rid] = _Run(rid, int(rec.get("epoch", 0)), t)
        run.first_at = min(run.first_at, t)
        ev = rec.get("event")
        if ev == "start":
            run.pid = int(rec["pid"]) if rec.get("pid") is not None else None
            run.restored = int(rec.get("restored_step") or 0)
        elif ev == "step":
            run.steps.append((int(rec["step"]), t))
        elif ev == "checkpoint":
            run.checkpoints.append((int(rec["step"]), t))
        elif ev == "notice" and run.noticed_at is None:
            run.noticed_at = t
        elif ev == "done":
            run.done = True
    return sorted(runs.values(), key=lambda r: r.first_at)


def _owners(instances: Sequence[Instance], pids: Mapping[str, int | None], runs: Sequence[_Run]) -> dict[str, _Run]:
    """Which run each instance's process was: by pid when the start record names it, else the first
    run that began after the instance's launch and before the next launch."""
    by_pid = {r.pid: r for r in runs if r.pid is not None}
    launched = sorted(
        (i for i in instances if i.launched_at is not None),
        key=lambda i: i.launched_at.timestamp() if i.launched_at is not None else 0.0,
    )
    owners: dict[str, _Run] = {}
    taken: set[str] = set()
    for inst in launched:
        pid = pids.get(inst.instance_id)
        if pid is not None and pid in by_pid:
            owners[inst.instance_id] = by_pid[pid]
            taken.add(by_pid[pid].run_id)
    for n, inst in enumerate(launched):
        if inst.instance_id in owners:
            continue
        assert inst.launched_at is not None
        lo = inst.launched_at.timestamp()
        nxt = launched[n + 1].launched_at if n + 1 < len(launched) else None
        hi = nxt.timestamp() if nxt is not None else float("inf")
        for run in runs:
            if run.run_id not in taken and lo <= run.first_at < hi:
                owners[inst.instance_id] = run
                taken.add(run.run_id)
                break
    return owners


def check_copies(local: ProcessCloud, job_id: str, uri: str, since: datetime) -> list[str]:
    """What the copies of ``job_id`` did wrong (empty: nothing):

    - a copy launched with epoch E whose agent ran with another epoch (the script does not take its
      epoch from ``COSTOPT_EPOCH``, so fencing cannot stop stale copies);
    - a copy given a preemption notice that was taken with steps it had not checkpointed although it
      could have known: its agent saw the notice and it trained two steps or more after that, or it
      never looked at a notice given at least :data:`NOTICE_REACTION_SECONDS` ahead and trained past
      that (the script ignores notices).
    """
    instances = local.list({TAG_JOB: job_id})
    pids = {i.instance_id: local.status(i.instance_id).pid for i in instances}
    runs = _runs(control.records(uri))
    owners = _owners(instances, pids, runs)
    problems: list[str] = []
    for inst in instances:
        run = owners.get(inst.instance_id)
        if run is None:
            continue
        launched_as = int(inst.tags.get(TAG_EPOCH, "0"))
        if run.epoch != launched_as:
            problems.append(
                f"copy {inst.instance_id} was launched as epoch {launched_as} (COSTOPT_EPOCH) but its agent ran as "
                f"epoch {run.epoch}: take the epoch from the environment (Agent.from_env()), or fencing cannot stop "
                "a stale copy"
            )
    for ev in local.interruptions(since):
        if ev.kind != "notice":
            continue
        run = owners.get(ev.instance_id)
        if run is None or run.done:
            continue
        last_step = max((s for s, _ in run.steps), default=run.restored)
        unsaved = last_step - max([run.restored, *(s for s, _ in run.checkpoints)])
        if unsaved <= 0:
            continue
        if run.noticed_at is not None:
            # Its agent saw the notice: the script should have checkpointed and stopped at once.
            after = sum(1 for _, t in run.steps if t > run.noticed_at)
            if after >= 2:
                problems.append(
                    f"copy {ev.instance_id} (epoch {run.epoch}) kept training {after} steps after its agent saw the "
                    f"preemption notice and was taken with {unsaved} steps not checkpointed: on a notice, "
                    "checkpoint (agent.should_checkpoint()) and stop (agent.should_stop())"
                )
            continue
        lead = (ev.deadline - ev.noticed_at).total_seconds() if ev.deadline is not None else 0.0
        late = ev.noticed_at.timestamp() + NOTICE_REACTION_SECONDS
        after = sum(1 for _, t in run.steps if t > late)
        if lead >= NOTICE_REACTION_SECONDS and after:
            problems.append(
                f"copy {ev.instance_id} (epoch {run.epoch}) never looked at its preemption notice ({lead:.1f} s "
                f"ahead), kept training {after} steps and was taken with {unsaved} steps not checkpointed: call "
                "agent.should_checkpoint() every step (it polls the notice) and stop (agent.should_stop())"
            )
    return problems


# -- the drill ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Tally:
    notices: int = 0
    recoveries: int = 0
    failed_recoveries: int = 0
    failed_in_a_row: int = 0
    reasons: list[str] = field(default_factory=list)

    def add(self, report: WatchReport, *, excused: bool = False) -> None:
        """Count a watcher pass; ``excused``: the market preempted a copy meanwhile, so a failed
        recovery is the market's doing, not the script's."""
        self.notices += len(report.notices)
        for rec in report.recoveries:
            if rec.recovered:
                self.recoveries += 1
                self.failed_in_a_row = 0
            else:
                self.failed_recoveries += 1
                self.failed_in_a_row = 0 if excused else self.failed_in_a_row + 1
                self.reasons.append(f"recovery {rec.migration_id} ({rec.cause}) rolled back: {rec.reason}")


class _GiveUp(Exception):
    """The job cannot go on (its recoveries keep failing): stop the drill and report."""


COMMAND_EXITS_AT_ONCE = "the command exits at once"
"""How the problem starts when the job's command ends on its own before its agent starts (a usage
error, a missing file): the CLI says so instead of blaming the checkpointing."""
STDERR_TAIL_LINES = 12


def _tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` non-empty lines of a text file (empty when it is missing)."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 8192))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]


def command_exit(local: ProcessCloud, job_id: str, uri: str) -> str | None:
    """Why the job cannot run at all, when that is so: its newest ended copy's command exited on its own
    (an exit code, not a kill) before its agent reported a start. The message names the copy, the exit
    code, how many copies did the same and the tail of its stderr. None otherwise (the copies start and
    fail later: restoring, checkpointing)."""
    ended = [i for i in local.list({TAG_JOB: job_id}) if i.state not in ALIVE_STATES]
    if not ended:
        return None

    def exited_before_start(inst: Instance) -> int | None:
        code = local.status(inst.instance_id).exit_code
        if code is None or control.progress(uri, int(inst.tags.get(TAG_EPOCH, "0"))).started:
            return None
        return code

    def launched(inst: Instance) -> tuple[int, float]:
        at = inst.launched_at.timestamp() if inst.launched_at is not None else 0.0
        return int(inst.tags.get(TAG_EPOCH, "0")), at

    newest = max(ended, key=launched)
    code = exited_before_start(newest)
    if code is None:
        return None
    alike = sum(1 for i in ended if exited_before_start(i) is not None)
    how = f"with code {code}" if code >= 0 else f"on signal {-code}"
    tail = _tail(local.status(newest.instance_id).stderr, STDERR_TAIL_LINES)
    said = "; its stderr ends with:\n" + "\n".join(f"  | {line}" for line in tail) if tail else "; its stderr is empty"
    return (
        f"{COMMAND_EXITS_AT_ONCE}: copy {newest.instance_id} (epoch {launched(newest)[0]}) exited {how} before its "
        f"agent reported a start ({alike} of {len(ended)} copies did); run the command by hand to see why" + said
    )


@dataclass(frozen=True, slots=True)
class DrillOptions:
    """What a drill asks of the job (validated: :class:`DrillError` names what to fix).

    - ``moves``, ``preemptions``: forced migrations, and preemptions (forced without a market; the
      market's with one);
    - ``steps``: the steps the script asks for (None: unknown; the audit then checks none are lost or
      repeated, not their number);
    - ``notice_seconds``: without a market, the notice given before a forced preemption;
    - ``gap_steps``: steps the current copy must make past its restore point before the next event;
    - ``timeout``: for the whole drill; ``event_timeout``: for one move, preemption or checkpoint
      (seconds);
    - ``unavailable_seconds``: how long a preempted (or refused) offer is kept out of the candidates;
    - ``max_failed_recoveries``: the drill gives up after that many failed recoveries in a row;
    - ``seed``: the market's seed, reported as is.
    """

    moves: int = 5
    preemptions: int = 5
    steps: int | None = None
    notice_seconds: float = 3.0
    gap_steps: int = 5
    timeout: float = 600.0
    event_timeout: float = 60.0
    unavailable_seconds: float = 2.0
    max_failed_recoveries: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("moves", "preemptions", "notice_seconds", "gap_steps", "timeout", "event_timeout"):
            value = getattr(self, name)
            if value < 0:
                raise DrillError(f"{name} must be >= 0, got {value}")
        if self.unavailable_seconds <= 0:
            raise DrillError(f"unavailable_seconds must be > 0, got {self.unavailable_seconds}")


def run_drill(
    argv: Sequence[str],
    local: ProcessCloud,
    engine: Engine,
    checkpoints: Path,
    options: DrillOptions,
    *,
    market: SimulatedMarket | None = None,
    offers: Sequence[OfferKey] = LOCAL_OFFERS,
) -> DrillReport:
    """Run the command ``argv`` (see :func:`parse_command`) as a job through ``options.moves`` forced
    migrations and ``options.preemptions`` preemptions (module docstring), then audit it.

    - ``local``: the processes' cloud; the migrator launches on it, or on ``market`` when given (whose
      processes are ``local``'s);
    - ``engine``: a migrated database of the migrator's tables (the drill's own: its job is registered
      there);
    - ``checkpoints``: the folder the job's checkpoint URI goes under;
    - ``offers``: the candidate offers of every launch (those of ``market``'s clouds with one).

    On return no instance of the drill is left running; closing ``market``, ``local`` and ``engine`` is
    the caller's.
    """
    o = options
    moves, preemptions = o.moves, o.preemptions
    steps_requested = o.steps
    started = time.monotonic()
    started_at = datetime.now(UTC)
    cloud: CloudProvider = market if market is not None else local
    offers = tuple(offers)
    unavailable = UnavailableOffers(engine, ttl=dict.fromkeys(DEFAULT_TTL, timedelta(seconds=o.unavailable_seconds)))
    mig = Migrator(
        engine,
        cloud,
        checkpoint_timeout=o.event_timeout,
        verify_timeout=o.event_timeout,
        poll_seconds=LOCAL_POLL_SECONDS,
        unavailable=unavailable,
    )
    watcher = InterruptionWatcher(
        mig,
        lambda job: list(offers),
        unavailable=unavailable,
        overlap=timedelta(seconds=30),
        retry_base=0.2,
        retry_cap=2.0,
    )
    job_id = f"drill-{uuid.uuid4().hex[:8]}"
    uri = str(checkpoints / job_id)
    problems: list[str] = []
    notes: list[str] = []
    tally = _Tally()
    done_moves = done_preemptions = orphans = 0
    timeout, event_timeout, notice_seconds = o.timeout, o.event_timeout, o.notice_seconds

    def candidates() -> list[OfferKey]:
        return unavailable.filter(offers) or list(offers)

    def pump() -> None:
        """One pass of the interruption watcher (the service's loop)."""
        before = market.preemptions if market is not None else 0
        report = watcher.poll()
        tally.add(report, excused=market is not None and market.preemptions > before)
        if tally.failed_in_a_row >= o.max_failed_recoveries:
            raise _GiveUp(
                command_exit(local, job_id, uri)
                or f"{tally.failed_in_a_row} recoveries in a row failed (last: {tally.reasons[-1]}); the job cannot "
                "restart from its checkpoints"
            )

    def finished() -> bool:
        j = mig.job(job_id)
        return j.status is JobStatus.FINISHED or control.progress(uri, j.epoch).done

    def wait(cond: Callable[[], bool], seconds: float) -> bool:
        end = min(time.monotonic() + seconds, started + timeout)
        while True:
            pump()
            if cond():
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.05)

    def ready() -> bool:
        j = mig.job(job_id)
        if j.status is not JobStatus.RUNNING or mig.active_migration(job_id) is not None:
            return False
        p = control.progress(uri, j.epoch)
        return p.done or p.last_step >= p.restored_step + o.gap_steps

    try:
        try:
            mig.register_job(job_id, argv, uri)
            first = mig.start(job_id, candidates())
            if first.state is not State.DONE:
                notes.append(f"the first launch failed ({first.reason}); the watcher retries it")
            plan: list[str] = []
            for i in range(max(moves, preemptions)):
                if i < moves:
                    plan.append("move")
                if i < preemptions and market is None:
                    plan.append("preempt")
            move_attempts = 0
            while plan:
                event = plan.pop(0)
                if not wait(ready, event_timeout) or finished():
                    problems.append(f"the job finished (or stalled) before the {event} it was due")
                    break
                job = mig.job(job_id)
                if event == "move":
                    move_attempts += 1
                    before = (market.preemptions, market.launch_failures) if market is not None else (0, 0)
                    rec = mig.move(job_id, candidates())
                    if rec.state is State.DONE:
                        done_moves += 1
                    elif (
                        market is not None
                        and (market.preemptions, market.launch_failures) != before
                        and move_attempts < 4 * moves
                    ):
                        # The market's doing (a preemption, no capacity), not the script's: move again.
                        notes.append(f"move {rec.id} was cut short by the market ({rec.reason}); moving again")
                        plan.insert(0, "move")
                    else:
                        problems.append(f"move {rec.id} rolled back: {rec.reason}")
                        if mig.job(job_id).status is JobStatus.FINISHED:
                            break
                    continue
                assert job.instance_id is not None
                local.preempt(job.instance_id, notice_seconds)
                old_epoch = job.epoch

                def recovered(old_epoch: int = old_epoch) -> bool:
                    j = mig.job(job_id)
                    return j.epoch > old_epoch and j.status is JobStatus.RUNNING

                if wait(lambda: recovered() or finished(), notice_seconds + event_timeout) and recovered():
                    done_preemptions += 1
                elif finished():
                    problems.append("the job finished during the preemption notice")
                    break
                else:
                    problems.append(
                        f"the watcher did not recover the job within {notice_seconds + event_timeout:g} s of the "
                        f"preemption of {job.instance_id}" + (f" ({tally.reasons[-1]})" if tally.reasons else "")
                    )
            if (
                market is not None
                and preemptions > 0
                and not wait(lambda: market.preemptions >= preemptions or finished(), timeout)
            ):
                problems.append(f"the drill timed out after {timeout:g} s waiting for {preemptions} preemptions")
            # Let the job run to its end; the watcher recovers a copy that dies, the reconciler cleans up.
            last_reconcile = 0.0
            while not finished():
                if time.monotonic() >= started + timeout:
                    problems.append(f"the job did not finish within {timeout:g} s")
                    break
                pump()
                if time.monotonic() - last_reconcile >= 1.0:
                    orphans += len(reconcile(engine, cloud).orphans_terminated)
                    last_reconcile = time.monotonic()
                time.sleep(0.05)
        except _GiveUp as exc:
            problems.append(str(exc))
        if market is not None:
            market.close()
            done_preemptions = market.preemptions
            if market.launch_failures:
                notes.append(f"{market.launch_failures} launch(es) found no capacity; the next offer was tried")
        job = mig.job(job_id)
        done = finished()
        if done and job.instance_id is not None:
            local.wait(job.instance_id, 30.0)
        orphans += len(reconcile(engine, cloud).orphans_terminated)
        alive = [i.instance_id for i in local.list({TAG_MANAGED: "true"}) if i.state in ALIVE_STATES]
        if alive and done:
            problems.append(f"instances still running after the job finished: {alive}")
            orphans += len(alive)
        problems.extend(check_copies(local, job_id, uri, started_at))
        audit = control.audit_job(uri, steps_requested)
        problems.extend(p for p in audit.problems if p not in problems)
        if tally.failed_recoveries:
            notes.append(f"{tally.failed_recoveries} recovery attempt(s) rolled back and were retried")
        ok = (
            audit.ok
            and audit.lost_steps == 0
            and audit.repeated_steps == 0
            and (steps_requested is None or audit.steps_done == steps_requested)
            and done_moves == moves
            and done_preemptions == preemptions
            and orphans == 0
            and not problems
        )
        return DrillReport(
            steps_requested=steps_requested,
            steps_done=audit.steps_done,
            lost_steps=audit.lost_steps,
            repeated_steps=audit.repeated_steps,
            moves=done_moves,
            preemptions=done_preemptions,
            orphans=orphans,
            ok=ok,
            wasted_steps=audit.wasted_steps,
            finished=audit.finished,
            seconds=round(time.monotonic() - started, 3),
            problems=tuple(problems),
            provider=cloud.name,
            seed=o.seed,
            notices=market.notices if market is not None else tally.notices,
            recoveries=tally.recoveries,
            launch_failures=market.launch_failures if market is not None else 0,
            notes=tuple(notes),
        )
    finally:
        if market is not None:
            market.close()
        for inst in local.list({TAG_MANAGED: "true"}):
            if inst.state in ALIVE_STATES:
                local.terminate(inst.instance_id)
