"""The FastAPI application: routes, startup (migrate, seed, schedule collectors), metrics."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api.routes import health, metrics, plans, prices
from api.wiring import build_sources, build_store, seed_if_empty
from costopt.settings import Settings, get_settings

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
    app.include_router(health.router)
    app.include_router(prices.router)
    app.include_router(plans.router)
    app.include_router(metrics.router)
    return app
