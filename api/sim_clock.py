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

import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

from costopt.clock import ServiceClock, WallClock
from costopt.cloud import CloudProvider
from costopt.settings import Settings
from providers.sim import SimCloud

log = logging.getLogger("costopt.sim_clock")

__all__ = [
    "BEHIND_LOG_EVERY_S",
    "DEFAULT_MAX_TICKS",
    "SimClockDriver",
    "driver_for",
    "running_drivers",
    "service_clock",
    "start_sim_clock",
]

DEFAULT_MAX_TICKS = 5
"""The default cap of one tick's jump, in nominal ticks (``tick x scale`` simulated seconds each): a tick up
to 5 times late still follows scale x wall (the driver's own work makes every tick a little late)."""
BEHIND_LOG_EVERY_S = 60.0
"""At most one "simulated clock behind" log line per this many wall seconds."""


class SimClockDriver:
    """Moves ``cloud``'s clock at ``scale`` simulated seconds per wall second, every ``tick`` wall seconds,
    in a daemon thread (:meth:`start` / :meth:`stop`); :meth:`advance` is one tick (the thread calls it),
    moving the clock at most ``max_tick`` simulated seconds (None: :data:`DEFAULT_MAX_TICKS` x ``tick`` x
    ``scale``; see the module doc). ``wall``: monotonic wall-clock seconds (injected in tests).

    :attr:`lag` is how far (simulated) the clock is behind ``scale`` x the wall time its ticks covered,
    from the cap; :attr:`capped_ticks` counts the ticks the cap cut."""

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
            self.cloud.run_to(target)

    # -- the thread -------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def advance(self) -> datetime:
        """One tick: move the clock by the wall time since the previous tick (none at the first) x scale,
        at most :attr:`max_tick` simulated seconds (the rest is dropped and added to :attr:`lag`), running
        every simulated event on the way; returns the new simulated time."""
        now = self.wall()
        last, self._last = self._last, now
        if last is not None and now > last:
            wanted = (now - last) * self.scale
            step = min(wanted, self.max_tick)
            if wanted > step:
                self._behind(now, now - last, wanted - step)
            self.cloud.run_to(self.cloud.now() + timedelta(seconds=step))
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


_DRIVERS: weakref.WeakKeyDictionary[SimCloud, SimClockDriver] = weakref.WeakKeyDictionary()
_DRIVERS_LOCK = threading.Lock()


def driver_for(settings: Settings, cloud: SimCloud) -> SimClockDriver:
    """The one driver of ``cloud`` in this process (made from the settings at the first call)."""
    with _DRIVERS_LOCK:
        driver = _DRIVERS.get(cloud)
        if driver is None:
            driver = _DRIVERS[cloud] = SimClockDriver.from_settings(settings, cloud)
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


def start_sim_clock(settings: Settings, providers: Mapping[str, CloudProvider]) -> SimClockDriver | None:
    """Start the driver of the simulated cloud the service launches on (None: it launches on a real
    cloud, whose time passes by itself). Stop it with :meth:`SimClockDriver.stop` at shutdown."""
    sim = _launch_sim(settings, providers)
    if sim is None:
        return None
    driver = driver_for(settings, sim)
    driver.start()
    return driver
