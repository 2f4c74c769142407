"""The FastAPI application: routes, startup (migrate, seed, schedule collectors, the job service and the
first admin key), metrics, one JSON error shape (:mod:`api.errors`) and the request body limit."""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api.errors import BodyLimit, install_error_handlers
from api.routes import admin, batches, health, jobs, metrics, plans, prices
from api.wiring import build_sources, build_store, build_unavailable, seed_if_empty
from costopt.errors import CostoptError
from costopt.settings import Settings, get_settings
from pricing.store import PriceStore

log = logging.getLogger("costopt.api")


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the service. At startup the store is migrated, seeded when empty (curated list prices
    and, when present, the real data folder) and the collectors are scheduled (if enabled)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = build_store(settings)
        if settings.seed_on_start:
            seed_if_empty(store, settings)
        app.state.store = store
        install_job_service(app, store, settings)
        from api.sim_clock import start_sim_clock

        # the simulated cloud's time runs COSTOPT_SIM_TIME_SCALE x faster than real time (None: a real cloud)
        app.state.sim_clock = start_sim_clock(settings, app.state.providers)
        issued = app.state.teams.bootstrap_admin()
        if issued is not None:
            # the one time this key is ever shown (only its hash is stored); never logged
            sys.stdout.write(f"costopt: admin key (shown once): {issued.secret}\n")
            sys.stdout.flush()
        scheduler = None
        if settings.collectors_enabled or settings.migration_jobs_enabled:
            from api.credentials import collector_names
            from api.scheduler import build_migration_jobs, build_scheduler

            scheduler = build_scheduler(
                store,
                # a cloud without credentials: its collectors are not scheduled, one log line says so
                build_sources(settings, collector_names(settings)) if settings.collectors_enabled else (),
                settings,
                migration=build_migration_jobs(settings, store) if settings.migration_jobs_enabled else None,
            )
            scheduler.start()
        app.state.scheduler = scheduler
        try:
            yield
        finally:
            if scheduler is not None:
                scheduler.shutdown(wait=False)
            if app.state.sim_clock is not None:
                app.state.sim_clock.stop()
            store.engine.dispose()

    app = FastAPI(
        title="costopt",
        version="0.1.0",
        description="Cross-cloud spot-market cost optimizer for ML training. Prices in USD per instance-hour; "
        "times in UTC.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.store = None
    app.state.sim_clock = None
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=settings.api_max_body_bytes)
    app.include_router(health.router)
    app.include_router(prices.router)
    app.include_router(plans.router)
    app.include_router(jobs.router)
    app.include_router(batches.router)
    app.include_router(admin.router)
    app.include_router(metrics.router)
    return app


def install_job_service(app: FastAPI, store: PriceStore, settings: Settings) -> None:
    """Put the job service's objects on ``app.state`` over ``store``'s database: ``teams``, ``jobs``,
    ``job_planner`` (the :class:`~costopt.jobs.placement.Placements` of the service), ``ledger`` (costs so
    far) and ``providers`` (by name, for the jobs' output)."""
    from api.job_planning import JobPlanner
    from api.wiring import build_cloud_providers
    from costopt.jobs.records import JobRepository
    from costopt.jobs.teams import TeamRepository
    from costopt.ledger.prices import StorePriceView
    from costopt.ledger.sql import SqlLedger

    engine = store.engine
    app.state.teams = TeamRepository(engine)
    app.state.jobs = JobRepository(engine)
    app.state.ledger = SqlLedger(engine, StorePriceView(store))
    app.state.job_planner = JobPlanner(store, settings, unavailable=build_unavailable(settings, engine))
    try:
        app.state.providers = {str(c.value): p for c, p in build_cloud_providers(settings, store).items()}
    except CostoptError as exc:
        log.warning("job output unavailable: the providers could not be built: %s", exc)
        app.state.providers = {}
