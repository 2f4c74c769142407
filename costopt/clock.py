"""The service's one clock: what "now" is and how to wait, for every loop that acts on jobs.

The job engine, the rebalancer, the interruption watcher and the :class:`~costopt.migration.Migrator`
(its ``now`` and ``sleep`` parameters) all read one :class:`ServiceClock`, so the same code runs live and
over the simulated cloud:

- live: :class:`WallClock` (``datetime.now(UTC)``, ``time.sleep``);
- the simulated cloud, offline (tests, backtests): ``providers.sim.SimCloud.service_clock()``: ``sleep``
  advances the simulated clock itself (a whole move runs in milliseconds);
- the simulated cloud in the service (``make run``): ``api.sim_clock.SimClockDriver``: a thread moves the
  simulated clock at ``COSTOPT_SIM_TIME_SCALE`` simulated seconds per second; ``sleep`` waits until it has
  moved that far.

Times are tz-aware UTC; ``sleep`` takes seconds *of that clock* (simulated seconds over the simulated
cloud).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

__all__ = ["ServiceClock", "WallClock"]


@runtime_checkable
class ServiceClock(Protocol):
    """Now (tz-aware UTC) and a wait measured on the same clock."""

    def now(self) -> datetime:
        """The current time, tz-aware UTC."""
        ...

    def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` (>= 0) of this clock's time have passed."""
        ...


class WallClock:
    """The live clock: the machine's UTC time and ``time.sleep``."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot sleep a negative time ({seconds} s)")
        time.sleep(seconds)
