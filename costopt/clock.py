"""The service's one clock: what "now" is and how to wait, for every loop that acts on jobs.

The job engine, the rebalancer, the interruption watcher and the :class:`~costopt.migration.Migrator`
(its ``now`` and ``sleep`` parameters) all read one :class:`ServiceClock`, so the same code runs live and
over the simulated cloud:

- live: :class:`WallClock` (``datetime.now(UTC)``, ``time.sleep``);
- the simulated cloud, offline (tests, backtests): ``providers.sim.SimCloud.service_clock()``: ``sleep``
  advances the simulated clock itself (a whole move runs in milliseconds);
- the simulated cloud in the service (``make run``): ``api.sim_clock.SimClockDriver``: a thread moves the
  simulated clock at ``COSTOPT_SIM_TIME_SCALE`` simulated seconds per second; ``sleep`` waits until it has
  moved that far;
- the simulated cloud in the service in lockstep (``COSTOPT_SIM_CLOCK=stepped``, the kill drill):
  ``api.sim_clock.SteppedClockDriver``: the clock moves by ``COSTOPT_SIM_STEP`` only once every piece of the
  service's work due at the current simulated time has run or waits on the clock.

**Lockstep** (:class:`Lockstep`): a clock that moves only when the service's work at the current time is
done must see the work that the service hands to its own threads. The job engine's workers and the
interruption watcher's recoveries are submitted with :func:`submit` and awaited with :func:`join`: plain
``pool.submit`` and ``concurrent.futures.wait`` unless a lockstep clock drives this process
(:func:`current_lockstep`), which then counts each such task as work until it ends (or waits on its clock).

Times are tz-aware UTC; ``sleep`` takes seconds *of that clock* (simulated seconds over the simulated
cloud).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = ["Lockstep", "ServiceClock", "WallClock", "current_lockstep", "join", "set_lockstep", "submit"]

T = TypeVar("T")


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


class Lockstep(Protocol):
    """A clock that moves only once the service's work at the current time is done
    (``api.sim_clock.SteppedClockDriver``): it runs the service's threaded work one piece at a time."""

    def submit(self, pool: Executor, fn: Callable[[], T], capacity: int) -> Future[T]:
        """``pool.submit(fn)``, counted as work until it ends; ``capacity``: the pool's threads (a task
        beyond them waits for one, as in the pool)."""
        ...

    def join(self, futures: Sequence[Future[Any]]) -> None:
        """Wait for ``futures`` (submitted here), the caller's turn given up meanwhile."""
        ...


_LOCKSTEP: Lockstep | None = None
_LOCKSTEP_LOCK = threading.Lock()


def current_lockstep() -> Lockstep | None:
    """The lockstep clock driving this process (one at most), or None."""
    return _LOCKSTEP


def set_lockstep(lockstep: Lockstep | None, *, expect: Lockstep | None = None) -> None:
    """Make ``lockstep`` the one driving this process (None: none). Raises when another one drives it
    (``expect``: the one being replaced, e.g. itself when it stops)."""
    global _LOCKSTEP
    with _LOCKSTEP_LOCK:
        if _LOCKSTEP is not None and _LOCKSTEP is not expect and lockstep is not None:
            raise RuntimeError("another lockstep clock already drives this process: one at a time")
        if lockstep is None and expect is not None and _LOCKSTEP is not expect:
            return  # another one took over meanwhile: leave it
        _LOCKSTEP = lockstep


def submit(pool: Executor, fn: Callable[[], T], *, capacity: int) -> Future[T]:
    """``pool.submit(fn)`` (``capacity``: the pool's threads), counted by the lockstep clock when one
    drives this process."""
    lockstep = _LOCKSTEP
    return pool.submit(fn) if lockstep is None else lockstep.submit(pool, fn, capacity)


def join(futures: Sequence[Future[Any]]) -> None:
    """Wait until every future of ``futures`` is done (their results are not read here)."""
    lockstep = _LOCKSTEP
    if lockstep is None:
        concurrent.futures.wait(futures)
    else:
        lockstep.join(futures)
