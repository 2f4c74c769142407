"""Aligned schedules and leased runs: how the service's scheduled jobs run once per tick across replicas.

Every replica has its own in-memory APScheduler (job stores are not shared). For the replicas to agree
on what a *tick* is, every schedule fires at the same times everywhere:

- :class:`Every`: an interval anchored at a fixed instant (:data:`ANCHOR`, 2000-01-01 00:00 UTC), so it
  fires at ``ANCHOR + k * interval`` in every process, whenever it started (:class:`AlignedInterval`
  computes each next fire time from the anchor, in integer microseconds, never from the previous run,
  so an unaligned first run does not shift the later ones);
- :class:`Cron`: a crontab expression (5 fields, UTC), which is aligned by nature.

A job added with :func:`add_leased_job` runs :class:`LeasedRun`: it computes the tick it runs for (the
scheduled fire time APScheduler ran it for, told by :class:`TickExecutor`, aligned down to the schedule:
a run that starts late still runs its own tick; without that executor, the latest fire time at or
before now) and runs the work only if it wins that tick's lease
(:meth:`costopt.jobs.leases.LeaseStore.hold`: compare-and-set on ``last_tick``, a lease of
``min(lease_ttl, period / 2)`` renewed by a heartbeat while it runs: a replica killed mid-run blocks
the job's next tick only when the lease TTL setting is longer than half its period). A replica that
finds the lease held by another run (the previous tick's, running a little long) keeps trying for up
to ``min(lease_ttl, period)`` before giving the tick up, so a slow run delays the next tick instead of
losing it (a run longer than that skips the ticks it overlaps, as ``max_instances=1`` does).
The first run right after start-up
(``first_run_now``) is for the latest tick already due: it runs unless a replica ran it.

**Database loss**: a run that fails because the database cannot serve (down, restarting, connections cut:
:func:`costopt.db.engine.db_unavailable`) is retried at the job's next tick like any failed run, and is
reported through :data:`OUTAGE` (:class:`DatabaseOutage`): one warning line when the first run fails (no
traceback), the following failures at DEBUG, one warning with the outage's length and failed runs when a
run succeeds again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from apscheduler.executors.base import run_job
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.job import Job
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.interval import IntervalTrigger

from costopt.db.engine import db_unavailable
from costopt.jobs.leases import LeaseStore

if TYPE_CHECKING:
    from apscheduler.triggers.cron import CronTrigger

__all__ = [
    "ANCHOR",
    "DEFAULT_LEASE_TTL",
    "OUTAGE",
    "AlignedInterval",
    "Cron",
    "DatabaseOutage",
    "Every",
    "InvalidCron",
    "LeasedRun",
    "Schedule",
    "TickExecutor",
    "add_leased_job",
    "cron_help",
    "current_tick",
]

log = logging.getLogger("costopt.scheduler")

ANCHOR = datetime(2000, 1, 1, tzinfo=UTC)
"""Where every interval schedule starts counting (the same in every replica)."""

DEFAULT_LEASE_TTL = timedelta(seconds=60)
"""The longest lease of a run (a killed replica's run blocks its job at most this long)."""


class Schedule(Protocol):
    """When a job fires, the same in every replica."""

    @property
    def period(self) -> timedelta:
        """The (shortest) time between two fire times."""
        ...

    def trigger(self) -> BaseTrigger:
        """The APScheduler trigger firing at the schedule's times (UTC)."""
        ...

    def tick_at(self, now: datetime) -> datetime:
        """The latest fire time at or before ``now`` (tz-aware UTC)."""
        ...


@dataclass(frozen=True, slots=True)
class Every:
    """Every ``interval``, at ``anchor + k * interval`` (k integer)."""

    interval: timedelta
    anchor: datetime = ANCHOR

    def __post_init__(self) -> None:
        if self.interval <= timedelta(0):
            raise ValueError(f"an interval must be positive, got {self.interval}")
        if self.anchor.tzinfo is None:
            raise ValueError("the anchor must be tz-aware UTC")

    @property
    def period(self) -> timedelta:
        return self.interval

    def trigger(self) -> IntervalTrigger:
        return AlignedInterval(self.interval, self.anchor)

    def tick_at(self, now: datetime) -> datetime:
        return self.anchor + ((now - self.anchor) // self.interval) * self.interval


class AlignedInterval(IntervalTrigger):  # type: ignore[misc]
    """An interval trigger firing at ``anchor + k * interval`` only: the next fire time is the first
    such time after the previous one (or at/after ``now`` for the first), whatever time the previous
    run actually had (APScheduler's own adds the interval to it)."""

    def __init__(self, interval: timedelta, anchor: datetime = ANCHOR) -> None:
        super().__init__(seconds=interval.total_seconds(), start_date=anchor, timezone=UTC)
        self.interval = interval
        self.anchor = anchor

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime:
        if previous_fire_time is not None:
            k = (previous_fire_time - self.anchor) // self.interval + 1
        else:
            k = -((self.anchor - now) // self.interval)  # ceil((now - anchor) / interval)
        return (self.anchor + k * self.interval).astimezone(UTC)

    def __getstate__(self) -> dict[str, Any]:
        state: dict[str, Any] = super().__getstate__()
        state["anchor"] = self.anchor
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.anchor = state["anchor"]


_SCHEDULED: ContextVar[datetime | None] = ContextVar("costopt_scheduled_run_time", default=None)
_TICK: ContextVar[datetime | None] = ContextVar("costopt_tick", default=None)


def current_tick() -> datetime | None:
    """The tick the calling leased run is for (None outside one)."""
    return _TICK.get()


def _run_scheduled(job: Job, alias: str, run_times: list[datetime], logger_name: str) -> Any:
    _SCHEDULED.set(run_times[-1])
    try:
        return run_job(job, alias, run_times, logger_name)
    finally:
        _SCHEDULED.set(None)


class TickExecutor(ThreadPoolExecutor):  # type: ignore[misc]
    """APScheduler's thread pool executor that also tells the run the fire time it was scheduled at
    (jobs are ``coalesce``: one run for the newest missed time)."""

    def _do_submit_job(self, job: Job, run_times: list[datetime]) -> None:
        def callback(f: Any) -> None:
            exc = f.exception()
            if exc:
                self._run_job_error(job.id, exc, getattr(exc, "__traceback__", None))
            else:
                self._run_job_success(job.id, f.result())

        f = self._pool.submit(_run_scheduled, job, job._jobstore_alias, run_times, self._logger.name)
        f.add_done_callback(callback)


class InvalidCron(ValueError):
    """A crontab expression APScheduler cannot use; the message shows what a valid one looks like."""


def cron_help(expr: str, detail: str) -> str:
    """The message for an invalid crontab expression ``expr``."""
    return (
        f"invalid crontab expression {expr!r} ({detail}): give 5 fields 'minute hour day-of-month month "
        "day-of-week' in UTC, e.g. '0 * * * *' (hourly, on the hour), '*/15 * * * *' (every 15 minutes) "
        "or '30 2 * * mon-fri' (02:30 on weekdays)"
    )


@dataclass(frozen=True, slots=True)
class Cron:
    """A crontab expression (5 fields, UTC). Raises :class:`InvalidCron` when APScheduler refuses it."""

    expr: str

    def __post_init__(self) -> None:
        self.trigger()

    def trigger(self) -> CronTrigger:
        from apscheduler.triggers.cron import CronTrigger

        try:
            return CronTrigger.from_crontab(self.expr, timezone=UTC)
        except ValueError as exc:
            raise InvalidCron(cron_help(self.expr, str(exc))) from exc

    @property
    def period(self) -> timedelta:
        """The shortest gap between fire times over the next 4 days (enough for any crontab that fires
        at least weekly-ish; a sparser one gets 4 days)."""
        trigger = self.trigger()
        t = trigger.get_next_fire_time(None, datetime.now(UTC))
        horizon = datetime.now(UTC) + timedelta(days=4)
        best = timedelta(days=4)
        while t is not None and t < horizon:
            nxt = trigger.get_next_fire_time(t, t + timedelta(microseconds=1))
            if nxt is None:
                break
            best = min(best, nxt - t)
            t = nxt
            if best <= timedelta(minutes=1):
                break
        return best

    def tick_at(self, now: datetime) -> datetime:
        trigger = self.trigger()
        lookback = timedelta(minutes=1)
        while lookback <= timedelta(days=800):
            t: datetime | None = trigger.get_next_fire_time(None, now - lookback)
            if t is not None and t <= now:
                while True:
                    nxt: datetime | None = trigger.get_next_fire_time(t, t + timedelta(microseconds=1))
                    if nxt is None or nxt > now:
                        return t.astimezone(UTC)
                    t = nxt
            lookback *= 2
        raise InvalidCron(cron_help(self.expr, f"it never fired in the 800 days before {now.isoformat()}"))


class DatabaseOutage:
    """The scheduled jobs' view of a database outage (see the module doc): :meth:`failed` for a run that
    failed because the database could not serve, :meth:`succeeded` for one that did its work (started at
    ``started``, on ``clock``) without failing. An outage ends at the first run that succeeded and started
    after the outage's latest failure (a run that began before it proves nothing). Thread-safe; ``clock``
    in seconds (monotonic)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self.since: float | None = None  # when the current outage's first run failed (None: no outage)
        self.last_failure = 0.0  # when its latest run failed
        self.failed_runs = 0  # failed runs of the current outage
        self.outages = 0  # outages seen since start

    def failed(self, name: str, exc: BaseException) -> None:
        with self._lock:
            now = self.clock()
            first = self.since is None
            if first:
                self.since, self.failed_runs = now, 0
                self.outages += 1
            self.failed_runs += 1
            self.last_failure = now
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        if first:
            log.warning("%s: database unavailable (%s); every scheduled job retries at its next tick", name, reason)
        else:
            log.debug("%s: database still unavailable (%s)", name, reason)

    def succeeded(self, name: str, started: float) -> None:
        if self.since is None:  # the common case, without the lock
            return
        with self._lock:
            if self.since is None or started <= self.last_failure:
                return
            since, runs, self.since, self.failed_runs = self.since, self.failed_runs, None, 0
        log.warning(
            "%s: database reachable again after %.1f s (%d scheduled runs failed meanwhile and were retried)",
            name,
            self.clock() - since,
            runs,
        )


OUTAGE = DatabaseOutage()
"""The process's one :class:`DatabaseOutage` (every :class:`LeasedRun` reports to it)."""


class LeasedRun:
    """The callable APScheduler runs for a leased job (see the module doc). ``leases`` None: run every
    time (one process, no database lease). Never raises: a failed run is logged (a database outage through
    :data:`OUTAGE`) and the job runs again at its next tick."""

    def __init__(
        self,
        name: str,
        schedule: Schedule,
        work: Callable[..., object],
        args: Sequence[Any] = (),
        *,
        leases: LeaseStore | None = None,
        lease_ttl: timedelta = DEFAULT_LEASE_TTL,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.name = name
        self.schedule = schedule
        self.work = work
        self.args = tuple(args)
        self.leases = leases
        self.ttl = min(lease_ttl, schedule.period / 2)
        self.wait = min(lease_ttl, schedule.period)
        self.wall = wall

    def __call__(self) -> bool:
        """Run the tick this run was scheduled for if this replica wins it; True when it ran."""
        tick = self.schedule.tick_at(_SCHEDULED.get() or self.wall())
        started = OUTAGE.clock()
        token = _TICK.set(tick)
        try:
            if self.leases is None:
                if self.work(*self.args) is not False:  # False: the work had nothing to do (OnServiceClock)
                    OUTAGE.succeeded(self.name, started)
                return True
            with self.leases.hold(self.name, self.ttl, tick=tick, wait=self.wait) as won:
                if not won:
                    OUTAGE.succeeded(self.name, started)  # the lease's table answered
                    if log.isEnabledFor(logging.DEBUG):
                        log.debug(
                            "%s: tick %s not run here: %s", self.name, tick.isoformat(), self.leases.get(self.name)
                        )
                    return False
                self.work(*self.args)
            OUTAGE.succeeded(self.name, started)
            return True
        except Exception as exc:
            if db_unavailable(exc):  # retried at the next tick; one line per outage (module doc)
                OUTAGE.failed(self.name, exc)
            else:
                log.exception("%s: the run of tick %s failed", self.name, tick.isoformat())
            return False
        finally:
            _TICK.reset(token)


def _missed_tick(leases: LeaseStore, name: str, schedule: Schedule) -> bool:
    """True when job ``name`` ran before (its lease row has a tick) but not the latest tick due now."""
    try:
        state = leases.get(name)
    except Exception as exc:  # the database cannot answer at start-up: the next tick runs as scheduled
        log.warning("%s: its last tick could not be read at start-up (%s): it runs at its next tick", name, exc)
        return False
    return state is not None and state.last_tick is not None and state.last_tick < schedule.tick_at(datetime.now(UTC))


def add_leased_job(
    scheduler: BaseScheduler,
    name: str,
    description: str,
    schedule: Schedule,
    work: Callable[..., object],
    args: Sequence[Any] = (),
    *,
    leases: LeaseStore | None = None,
    lease_ttl: timedelta = DEFAULT_LEASE_TTL,
    first_run_now: bool = True,
    max_instances: int | None = None,
) -> Job:
    """Add ``work(*args)`` as job ``name`` firing on ``schedule`` (``coalesce``), each run under the lease
    of its tick (``leases`` None: no lease, ``max_instances=1``; with leases, ``max_instances=2``: a run
    that fires while the previous one goes on waits for its lease, they never overlap). ``first_run_now``: also run once
    at start-up, for the latest tick already due. Without it, a job whose lease row shows it ran before, but not
    that tick (the replicas were down across it, or killed before it ran), still runs it at start-up (a
    missed rebalancer pass is not put off a whole period); a job that never ran waits for its next tick.
    ``max_instances``: APScheduler's bound instead (a poll that returns at once while its previous run goes
    on: :class:`api.scheduler.Poll`)."""
    extra: dict[str, Any] = {}
    if first_run_now or (leases is not None and _missed_tick(leases, name, schedule)):
        extra["next_run_time"] = datetime.now(UTC)
    seconds = schedule.period.total_seconds()
    return scheduler.add_job(
        LeasedRun(name, schedule, work, args, leases=leases, lease_ttl=lease_ttl),
        schedule.trigger(),
        id=name,
        name=description,
        # With a lease, a second instance may start while the previous run goes on: it waits for the
        # lease (up to a period) instead of giving its tick up; the lease keeps the two from overlapping.
        max_instances=max_instances or (1 if leases is None else 2),
        coalesce=True,
        # A late run still runs its own tick (unless a replica ran it or a newer one): be lenient.
        misfire_grace_time=max(10, int(seconds)),
        **extra,
    )
