"""The service's simulated time: a thread that moves the simulated cloud's clock faster than real time.

In ``make run`` (``COSTOPT_PROVIDER=sim``, the default) nothing moves the simulated cloud but this driver:
every ``COSTOPT_SIM_TICK`` of wall time it advances the cloud's clock by the wall time elapsed x
``COSTOPT_SIM_TIME_SCALE`` (600 by default: ten simulated minutes per second) through
:meth:`providers.sim.SimCloud.run_to`, so simulated agents train, checkpoint, get preempted and finish
while the service's own loops (job engine, rebalancer, interruption watcher, migrator) act on them. The
clock starts at ``COSTOPT_SIM_START`` (inside the seeded real prices).

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

__all__ = ["SimClockDriver", "driver_for", "service_clock", "start_sim_clock"]


class SimClockDriver:
    """Moves ``cloud``'s clock at ``scale`` simulated seconds per wall second, every ``tick`` wall seconds,
    in a daemon thread (:meth:`start` / :meth:`stop`); :meth:`advance` is one tick (the thread calls it).
    ``wall``: monotonic wall-clock seconds (injected in tests)."""

    def __init__(
        self,
        cloud: SimCloud,
        *,
        scale: float,
        tick: float = 0.2,
        wall: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (scale > 0 and math.isfinite(scale)):
            raise ValueError(f"the time scale must be a finite number > 0 (simulated s per wall s), got {scale}")
        if not (tick > 0 and math.isfinite(tick)):
            raise ValueError(f"the tick must be a finite number of seconds > 0, got {tick}")
        self.cloud = cloud
        self.scale = float(scale)
        self.tick = float(tick)
        self.wall = wall
        self._last: float | None = None
        self._moved = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ticks = 0

    @classmethod
    def from_settings(cls, settings: Settings, cloud: SimCloud) -> SimClockDriver:
        """``COSTOPT_SIM_TIME_SCALE`` and ``COSTOPT_SIM_TICK``."""
        return cls(cloud, scale=settings.sim_time_scale, tick=settings.sim_tick.total_seconds())

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
        running every simulated event on the way; returns the new simulated time."""
        now = self.wall()
        last, self._last = self._last, now
        if last is not None and now > last:
            self.cloud.run_to(self.cloud.now() + timedelta(seconds=(now - last) * self.scale))
        self.ticks += 1
        with self._moved:
            self._moved.notify_all()
        return self.cloud.now()

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if self.running:
            return
        self._stop.clear()
        self._last = None
        self._thread = threading.Thread(target=self._run, name="sim-clock", daemon=True)
        self._thread.start()
        log.info("simulated clock running at %gx from %s (a tick every %g s)", self.scale, self.cloud.now(), self.tick)

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
