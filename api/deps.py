"""FastAPI dependencies: the application's store, settings, job repository and job planner, set at
startup (the caller's identity is :mod:`api.auth`'s).

They are ``async def``: they only read ``app.state``, and FastAPI runs a plain ``def`` dependency in its
thread pool (a thread hop per dependency per request, measurable at hundreds of requests/s)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request

from api.job_planning import JobPlanner
from costopt.jobs.records import JobRepository
from costopt.settings import Settings
from pricing.store import PriceStore


async def get_store(request: Request) -> PriceStore:
    store: PriceStore | None = getattr(request.app.state, "store", None)
    if store is None:
        raise HTTPException(status_code=503, detail="the price store is not ready yet; retry shortly")
    return store


async def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


StoreDep = Annotated[PriceStore, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]


async def get_jobs(request: Request) -> JobRepository:
    """The job repository (``app.state.jobs``, set at startup)."""
    jobs: JobRepository | None = getattr(request.app.state, "jobs", None)
    if jobs is None:
        raise HTTPException(status_code=503, detail="the job service is not ready yet; retry shortly")
    return jobs


async def get_job_planner(request: Request) -> JobPlanner:
    """The job planner (``app.state.job_planner``, set at startup)."""
    planner: JobPlanner | None = getattr(request.app.state, "job_planner", None)
    if planner is None:
        raise HTTPException(status_code=503, detail="the job planner is not ready yet; retry shortly")
    return planner


JobsDep = Annotated[JobRepository, Depends(get_jobs)]
JobPlannerDep = Annotated[JobPlanner, Depends(get_job_planner)]
