"""The FastAPI application: routes, startup (migrate, seed, schedule collectors, the job service and the
first admin key), metrics, one JSON error shape (:mod:`api.errors`) and the request body limit."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Protocol

from fastapi import FastAPI

from api import hot_path
from api.errors import BodyLimit, install_error_docs, install_error_handlers
from api.routes import (
    admin,
    batches,
    fleet_workers,
    fleets,
    health,
    jobs,
    metrics,
    plans,
    prices,
    report_page,
    reports,
)
from api.wiring import build_sources, build_store, seed_if_empty
from costopt.settings import Settings, get_settings
from pricing.store import PriceStore

if TYPE_CHECKING:
    from apscheduler.schedulers.base import BaseScheduler

    from api.scheduler import ServiceTime

log = logging.getLogger("costopt.api")

SHUTDOWN_WAIT_S = 20.0
"""How long the app's shutdown waits for the scheduled passes running then (the fleets' pass, a collector, the
engine's tick) before it closes the job service and the database engine under them."""


class _Stoppable(Protocol):
    def stop(self) -> None: ...

    def wait_idle(self, timeout: float) -> bool: ...


def stop_background(
    scheduler: BaseScheduler | None,
    fleet_executor: _Stoppable | None,
    timeout: float,
    *,
    clock: Callable[[float], object] | None = None,
) -> bool:
    """Stop the scheduled work and wait for what runs, ``timeout`` seconds at most in all: the fleet
    executor starts no new pass and ends a running one after the fleet it is at
    (:meth:`costopt.fleets.executor.FleetExecutor.stop`); the scheduler runs nothing more; ``clock`` (the
    simulated clock's ``stop``: the work waiting on it goes on) is called with the time left; then the
    scheduler's running jobs and the executor's pass are waited for. True when nothing runs any more;
    False (logged) when something still did at the deadline (a pass cut short there is taken up by the
    next process: its steps are idempotent)."""
    deadline = time.monotonic() + max(0.0, timeout)
    if fleet_executor is not None:
        fleet_executor.stop()
    waiter = None
    if scheduler is not None and scheduler.running:  # it submits nothing more, then waits for its pool
        waiter = threading.Thread(
            target=scheduler.shutdown, kwargs={"wait": True}, name="scheduler-shutdown", daemon=True
        )
        waiter.start()
    if clock is not None:
        clock(max(0.0, deadline - time.monotonic()))
    done = True
    if waiter is not None:
        waiter.join(max(0.0, deadline - time.monotonic()))
        done = not waiter.is_alive()
    if fleet_executor is not None:  # also a pass run by the stepped clock, not by the scheduler
        done = fleet_executor.wait_idle(max(0.0, deadline - time.monotonic())) and done
    if not done:
        log.warning("shutdown: a scheduled pass still ran after %.0f s; it is left to end or be cut short", timeout)
    return done


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

        # the simulated cloud's time runs COSTOPT_SIM_TIME_SCALE x faster than real time (None: a real cloud);
        # the stepped clock (COSTOPT_SIM_CLOCK=stepped) starts once it has the scheduled jobs it runs (below)
        app.state.sim_clock = start_sim_clock(settings, app.state.providers, start=settings.sim_clock != "stepped")
        issued = app.state.teams.bootstrap_admin()
        if issued is not None:
            # the one time this key is ever shown (only its hash is stored); never logged
            sys.stdout.write(f"costopt: admin key (shown once): {issued.secret}\n")
            sys.stdout.flush()
        scheduler = None
        if settings.collectors_enabled or settings.migration_jobs_enabled:
            from api.credentials import collector_names
            from api.rebalancing import build_rebalancer
            from api.scheduler import JobServiceJobs, build_scheduler
            from costopt.jobs.leases import LeaseStore

            service = app.state.job_service
            scheduler = build_scheduler(
                store,
                # a cloud without credentials: its collectors are not scheduled, one log line says so
                build_sources(settings, collector_names(settings)) if settings.collectors_enabled else (),
                settings,
                # the job service's migrators: one set per process (api/service.py)
                migration=service.migration if settings.migration_jobs_enabled else None,
                # the engine's tick and the rebalancer move jobs: with the migration jobs
                job_service=JobServiceJobs.from_settings(
                    settings, service.engine.tick, build_rebalancer(service, settings)
                )
                if settings.migration_jobs_enabled
                else None,
                # every scheduled job runs once per tick across the replicas sharing this database
                leases=LeaseStore(store.engine),
                # over the simulated cloud, job-side schedules count its (faster) time
                service_time=_service_time(settings, app.state.sim_clock),
            )
            scheduler.start()
        from api.fleet_service import add_fleet_job, fleet_executor_enabled

        if fleet_executor_enabled(settings):  # the fleets' rounds, once per tick across replicas
            from api.scheduler import new_scheduler
            from api.sim_clock import SteppedClockDriver
            from costopt.jobs.leases import LeaseStore

            if isinstance(app.state.sim_clock, SteppedClockDriver):  # in lockstep with the stepped clock
                from datetime import timedelta

                from api.fleet_service import FLEETS_JOB_ID, fleets_job
                from api.scheduler import OnServiceClock
                from api.ticks import Every

                stepped = app.state.sim_clock
                every = Every(timedelta(seconds=settings.fleet_tick))
                stepped.add_job(
                    FLEETS_JOB_ID, OnServiceClock(every, stepped.now, fleets_job, [app.state.fleet_executor])
                )
            else:
                if scheduler is None:
                    scheduler = new_scheduler()
                    scheduler.start()
                add_fleet_job(scheduler, app.state.fleet_executor, settings, LeaseStore(store.engine))
        app.state.scheduler = scheduler
        if app.state.sim_clock is not None:
            app.state.sim_clock.start()  # idempotent
        if settings.gc_freeze:  # what lives now lives as long as the process: out of the full GC passes
            from api.heap import settle
            from api.planning import planner_inputs

            try:  # the first quote's catalog, built before the heap settles
                planner_inputs(settings, store)
            except Exception as exc:  # the first quote will say it again, to its caller
                log.warning("the planner's catalog could not be built at start-up: %s", exc)
            settle()
        try:
            yield
        finally:
            # the scheduled passes first, waited for (bounded): none outlives the job service and the engine
            sim_clock = app.state.sim_clock
            stop_background(
                scheduler,
                getattr(app.state, "fleet_executor", None),
                SHUTDOWN_WAIT_S,
                clock=None if sim_clock is None else sim_clock.stop,
            )
            app.state.job_service.close()
            hot_path.shutdown(app)
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
    install_error_docs(app)  # the OpenAPI document declares the error answers in their one shape
    app.add_middleware(BodyLimit, max_bytes=settings.api_max_body_bytes)
    app.include_router(health.router)
    app.include_router(prices.router)
    app.include_router(plans.router)
    app.include_router(jobs.router)
    app.include_router(batches.router)
    app.include_router(fleets.router)
    app.include_router(fleet_workers.router)
    app.include_router(reports.router)
    app.include_router(report_page.router)
    app.include_router(admin.router)
    app.include_router(metrics.router)
    return app


def _service_time(settings: Settings, sim_clock: object) -> ServiceTime | None:
    """The job-side schedules on the simulated clock when the service runs one (None: wall clock)."""
    from api.scheduler import ServiceTime
    from api.sim_clock import SimClockDriver, SteppedClockDriver

    if not isinstance(sim_clock, SimClockDriver):
        return None
    # the stepped clock (COSTOPT_SIM_CLOCK=stepped) runs them itself, in lockstep with its steps
    stepper = sim_clock if isinstance(sim_clock, SteppedClockDriver) else None
    return ServiceTime(now=sim_clock.now, poll=settings.sim_tick, stepper=stepper)


def install_job_service(app: FastAPI, store: PriceStore, settings: Settings) -> None:
    """Build the job service over ``store``'s database (:func:`api.service.build_job_service`: one set of
    migrators shared by the engine, the watcher and the reconciler) and put its objects on ``app.state``:
    ``job_service``, ``teams``, ``jobs``, ``job_planner`` (the service's
    :class:`~costopt.jobs.placement.Placements`, which also quotes submissions), ``ledger`` (costs so far)
    and ``providers`` (by name, for the jobs' output). A service installed before is closed first."""
    from api.job_planning import JobPlanner
    from api.service import build_job_service

    old = getattr(app.state, "job_service", None)
    if old is not None:
        old.close()
    service = build_job_service(settings, store)
    app.state.job_service = service
    app.state.teams = service.teams
    app.state.jobs = service.repo
    app.state.ledger = service.ledger
    placements = service.placements
    app.state.job_planner = (
        placements
        if isinstance(placements, JobPlanner)
        else JobPlanner(store, settings, unavailable=service.unavailable)
    )
    app.state.providers = dict(service.providers)
    from api.fleet_service import build_fleet_executor

    app.state.fleet_executor = build_fleet_executor(settings, service)  # the fleets' rounds (scheduled at startup)
