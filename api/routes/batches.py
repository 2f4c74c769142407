"""``POST /v1/batches``: jobs planned together, as ``costopt plan-batch`` plans a collection.

The collection planner (:func:`costopt.planning.collection.plan_collection`) places every job at once
under the batch's objective (``deadline``: all finish by ``deadline_hours`` at the least total expected
cost, or the least total cost without a deadline; ``makespan``: the shortest makespan within
``budget_usd``) and the GPU quotas, priced whole-instance (what the ledger bills). Then every job is
created ``queued`` with its planned offer as its quote (first of its candidates), sharing ``batch_id``.

The jobs' constraints filter the offers the batch is planned on, so they must be the same on every
job of a batch (or absent). With an ``Idempotency-Key`` a retried batch returns the first one (200);
the plan is stored with the batch before its jobs are created, so a retry after a failure half-way
creates the jobs still missing, each once.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from api.auth import CallerDep
from api.deps import JobPlannerDep, JobsDep, SettingsDep
from api.errors import ApiError
from api.job_planning import JobInfeasible, JobPlanner, UnknownJobType, candidate_doc
from api.job_schemas import BatchCreate, BatchPublic
from api.routes.jobs import job_spec, planning_error, provider_for, render_job
from api.tenancy import check_team
from costopt.db.jobs_schema import batches
from costopt.jobs.records import JobRepository, NewJob, new_job_id
from costopt.planning.model import InvalidJob

router = APIRouter(prefix="/v1/batches", tags=["batches"])

_MICRO = Decimal("0.000001")

IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key", max_length=200)]


def _existing(jobs: JobRepository, team_id: str, key: str) -> dict[str, Any] | None:
    with jobs.engine.connect() as conn:
        row = conn.execute(
            select(batches).where(batches.c.team_id == team_id, batches.c.idempotency_key == key)
        ).first()
    return None if row is None else {"id": row.id, "plan": json.loads(row.plan or "{}")}


def _collection_objective(body: BatchCreate) -> Any:
    from costopt.planning.objectives import build_collection_objective

    o = body.objective
    if o.name == "makespan":
        return build_collection_objective("min-makespan-budget", {"budget_usd": o.budget_usd})
    if o.deadline_hours is None:
        return build_collection_objective("min-total-cost", {})
    return build_collection_objective(
        "sweep-min-cost", {"deadline_hours": o.deadline_hours, "confidence": o.confidence}
    )


def _plan(
    body: BatchCreate, specs: list[dict[str, Any]], planner: JobPlanner
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the plan's summary, each job's quote) of the batch."""
    from api.planning import catalog_at, collection_plan_record, planner_inputs
    from costopt.planning.collection import (
        CollectionInfeasible,
        CollectionSpec,
        JobGroup,
        Quota,
        SolverOptions,
        plan_collection,
    )
    from costopt.planning.model import JobSpec
    from costopt.throughput.catalog import ThroughputCatalog
    from costopt.throughput.model import DEFAULT_PRECISION, JobType, Precision

    constraints = [s.get("constraints") or {} for s in specs]
    if any(c != constraints[0] for c in constraints):
        raise ApiError(
            422,
            "invalid_request",
            "the jobs of a batch are planned on one set of offers: give every job the same constraints (or none)",
            [{"field": "jobs.*.constraints", "problem": "differs between jobs"}],
        )
    inputs = planner_inputs(planner.settings, planner.store)
    catalogs: dict[Precision, ThroughputCatalog] = {}  # each job's throughputs at its precision
    groups = []
    types = []
    for i, spec in enumerate(specs):
        job_type, _ = planner.catalog_for(spec)
        precision: Precision = spec.get("precision") or DEFAULT_PRECISION
        if precision not in catalogs:
            catalogs[precision] = catalog_at(planner.settings, planner.store, precision)
        if spec.get("throughput"):
            job_type = JobType(f"user throughput {i}")
            for acc, v in spec["throughput"].items():
                catalogs[precision] = catalogs[precision].with_measurement(job_type, acc, int(spec["gpus"]), float(v))
        types.append(job_type)
        job = JobSpec(job_type, float(spec["steps"]), int(spec["gpus"]), precision=precision)
        groups.append(JobGroup(job, 1, f"job {i}"))
    catalog = catalogs.get(DEFAULT_PRECISION, inputs.catalog)
    objective = _collection_objective(body)
    quotas = tuple(Quota(q.cloud.value, q.region, q.gpus) for q in body.quotas)
    now, _, table = planner.offer_table(planner.default_at(), constraints[0], inputs.hazards)
    assumptions = replace(inputs.assumptions, per_gpu_packing=False)
    try:
        plan = plan_collection(
            CollectionSpec(tuple(groups), objective, quotas),
            table,
            catalog,
            assumptions,
            options=SolverOptions(time_limit_s=30.0),
            catalogs=catalogs,
        )
    except CollectionInfeasible as exc:
        details: list[dict[str, Any]] = [{"binding": exc.binding}]
        if exc.group is not None:
            details[0]["job"] = int(exc.group.split()[-1])
        if exc.shortfall_gpus:
            details[0]["shortfall_gpus"] = exc.shortfall_gpus
        raise ApiError(422, "infeasible", str(exc), details) from exc
    as_of = now.at.astimezone(UTC).isoformat().replace("+00:00", "Z")
    quotes: list[dict[str, Any]] = []
    for i, assignment in enumerate(sorted(plan.assignments, key=lambda g: int(g.group.split()[-1]))):
        if int(assignment.group.split()[-1]) != i or len(assignment.allocations) != 1:
            raise RuntimeError(f"the collection plan placed group {assignment.group} unexpectedly")
        a = assignment.allocations[0]
        offer: dict[str, Any] = {
            "cloud": a.cloud,
            "region": a.region,
            "zone": a.zone,
            "instance_type": a.instance_type,
            "market": a.market,
            "accelerator": a.accelerator,
            "gpu_count": _gpu_count(table, a.offer_row),
        }
        planned: dict[str, Any] = {
            "offer": offer,
            "usd_per_hour": a.job_usd_per_hour,
            "expected_hours": a.expected_hours,
            "expected_cost_usd": str(a.cost_per_job_usd.quantize(_MICRO)),
            "steps_per_s": _steps_per_s(
                catalogs[specs[i].get("precision") or DEFAULT_PRECISION], types[i], a.accelerator, int(specs[i]["gpus"])
            ),
        }
        others = _alternatives(planner, specs[i], offer)
        quotes.append(
            {
                **planned,
                "as_of": as_of,
                "reason": f"planned with the batch: {plan.reason}",
                "per_gpu_packing": False,
                "candidates": [planned, *others],
            }
        )
    return {"as_of": as_of, **collection_plan_record(plan)}, quotes


def _gpu_count(table: Any, row: int) -> float | None:
    try:
        return float(table.gpus[row])
    except (IndexError, TypeError):
        return None


def _steps_per_s(catalog: Any, job_type: Any, accelerator: str, gpus: int) -> float | None:
    cell = catalog.get(job_type, accelerator, gpus)
    return None if cell is None else float(cell.steps_per_s)


def _alternatives(planner: JobPlanner, spec: dict[str, Any], planned: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's next best single-job placements (fallbacks when its planned offer cannot launch)."""
    try:
        _, plan = planner.plan(spec, top=5)
    except (UnknownJobType, JobInfeasible, InvalidJob):
        return []
    keys = ("cloud", "region", "zone", "instance_type", "market")
    return [
        candidate_doc(c)
        for c in plan.alternatives
        if tuple(getattr(c, k) for k in keys) != tuple(planned[k] for k in keys)
    ][:4]


@router.post(
    "",
    status_code=201,
    response_model=BatchPublic,
    responses={200: {"model": BatchPublic, "description": "the Idempotency-Key was used before: the first batch"}},
)
def submit_batch(
    body: BatchCreate,
    request: Request,
    response: Response,
    caller: CallerDep,
    jobs: JobsDep,
    planner: JobPlannerDep,
    settings: SettingsDep,
    idempotency_key: IdempotencyKey = None,
) -> BatchPublic:
    """Plan the jobs together and queue them (422 ``unknown_job_type``, ``infeasible`` naming what binds)."""
    check_team(request.app.state.teams, caller.team_id, settings, bodies=body.jobs)  # checkpoint URIs, images
    stored = _existing(jobs, caller.team_id, idempotency_key) if idempotency_key is not None else None
    if stored is None:
        batch_id = f"batch-{secrets.token_hex(8)}"
        ids = [new_job_id() for _ in body.jobs]
        specs = [job_spec(j, jid, settings) for j, jid in zip(body.jobs, ids, strict=True)]
        try:
            summary, quotes = _plan(body, specs, planner)
        except (UnknownJobType, JobInfeasible) as exc:
            raise planning_error(exc) from exc
        except InvalidJob as exc:
            raise ApiError(422, "invalid_request", str(exc)) from exc
        doc: dict[str, Any] = {
            "summary": summary,
            "jobs": [
                {"id": jid, "name": j.name, "spec": s, "quote": q}
                for jid, j, s, q in zip(ids, body.jobs, specs, quotes, strict=True)
            ],
        }
        # the service's own host only when enabled for the team, before anything is stored
        providers = [provider_for(q, settings) for q in quotes]
        check_team(request.app.state.teams, caller.team_id, settings, providers=providers)
        try:
            with jobs.engine.begin() as conn:
                conn.execute(
                    insert(batches).values(
                        id=batch_id,
                        team_id=caller.team_id,
                        objective=json.dumps(body.objective.model_dump(mode="json"), sort_keys=True),
                        plan=json.dumps(doc, sort_keys=True),
                        idempotency_key=idempotency_key,
                        created_at=datetime.now(UTC),
                    )
                )
            created = True
        except IntegrityError:
            if idempotency_key is None:
                raise
            stored = _existing(jobs, caller.team_id, idempotency_key)
            if stored is None:
                raise
    if stored is not None:
        batch_id, doc, created = str(stored["id"]), dict(stored["plan"]), False
    out = []
    for i, item in enumerate(doc["jobs"]):
        job, _ = jobs.create(
            NewJob(
                team_id=caller.team_id,
                spec=item["spec"],
                steps_total=int(item["spec"]["steps"]),
                provider=provider_for(item["quote"], settings),
                name=item["name"],
                quote=item["quote"],
                batch_id=batch_id,
                idempotency_key=f"{batch_id}#{i}",
                job_id=item["id"],
            )
        )
        out.append(render_job(request, jobs, job))
    if not created:
        response.status_code = 200
    return BatchPublic(id=batch_id, plan=doc["summary"], jobs=out)
