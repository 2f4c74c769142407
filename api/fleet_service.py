"""The fleets' service objects: the round executor and the workers' sync, built from the settings and the
job service (one set of providers, one clock, one ledger), and the scheduled ``fleets`` job.

The executor runs once per tick across replicas under the ``fleets`` lease (:func:`api.ticks.
add_leased_job`), every ``COSTOPT_FLEET_TICK`` seconds. Fleet instances are launched on the providers
that can run a worker process: ``local`` and the clouds (their boot script runs the worker); the simulated
cloud runs none, so a fleet's instances on ``sim`` stay pending (planned in docs/fleets.md).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from costopt.fleets.executor import FleetExecutor
from costopt.fleets.store import FleetRepository
from costopt.fleets.sync import WorkerSync
from costopt.settings import Settings

if TYPE_CHECKING:
    from apscheduler.schedulers.base import BaseScheduler

    from api.service import JobService
    from costopt.jobs.leases import LeaseStore

__all__ = ["FLEETS_JOB_ID", "add_fleet_job", "build_fleet_executor", "build_worker_sync", "fleet_executor_enabled"]

FLEETS_JOB_ID = "fleets"
NO_WORKER_PROVIDERS = frozenset({"sim"})
"""Providers whose instances run no worker process."""


def fleet_executor_enabled(settings: Settings) -> bool:
    return (
        settings.migration_jobs_enabled if settings.fleet_executor_enabled is None else settings.fleet_executor_enabled
    )


def worker_command(settings: Settings, provider: str) -> Sequence[str]:
    """The command a fleet instance of ``provider`` runs: ``COSTOPT_FLEET_WORKER_COMMAND``, else the worker
    module under this service's own Python (local) or ``python3`` (a cloud's image)."""
    if settings.fleet_worker_command:
        return shlex.split(settings.fleet_worker_command)
    python = sys.executable if provider == "local" else "python3"
    return [python, "-m", "costopt.agent.worker"]


def build_fleet_executor(settings: Settings, service: JobService) -> FleetExecutor:
    """The executor over the job service's database, clock and providers (by name), billing the fleets to
    the service's ledger (:class:`costopt.fleets.billing.FleetBilling`)."""
    from costopt.fleets.billing import FleetBilling

    repo = FleetRepository(service.repo.engine, now=service.clock)
    prices = getattr(service.ledger, "prices", None)
    billing = None if prices is None else FleetBilling(repo, service.ledger, prices)
    providers = {name: p for name, p in service.providers.items() if name not in NO_WORKER_PROVIDERS}
    return FleetExecutor(
        repo,
        service.repo,
        providers,
        worker_command=lambda provider: worker_command(settings, provider),
        service_url=settings.service_url,
        worker_env={"COSTOPT_WORKER_POLL": repr(float(settings.fleet_worker_poll))},
        dead_after_s=settings.fleet_dead_after,
        boot_timeout_s=settings.fleet_boot_timeout,
        billing=billing,
        grid_s=settings.fleet_tick,
    )


def build_worker_sync(settings: Settings, service: JobService) -> WorkerSync:
    return WorkerSync(
        FleetRepository(service.repo.engine, now=service.clock), service.repo, poll_s=settings.fleet_worker_poll
    )


def fleets_job(executor: FleetExecutor) -> None:
    report = executor.tick()
    for err in report.errors:
        import logging

        logging.getLogger("costopt.fleets").warning("fleet executor: %s", err)


def add_fleet_job(
    scheduler: BaseScheduler, executor: FleetExecutor, settings: Settings, leases: LeaseStore | None
) -> Any:
    """The ``fleets`` job: :meth:`FleetExecutor.tick` every ``COSTOPT_FLEET_TICK`` seconds, once per tick
    across replicas (under ``leases``)."""
    from api.ticks import Every, add_leased_job

    return add_leased_job(
        scheduler,
        FLEETS_JOB_ID,
        "run the fleets' rounds",
        Every(timedelta(seconds=settings.fleet_tick)),
        fleets_job,
        [executor],
        leases=leases,
        lease_ttl=settings.scheduler_lease_ttl,
    )
