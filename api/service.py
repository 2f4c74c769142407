"""The job service's objects, assembled in one place: repositories, the ledger, placements, the migration
jobs (reconciler and interruption watcher) and the job engine, all sharing one set of migrators.

:func:`build_job_service` is what the REST app, the scheduler and ``costopt rebalance`` build the service
from, so every part of it sees the same migrators (one per provider name), the same ledger and the same
unavailable-offers cache as the migration jobs (:func:`api.scheduler.build_migration_jobs` builds them;
nothing here builds a second set).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from api.scheduler import MigrationJobs, build_migration_jobs
from costopt.clock import ServiceClock
from costopt.cloud import CloudProvider
from costopt.domain import Cloud, OfferKey
from costopt.jobs.costs import job_cost
from costopt.jobs.engine import JobEngine
from costopt.jobs.model import JobState
from costopt.jobs.placement import Placements
from costopt.jobs.records import JobNotFound, JobRepository
from costopt.jobs.teams import TeamRepository
from costopt.ledger.book import Ledger
from costopt.ledger.model import LedgerError
from costopt.migration.machine import Migrator
from costopt.migration.records import JobRecord as MigratorJob
from costopt.migration.unavailable import UnavailableOffers
from costopt.migration.watch import OffersFor
from costopt.settings import Settings
from pricing.store import PriceStore

if TYPE_CHECKING:
    from api.job_planning import JobPlanner

log = logging.getLogger("costopt.service")

__all__ = ["JobService", "build_job_service", "managed_offers_for"]


@dataclass(frozen=True, slots=True)
class JobService:
    """The service's job objects. ``migration`` holds the migrators (``migrators``, by provider name) the
    engine, the watcher and the reconciler share; ``ledger`` is the one they bill to."""

    repo: JobRepository
    teams: TeamRepository
    ledger: Ledger
    unavailable: UnavailableOffers
    placements: Placements
    migration: MigrationJobs
    engine: JobEngine
    providers: Mapping[str, CloudProvider]
    clock: Callable[[], datetime]
    service_clock: ServiceClock

    @property
    def migrators(self) -> Mapping[str, Migrator]:
        return self.migration.migrators

    def cost(self, job_id: str, at: datetime | None = None) -> Decimal:
        """The job's cost so far (:func:`costopt.jobs.costs.job_cost`) at ``at`` (default: now)."""
        return job_cost(self.ledger, job_id, at or self.clock())

    def close(self) -> None:
        """Stop the engine's workers (running migrations finish first)."""
        self.engine.close()


def managed_offers_for(repo: JobRepository, engine: JobEngine, fallback: OffersFor) -> OffersFor:
    """The watcher's candidate offers: a managed job is recovered on its own ranked placements (its
    objective and constraints; the offer it lost last), nothing while the engine launches it (the engine
    counts those attempts); any other job (a drill's) on ``fallback``."""

    def offers_for(job: MigratorJob) -> list[OfferKey]:
        try:
            record = repo.get(job.job_id)
        except JobNotFound:
            return list(fallback(job))
        if record.state in (JobState.QUEUED, JobState.LAUNCHING) or record.state.terminal:
            return []
        return engine.recovery_offers(record, job)

    return offers_for


def build_job_service(
    settings: Settings,
    store: PriceStore,
    providers: Mapping[Cloud, CloudProvider] | None = None,
    clock: ServiceClock | None = None,
    *,
    placements: Placements | None = None,
    workers: int | None = None,
) -> JobService:
    """The job service over ``store``'s database (see the module doc).

    - ``providers``: by cloud (None: :func:`api.wiring.build_cloud_providers` from the settings);
    - ``clock``: the service's one clock (None: :func:`api.sim_clock.service_clock`: the simulated cloud's
      driver when the service launches on it, else the wall clock): the repository, the engine, the
      rebalancer, the watchers, the reconciler, the migrators (``now`` and ``sleep``), the ledger's
      intervals and the unavailable-offers cache all read it;
    - ``placements``: where jobs may run (None: :class:`api.job_planning.JobPlanner` over the store, its
      budgets reduced by each job's cost so far);
    - ``workers``: the engine's worker threads (None: ``settings.engine_workers``; 0 runs migrations in
      the tick).
    """
    from api.sim_clock import service_clock
    from api.wiring import build_cloud_providers

    provs = providers if providers is not None else build_cloud_providers(settings, store)
    if clock is None:
        clock = service_clock(settings, {p.name: p for p in provs.values()})
    migration = build_migration_jobs(settings, store, provs, clock)
    by_name = dict(migration.providers)
    now = clock.now
    ledger = next((m.ledger for m in migration.migrators.values() if m.ledger is not None), None)
    if ledger is None:  # build_migration_jobs bills every migrator: this is a wiring bug
        raise RuntimeError("the migration jobs' migrators have no ledger: the job service cannot bill jobs")
    engine_db = store.engine
    repo = JobRepository(engine_db, now=now)
    if placements is None:
        placements = _planner(settings, store, migration.unavailable, ledger, clock)
    engine = JobEngine(
        repo,
        migration.migrators,
        placements,
        now,
        settings.checkpoint_root,
        launch_attempts=settings.launch_attempts,
        cancel_timeout=settings.cancel_timeout.total_seconds(),
        workers=settings.engine_workers if workers is None else workers,
        progress_observer=_throughput_learner(store),
    )
    for watcher in migration.watchers.values():
        watcher.offers_for = managed_offers_for(repo, engine, watcher.offers_for)
    migration.resumed_elsewhere = lambda job_id: _engine_resumes(repo, job_id)
    return JobService(
        repo=repo,
        teams=TeamRepository(engine_db),
        ledger=ledger,
        unavailable=migration.unavailable,
        placements=placements,
        migration=migration,
        engine=engine,
        providers=by_name,
        clock=now,
        service_clock=clock,
    )


def _engine_resumes(repo: JobRepository, job_id: str) -> bool:
    """True when the job engine resumes ``job_id``'s migrations at its start (an active managed job, not a
    fleet's: :meth:`costopt.jobs.engine.JobEngine.tick`'s first pass), so the reconciler leaves them to it."""
    from costopt.fleets.model import FLEET_PROVIDER
    from costopt.jobs.model import ACTIVE_STATES

    try:
        job = repo.get(job_id)
    except JobNotFound:
        return False
    return job.state in ACTIVE_STATES and job.provider != FLEET_PROVIDER


def _throughput_learner(store: PriceStore) -> Callable[[Any, Any, Any], None]:
    """The engine's progress observer: each running copy's progress becomes a throughput measurement of
    its job type on its accelerator (:mod:`costopt.throughput.learning`), folded into the planner's cached
    catalogs at once (:func:`api.planning.learn`), so placements and the rebalancer read it."""
    from api.planning import learn
    from costopt.ledger.prices import StorePriceView
    from costopt.throughput.learning import ThroughputLearner, engine_observer
    from costopt.throughput.registry import MeasurementRegistry

    learner = ThroughputLearner(MeasurementRegistry(store.engine), on_measurement=learn)
    return engine_observer(learner, StorePriceView(store).shape)


def _planner(
    settings: Settings, store: PriceStore, unavailable: UnavailableOffers, ledger: Ledger, clock: ServiceClock
) -> JobPlanner:
    from api.job_planning import JobPlanner
    from costopt.clock import WallClock

    def spent(job_id: str, at: datetime) -> Decimal:
        try:
            return job_cost(ledger, job_id, at)
        except LedgerError as exc:  # an open interval without a price: plan on the budget as given
            log.warning("job %s: cost so far unknown (%s); its budget is not reduced", job_id, exc)
            return Decimal(0)

    # Over the simulated cloud, quotes are made at its time (the prices the job will launch at).
    sim_now = None if isinstance(clock, WallClock) else clock.now
    return JobPlanner(store, settings, unavailable=unavailable, spent=spent, now=sim_now)
