"""``/v1/fleet-workers/{worker_id}/sync``: the fleet workers' one route (:mod:`costopt.agent.worker`).

A worker authenticates with its own token (``Authorization: Bearer <token>``, given to its instance at
launch; only its SHA-256 is stored), never a team's key. It reports its copies and gets the desired state
back (:class:`costopt.fleets.sync.WorkerSync`). An unknown worker or a wrong token is a 401.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

from api.errors import ApiError
from costopt.fleets.sync import WorkerRefused, WorkerSync

router = APIRouter(prefix="/v1/fleet-workers", tags=["fleets"])

_bearer = HTTPBearer(auto_error=False, description="The worker's token (COSTOPT_WORKER_TOKEN)")
WorkerId = Annotated[str, Path(min_length=1, max_length=64, description="The fleet instance's id (fi-...).")]
Step = Annotated[int | None, Field(ge=0, le=10**15)]


class CopyReport(BaseModel):
    """One copy the worker runs or ran: its job and epoch, and what its agent's log says."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    job_id: Annotated[str, Field(min_length=1, max_length=64)]
    epoch: Annotated[int, Field(ge=0, le=10**9)]
    state: Literal["running", "exited"]
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    step: Step = None
    restored_step: Step = None
    checkpoint_step: Step = None
    done: bool = False
    last_report_at: float | None = None


class SyncIn(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    copies: Annotated[list[CopyReport], Field(max_length=1000)] = []
    gpus: int | None = None
    stopping: bool = False
    at: float | None = None


class LeaseOut(BaseModel):
    job_id: str
    epoch: int
    gpus: list[int]
    command: list[str]
    env: dict[str, str]
    checkpoint_uri: str
    steps_total: int


class CopyKey(BaseModel):
    job_id: str
    epoch: int


class SyncOut(BaseModel):
    """The desired state: the copies that may run on this instance now (``run``), the exited copies the
    service recorded (``ack``), and ``release``: the instance left the fleet (stop everything and end).
    ``round_ends_at`` and ``waiting`` tell the worker when to sync next (at the round's end; soon while a
    lease waits for a copy elsewhere to stop)."""

    round: int
    round_ends_at: str | None
    poll_s: float
    run: list[LeaseOut]
    waiting: int = Field(description="Leases of this round waiting for their job's previous copy to stop")
    ack: list[CopyKey]
    release: bool


def worker_sync(request: Request) -> WorkerSync:
    sync: WorkerSync | None = getattr(request.app.state, "fleet_sync", None)
    jobs = getattr(request.app.state, "jobs", None)
    if jobs is None:
        raise ApiError(503, "unavailable", "the job service is starting: retry shortly")
    if sync is None or sync.jobs is not jobs:
        from costopt.fleets.store import FleetRepository

        settings = request.app.state.settings
        sync = WorkerSync(FleetRepository(jobs.engine, now=jobs.now), jobs, poll_s=settings.fleet_worker_poll)
        request.app.state.fleet_sync = sync
    return sync


@router.post("/{worker_id}/sync", response_model=SyncOut)
def sync_worker(
    worker_id: WorkerId,
    body: SyncIn,
    sync: Annotated[WorkerSync, Depends(worker_sync)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Any:
    """Record the worker's report and answer its desired state (401 for an unknown worker or a wrong token)."""
    if credentials is None or not credentials.credentials:
        raise ApiError(401, "unauthorized", "a fleet worker sends its token: Authorization: Bearer <token>")
    try:
        return sync.sync(worker_id, credentials.credentials, body.model_dump())
    except WorkerRefused as exc:
        raise ApiError(401, "unauthorized", str(exc)) from exc
