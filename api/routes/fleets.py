"""``/v1/fleets``: lease fleets, follow them, scale them, release them (an API key is required).

Scope as for jobs: a member sees its own team's fleets only; another team's fleet id answers 404 and
changes nothing, exactly as an unknown id. An admin sees every team's.

``POST /v1/fleets`` stores the fleet ``active`` with its instances ``pending``; the service's round
executor launches them (each runs a worker) and shares them among the jobs submitted with ``fleet_id``
(``POST /v1/jobs``), round by round, under the fleet's policy. With an ``Idempotency-Key`` a retried
request returns the first fleet (200).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request, Response

from api.auth import Caller, CallerDep
from api.deps import JobPlannerDep, JobsDep, SettingsDep, StoreDep
from api.errors import ApiError
from api.fleet_schemas import FleetCreate, FleetPublic, FleetScale, FleetsListPublic
from api.fleets import (
    canonical_policy,
    check_active,
    fleet_not_found,
    instances_by_offer,
    instances_by_plan,
    render_fleet,
)
from api.job_planning import JobPlanner
from api.job_schemas import JobCreate
from api.tenancy import check_team
from costopt.fleets.model import (
    FLEET_PROVIDER,
    FleetError,
    FleetNotFound,
    FleetRecord,
    FleetStateError,
    NewFleet,
    seeded_fleet_id,
    seeded_id,
)
from costopt.fleets.store import FleetRepository, NewFleetJob
from costopt.jobs.records import JobRecord, JobRepository, NewJob

log = logging.getLogger("costopt.api")

router = APIRouter(prefix="/v1/fleets", tags=["fleets"])

FleetId = Annotated[str, Path(min_length=1, max_length=64, description="The fleet's id (fleet-...).")]
IdempotencyKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", max_length=200, description="A retry with the same key returns the first fleet."),
]


def fleet_repository(request: Request) -> FleetRepository:
    """The service's fleet repository (made once per app, on the job repository's database and clock)."""
    repo: FleetRepository | None = getattr(request.app.state, "fleets", None)
    jobs = getattr(request.app.state, "jobs", None)
    if repo is None or (jobs is not None and repo.engine is not jobs.engine):
        if jobs is None:
            raise ApiError(503, "unavailable", "the job service is starting: retry shortly")
        repo = FleetRepository(jobs.engine, now=jobs.now)
        request.app.state.fleets = repo
    return repo


def get_fleet(repo: FleetRepository, caller: Caller, fleet_id: str) -> FleetRecord:
    try:
        return repo.get(fleet_id, caller.scope)
    except FleetNotFound as exc:
        raise fleet_not_found(fleet_id) from exc


def _render(request: Request, repo: FleetRepository, jobs: JobsDep, fleet: FleetRecord) -> FleetPublic:
    return render_fleet(fleet, repo, jobs, getattr(request.app.state, "ledger", None))


@router.post(
    "",
    status_code=201,
    response_model=FleetPublic,
    responses={200: {"model": FleetPublic, "description": "the Idempotency-Key was used before: the first fleet"}},
)
def create_fleet(
    body: FleetCreate,
    request: Request,
    response: Response,
    caller: CallerDep,
    jobs: JobsDep,
    store: StoreDep,
    planner: JobPlannerDep,
    settings: SettingsDep,
    idempotency_key: IdempotencyKey = None,
) -> FleetPublic:
    """Lease a fleet: its instances (by offer, or the planner's cheapest for GPUs per accelerator), the
    Gavel policy that shares it (422 listing the known ones for an unknown name) and the round length."""
    repo = fleet_repository(request)
    if idempotency_key is not None:
        first = repo.by_idempotency_key(caller.team_id, idempotency_key)
        if first is not None:
            response.status_code = 200
            return _render(request, repo, jobs, first)
    policy = canonical_policy(body.policy)
    if body.instances is not None:
        instances = instances_by_offer(body.instances, store, settings, planner, field="instances")
    else:
        assert body.plan is not None
        instances = instances_by_plan(body.plan, store, settings, planner, field="plan")
    check_team(request.app.state.teams, caller.team_id, settings, providers=[i.provider for i in instances])
    spec = body.model_dump(mode="json")
    spec["policy"] = policy
    ids: dict[str, str] = {}
    if settings.job_id_seed is not None and idempotency_key is not None:  # a drill's runs compare fleet by fleet
        team = request.app.state.teams.team(caller.team_id)
        fleet_id = seeded_fleet_id(
            settings.job_id_seed, team.name if team is not None else caller.team_id, idempotency_key
        )
        ids["fleet_id"] = fleet_id
        instances = [
            dataclasses.replace(inst, instance_id=seeded_id("fi-", settings.job_id_seed, fleet_id, str(n)))
            for n, inst in enumerate(instances)
        ]
    try:
        fleet, created = repo.create(
            NewFleet(
                team_id=caller.team_id,
                policy=policy,
                instances=tuple(instances),
                round_s=body.round_s,
                resolve_rounds=body.resolve_every_rounds,
                name=body.name,
                spec=spec,
                idempotency_key=idempotency_key,
                **ids,
            )
        )
    except FleetError as exc:
        raise ApiError(422, "invalid_request", str(exc)) from exc
    if not created:
        response.status_code = 200
    else:
        log.info("fleet %s (%d instances, %s) leased by key %s", fleet.id, len(instances), policy, caller.key_id)
    return _render(request, repo, jobs, fleet)


@router.get("", response_model=FleetsListPublic)
def list_fleets(
    request: Request,
    caller: CallerDep,
    jobs: JobsDep,
    team: Annotated[str | None, Query(max_length=64, description="Admins: one team's fleets.")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> FleetsListPublic:
    """Fleets oldest first, ``limit`` at a time."""
    repo = fleet_repository(request)
    if not caller.is_admin and team is not None and team != caller.team_id:
        raise ApiError(403, "forbidden", "a member key lists its own team's fleets only: drop ?team=")
    scope = team if caller.is_admin else caller.team_id
    try:
        page = repo.page(team_id=scope, limit=limit, cursor=cursor)
    except ValueError as exc:
        raise ApiError(422, "invalid_request", str(exc), [{"field": "query.cursor", "problem": str(exc)}]) from exc
    return FleetsListPublic(
        total=page.total, items=[_render(request, repo, jobs, f) for f in page.items], next_cursor=page.next_cursor
    )


@router.get("/{fleet_id}", response_model=FleetPublic)
def show_fleet(fleet_id: FleetId, request: Request, caller: CallerDep, jobs: JobsDep) -> FleetPublic:
    """The fleet: instances and GPUs, the allocation in force, the current round's leases, each job's
    throughput and progress, and the cost so far."""
    repo = fleet_repository(request)
    return _render(request, repo, jobs, get_fleet(repo, caller, fleet_id))


@router.post("/{fleet_id}/scale", response_model=FleetPublic)
def scale_fleet(
    fleet_id: FleetId,
    body: FleetScale,
    request: Request,
    caller: CallerDep,
    jobs: JobsDep,
    store: StoreDep,
    planner: JobPlannerDep,
    settings: SettingsDep,
) -> FleetPublic:
    """Add instances (``add`` by offer, ``add_plan`` by GPUs per accelerator) and drain others
    (``remove``: their jobs checkpoint and move at the next round, then they are terminated)."""
    repo = fleet_repository(request)
    fleet = get_fleet(repo, caller, fleet_id)
    check_active(fleet)
    new = instances_by_offer(body.add, store, settings, planner, field="add") if body.add else []
    if body.add_plan is not None:
        new += instances_by_plan(body.add_plan, store, settings, planner, field="add_plan")
    check_team(request.app.state.teams, caller.team_id, settings, providers=[i.provider for i in new])
    try:
        if body.remove:
            repo.drain(fleet.id, body.remove)
        repo.add_instances(fleet.id, new)
    except FleetNotFound as exc:
        raise ApiError(404, "not_found", str(exc), [{"field": "remove", "problem": str(exc)}]) from exc
    except FleetStateError as exc:
        raise ApiError(409, "fleet_released", str(exc)) from exc
    log.info("fleet %s scaled by key %s: +%d, -%d", fleet.id, caller.key_id, len(new), len(body.remove))
    return _render(request, repo, jobs, repo.get(fleet.id))


@router.post("/{fleet_id}/release", status_code=202, response_model=FleetPublic)
def release_fleet(fleet_id: FleetId, request: Request, caller: CallerDep, jobs: JobsDep) -> FleetPublic:
    """Release the fleet: its unfinished jobs checkpoint and stop (cancelled), its instances are
    terminated. Idempotent."""
    repo = fleet_repository(request)
    fleet = get_fleet(repo, caller, fleet_id)
    released = repo.release(fleet.id)
    log.info("fleet %s released by key %s", fleet.id, caller.key_id)
    return _render(request, repo, jobs, released)


def submit_to_fleet(
    request: Request,
    caller: Caller,
    jobs: JobRepository,
    planner: JobPlanner,
    body: JobCreate,
    spec: dict[str, Any],
    job_id: str,
    idempotency_key: str | None,
) -> tuple[JobRecord, bool]:
    """``POST /v1/jobs`` with ``fleet_id``: queue the job in the fleet (its ``jobs`` row, provider
    ``fleet``, then its fleet row) and return ``(job, created)`` (``created`` False: the idempotency key
    was used before, the first job). Refused with a reason: 422 ``unknown_fleet`` (none the caller may
    see), 409 ``fleet_released``, 422 ``fleet_cannot_run`` (no instance has enough GPUs, or the
    throughput is unknown on every worker type of the fleet); :class:`UnknownJobType` for a job type the
    catalog does not know (the caller's 422)."""
    from api.fleets import job_admission, refused

    if idempotency_key is not None:
        first = jobs.by_idempotency_key(caller.team_id, idempotency_key)
        if first is not None:
            return first, False
    repo = fleet_repository(request)
    assert body.fleet_id is not None
    try:
        fleet = repo.get(body.fleet_id, caller.scope)
    except FleetNotFound as exc:
        raise ApiError(
            422,
            "unknown_fleet",
            f"no fleet {body.fleet_id!r}: `GET /v1/fleets` lists your fleets",
            [{"field": "fleet_id", "problem": "unknown fleet"}],
        ) from exc
    check_active(fleet)
    adm, rates = job_admission(spec, repo.instances(fleet.id), planner)
    if not adm.ok:
        raise refused(fleet.id, adm)
    spec["fleet_id"] = fleet.id
    spec["fleet_throughput"] = rates  # what the fleet row holds, so the executor can rebuild it from the job
    job, created = jobs.insert(
        NewJob(
            team_id=caller.team_id,
            spec=spec,
            steps_total=body.steps,
            provider=FLEET_PROVIDER,
            name=body.name,
            quote=None,
            idempotency_key=idempotency_key,
            job_id=job_id,
        )
    )
    if created:
        repo.add_job(
            NewFleetJob(
                job_id=job.id,
                fleet_id=fleet.id,
                team_id=job.team_id,
                gpus=body.gpus,
                throughput=rates,
                steps_total=body.steps,
                arrived_at=job.created_at,
                weight=body.weight,
                slo_s=body.slo_s,
            )
        )
        log.info("job %s submitted into fleet %s by key %s", job.id, fleet.id, caller.key_id)
    return job, created
