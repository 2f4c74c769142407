"""``/v1/jobs``: submit managed jobs, list and follow them, cancel them (an API key is required).

Scope: a member sees its own team's jobs only; another team's job id answers 404 and changes nothing,
exactly as an unknown id. An admin sees every team's (``?team=`` filters).

``POST /v1/jobs`` plans the job at once (the quote, whole-instance priced: what the ledger will bill) and
stores it ``queued``; the engine launches it. With an ``Idempotency-Key`` (<= 200 characters) a retried
submission returns the first job (200) and creates nothing, also when retries race.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request, Response
from sqlalchemy.engine import Connection

from api.auth import Caller, CallerDep
from api.deps import JobPlannerDep, JobsDep, SettingsDep
from api.errors import ApiError
from api.hot_path import blocking, json_of
from api.job_planning import JobInfeasible, JobPlanner, UnknownJobType
from api.job_schemas import (
    EventPublic,
    EventsListPublic,
    JobCreate,
    JobPublic,
    JobsListPublic,
    LogCopyPublic,
    LogsPublic,
    MovePublic,
    OfferPublic,
    PlacementPublic,
    QuotePublic,
)
from api.tenancy import check_team
from costopt.domain import OfferKey
from costopt.jobs.costs import page_costs
from costopt.jobs.model import JobState
from costopt.jobs.records import (
    JobEvent,
    JobNotFound,
    JobRecord,
    JobRepository,
    NewJob,
    new_job_id,
    seeded_job_id,
)
from costopt.jobs.view import MoveView, job_view, launched
from costopt.planning.model import InvalidJob
from costopt.settings import Settings
from costopt.throughput.model import DEFAULT_PRECISION

log = logging.getLogger("costopt.api")

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

JobId = Annotated[str, Path(min_length=1, max_length=64, description="The job's id (job-...).")]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        max_length=200,
        description="Any string <= 200 characters: a retry with the same key returns the first job.",
    ),
]


# -- rendering -----------------------------------------------------------------------------------------


def _offer_public(doc: Mapping[str, Any] | None) -> OfferPublic | None:
    if not doc:
        return None
    return OfferPublic(
        cloud=str(doc.get("cloud", "")),
        region=str(doc.get("region", "")),
        zone=str(doc.get("zone", "")),
        instance_type=str(doc.get("instance_type", "")),
        market=str(doc.get("market", "")),
        accelerator=doc.get("accelerator"),
        gpu_count=doc.get("gpu_count"),
    )


def _known_offer(job: JobRecord, key: OfferKey) -> Mapping[str, Any] | None:
    """The quote's description of ``key`` (accelerator, GPUs), when the quote holds it."""
    quote = job.quote or {}
    for cand in [quote, *quote.get("candidates", [])]:
        offer = cand.get("offer") if isinstance(cand, Mapping) else None
        if isinstance(offer, Mapping):
            try:
                if OfferKey.from_doc(offer) == key:
                    found: Mapping[str, Any] = cand
                    return found
            except (KeyError, ValueError):
                continue
    return None


def _placement(request: Request, job: JobRecord) -> PlacementPublic | None:
    """Where the job runs now; the accelerator and GPU count from its quote, or else the store's
    instance catalog (a job moved off its quoted candidates)."""
    if job.offer is None:
        return None
    known = _known_offer(job, job.offer) or {}
    offer = known.get("offer") or {}
    accelerator, gpus = offer.get("accelerator"), offer.get("gpu_count")
    store = getattr(request.app.state, "store", None)
    if accelerator is None and store is not None:
        found = next((t for t in store.instance_types(job.offer.cloud) if t.name == job.offer.instance_type), None)
        if found is not None:
            accelerator, gpus = found.accelerator, float(found.gpu_count)
    return PlacementPublic(
        **job.offer.to_doc(),
        accelerator=accelerator,
        gpu_count=gpus,
        usd_per_hour=float(job.usd_per_hour) if job.usd_per_hour is not None else None,
    )


def _quote(job: JobRecord) -> QuotePublic | None:
    q = job.quote
    if not q or "offer" not in q:
        return None
    offer = _offer_public(q.get("offer"))
    assert offer is not None
    return QuotePublic(
        offer=offer,
        usd_per_hour=float(q["usd_per_hour"]),
        expected_hours=float(q["expected_hours"]),
        expected_cost_usd=str(q["expected_cost_usd"]),
        steps_per_s=q.get("steps_per_s"),
        as_of=q.get("as_of"),
        reason=q.get("reason"),
    )


def _offer_key_public(key: OfferKey | None) -> OfferPublic | None:
    return None if key is None else OfferPublic(**key.to_doc())


def _move(m: MoveView) -> MovePublic:
    return MovePublic(
        at=m.at,
        kind=m.kind,
        reason=m.reason,
        cost_usd=str(m.cost_usd) if m.cost_usd is not None else None,
        from_=_offer_key_public(m.from_offer),
        to=_offer_key_public(m.to_offer),
    )


def render_job(
    request: Request,
    jobs: JobRepository,
    job: JobRecord,
    *,
    now: datetime | None = None,
    events: Sequence[JobEvent] | None = None,
    conn: Connection | None = None,
    costs: Mapping[str, Decimal] | None = None,
) -> JobPublic:
    """A job as the API shows it: the record, its quote and placement, and the live figures of
    :func:`costopt.jobs.view.job_view` (ETA, the ledger's cost so far, moves and preemptions with their
    reason and cost) at the service's now. ``events``: the job's events when read already (a page's,
    :meth:`JobRepository.events_of`; None: read here). ``conn``: the request's connection
    (:meth:`JobRepository.reading`): the events and the ledger are read on it (None: on their own).
    ``costs``: a page's costs read at once (:func:`~costopt.jobs.costs.page_costs`; None: this job's here)."""
    at = now or jobs.now()
    spec = job.spec
    view = job_view(
        job,
        jobs.events(job.id, conn=conn) if events is None else events,
        ledger=getattr(request.app.state, "ledger", None),
        placements=request.app.state.job_planner,
        at=at,
        conn=conn,
        costs=costs,
    )
    return JobPublic(
        id=job.id,
        team_id=job.team_id,
        batch_id=job.batch_id,
        name=job.name,
        state=job.state,
        reason=job.reason,
        job_type=spec.get("job_type"),
        throughput=spec.get("throughput"),
        steps_total=job.steps_total,
        steps_done=view.steps_done,
        gpus=int(spec.get("gpus", 1)),
        precision=str(spec.get("precision") or DEFAULT_PRECISION),
        objective={k: v for k, v in (spec.get("objective") or {}).items() if v is not None},
        constraints={k: v for k, v in (spec.get("constraints") or {}).items() if v is not None},
        command=list(spec.get("command") or []),
        image=spec.get("image"),
        checkpoint_uri=str(spec.get("checkpoint_uri", "")),
        provider=job.provider,
        placement=_placement(request, job),
        quote=_quote(job),
        eta=view.eta,
        cost_so_far_usd=str(view.cost_so_far_usd) if view.cost_so_far_usd is not None else None,
        moves=[_move(m) for m in view.moves],
        exit_code=view.exit_code,
        cancel_requested_at=job.cancel_requested_at,
        created_at=job.created_at,
        updated_at=job.updated_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        fleet_id=spec.get("fleet_id"),
    )


# -- helpers shared with the batch routes ------------------------------------------------------------------


def job_spec(body: JobCreate, job_id: str, settings: Settings) -> dict[str, Any]:
    """The normalized submission stored with the job (JSON values; the checkpoint URI defaulted)."""
    spec = body.model_dump(mode="json", exclude={"name"})
    if not spec.get("checkpoint_uri"):
        spec["checkpoint_uri"] = f"{settings.checkpoint_root.rstrip('/')}/{job_id}"
    return spec


def provider_for(quote: Mapping[str, Any], settings: Settings) -> str:
    """The provider that will run the job: the planned offer's cloud when the service runs it, else the
    service's default provider (e.g. ``sim``, which runs every cloud's offers)."""
    cloud = str((quote.get("offer") or {}).get("cloud", ""))
    return cloud if cloud in settings.all_providers() else settings.provider


def planning_error(exc: UnknownJobType | JobInfeasible | InvalidJob) -> ApiError:
    """The 422 of a job that cannot be planned."""
    if isinstance(exc, InvalidJob):
        return ApiError(422, "invalid_request", str(exc), [{"field": "objective", "problem": str(exc)}])
    if isinstance(exc, UnknownJobType):
        return ApiError(
            422,
            "unknown_job_type",
            str(exc),
            [{"field": "job_type", "problem": f"unknown job type {exc.name!r}", "did_you_mean": exc.matches}],
        )
    return ApiError(422, "infeasible", str(exc), [{"binding": exc.binding}])


def not_found(job_id: str) -> ApiError:
    """The 404 of a job the caller may not see: the same for another team's as for none."""
    return ApiError(404, "not_found", f"no job {job_id!r}: `costopt jobs list` shows your jobs")


def get_job(jobs: JobRepository, caller: Caller, job_id: str, conn: Connection | None = None) -> JobRecord:
    """The job, when the caller may see it (404 otherwise, the same for another team's as for none)."""
    try:
        return jobs.get(job_id, caller.scope, conn=conn)
    except JobNotFound as exc:
        raise not_found(job_id) from exc


def parse_states(state: str | None) -> list[JobState] | None:
    if state is None or not state.strip():
        return None
    out: list[JobState] = []
    for part in state.split(","):
        try:
            out.append(JobState(part.strip().lower()))
        except ValueError as exc:
            raise ApiError(
                422,
                "invalid_request",
                f"unknown state {part.strip()!r}: choose from {', '.join(s.value for s in JobState)}",
                [{"field": "query.state", "problem": f"unknown state {part.strip()!r}"}],
            ) from exc
    return out


def scope_for_listing(caller: Caller, team: str | None) -> str | None:
    """The team a listing is limited to: the member's own; an admin's ``team`` filter (None: all)."""
    if caller.is_admin:
        return team
    if team is not None and team != caller.team_id:
        raise ApiError(403, "forbidden", "a member key lists its own team's jobs only: drop ?team=")
    return caller.team_id


# -- routes ----------------------------------------------------------------------------------------------


@router.post(
    "",
    status_code=201,
    response_model=JobPublic,
    responses={200: {"model": JobPublic, "description": "the Idempotency-Key was used before: the first job"}},
)
async def submit_job(
    body: JobCreate,
    request: Request,
    caller: CallerDep,
    jobs: JobsDep,
    planner: JobPlannerDep,
    settings: SettingsDep,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Plan the job (the quote) and queue it; 422 ``unknown_job_type`` (with close matches) or
    ``infeasible`` (naming the binding constraint) when it cannot be planned. The job and its event are
    written in one transaction that is also the idempotency check (a key the team used already inserts
    nothing and answers the first job, 200), and rendered from what was written (nothing read back).
    The work runs on the read pool and the body is serialized once (api/hot_path.py), as for reads."""
    job, status = await blocking(request, _submit_job, body, request, caller, jobs, planner, settings, idempotency_key)
    return json_of(job, status)


def _submit_job(
    body: JobCreate,
    request: Request,
    caller: Caller,
    jobs: JobRepository,
    planner: JobPlanner,
    settings: Settings,
    idempotency_key: str | None,
) -> tuple[JobPublic, int]:
    """:func:`submit_job`'s work: the job as rendered and the status (201 new, 200 the key's first job)."""
    if settings.job_id_seed is not None and idempotency_key is not None:  # a drill's runs compare job by job
        team = request.app.state.teams.team(caller.team_id)
        job_id = seeded_job_id(settings.job_id_seed, team.name if team is not None else caller.team_id, idempotency_key)
    else:
        job_id = new_job_id()
    spec = job_spec(body, job_id, settings)
    check_team(request.app.state.teams, caller.team_id, settings, bodies=[body])  # its checkpoint URI and image
    if body.fleet_id is not None:  # the fleet's policy places it: no quote on the open market
        from api.routes.fleets import submit_to_fleet

        try:
            job, created = submit_to_fleet(request, caller, jobs, planner, body, spec, job_id, idempotency_key)
        except UnknownJobType as exc:
            raise planning_error(exc) from exc
        if not created:
            with jobs.reading() as conn:
                return render_job(request, jobs, job, conn=conn), 200
        return render_job(request, jobs, job, events=()), 201
    try:
        quote = planner.quote(spec)
    except (UnknownJobType, JobInfeasible, InvalidJob) as exc:
        # a retry of a job accepted before answers that job, even when it could not be planned now
        first = None if idempotency_key is None else jobs.by_idempotency_key(caller.team_id, idempotency_key)
        if first is None:
            raise planning_error(exc) from exc
        return render_job(request, jobs, first), 200
    provider = provider_for(quote, settings)
    check_team(request.app.state.teams, caller.team_id, settings, providers=[provider])  # local: only if enabled
    job, created = jobs.insert(
        NewJob(
            team_id=caller.team_id,
            spec=spec,
            steps_total=body.steps,
            provider=provider,
            name=body.name,
            quote=quote,
            idempotency_key=idempotency_key,
            job_id=job_id,
        )
    )
    if not created:  # the key was used before (a retry): the first job, 200
        with jobs.reading() as conn:
            return render_job(request, jobs, job, conn=conn), 200
    log.info("job %s submitted by key %s (team %s)", job.id, caller.key_id, caller.team_id)
    # queued, never launched: no moves and nothing billed (no events or ledger to read)
    return render_job(request, jobs, job, events=()), 201


@router.get("", response_model=JobsListPublic)
def list_jobs(
    request: Request,
    caller: CallerDep,
    jobs: JobsDep,
    state: Annotated[str | None, Query(max_length=200, description="States, comma-separated.")] = None,
    team: Annotated[str | None, Query(max_length=64, description="Admins: one team's jobs.")] = None,
    batch: Annotated[str | None, Query(max_length=64, description="One batch's jobs.")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=200, description="next_cursor of the previous page.")] = None,
) -> JobsListPublic:
    """Jobs oldest first, ``limit`` at a time; pages are stable while jobs are added."""
    scope, states = scope_for_listing(caller, team), parse_states(state)
    with jobs.reading() as conn:
        try:
            page = jobs.page(team_id=scope, states=states, batch_id=batch, limit=limit, cursor=cursor, conn=conn)
        except ValueError as exc:
            raise ApiError(422, "invalid_request", str(exc), [{"field": "query.cursor", "problem": str(exc)}]) from exc
        now = jobs.now()
        events = jobs.events_of([j.id for j in page.items], conn=conn)  # one query for the page, not one per job
        ledger = getattr(request.app.state, "ledger", None)
        billed = [j.id for j in page.items if launched(j, events[j.id])]
        # the page's ledger lines in one read, not one per job (None: priced job by job)
        costs = page_costs(ledger, billed, now, conn=conn) if ledger is not None and billed else None
        return JobsListPublic(
            total=page.total,
            items=[
                render_job(request, jobs, j, now=now, events=events[j.id], conn=conn, costs=costs) for j in page.items
            ],
            next_cursor=page.next_cursor,
        )


@router.get("/{job_id}", response_model=JobPublic)
async def show_job(job_id: JobId, request: Request, caller: CallerDep, jobs: JobsDep) -> Response:
    """One job, with its live figures: the job, its events and (when it launched) the ledger read on one
    connection (on the read pool; the hottest route, see api/hot_path.py)."""
    return json_of(await blocking(request, _show_job, request, jobs, caller, job_id))


def _show_job(request: Request, jobs: JobRepository, caller: Caller, job_id: str) -> JobPublic:
    with jobs.reading() as conn:
        return render_job(request, jobs, get_job(jobs, caller, job_id, conn), conn=conn)


@router.post("/{job_id}/cancel", status_code=202, response_model=JobPublic)
def cancel_job(job_id: JobId, request: Request, caller: CallerDep, jobs: JobsDep) -> JobPublic:
    """Ask for the job to be cancelled (checkpointed, terminated; a queued job at once). Idempotent; a
    finished job is returned unchanged."""
    try:
        job = jobs.request_cancel(job_id, caller.scope)
    except JobNotFound as exc:
        raise not_found(job_id) from exc
    log.info("job %s: cancel requested by key %s", job_id, caller.key_id)
    with jobs.reading() as conn:
        return render_job(request, jobs, job, conn=conn)


@router.get("/{job_id}/events", response_model=EventsListPublic)
def job_events(
    job_id: JobId,
    caller: CallerDep,
    jobs: JobsDep,
    after: Annotated[int, Query(ge=0, le=2**62, description="Events after this id.")] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 500,
) -> EventsListPublic:
    """The job's events (state changes, moves, preemptions...) in order."""
    with jobs.reading() as conn:
        get_job(jobs, caller, job_id, conn)
        found = jobs.events(job_id, after_id=after, limit=limit, conn=conn)
    return EventsListPublic(
        items=[
            EventPublic(
                id=e.id,
                at=e.at,
                kind=e.kind,
                from_state=e.from_state,
                to_state=e.to_state,
                reason=e.reason,
                cost_usd=str(e.cost_usd) if e.cost_usd is not None else None,
                detail=dict(e.detail) if e.detail is not None else None,
            )
            for e in found
        ]
    )


@router.get("/{job_id}/logs", response_model=LogsPublic)
def job_logs(
    job_id: JobId,
    request: Request,
    caller: CallerDep,
    jobs: JobsDep,
    tail: Annotated[int, Query(ge=1, le=10_000, description="Last lines of each copy.")] = 200,
) -> LogsPublic:
    """Each copy's own output (its last ``tail`` lines), oldest copy first."""
    from costopt.cloud import NotFoundError
    from costopt.migration.ledger_sync import copies

    get_job(jobs, caller, job_id)
    providers = job_providers(request)
    out: list[LogCopyPublic] = []
    for row in copies(jobs.engine, job_id):
        provider = providers(row.provider)
        text, error = "", None
        if provider is None:
            error = f"provider {row.provider!r} is not configured in this service"
        else:
            try:
                text = provider.output(row.instance_id, tail=tail)
            except NotFoundError:
                error = "the instance is gone and its provider kept no output"
            except NotImplementedError:
                error = f"provider {row.provider!r} keeps no output"
        out.append(
            LogCopyPublic(
                epoch=int(row.epoch),
                instance_id=row.instance_id,
                provider=row.provider,
                started_at=row.started_at,
                ended_at=row.ended_at,
                output=text,
                error=error,
            )
        )
    return LogsPublic(copies=out)


def job_providers(request: Request) -> Any:
    """A lookup provider name -> CloudProvider (None: not configured): ``app.state.providers`` (a
    mapping by name, set at startup by the job service)."""
    providers: Mapping[str, Any] = getattr(request.app.state, "providers", None) or {}

    def lookup(name: str) -> Any:
        return providers.get(name) or providers.get(str(name).lower())

    return lookup
