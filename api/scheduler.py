"""APScheduler 3.x jobs: price collection, the migrator's reconciler and interruption watcher, the job
engine's tick and the rebalancer, each run once per tick across service replicas.

- **Price jobs** (:func:`add_price_jobs`): one interval job per source (``collect:<source>``). A source
  that keeps failing backs off: a run is skipped while the time since its last attempt is shorter
  than :func:`pricing.collect.backoff_delay`.
- **Migration jobs** (:func:`add_migration_jobs`, on a :class:`MigrationJobs`): ``migration:reconcile``
  every ``reconcile_interval`` (default 5 min) lists every configured provider's instances, terminates
  orphans and marks jobs whose instance vanished for recovery (its first run, at start, also resumes
  the migrations a crash left active); ``migration:watch`` every ``watch_interval`` (default 5 s) runs
  one :meth:`InterruptionWatcher.poll` per provider (notices -> checkpoint requests, preemptions and
  marked jobs -> recoveries).

Every job has ``max_instances=1`` (a slow run never overlaps itself) and ``coalesce=True`` (missed
runs collapse into one). A failing provider is logged and skipped, the other providers still run, and
an exception never stops the scheduler (APScheduler logs it and runs the job again at its next time).
A database that cannot serve (down, restarting, connections cut) is not a provider's failure: the pass
stops, its leased run reports the outage once (:data:`api.ticks.OUTAGE`) and the next tick retries
(over the service clock, the tick is not counted as run: the next poll retries it).
The two migration jobs take one lock, so a reconciler pass never sees a recovery half done in this
process (across replicas, the reconciler leaves in-flight migrations alone: docs/architecture.md).
- **Job-service jobs** (:func:`add_job_service_jobs`): ``engine`` every ``COSTOPT_ENGINE_INTERVAL``
  (:meth:`costopt.jobs.engine.JobEngine.tick`) and ``rebalance`` on the ``COSTOPT_REBALANCE_CRON``
  crontab (:meth:`costopt.jobs.rebalance.Rebalancer.run_once`).

**Service time**: over the simulated cloud (``COSTOPT_PROVIDER=sim``, whose clock runs
``COSTOPT_SIM_TIME_SCALE`` x faster than real time), the migration and job-service schedules are counted
on the service clock (:class:`ServiceTime`, :class:`OnServiceClock`): the scheduler polls every
``COSTOPT_SIM_TICK`` of wall time and runs a job when its interval or crontab has a new tick in simulated
time, so an hourly rebalance runs every simulated hour (6 s of wall time at 600x). Price collection
stays on the wall clock. These runs take no lease: the embedded simulated cloud lives in one process.

**Replicas**: every job fires at aligned times (:mod:`api.ticks`: intervals anchored at a fixed
instant, crontabs) and, given a :class:`~costopt.jobs.leases.LeaseStore` (``leases=``), runs a tick
only when it wins that tick's lease, so each tick runs exactly once across the replicas sharing a
database, and a killed replica's jobs are taken over at the next tick.

:func:`build_scheduler` builds a scheduler with price jobs, migration jobs or both;
:func:`build_migration_jobs` builds the service's migration jobs from the settings.
"""

from __future__ import annotations

import builtins
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from apscheduler.job import Job
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import Engine, select

from api.ticks import DEFAULT_LEASE_TTL, Every, Schedule, TickExecutor, add_leased_job
from costopt.clock import ServiceClock
from costopt.cloud import CloudProvider, Instance, InstanceState, Interruption, LaunchSpec
from costopt.db.engine import db_unavailable
from costopt.db.migration_schema import migration_jobs
from costopt.domain import Cloud, Market, OfferKey
from costopt.jobs.leases import LeaseStore
from costopt.migration.machine import Migrator
from costopt.migration.reconcile import ReconcileReport, reconcile
from costopt.migration.records import RACES, JobRecord
from costopt.migration.unavailable import UnavailableOffers
from costopt.migration.watch import InterruptionWatcher, OffersFor, WatchReport
from costopt.settings import Settings
from pricing.base import PriceSource
from pricing.collect import backoff_delay, run_source
from pricing.sources import source_intervals
from pricing.store import PriceStore

log = logging.getLogger("costopt.scheduler")

RECONCILE_JOB_ID = "migration:reconcile"
WATCH_JOB_ID = "migration:watch"
ENGINE_JOB_ID = "engine"
REBALANCE_JOB_ID = "rebalance"
DEFAULT_RECONCILE_INTERVAL = timedelta(minutes=5)
DEFAULT_WATCH_INTERVAL = timedelta(seconds=5)


def new_scheduler() -> BackgroundScheduler:
    """An empty scheduler (not started), UTC, every job ``max_instances=1`` and ``coalesce=True``, its runs
    told their scheduled fire time (:class:`api.ticks.TickExecutor`)."""
    return BackgroundScheduler(
        timezone=UTC, executors={"default": TickExecutor()}, job_defaults={"max_instances": 1, "coalesce": True}
    )


# -- price collection -------------------------------------------------------------------------------


def _job(store: PriceStore, source: PriceSource, interval: timedelta) -> None:
    status = {s.name: s for s in store.sources()}.get(source.name)
    now = datetime.now(UTC)
    if status is not None and status.consecutive_failures >= 2 and status.last_attempt_at is not None:
        wait = backoff_delay(interval, status.consecutive_failures)
        if now - status.last_attempt_at < wait - timedelta(seconds=1):
            log.info(
                "price source %s: backing off after %d failures (next try after %s)",
                source.name,
                status.consecutive_failures,
                status.last_attempt_at + wait,
            )
            return
    run_source(store, source)


def add_price_jobs(
    scheduler: BackgroundScheduler,
    store: PriceStore,
    sources: Sequence[PriceSource],
    settings: Settings,
    *,
    leases: LeaseStore | None = None,
) -> list[Job]:
    """One interval job per source (``collect:<name>``), first run right away (for the latest tick due),
    under ``leases`` when given."""
    intervals = source_intervals(settings)
    added = []
    for source in sources:
        interval = timedelta(seconds=intervals.get(source.name, 3600.0))
        added.append(
            add_leased_job(
                scheduler,
                f"collect:{source.name}",
                f"collect prices from {source.name}",
                Every(interval),
                _job,
                [store, source, interval],
                leases=leases,
                lease_ttl=settings.scheduler_lease_ttl,
            )
        )
    return added


# -- migration ------------------------------------------------------------------------------------


class _OwnJobsView:
    """``provider`` as one reconciler pass should see it when several providers share the database.

    :func:`costopt.migration.reconcile.reconcile` describes the instance of *every* running job with the
    provider it is given, so a job on another cloud would look vanished. Here ``describe`` of an
    instance that belongs to a job of another provider answers ``running`` (that job is left to its own
    provider's pass); everything else goes to ``provider``.
    """

    def __init__(self, provider: CloudProvider, engine: Engine) -> None:
        self.inner = provider
        self.engine = engine
        self.name = provider.name

    def _foreign_job(self, instance_id: str) -> JobRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                select(migration_jobs).where(
                    migration_jobs.c.instance_id == instance_id, migration_jobs.c.provider != self.name
                )
            ).first()
        return None if row is None else JobRecord.of(row)

    def describe(self, instance_id: str) -> Instance:
        job = self._foreign_job(instance_id)
        if job is None:
            return self.inner.describe(instance_id)
        offer = job.offer or OfferKey(Cloud.SIM, "", "", "", Market.SPOT)
        return Instance(instance_id=instance_id, offer=offer, state=InstanceState.RUNNING, tags={})

    def launch(self, spec: LaunchSpec, idempotency_token: str) -> Instance:
        return self.inner.launch(spec, idempotency_token)

    def terminate(self, instance_id: str) -> None:
        self.inner.terminate(instance_id)

    def list(self, tags: Mapping[str, str]) -> builtins.list[Instance]:
        return self.inner.list(tags)

    def interruptions(self, since: datetime) -> builtins.list[Interruption]:
        return self.inner.interruptions(since)

    def acknowledge(self, interruptions: Sequence[Interruption]) -> None:
        self.inner.acknowledge(interruptions)

    def output(self, instance_id: str, *, tail: int | None = None) -> str:
        return self.inner.output(instance_id, tail=tail)


def _provider_clock(provider: CloudProvider) -> Callable[[], datetime] | None:
    """The provider's own clock when it has one (the simulated cloud's ``now``), else None (wall)."""
    now = getattr(provider, "now", None)
    return now if callable(now) else None


class MigrationJobs:
    """What the migration jobs run on: one database, the configured providers (one migrator and one
    :class:`InterruptionWatcher` each), and their intervals.

    - ``providers``: the providers (e.g. ``providers.factory.build_providers(settings)``, a mapping by
      cloud, or any iterable); their names must differ;
    - ``offers_for(job)``: candidate offers for a recovery, best first;
    - ``unavailable``: the unavailable-offers cache (default: one on ``engine``);
    - ``make_migrator``: builds the migrator of a provider (default ``Migrator(engine, provider,
      unavailable=unavailable)``, not billed: give one with the service's ledger to bill copies);
    - ``watch_overlap``: how far back each watcher re-reads before its last pass;
    - ``resume_on_start``: the first reconciler pass resumes every migration left active (by a crash).
      Assumes one service process drives migrations per database. :attr:`resumed_elsewhere` (settable; the
      job service sets it): the jobs whose migrations another actor resumes at its own start (the job
      engine's, in its worker pool, side by side): the reconciler leaves them to it (resuming them too, one
      after another under the migration jobs' lock, held the interruption watcher back for as long);
    - ``clock``: the service clock's now (:mod:`costopt.clock`) the watchers and the reconciler read
      (None: each provider's own clock when it has one, else the wall clock);
    - ``recovery_workers``: how many recoveries one watcher pass runs at once (its clock's ``sleep`` must
      wait for the clock, not move it: the service's), and each watcher's recovery cap: at most this many
      RECOVER migrations of its provider's jobs active at once in the database, those the job engine and
      the reconciler resume after a restart included (a pass starts the cap minus the active ones, in a
      stable order: :mod:`costopt.migration.watch`), so a restarted service starts no more than one never
      killed.
    """

    def __init__(
        self,
        engine: Engine,
        providers: Mapping[Any, CloudProvider] | Iterable[CloudProvider],
        offers_for: OffersFor,
        *,
        unavailable: UnavailableOffers | None = None,
        make_migrator: Callable[[Engine, CloudProvider], Migrator] | None = None,
        reconcile_interval: timedelta = DEFAULT_RECONCILE_INTERVAL,
        watch_interval: timedelta = DEFAULT_WATCH_INTERVAL,
        watch_overlap: timedelta = timedelta(minutes=10),
        resume_on_start: bool = True,
        clock: Callable[[], datetime] | None = None,
        recovery_workers: int = 1,
    ) -> None:
        if reconcile_interval <= timedelta(0) or watch_interval <= timedelta(0):
            raise ValueError(f"intervals must be positive (reconcile {reconcile_interval}, watch {watch_interval})")
        items = list(providers.values()) if isinstance(providers, Mapping) else list(providers)
        if not items:
            raise ValueError("no provider configured: the migration jobs need at least one")
        self.providers: dict[str, CloudProvider] = {}
        for p in items:
            if p.name in self.providers:
                raise ValueError(f"two providers are named {p.name!r}: jobs are kept per provider name")
            self.providers[p.name] = p
        self.engine = engine
        self.unavailable = unavailable if unavailable is not None else UnavailableOffers(engine)
        build = make_migrator or (lambda eng, prov: Migrator(eng, prov, unavailable=self.unavailable))
        self.migrators = {name: build(engine, p) for name, p in self.providers.items()}
        self.watchers = {
            name: InterruptionWatcher(
                m,
                offers_for,
                unavailable=self.unavailable,
                overlap=watch_overlap,
                clock=clock or _provider_clock(m.provider),
                workers=recovery_workers,
                cap=recovery_workers,
            )
            for name, m in self.migrators.items()
        }
        self.reconcile_interval = reconcile_interval
        self.watch_interval = watch_interval
        self.resume_on_start = resume_on_start
        self.resumed_elsewhere: Callable[[str], bool] | None = None
        self.clock = clock
        self.lock = threading.Lock()
        self._started = False

    def reconcile(self) -> dict[str, ReconcileReport]:
        """One reconciler pass over every provider (a failing provider is logged and skipped)."""
        out: dict[str, ReconcileReport] = {}
        with self.lock:
            first = not self._started
            for name, migrator in self.migrators.items():
                try:
                    if first and self.resume_on_start:
                        _resume_all(name, migrator, self.resumed_elsewhere)
                    report = reconcile(
                        self.engine,
                        _OwnJobsView(migrator.provider, self.engine),
                        ledger=migrator.ledger,
                        unavailable=migrator.unavailable or self.unavailable,
                        egress=migrator.egress,
                        now=self.clock or _provider_clock(migrator.provider) or _wall_now,
                    )
                except Exception as exc:
                    if db_unavailable(exc):  # not the provider's fault: the pass is retried at the next tick
                        raise
                    log.exception("reconciler: provider %s failed; the other providers go on", name)
                    continue
                if report.orphans_terminated or report.marked_for_recovery or report.finished:
                    log.warning(
                        "reconciler %s: orphans terminated %s, marked for recovery %s, finished %s",
                        name,
                        list(report.orphans_terminated),
                        list(report.marked_for_recovery),
                        list(report.finished),
                    )
                out[name] = report
            self._started = True  # the resume at start is done (a database outage retries it next pass)
        return out

    def watch(self) -> dict[str, WatchReport]:
        """One interruption-watcher pass per provider (a failing provider is logged and skipped)."""
        out: dict[str, WatchReport] = {}
        with self.lock:
            for name, watcher in self.watchers.items():
                try:
                    out[name] = watcher.poll()
                except Exception as exc:
                    if db_unavailable(exc):  # not the provider's fault: the pass is retried at the next tick
                        raise
                    log.exception("interruption watcher: provider %s failed; the other providers go on", name)
        return out


def _resume_all(name: str, migrator: Migrator, elsewhere: Callable[[str], bool] | None = None) -> None:
    """Resume every migration a crash left active, job by job, but those of the jobs ``elsewhere`` says
    another actor resumes (the job engine's): a job whose migration another actor (the engine, just
    restarted too) advanced first is a lost race (:data:`RACES`), logged in one line and left to the
    winner, and the other jobs are still resumed."""
    migrator.sync_ledger()
    for job_id in sorted({m.job_id for m in migrator.active_migrations()}):
        if elsewhere is not None and elsewhere(job_id):
            continue
        try:
            resumed = migrator.resume(job_id)
        except RACES as exc:
            log.warning(
                "reconciler %s: job %s: another actor advanced its migration first (%s: %s); left to it",
                name,
                job_id,
                type(exc).__name__,
                exc,
            )
            continue
        for rec in resumed:
            log.warning("resumed migration %d of job %s: %s", rec.id, rec.job_id, rec.state.value)


def _wall_now() -> datetime:
    return datetime.now(UTC)


def _logged(what: str, work: Callable[[], object]) -> None:
    """``work()`` with its failure logged as ``what`` failing (it counts as run), except a database outage:
    raised, so the leased run reports the outage once and the next tick retries (:data:`api.ticks.OUTAGE`)."""
    try:
        work()
    except Exception as exc:
        if db_unavailable(exc):
            raise
        log.exception("%s failed", what)


def reconcile_job(jobs: MigrationJobs) -> None:
    """The ``migration:reconcile`` job (errors logged; a database outage raised, for the leased run)."""
    _logged("reconciler pass", jobs.reconcile)


def watch_job(jobs: MigrationJobs) -> None:
    """The ``migration:watch`` job (errors logged; a database outage raised, for the leased run)."""
    _logged("interruption watcher pass", jobs.watch)


@dataclass(frozen=True, slots=True)
class ServiceTime:
    """Job-side schedules counted on the service clock instead of the wall clock (the simulated cloud's
    clock, running ``COSTOPT_SIM_TIME_SCALE`` x faster than real time): the scheduler polls every ``poll``
    of wall time and each job runs when its schedule has a tick on ``now`` it has not run yet. ``stepper``
    (``COSTOPT_SIM_CLOCK=stepped``): the clock's driver runs the jobs itself, in lockstep with its steps,
    instead of the scheduler."""

    now: Callable[[], datetime]
    poll: timedelta
    stepper: Stepper | None = None


class Stepper(Protocol):
    """A clock that runs the service's scheduled jobs itself (:class:`api.sim_clock.SteppedClockDriver`)."""

    def add_job(self, name: str, work: OnServiceClock, *, group: str | None = None) -> None: ...


class TickMemory(Protocol):
    """Where a job on the service clock keeps the last tick it ran, across restarts of the process."""

    def last(self) -> datetime | None:
        """The last tick recorded (None: the job never ran)."""
        ...

    def ran(self, tick: datetime) -> None:
        """Record that the run of ``tick`` ended."""
        ...


@dataclass(frozen=True, slots=True)
class LeaseTicks:
    """A :class:`TickMemory` in the lease table (``scheduler_leases``, row ``name``: its ``last_tick``; no
    lease is held past the write). The ticks are the service clock's (simulated time over the simulated
    cloud): give it a name of its own, not a wall-clock job's."""

    leases: LeaseStore
    name: str

    def last(self) -> datetime | None:
        state = self.leases.get(self.name)
        return None if state is None else state.last_tick

    def ran(self, tick: datetime) -> None:
        if self.leases.claim_tick(self.name, tick, timedelta(seconds=60)):  # last_tick := tick (when newer)
            self.leases.release(self.name)


class OnServiceClock:
    """``work(*args)`` once per tick of ``schedule`` counted on the service clock ``now``: each call runs
    it when the schedule's latest tick at ``now()`` is newer than the last one run (ticks skipped between
    two calls coalesce into one run; a run that raised does not count, so the next call retries it).
    ``first_run_now`` False: the tick current at creation is skipped (the first run is at the next tick),
    unless ``memory`` says the job ran before and not that tick: a restarted process (killed, or down across
    a tick) then runs the latest tick due at once, as the process it replaces would have (the rebalancer: a
    pass lost to a kill would otherwise move the jobs a whole period later). ``memory`` records each tick
    run (after the work ended). Returns True when it ran."""

    def __init__(
        self,
        schedule: Schedule,
        now: Callable[[], datetime],
        work: Callable[..., object],
        args: Sequence[Any] = (),
        *,
        first_run_now: bool = True,
        memory: TickMemory | None = None,
    ) -> None:
        self.schedule = schedule
        self.now = now
        self.work = work
        self.args = tuple(args)
        self.memory = memory
        self.last: datetime | None = None
        if not first_run_now:
            current = schedule.tick_at(now())
            ran = None if memory is None else memory.last()
            # never ran, or a tick ahead of the clock (a simulated cloud started again from its start over an
            # old database): the current tick is skipped, as on a first start
            self.last = current if ran is None or ran > current else ran
        self.__name__ = getattr(work, "__name__", "work")

    def due(self) -> bool:
        """True when the schedule has a tick at ``now()`` not run yet (a call would run the work)."""
        return self.last is None or self.schedule.tick_at(self.now()) > self.last

    def __call__(self) -> bool:
        tick = self.schedule.tick_at(self.now())
        if self.last is not None and tick <= self.last:
            return False
        self.work(*self.args)  # a run that raises (a database outage) leaves its tick to the next call
        self.last = tick
        if self.memory is not None:
            try:
                self.memory.ran(tick)
            except Exception as exc:  # the run happened; only a restart's catch-up would miss it
                log.warning("%s: the tick %s ran but could not be recorded: %s", self.__name__, tick.isoformat(), exc)
        return True


POLL_SUMMARY_EVERY_S = 60.0
"""At most one summary line per service-clock job per this many wall seconds (:class:`Poll`)."""


class Poll:
    """One poll of a job on the service clock (``work``: its :class:`OnServiceClock`), scheduled every
    ``COSTOPT_SIM_TICK`` of wall time with room for two instances: a poll that finds the previous run still
    going returns at once (False) and is counted, instead of APScheduler's "skipped: maximum number of
    running instances reached" warning at every such poll (5 a second for each of the engine, the watcher
    and the reconciler in the soak, whose runs outlast a 200 ms poll; not the simulated cloud's instances).
    Once per :data:`POLL_SUMMARY_EVERY_S` of wall time at most, when polls found it running (its runs outlast
    the poll: on the service clock it runs less often than its schedule), one WARNING line says how many runs
    ended, the longest and the mean run, and the polls that found it running."""

    def __init__(self, name: str, work: Callable[[], bool], *, wall: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.work = work
        self.wall = wall
        self.__name__ = name
        self._running = threading.Lock()
        self._count = threading.Lock()
        self.busy_polls = 0
        """Polls that found the previous run still going (since the last summary)."""
        self.runs: list[float] = []
        """The wall seconds of the runs that did work since the last summary."""
        self._since = wall()

    def __call__(self) -> bool:
        if not self._running.acquire(blocking=False):
            with self._count:
                self.busy_polls += 1
            return False
        try:
            started = self.wall()
            ran = self.work()
            ended = self.wall()
        finally:
            self._running.release()
        with self._count:
            if ran:
                self.runs.append(ended - started)
            if ended - self._since < POLL_SUMMARY_EVERY_S:
                return ran
            runs, busy, since = self.runs, self.busy_polls, self._since
            self.runs, self.busy_polls, self._since = [], 0, ended
        if busy:
            log.warning(
                "%s: %d run(s) in the last %.0f s, longest %.2f s, mean %.2f s; %d poll(s) found a run going "
                "(its runs outlast the %s poll)",
                self.name,
                len(runs),
                ended - since,
                max(runs, default=0.0),
                sum(runs) / len(runs) if runs else 0.0,
                busy,
                "COSTOPT_SIM_TICK",
            )
        return ran


def _add(
    scheduler: BackgroundScheduler,
    name: str,
    description: str,
    schedule: Schedule,
    work: Callable[..., object],
    args: Sequence[Any],
    *,
    leases: LeaseStore | None,
    lease_ttl: timedelta,
    first_run_now: bool = True,
    service_time: ServiceTime | None = None,
    group: str | None = None,
) -> Job | None:
    if service_time is None:
        return add_leased_job(
            scheduler,
            name,
            description,
            schedule,
            work,
            args,
            leases=leases,
            lease_ttl=lease_ttl,
            first_run_now=first_run_now,
        )
    # The simulated cloud lives in this process (a replica has its own): no lease across replicas. A job
    # whose first tick waits (the rebalancer) keeps its last tick run in the lease table, under a name of
    # its own (service-clock ticks), so a restart runs a tick it lost.
    memory = None if first_run_now or leases is None else LeaseTicks(leases, f"{name}@service-clock")
    on_clock = OnServiceClock(schedule, service_time.now, work, args, first_run_now=first_run_now, memory=memory)
    if service_time.stepper is not None:  # the stepped clock runs it (``group``: jobs sharing a lock)
        service_time.stepper.add_job(name, on_clock, group=group)
        return None
    poll = Poll(name, on_clock)
    return add_leased_job(scheduler, name, description, Every(service_time.poll), poll, (), max_instances=2)


def add_migration_jobs(
    scheduler: BackgroundScheduler,
    jobs: MigrationJobs,
    *,
    leases: LeaseStore | None = None,
    lease_ttl: timedelta = DEFAULT_LEASE_TTL,
    service_time: ServiceTime | None = None,
) -> list[Job]:
    """``migration:reconcile`` and ``migration:watch``, first runs right away, under ``leases`` when given
    (``service_time``: their intervals counted on the service clock; with its ``stepper``, run by it and not
    returned)."""
    added = [
        _add(
            scheduler,
            job_id,
            name,
            Every(interval),
            func,
            [jobs],
            leases=leases,
            lease_ttl=lease_ttl,
            service_time=service_time,
            group="migration",  # both take MigrationJobs.lock
        )
        for job_id, func, interval, name in (
            (RECONCILE_JOB_ID, reconcile_job, jobs.reconcile_interval, "reconcile instances with jobs"),
            (WATCH_JOB_ID, watch_job, jobs.watch_interval, "react to preemption notices and preemptions"),
        )
    ]
    return [j for j in added if j is not None]


# -- the job service --------------------------------------------------------------------------------


class _Rebalances(Protocol):
    def run_once(self, *, dry_run: bool) -> object: ...


@dataclass(frozen=True, slots=True)
class JobServiceJobs:
    """The job service's scheduled work: ``engine_tick`` (:meth:`costopt.jobs.engine.JobEngine.tick`)
    every ``engine_interval``, and ``rebalancer`` (:class:`costopt.jobs.rebalance.Rebalancer`) on
    ``rebalance_schedule`` (:class:`api.ticks.Cron` of ``COSTOPT_REBALANCE_CRON`` in the service)."""

    engine_tick: Callable[[], object]
    rebalancer: _Rebalances
    engine_interval: timedelta
    rebalance_schedule: Schedule

    @classmethod
    def from_settings(
        cls, settings: Settings, engine_tick: Callable[[], object], rebalancer: _Rebalances
    ) -> JobServiceJobs:
        """With ``COSTOPT_ENGINE_INTERVAL`` and ``COSTOPT_REBALANCE_CRON`` (raises
        :class:`api.ticks.InvalidCron`, saying what a valid crontab looks like)."""
        from api.ticks import Cron

        return cls(engine_tick, rebalancer, settings.engine_interval, Cron(settings.rebalance_cron))


def engine_job(tick: Callable[[], object]) -> None:
    """The ``engine`` job: one engine pass (errors logged; a database outage raised, for the leased run)."""
    _logged("job engine tick", tick)


def rebalance_job(rebalancer: _Rebalances) -> None:
    """The ``rebalance`` job: one rebalancer pass that moves (errors logged; a database outage raised, for
    the leased run)."""
    _logged("rebalancer pass", lambda: rebalancer.run_once(dry_run=False))


def add_job_service_jobs(
    scheduler: BackgroundScheduler,
    jobs: JobServiceJobs,
    *,
    leases: LeaseStore | None = None,
    lease_ttl: timedelta = DEFAULT_LEASE_TTL,
    service_time: ServiceTime | None = None,
) -> list[Job]:
    """``engine`` (first run right away) and ``rebalance`` (first run at its next scheduled time), under
    ``leases`` when given (``service_time``: the interval and the crontab counted on the service clock; with its
    ``stepper``, run by it and not returned)."""
    added = [
        _add(
            scheduler,
            ENGINE_JOB_ID,
            "advance managed jobs",
            Every(jobs.engine_interval),
            engine_job,
            [jobs.engine_tick],
            leases=leases,
            lease_ttl=lease_ttl,
            service_time=service_time,
        ),
        _add(
            scheduler,
            REBALANCE_JOB_ID,
            "move running jobs where the decision rule says it pays",
            jobs.rebalance_schedule,
            rebalance_job,
            [jobs.rebalancer],
            leases=leases,
            lease_ttl=lease_ttl,
            first_run_now=False,
            service_time=service_time,
        ),
    ]
    return [j for j in added if j is not None]


def _timeouts(provider: CloudProvider, settings: Settings | None = None) -> dict[str, float]:
    """A provider's own migrator timeouts when it has them (the simulated cloud's, in its seconds: its
    boot and restore take minutes of simulated time), else the migrator's defaults. On the simulated cloud
    the checkpoint timeout also covers one tick of the service's clock driver (``settings``: its
    ``COSTOPT_SIM_MAX_TICK``): a request written during a tick is seen by the agents at the start of the
    next one, which may move the clock that much (a late tick on a loaded machine), so without it a move
    rolled back whenever a tick moved the clock more than the timeout (420 s; a tick moves up to 600 s at
    600x). With the stepped clock (``COSTOPT_SIM_CLOCK=stepped``), one step (``COSTOPT_SIM_STEP``)."""
    own = getattr(provider, "migrator_timeouts", None)
    out = dict(own()) if callable(own) else {}
    if settings is not None and provider.name == "sim" and "checkpoint_timeout" in out:
        from api.sim_clock import DEFAULT_MAX_TICKS

        cap = settings.sim_max_tick
        if settings.sim_clock == "stepped":  # a step of the stepped clock
            tick = settings.sim_step.total_seconds()
        else:
            tick = (
                cap.total_seconds()
                if cap is not None
                else DEFAULT_MAX_TICKS * settings.sim_tick.total_seconds() * settings.sim_time_scale
            )
        out["checkpoint_timeout"] += tick
    return out


def build_migration_jobs(
    settings: Settings,
    store: PriceStore,
    providers: Mapping[Cloud, CloudProvider] | None = None,
    clock: ServiceClock | None = None,
) -> MigrationJobs:
    """The service's reconciler and interruption watcher over every configured provider (None:
    :func:`api.wiring.build_cloud_providers`): migrators billed to the ledger in the store's database
    (priced at the store's prices), recoveries on :func:`api.recovery.recovery_offers`.

    ``clock``: the service's one clock (:func:`api.sim_clock.service_clock` when None): the migrators'
    ``now`` and ``sleep``, the unavailable-offers cache, the watchers and the reconciler all read it, so
    ledger intervals, migration times and job events are on one clock (the simulated one over the sim)."""
    from api.recovery import recovery_offers_for
    from api.sim_clock import service_clock
    from api.wiring import build_cloud_providers, build_unavailable
    from costopt.ledger.prices import StorePriceView
    from costopt.ledger.sql import SqlLedger

    engine = store.engine
    provs = providers if providers is not None else build_cloud_providers(settings, store)
    if clock is None:
        clock = service_clock(settings, {p.name: p for p in provs.values()})
    unavailable = build_unavailable(settings, engine)
    unavailable.clock = clock.now
    ledger = SqlLedger(engine, StorePriceView(store))
    return MigrationJobs(
        engine,
        provs,
        recovery_offers_for(store, settings),
        unavailable=unavailable,
        make_migrator=lambda eng, prov: Migrator(
            eng,
            prov,
            ledger=ledger,
            unavailable=unavailable,
            now=clock.now,
            sleep=clock.sleep,
            **_timeouts(prov, settings),  # type: ignore[arg-type]  # checkpoint_timeout and verify_timeout only
        ),
        reconcile_interval=settings.reconcile_interval,
        watch_interval=settings.interruption_poll_interval,
        watch_overlap=settings.interruption_overlap,
        clock=clock.now,
        recovery_workers=settings.recovery_workers,
    )


def build_scheduler(
    store: PriceStore | None = None,
    sources: Sequence[PriceSource] = (),
    settings: Settings | None = None,
    *,
    migration: MigrationJobs | None = None,
    job_service: JobServiceJobs | None = None,
    leases: LeaseStore | None = None,
    service_time: ServiceTime | None = None,
) -> BackgroundScheduler:
    """A scheduler (not started) with the price jobs (``store`` and ``sources`` given; ``settings`` for
    their intervals), the migration jobs (``migration`` given) and the job service's (``job_service``
    given), each run once per tick across replicas when ``leases`` is given (the service passes a
    :class:`~costopt.jobs.leases.LeaseStore` on its database). ``service_time``: the migration and job
    service jobs' schedules counted on the service clock (the simulated one; price jobs stay on the wall)."""
    scheduler = new_scheduler()
    ttl = settings.scheduler_lease_ttl if settings is not None else DEFAULT_LEASE_TTL
    if store is not None and sources:
        if settings is None:
            raise ValueError("price jobs need the settings (their intervals): pass settings=")
        add_price_jobs(scheduler, store, sources, settings, leases=leases)
    if migration is not None:
        add_migration_jobs(scheduler, migration, leases=leases, lease_ttl=ttl, service_time=service_time)
    if job_service is not None:
        add_job_service_jobs(scheduler, job_service, leases=leases, lease_ttl=ttl, service_time=service_time)
    return scheduler


def run_forever(store: PriceStore, sources: Sequence[PriceSource], settings: Settings) -> None:
    """Run the collectors on their schedule until SIGINT/SIGTERM."""
    scheduler = build_scheduler(store, sources, settings)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    scheduler.start()
    log.warning("collecting prices from %s; Ctrl-C to stop", ", ".join(s.name for s in sources))
    try:
        stop.wait()
    finally:
        scheduler.shutdown(wait=False)
