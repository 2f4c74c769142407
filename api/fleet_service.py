"""The fleets' service objects: the round executor and the workers' sync, built from the settings and the
job service (one set of providers, one clock, one ledger), and the scheduled ``fleets`` job.

The executor runs once per tick across replicas under the ``fleets`` lease (:func:`api.ticks.
add_leased_job`), every ``COSTOPT_FLEET_TICK`` seconds. Fleet instances are launched on every provider of
the service: ``local`` runs the worker as a process, a cloud's boot script runs it, and the simulated cloud
runs a simulated worker (:mod:`providers.sim_worker`) when the service runs on its clock
(``COSTOPT_PROVIDER=sim``): its syncs go to the service's :class:`~costopt.fleets.sync.WorkerSync` in
process (:func:`in_process_transport`), through the sync route's own request and answer models.
"""

from __future__ import annotations

import contextlib
import ipaddress
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from costopt.agent.worker import Transport, WorkerConfig, WorkerError
from costopt.fleets.executor import FleetExecutor
from costopt.fleets.store import FleetRepository
from costopt.fleets.sync import WorkerRefused, WorkerSync
from costopt.settings import Settings

if TYPE_CHECKING:
    from apscheduler.schedulers.base import BaseScheduler

    from api.service import JobService
    from costopt.jobs.leases import LeaseStore
    from providers.sim import SimCloud

__all__ = [
    "FLEETS_JOB_ID",
    "add_fleet_job",
    "build_fleet_executor",
    "build_worker_sync",
    "fleet_executor_enabled",
    "in_process_transport",
    "service_url_problem",
    "worker_command",
    "worker_env",
]

FLEETS_JOB_ID = "fleets"
SIM_DEAD_AFTER_POLLS = 3
"""On the simulated clock, a fleet instance is lost after at least this many of its worker's heartbeats
(``SimConfig.worker_poll``) without a sync."""


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


def worker_env(settings: Settings) -> dict[str, str]:
    """The variables every fleet worker gets besides its identity (the executor adds the service URL, fleet,
    worker id, token and GPUs): its poll interval, ``COSTOPT_FLEET_WORKER_POLL``."""
    return {"COSTOPT_WORKER_POLL": repr(float(settings.fleet_worker_poll))}


IN_PROCESS_PROVIDERS = ("local", "sim")
"""Providers whose fleet workers run on this machine (a process, or in the service's process)."""


def service_url_problem(settings: Settings, provider: str) -> str | None:
    """Why a fleet worker on an instance of ``provider`` could not reach ``COSTOPT_SERVICE_URL`` (None: it
    can, as far as the service can tell): a cloud instance cannot reach a loopback address (``localhost``,
    127.0.0.0/8, ``::1``), nor a URL that is not http(s) with a host. ``local`` and ``sim`` run their workers
    on this machine: never a problem."""
    if provider in IN_PROCESS_PROVIDERS:
        return None
    url = settings.service_url
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    fix = "set COSTOPT_SERVICE_URL to the URL this service is reached at from the cloud's instances"
    if parts.scheme not in ("http", "https") or not host:
        return f"COSTOPT_SERVICE_URL {url!r} is not an http(s) URL with a host: {fix}"
    loopback = host == "localhost" or host.endswith(".localhost")
    with contextlib.suppress(ValueError):
        loopback = loopback or ipaddress.ip_address(host).is_loopback
    if loopback:
        return (
            f"COSTOPT_SERVICE_URL {url!r} is a loopback address a {provider} instance cannot reach (its worker "
            f"would never sync and the instance would be replaced again and again): {fix}"
        )
    return None


def build_fleet_executor(settings: Settings, service: JobService) -> FleetExecutor:
    """The executor over the job service's database, clock and providers (by name), billing the fleets to
    the service's ledger (:class:`costopt.fleets.billing.FleetBilling`)."""
    from costopt.fleets.billing import FleetBilling

    repo = FleetRepository(service.repo.engine, now=service.clock)
    prices = getattr(service.ledger, "prices", None)
    billing = None if prices is None else FleetBilling(repo, service.ledger, prices)
    providers = dict(service.providers)
    dead_after = settings.fleet_dead_after
    sim = _service_sim(settings, providers)
    if sim is None:
        providers.pop("sim", None)  # its time is not the service's: its instances wait, saying why
    else:
        sim.attach_fleet(in_process_transport(build_worker_sync(settings, service)))
        dead_after = max(dead_after, SIM_DEAD_AFTER_POLLS * sim.config.worker_poll.total_seconds())
    return FleetExecutor(
        repo,
        service.repo,
        providers,
        worker_command=lambda provider: worker_command(settings, provider),
        service_url=settings.service_url,
        worker_env=worker_env(settings),
        dead_after_s=dead_after,
        boot_timeout_s=settings.fleet_boot_timeout,
        billing=billing,
        grid_s=settings.fleet_tick,
        restart_overhead_s=settings.fleet_restart_overhead,
        id_seed=settings.job_id_seed,
        unreachable={name: why for name in providers if (why := service_url_problem(settings, name)) is not None},
    )


def build_worker_sync(settings: Settings, service: JobService) -> WorkerSync:
    return WorkerSync(
        FleetRepository(service.repo.engine, now=service.clock), service.repo, poll_s=settings.fleet_worker_poll
    )


def _service_sim(settings: Settings, providers: Mapping[str, Any]) -> SimCloud | None:
    """The simulated cloud when the service runs on its clock (``COSTOPT_PROVIDER=sim``), else None."""
    from providers.sim import SimCloud

    sim = providers.get("sim")
    return sim if settings.provider == "sim" and isinstance(sim, SimCloud) else None


def in_process_transport(sync: WorkerSync) -> Callable[[WorkerConfig], Transport]:
    """The transport of workers that live in the service's process (the simulated cloud's): each sync is
    what ``POST /v1/fleet-workers/{id}/sync`` does, without a socket: the request validated by the route's
    model, :meth:`WorkerSync.sync` with the worker's own token, the answer through the route's model. A
    refused token is :class:`~costopt.agent.worker.WorkerError` (the route's 401); any other failure an
    ``OSError`` (its 500: the worker retries at its next sync)."""
    from api.routes.fleet_workers import SyncIn, SyncOut

    def for_worker(config: WorkerConfig) -> Transport:
        route = f"/v1/fleet-workers/{config.worker_id}/sync"

        def post(path: str, doc: Mapping[str, Any]) -> Mapping[str, Any]:
            if path != route:
                raise OSError(f"no route {path} for worker {config.worker_id}")
            try:
                body = SyncIn.model_validate(doc)
                answer = sync.sync(config.worker_id, config.token, body.model_dump())
                out: Mapping[str, Any] = SyncOut.model_validate(answer).model_dump(mode="json")
            except WorkerRefused as exc:
                raise WorkerError(f"the service refused this worker (401): {exc}") from exc
            except Exception as exc:
                raise OSError(f"the service failed the sync: {type(exc).__name__}: {exc}") from exc
            return out

        return post

    return for_worker


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
