"""The service's simulated time: a thread that moves the simulated cloud's clock faster than real time.

In ``make run`` (``COSTOPT_PROVIDER=sim``, the default) nothing moves the simulated cloud but this driver:
every ``COSTOPT_SIM_TICK`` of wall time it advances the cloud's clock by the wall time elapsed x
``COSTOPT_SIM_TIME_SCALE`` (600 by default: ten simulated minutes per second) through
:meth:`providers.sim.SimCloud.run_to`, so simulated agents train, checkpoint, get preempted and finish
while the service's own loops (job engine, rebalancer, interruption watcher, migrator) act on them. The
clock starts at ``COSTOPT_SIM_START`` (inside the seeded real prices).

**A tick's jump is capped** at ``COSTOPT_SIM_MAX_TICK`` of simulated time (default
:data:`DEFAULT_MAX_TICKS` nominal ticks: ``5 x COSTOPT_SIM_TICK x COSTOPT_SIM_TIME_SCALE``, 10 simulated
minutes at the defaults). A tick that comes late (a loaded machine, many agents to run) would otherwise move
the clock by scale x its whole wall time (seen: ~40 simulated hours in one tick at 3600x with 50 jobs), and
the job engine, which runs once per poll, would see hours of its jobs' lives at once. A capped tick drops
the rest: the simulated clock then runs slower than scale x wall while the service is behind (it does not
catch up later). The driver logs that at most once a minute (:data:`BEHIND_LOG_EVERY_S`) and counts it
(:attr:`SimClockDriver.lag`, :attr:`SimClockDriver.capped_ticks`; ``GET /metrics``:
``costopt_sim_clock_lag_seconds``, ``costopt_sim_clock_capped_ticks_total``).

:class:`SimClockDriver` is also the service's :class:`costopt.clock.ServiceClock` over the simulated cloud:
``now()`` is the simulated time and ``sleep(seconds)`` waits until the driver has moved the clock that far
(simulated seconds), so a migrator polling every 2 s polls at every tick. Offline (tests, backtests), use
:meth:`providers.sim.SimCloud.service_clock` instead: its ``sleep`` moves the clock itself.

:func:`service_clock` gives the one clock of a service: this driver when it launches on the simulated
cloud, else :class:`costopt.clock.WallClock`. :func:`driver_for` keeps one driver per simulated cloud.
"""

from __future__ import annotations

import concurrent.futures
import heapq
import logging
import math
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from costopt.clock import ServiceClock, WallClock, set_lockstep
from costopt.cloud import CloudProvider
from costopt.settings import Settings
from providers.sim import ClockError, SimCloud

log = logging.getLogger("costopt.sim_clock")
T = TypeVar("T")

__all__ = [
    "BEHIND_LOG_EVERY_S",
    "DEFAULT_MAX_TICKS",
    "HOLD_S",
    "SimClockDriver",
    "SteppedClockDriver",
    "driver_for",
    "make_driver",
    "running_drivers",
    "service_clock",
    "start_sim_clock",
]

HOLD_S = 30.0
"""The most simulated time a tick moves under one hold of the cloud's lock: a tick moves the clock in slices
of at most this, letting go of the lock (and waking the sleepers) between them. The lock was held for the
whole tick before, with every simulated fleet worker's sync into the service (database round trips) run
under it: 2-6 s of wall time a tick in the soak (load 5-13), while the job engine's, the watcher's and the
migrator's calls to the cloud (``describe``, ``launch``) waited for it, which left the engine's tick idle
most of the time and its jobs queued (docs/reliability.md "Soak", session 11)."""
YIELD_S = 0.0005
"""How long the driver sleeps between two slices of a tick, so a thread waiting for the cloud's lock takes it
before the driver does again (a lock released and taken back at once by the same thread is rarely won by a
waiter)."""
DEFAULT_MAX_TICKS = 5
"""The default cap of one tick's jump, in nominal ticks (``tick x scale`` simulated seconds each): a tick up
to 5 times late still follows scale x wall (the driver's own work makes every tick a little late)."""
BEHIND_LOG_EVERY_S = 60.0
"""At most one "simulated clock behind" log line per this many wall seconds."""


def _run_to_at_least(cloud: SimCloud, target: datetime) -> None:
    """Move ``cloud``'s clock to ``target``, unless another thread moves it there or past first: the time is
    read before :meth:`SimCloud.run_to` takes the cloud's lock, and sleepers that advance the clock
    themselves (a driver stopped at shutdown, whose waiting work goes on) run side by side, so one of them
    may find the clock past its target (``ClockError``, which failed the engine's migration workers at
    every shutdown that caught them sleeping: docs/reliability.md "Soak", session 10). The clock never
    goes back: a target already passed is reached."""
    try:
        cloud.run_to(target)
    except ClockError:
        if cloud.now() < target:
            raise


class SimClockDriver:
    """Moves ``cloud``'s clock at ``scale`` simulated seconds per wall second, every ``tick`` wall seconds,
    in a daemon thread (:meth:`start` / :meth:`stop`); :meth:`advance` is one tick (the thread calls it),
    moving the clock at most ``max_tick`` simulated seconds (None: :data:`DEFAULT_MAX_TICKS` x ``tick`` x
    ``scale``; see the module doc). ``wall``: monotonic wall-clock seconds (injected in tests).
    (:class:`SteppedClockDriver`: the clock in lockstep with the service instead.)

    :attr:`lag` is how far (simulated) the clock is behind ``scale`` x the wall time its ticks covered,
    from the cap; :attr:`capped_ticks` counts the ticks the cap cut."""

    mode = "wall"

    def __init__(
        self,
        cloud: SimCloud,
        *,
        scale: float,
        tick: float = 0.2,
        max_tick: float | None = None,
        wall: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (scale > 0 and math.isfinite(scale)):
            raise ValueError(f"the time scale must be a finite number > 0 (simulated s per wall s), got {scale}")
        if not (tick > 0 and math.isfinite(tick)):
            raise ValueError(f"the tick must be a finite number of seconds > 0, got {tick}")
        if max_tick is None:
            max_tick = DEFAULT_MAX_TICKS * tick * scale
        if not (max_tick > 0 and math.isfinite(max_tick)):
            raise ValueError(f"the cap of a tick must be a finite number of simulated seconds > 0, got {max_tick}")
        self.cloud = cloud
        self.scale = float(scale)
        self.tick = float(tick)
        self.max_tick = float(max_tick)
        self.wall = wall
        self.lag = timedelta(0)
        self.capped_ticks = 0
        self._logged_at: float | None = None  # wall time of the latest "behind" line
        self._capped_since_log = 0
        self._last: float | None = None
        self._moved = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ticks = 0

    @classmethod
    def from_settings(cls, settings: Settings, cloud: SimCloud) -> SimClockDriver:
        """``COSTOPT_SIM_TIME_SCALE``, ``COSTOPT_SIM_TICK`` and ``COSTOPT_SIM_MAX_TICK``."""
        cap = settings.sim_max_tick
        return cls(
            cloud,
            scale=settings.sim_time_scale,
            tick=settings.sim_tick.total_seconds(),
            max_tick=None if cap is None else cap.total_seconds(),
        )

    # -- the clock --------------------------------------------------------------------------------------

    def now(self) -> datetime:
        """The simulated time (tz-aware UTC)."""
        return self.cloud.now()

    def sleep(self, seconds: float) -> None:
        """Return once the simulated clock has moved ``seconds`` (>= 0) past now. While the driver is not
        running, nothing else moves the clock: it is then advanced here (as offline)."""
        if not seconds >= 0:
            raise ValueError(f"cannot sleep {seconds} s")
        target = self.cloud.now() + timedelta(seconds=seconds)
        with self._moved:
            while self.cloud.now() < target:
                if not self.running:
                    break
                self._moved.wait(timeout=max(self.tick, 0.01))
        if self.cloud.now() < target:
            _run_to_at_least(self.cloud, target)

    # -- the thread -------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def advance(self) -> datetime:
        """One tick: move the clock by the wall time since the previous tick (none at the first) x scale,
        at most :attr:`max_tick` simulated seconds (the rest is dropped and added to :attr:`lag`), running
        every simulated event on the way, in slices of at most :data:`HOLD_S` simulated seconds each under
        one hold of the cloud's lock (sleepers woken after each); returns the new simulated time."""
        now = self.wall()
        last, self._last = self._last, now
        if last is not None and now > last:
            wanted = (now - last) * self.scale
            step = min(wanted, self.max_tick)
            if wanted > step:
                self._behind(now, now - last, wanted - step)
            target = self.cloud.now() + timedelta(seconds=step)
            hold = timedelta(seconds=HOLD_S)
            while (at := self.cloud.now()) < target:  # in slices: the lock let go between them (HOLD_S)
                if at > target - hold:
                    _run_to_at_least(self.cloud, target)
                    break
                _run_to_at_least(self.cloud, at + hold)
                with self._moved:
                    self._moved.notify_all()
                time.sleep(YIELD_S)
        self.ticks += 1
        with self._moved:
            self._moved.notify_all()
        return self.cloud.now()

    def _behind(self, now: float, elapsed: float, dropped: float) -> None:
        """Count a capped tick (``elapsed`` wall seconds, ``dropped`` simulated seconds not moved) and say so
        at most once per :data:`BEHIND_LOG_EVERY_S` of wall time."""
        self.lag += timedelta(seconds=dropped)
        self.capped_ticks += 1
        self._capped_since_log += 1
        if self._logged_at is not None and now - self._logged_at < BEHIND_LOG_EVERY_S:
            return
        log.warning(
            "simulated clock behind: a tick came after %.1f s of wall time (%.0f simulated s at %gx), moved "
            "%.0f simulated s (COSTOPT_SIM_MAX_TICK); %d capped tick(s) since the last such line, %.0f simulated "
            "s behind in all: the simulated clock runs slower than %gx while the service is behind",
            elapsed,
            elapsed * self.scale,
            self.scale,
            self.max_tick,
            self._capped_since_log,
            self.lag.total_seconds(),
            self.scale,
        )
        self._logged_at, self._capped_since_log = now, 0

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if self.running:
            return
        self._stop.clear()
        self._last = None
        self._thread = threading.Thread(target=self._run, name="sim-clock", daemon=True)
        self._thread.start()
        log.info(
            "simulated clock running at %gx from %s (a tick every %g s, at most %g simulated s a tick)",
            self.scale,
            self.cloud.now(),
            self.tick,
            self.max_tick,
        )

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and wait for it (at most ``timeout`` seconds); sleepers return."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
        with self._moved:
            self._moved.notify_all()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.advance()
            except Exception:
                log.exception("simulated clock: a tick failed; the next tick goes on")
            self._stop.wait(self.tick)


class _Token:
    """One piece of the service's work under a :class:`SteppedClockDriver`: it runs when given its turn
    (``go``) and holds it until it ends, waits on the clock or joins other work."""

    __slots__ = ("finished", "go", "name", "pool")

    def __init__(self, name: str, pool: _Pool | None = None) -> None:
        self.name = name
        self.go = threading.Event()
        self.finished = False
        self.pool = pool


class _Pool:
    """A thread pool's tasks as the stepped driver counts them: at most ``capacity`` started, the rest
    waiting for a thread in submission order (as in the pool)."""

    __slots__ = ("capacity", "key", "pending", "started")

    def __init__(self, key: int, capacity: int) -> None:
        self.key = key
        self.capacity = max(1, capacity)
        self.started = 0
        self.pending: deque[_Token] = deque()


class _StepJob:
    """A scheduled job of the service run by the stepped driver: ``work`` (an
    :class:`api.scheduler.OnServiceClock`) when its schedule has a tick not yet run, one run at a time, never
    while a job of the same ``group`` runs (they share a lock)."""

    __slots__ = ("group", "name", "running", "work")

    def __init__(self, name: str, work: Any, group: str | None) -> None:
        self.name = name
        self.work = work
        self.group = group
        self.running = False


class SteppedClockDriver(SimClockDriver):
    """The simulated clock in lockstep with the service (``COSTOPT_SIM_CLOCK=stepped``): it moves by
    ``step`` simulated seconds at a time, and only once every piece of the service's work due at the current
    simulated time has run or waits on the clock, however long that takes in wall time. So a run is the same
    whatever the machine's load: the kill drill's runs without kills give the same ledger.

    One step at simulated time T (:meth:`advance`):

    1. every sleeper (:meth:`sleep`) whose time has come (<= T) is given its turn, in the order of its wake-up
       time, then of its sleep;
    2. every scheduled job added with :meth:`add_job`, in the order added, when its schedule has a tick at T
       not yet run, none of its runs is still going and no job of its group runs (the migration jobs share a
       lock), runs in a thread of its own;
    3. the clock moves to T + step through the cloud's events (:meth:`providers.sim.SimCloud.run_to`).

    The steps fall on a grid (:meth:`next_step`: ``STEP_ANCHOR + k x step``): a clock found off it at start
    (restarted after a kill mid-step, submissions that took longer) first moves to its next point.

    **Turns**: the service's work runs one piece at a time, the next only once the previous one ended or waits
    (on the clock: :meth:`sleep`; on the work it handed to other threads: :meth:`join`). Work handed to a
    thread pool (:func:`costopt.clock.submit`: the job engine's workers, the watcher's recoveries) takes its
    turn in submission order, at most the pool's capacity of it started. Each step waits until no piece has or
    awaits its turn. Threads the driver does not know of (HTTP requests) run as they come; their ``sleep``
    waits for the clock.

    While it runs, it is the process's :func:`costopt.clock.current_lockstep` (one at a time). A piece that
    keeps its turn for :data:`STUCK_LOG_EVERY_S` of wall time is logged with its stack (a wait the driver does
    not see would hold the clock for ever)."""

    mode = "stepped"

    def __init__(self, cloud: SimCloud, *, step: float, wall: Callable[[], float] = time.monotonic) -> None:
        if not (step > 0 and math.isfinite(step)):
            raise ValueError(f"the step must be a finite number of simulated seconds > 0, got {step}")
        super().__init__(cloud, scale=1.0, tick=1.0, max_tick=step, wall=wall)
        self.step = float(step)
        self.steps = 0
        self._cv = threading.Condition()
        self._runnable: deque[_Token] = deque()
        self._current: _Token | None = None
        self._sleepers: list[tuple[datetime, int, _Token]] = []  # a heap: (wake-up time, order, token)
        self._joiners: list[tuple[_Token, list[_Token]]] = []
        self._tokens: dict[Future[Any], _Token] = {}
        self._pools: dict[int, tuple[Any, _Pool]] = {}  # id(pool) -> (pool, its count)
        self._jobs: list[_StepJob] = []
        self._order = 0
        self._local = threading.local()

    @classmethod
    def from_settings(cls, settings: Settings, cloud: SimCloud) -> SteppedClockDriver:
        """``COSTOPT_SIM_STEP``."""
        return cls(cloud, step=settings.sim_step.total_seconds())

    # -- the service's scheduled jobs -------------------------------------------------------------------

    def add_job(self, name: str, work: Any, *, group: str | None = None) -> None:
        """Run ``work`` (an :class:`api.scheduler.OnServiceClock`: ``due()`` and a call) at each step where it
        is due (class doc). ``group``: jobs that must not run at once."""
        with self._cv:
            if any(j.name == name for j in self._jobs):
                raise ValueError(f"a job named {name!r} is already stepped")
            self._jobs.append(_StepJob(name, work, group))

    @property
    def job_names(self) -> list[str]:
        return [j.name for j in self._jobs]

    def _start_job(self, job: _StepJob) -> None:
        token = _Token(f"job {job.name}")
        job.running = True

        def run() -> None:
            self._local.token = token
            try:
                self._wait_turn(token)
                job.work()
            except Exception:
                log.exception("stepped clock: scheduled job %s failed; it runs again when next due", job.name)
            finally:
                self._local.token = None
                with self._cv:
                    job.running = False
                    self._finished(token)

        with self._cv:
            self._runnable.append(token)
        threading.Thread(target=run, name=f"sim-step-{job.name}", daemon=True).start()

    # -- the clock --------------------------------------------------------------------------------------

    def sleep(self, seconds: float) -> None:
        """Return once the simulated clock has moved ``seconds`` (>= 0) past now. A piece of the service's
        work gives up its turn meanwhile; another thread waits for the clock; while the driver does not run,
        the clock is advanced here (as offline)."""
        if not seconds >= 0:
            raise ValueError(f"cannot sleep {seconds} s")
        token: _Token | None = getattr(self._local, "token", None)
        target = self.cloud.now() + timedelta(seconds=seconds)
        if token is not None and self.running and seconds > 0:
            with self._cv:
                self._order += 1
                heapq.heappush(self._sleepers, (target, self._order, token))
                self._give_up(token)
            self._wait_turn(token)
        elif token is None:
            with self._moved:
                while self.cloud.now() < target and self.running:
                    self._moved.wait(timeout=0.2)
        if self.cloud.now() < target and not self.running:
            _run_to_at_least(self.cloud, target)

    # -- work handed to threads (costopt.clock.submit / join) --------------------------------------------

    def submit(self, pool: Executor, fn: Callable[[], T], capacity: int) -> Future[T]:
        """``pool.submit(fn)``, run in its turn (class doc)."""
        with self._cv:
            entry = self._pools.get(id(pool))
            if entry is None or entry[0] is not pool:
                entry = self._pools[id(pool)] = (pool, _Pool(id(pool), capacity))
            count = entry[1]
            token = _Token(getattr(fn, "__name__", "task"), count)
            if count.started < count.capacity:
                count.started += 1
                self._runnable.append(token)
            else:
                count.pending.append(token)

        def run() -> T:
            self._local.token = token
            try:
                self._wait_turn(token)
                return fn()
            finally:
                self._local.token = None

        try:
            future = pool.submit(run)
        except BaseException:
            with self._cv:
                self._finished(token)
            raise
        with self._cv:
            self._tokens[future] = token
        # after the future's result is set: the next piece sees this one done
        future.add_done_callback(lambda f: self._done(f, token))
        return future

    def _done(self, future: Future[Any], token: _Token) -> None:
        with self._cv:
            self._tokens.pop(future, None)
            self._finished(token)

    def join(self, futures: Sequence[Future[Any]]) -> None:
        """Wait for ``futures``; a piece of the service's work gives up its turn meanwhile and gets it back
        once they ended."""
        token: _Token | None = getattr(self._local, "token", None)
        if token is not None and self.running:
            with self._cv:
                waits = [t for f in futures if (t := self._tokens.get(f)) is not None and not t.finished]
                if waits:
                    self._joiners.append((token, waits))
                    self._give_up(token)
            if waits:
                self._wait_turn(token)
        concurrent.futures.wait(futures)

    # -- turns (under self._cv) -------------------------------------------------------------------------

    def _give_up(self, token: _Token) -> None:
        token.go.clear()
        if self._current is token:
            self._current = None
        self._cv.notify_all()

    def _finished(self, token: _Token) -> None:
        if token.finished:
            return
        token.finished = True
        if self._current is token:
            self._current = None
        pool = token.pool
        if pool is not None:
            if token in pool.pending:  # never started (the pool refused it, or it was cancelled)
                pool.pending.remove(token)
            else:
                pool.started -= 1
                if pool.pending and pool.started < pool.capacity:
                    pool.started += 1
                    self._runnable.append(pool.pending.popleft())
            if not pool.started and not pool.pending:  # forget the pool (the watcher's live for one pass)
                self._pools.pop(pool.key, None)
        still = []
        for joiner, waits in self._joiners:
            if all(t.finished for t in waits):
                self._runnable.append(joiner)
            else:
                still.append((joiner, waits))
        self._joiners = still
        self._cv.notify_all()

    def _wait_turn(self, token: _Token) -> None:
        while not token.go.wait(timeout=0.5):
            if not self.running:
                return

    def _drain(self) -> None:
        """Give each waiting piece its turn until none has or awaits one."""
        with self._cv:
            since = self.wall()
            logged = since
            while not self._stop.is_set():
                current = self._current
                if current is None:
                    if not self._runnable:
                        return
                    current = self._current = self._runnable.popleft()
                    since = logged = self.wall()
                    current.go.set()
                    continue
                self._cv.wait(timeout=1.0)
                if self._current is current and self.wall() - logged >= STUCK_LOG_EVERY_S:
                    logged = self.wall()
                    log.warning(
                        "stepped clock: %s has held its turn for %.0f s of wall time at %s (the clock waits for "
                        "it); its threads' stacks: %s",
                        current.name,
                        logged - since,
                        self.cloud.now(),
                        _stacks(current),
                    )

    # -- the thread -------------------------------------------------------------------------------------

    def advance(self) -> datetime:
        """One step (class doc); returns the new simulated time."""
        now = self.cloud.now()
        with self._cv:
            while self._sleepers and self._sleepers[0][0] <= now:
                self._runnable.append(heapq.heappop(self._sleepers)[2])
        self._drain()
        for job in self._jobs:
            if self._stop.is_set():
                return self.cloud.now()
            with self._cv:
                busy = job.running or (
                    job.group is not None and any(j.running for j in self._jobs if j.group == job.group)
                )
            if busy or not job.work.due():
                continue
            self._start_job(job)
            self._drain()
        if self._stop.is_set():
            return self.cloud.now()
        self.cloud.run_to(self.next_step(now))
        self.steps += 1
        self.ticks += 1
        with self._moved:
            self._moved.notify_all()
        return self.cloud.now()

    def next_step(self, now: datetime) -> datetime:
        """The first time after ``now`` on the steps' grid (``ANCHOR + k x step``, the anchor of
        :class:`api.ticks.Every`): runs that started a little apart (a restart, submissions that took longer)
        step at the same simulated times."""
        step_us = max(1, round(self.step * 1_000_000))
        since_us = (now - STEP_ANCHOR) // timedelta(microseconds=1)
        return STEP_ANCHOR + timedelta(microseconds=(since_us // step_us + 1) * step_us)

    def start(self) -> None:
        """Start the thread (idempotent); the driver becomes the process's lockstep clock."""
        if self.running:
            return
        set_lockstep(self)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="sim-clock-stepped", daemon=True)
        self._thread.start()
        log.info(
            "simulated clock in lockstep from %s: %g simulated s a step, once the service's due work has run",
            self.cloud.now(),
            self.step,
        )

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread; every piece waiting for its turn or the clock goes on (no more turns)."""
        self._stop.set()
        with self._cv:
            for token in [*self._runnable, *(t for _, _, t in self._sleepers), *(j for j, _ in self._joiners)]:
                token.go.set()
            self._cv.notify_all()
        super().stop(timeout)
        set_lockstep(None, expect=self)

    def _run(self) -> None:
        now = self.cloud.now()
        if now != self.next_step(now) - timedelta(seconds=self.step):
            self.cloud.run_to(self.next_step(now))  # off the grid (restarted mid-step): its next point first
        while not self._stop.is_set():
            try:
                self.advance()
            except Exception:
                log.exception("stepped clock: a step failed; the next step goes on")
                self._stop.wait(1.0)


STEP_ANCHOR = datetime(2000, 1, 1, tzinfo=UTC)
"""Where the stepped clock's grid starts (the same as :data:`api.ticks.ANCHOR`)."""
STUCK_LOG_EVERY_S = 60.0
"""A piece of the service's work that keeps its turn this long (wall) under a :class:`SteppedClockDriver` is
logged with its stack, once per this many seconds."""


def _stacks(token: _Token) -> str:
    """The stacks of the threads that run ``token`` (found by their thread-local token: best effort)."""
    frames = sys._current_frames()
    out = []
    for thread in threading.enumerate():
        if thread.ident is None or thread.ident not in frames:
            continue
        if thread.name.startswith(("costopt-", "sim-step-")):
            out.append(f"{thread.name}: {''.join(traceback.format_stack(frames[thread.ident], limit=8))}")
    return "\n".join(out) or "(none found)"


def make_driver(settings: Settings, cloud: SimCloud) -> SimClockDriver:
    """The driver ``COSTOPT_SIM_CLOCK`` asks for: wall (:class:`SimClockDriver`) or stepped
    (:class:`SteppedClockDriver`)."""
    if settings.sim_clock == "stepped":
        return SteppedClockDriver.from_settings(settings, cloud)
    return SimClockDriver.from_settings(settings, cloud)


_DRIVERS: weakref.WeakKeyDictionary[SimCloud, SimClockDriver] = weakref.WeakKeyDictionary()
_DRIVERS_LOCK = threading.Lock()


def driver_for(settings: Settings, cloud: SimCloud) -> SimClockDriver:
    """The one driver of ``cloud`` in this process (made from the settings at the first call)."""
    with _DRIVERS_LOCK:
        driver = _DRIVERS.get(cloud)
        if driver is None:
            driver = _DRIVERS[cloud] = make_driver(settings, cloud)
        return driver


def running_drivers() -> list[SimClockDriver]:
    """The drivers of this process whose thread runs (the service's one, when it runs on the simulated
    cloud); read by ``GET /metrics``."""
    with _DRIVERS_LOCK:
        return [d for d in _DRIVERS.values() if d.running]


def _launch_sim(settings: Settings, providers: Mapping[str, CloudProvider]) -> SimCloud | None:
    sim = providers.get("sim")
    return sim if settings.provider == "sim" and isinstance(sim, SimCloud) else None


def service_clock(settings: Settings, providers: Mapping[str, CloudProvider]) -> ServiceClock:
    """The service's one clock: the simulated cloud's driver when the service launches on it
    (``COSTOPT_PROVIDER=sim``, ``providers`` by name holding that cloud), else the wall clock."""
    sim = _launch_sim(settings, providers)
    return driver_for(settings, sim) if sim is not None else WallClock()


def start_sim_clock(
    settings: Settings, providers: Mapping[str, CloudProvider], *, start: bool = True
) -> SimClockDriver | None:
    """Start the driver of the simulated cloud the service launches on (None: it launches on a real
    cloud, whose time passes by itself). Stop it with :meth:`SimClockDriver.stop` at shutdown. ``start``
    False: the driver only (a stepped one is started once it has its jobs)."""
    sim = _launch_sim(settings, providers)
    if sim is None:
        return None
    driver = driver_for(settings, sim)
    if start:
        driver.start()
    return driver
