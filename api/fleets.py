"""Fleet requests as a service: instances from offers or from a plan, admission of jobs, rendering.

Shared by the fleet routes (:mod:`api.routes.fleets`) and the job routes (a job submitted with
``fleet_id``). Bad input is a :class:`api.errors.ApiError` (422) that says what to fix:

- an offer whose instance type the store does not know, that has no whole GPU, or no price in effect now;
- a plan no offer satisfies, or whose cheapest mix exceeds the budget;
- a policy name not in :data:`costopt.gavel.policies.POLICIES` (the message lists the known names);
- a job no instance of the fleet can run (too few GPUs in any one instance, unknown throughput): the
  reason for each worker type.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from api.errors import ApiError
from api.fleet_schemas import (
    AllocationPublic,
    FleetInstancePublic,
    FleetInstancesIn,
    FleetJobPublic,
    FleetPlanIn,
    FleetPublic,
    LeasePublic,
    RoundPublic,
    offer_public,
)
from api.job_planning import JobPlanner
from costopt.domain import Cloud, Market, OfferKey, normalize_accelerator
from costopt.fleets.model import (
    Admission,
    FleetInstance,
    FleetJob,
    FleetRecord,
    FleetState,
    NewInstance,
    admission,
    capacity_of,
)
from costopt.fleets.store import FleetRepository
from costopt.jobs.records import JobRecord, JobRepository
from costopt.settings import Settings
from pricing.store import PriceStore

if TYPE_CHECKING:
    from costopt.ledger.book import Ledger

log = logging.getLogger("costopt.api")

__all__ = [
    "canonical_policy",
    "fleet_not_found",
    "instances_by_offer",
    "instances_by_plan",
    "job_admission",
    "render_fleet",
]


def fleet_not_found(fleet_id: str) -> ApiError:
    """The 404 of a fleet the caller may not see: the same for another team's as for none."""
    return ApiError(404, "not_found", f"no fleet {fleet_id!r}: `GET /v1/fleets` lists your fleets")


def canonical_policy(name: str) -> str:
    """The registry's name of policy ``name`` (any case); a 422 listing the known policies otherwise."""
    from costopt.gavel.errors import UnknownPolicy
    from costopt.gavel.policies import POLICIES

    try:
        return POLICIES.canonical(name)
    except UnknownPolicy as exc:
        raise ApiError(
            422,
            "unknown_policy",
            str(exc),
            [
                {
                    "field": "policy",
                    "problem": f"unknown policy {name!r}",
                    "known": list(exc.known),
                    "did_you_mean": list(exc.close),
                }
            ],
        ) from exc


def _provider_for(offer: OfferKey, settings: Settings) -> str:
    """The provider that launches an instance of ``offer``: its cloud's when the service runs that cloud,
    else the service's default provider (``sim``, ``local``...)."""
    cloud = offer.cloud.value
    return cloud if cloud in settings.all_providers() else settings.provider


def _now(store: PriceStore, settings: Settings, planner: JobPlanner) -> datetime:
    from api.planning import plan_now

    return plan_now(store, settings, planner.default_at()).at


def instances_by_offer(
    items: Sequence[FleetInstancesIn], store: PriceStore, settings: Settings, planner: JobPlanner, *, field: str
) -> list[NewInstance]:
    """The instances of ``items`` (offer and count each), their accelerator and GPUs from the store's
    instance catalog and their price now; 422 naming the offer that cannot make a fleet instance."""
    at = _now(store, settings, planner)
    types: dict[Cloud, dict[str, Any]] = {}
    out: list[NewInstance] = []
    for i, item in enumerate(items):
        o = item.offer
        key = OfferKey(o.cloud, o.region, o.zone, o.instance_type, Market(o.market))
        where = f"{field}[{i}].offer"
        known = types.setdefault(o.cloud, {t.name: t for t in store.instance_types(o.cloud)})
        itype = known.get(o.instance_type)
        if itype is None:
            from api.job_planning import close_matches

            close = close_matches(o.instance_type, list(known), n=3)
            raise ApiError(
                422,
                "unknown_instance_type",
                f"{o.cloud.value} has no instance type {o.instance_type!r} in the catalog"
                + (f" (did you mean {', '.join(close)}?)" if close else ""),
                [{"field": f"{where}.instance_type", "problem": "unknown instance type", "did_you_mean": close}],
            )
        gpus = float(itype.gpu_count or 0)
        if gpus < 1 or gpus != int(gpus) or not itype.accelerator:
            raise ApiError(
                422,
                "no_gpu",
                f"{o.instance_type} carries {gpus:g} GPUs: a fleet instance needs at least one whole GPU",
                [{"field": f"{where}.instance_type", "problem": "no whole GPU"}],
            )
        price = store.price_at(key, at)
        if price is None:
            raise ApiError(
                422,
                "no_price",
                f"offer {key} has no price in effect at {at.isoformat()}: the ledger could not bill it; "
                "choose an offer `costopt prices latest` lists",
                [{"field": where, "problem": "no price in effect"}],
            )
        provider = _provider_for(key, settings)
        for _ in range(item.count):
            out.append(
                NewInstance(
                    offer=key,
                    accelerator=itype.accelerator,
                    gpus=int(gpus),
                    provider=provider,
                    usd_per_hour=Decimal(repr(float(price.usd_per_hour))),
                )
            )
    return out


def instances_by_plan(
    plan: FleetPlanIn, store: PriceStore, settings: Settings, planner: JobPlanner, *, field: str
) -> list[NewInstance]:
    """The cheapest instances carrying the plan's GPUs per accelerator (:func:`costopt.fleets.plan.
    cheapest_cover` over the offers in effect now under the plan's constraints); 422 when an
    accelerator has no offer, or the mix exceeds ``max_usd_per_hour``."""
    from api.job_planning import apply_constraints
    from api.planning import offers_at
    from costopt.fleets.plan import cheapest_cover

    _, frame = offers_at(store, settings, planner.default_at(), plan.clouds, unavailable=planner.unavailable)
    frame = apply_constraints(frame, {"regions": plan.regions, "markets": plan.markets})
    frame = frame[frame["gpu_count"].notna() & (frame["gpu_count"] >= 1)]
    frame = frame[frame["gpu_count"] == frame["gpu_count"].round()]
    out: list[NewInstance] = []
    total = 0.0
    for raw, n in plan.accelerators.items():
        acc = normalize_accelerator(raw)
        rows = frame[frame["accelerator"] == acc].reset_index(drop=True)
        picked = (
            cheapest_cover(rows["usd_per_hour"].tolist(), [int(g) for g in rows["gpu_count"]], n) if len(rows) else None
        )
        if picked is None:
            raise ApiError(
                422,
                "infeasible",
                f"no offer with {acc} GPUs is in effect now under the plan's constraints",
                [{"field": f"{field}.accelerators.{raw}", "problem": "no offer"}],
            )
        picks, usd = picked
        total += usd
        for p in picks:
            r = rows.iloc[p.offer]
            key = OfferKey(Cloud(r["cloud"]), r["region"], r["zone"], r["instance_type"], Market(r["market"]))
            for _ in range(p.count):
                out.append(
                    NewInstance(
                        offer=key,
                        accelerator=acc,
                        gpus=int(r["gpu_count"]),
                        provider=_provider_for(key, settings),
                        usd_per_hour=Decimal(repr(float(r["usd_per_hour"]))),
                    )
                )
    if plan.max_usd_per_hour is not None and total > plan.max_usd_per_hour + 1e-9:
        raise ApiError(
            422,
            "over_budget",
            f"the cheapest instances for {dict(plan.accelerators)} cost {total:.4f} USD/h, over the budget of "
            f"{plan.max_usd_per_hour:g} USD/h: ask for fewer GPUs or raise max_usd_per_hour",
            [
                {
                    "field": f"{field}.max_usd_per_hour",
                    "problem": "over budget",
                    "cheapest_usd_per_hour": round(total, 6),
                }
            ],
        )
    return out


def job_admission(
    spec: Mapping[str, Any], instances: Sequence[FleetInstance], planner: JobPlanner
) -> tuple[Admission, dict[str, float]]:
    """Where the fleet can run a job of ``spec`` (a normalized ``POST /v1/jobs`` body) and its throughput
    on every accelerator where it is known (steps/s, from the catalog or the job's own: kept with the job,
    so instances of another accelerator added later can run it too). Raises
    :class:`~api.job_planning.UnknownJobType` for a job type the catalog does not know."""
    gpus = int(spec.get("gpus", 1))
    job_type, catalog = planner.catalog_for(spec)
    members = [(i.accelerator, i.gpus) for i in instances if i.state.member]
    rates: dict[str, float] = {}
    for acc in sorted({a for a, _ in members} | set(catalog.accelerators())):
        cell = catalog.get(job_type, acc, gpus)
        if cell is not None and cell.steps_per_s > 0:
            rates[acc] = float(cell.steps_per_s)
    return admission(gpus, rates, members), rates


def refused(fleet_id: str, adm: Admission) -> ApiError:
    """The 422 of a job the fleet cannot run, with the reason for each worker type."""
    why = "; ".join(f"{k}: {v}" for k, v in adm.reasons.items())
    return ApiError(
        422,
        "fleet_cannot_run",
        f"fleet {fleet_id} cannot run the job ({why})",
        [{"field": "fleet_id", "worker_type": k, "problem": v} for k, v in adm.reasons.items()],
    )


# -- rendering -----------------------------------------------------------------------------------------


def _instance_public(i: FleetInstance) -> FleetInstancePublic:
    return FleetInstancePublic(
        id=i.id,
        state=i.state.value,
        provider=i.provider,
        instance_id=i.instance_id,
        offer=offer_public(i.offer.to_doc(), i.accelerator, float(i.gpus)),
        accelerator=i.accelerator,
        gpus=i.gpus,
        usd_per_hour=float(i.usd_per_hour) if i.usd_per_hour is not None else None,
        replaces=i.replaces,
        created_at=i.created_at,
        launched_at=i.launched_at,
        last_seen_at=i.last_seen_at,
        ended_at=i.ended_at,
        end_reason=i.end_reason,
        billed_to=i.billed_to,
    )


def allocation_fractions(doc: Mapping[str, Any] | None) -> dict[str, dict[str, float]]:
    """``{job id: {worker type: time fraction > 0}}`` of a stored allocation document."""
    if not doc:
        return {}
    types = [str(t) for t in doc.get("worker_types", [])]
    out: dict[str, dict[str, float]] = {}
    for job_id, row in zip(doc.get("job_ids", []), doc.get("x", []), strict=False):
        out[str(job_id)] = {t: float(v) for t, v in zip(types, row, strict=False) if float(v) > 0}
    return out


def _costs(ledger: Ledger | None, team: str, at: datetime, job_ids: Collection[str]) -> dict[str, Decimal] | None:
    """The cost so far of each of ``job_ids`` (a fleet's jobs and the fleet's own id, its idle time), read from
    their ledger lines only (not the team's whole history); None when not priced now."""
    if ledger is None:
        return None
    from costopt.ledger.model import LedgerError

    try:
        return ledger.costs(team=team, as_of=at, job_ids=job_ids).by("job_id")
    except LedgerError as exc:  # an open interval without a price in effect: not priced now
        log.warning("fleet costs of team %s not priced now: %s", team, exc)
        return None


def render_fleet(
    fleet: FleetRecord,
    repo: FleetRepository,
    jobs: JobRepository,
    ledger: Ledger | None,
) -> FleetPublic:
    """A fleet as the API shows it (everything read on one connection; costs from the ledger)."""
    now = repo.now()
    with repo.reading() as conn:
        instances = repo.instances(fleet.id, conn=conn)
        fjobs = repo.jobs(fleet.id, conn=conn)
        current = repo.round(fleet.id, fleet.round, conn=conn) if fleet.round else None
        records: dict[str, JobRecord] = {}
        for fj in fjobs:
            try:
                records[fj.job_id] = jobs.get(fj.job_id, conn=conn)
            except LookupError:
                continue
    costs = _costs(ledger, fleet.team_id, now, [fj.job_id for fj in fjobs] + [fleet.id])
    fractions = allocation_fractions(fleet.allocation)
    planned: dict[str, int] = {}
    for i in instances:
        if i.state.member:
            planned[i.accelerator] = planned.get(i.accelerator, 0) + i.gpus
    job_rows = [_job_public(fj, records.get(fj.job_id), fractions.get(fj.job_id, {}), now, costs) for fj in fjobs]
    total: str | None = None
    idle: str | None = None
    if costs is not None:
        idle_usd = costs.get(fleet.id, Decimal(0))
        idle = str(idle_usd)
        total = str(idle_usd + sum((costs.get(fj.job_id, Decimal(0)) for fj in fjobs), Decimal(0)))
    alloc = fleet.allocation
    return FleetPublic(
        id=fleet.id,
        team_id=fleet.team_id,
        name=fleet.name,
        policy=fleet.policy,
        round_s=fleet.round_s,
        resolve_every_rounds=fleet.resolve_rounds,
        state=fleet.state.value,
        gpus=capacity_of(instances),
        gpus_planned=planned,
        instances=[_instance_public(i) for i in instances],
        allocation=None
        if not alloc
        else AllocationPublic(
            policy=str(alloc.get("policy", fleet.policy)),
            solved_round=alloc.get("round"),
            solved_at=datetime.fromisoformat(alloc["at"]) if alloc.get("at") else None,
            worker_types=[str(t) for t in alloc.get("worker_types", [])],
            objective=alloc.get("objective"),
            fractions=fractions,
        ),
        round=None
        if current is None
        else RoundPublic(
            number=current.round,
            started_at=current.started_at,
            ends_at=current.ends_at,
            capacity=dict(current.capacity),
            assignment=[
                LeasePublic(job_id=a.job_id, instance=a.instance, gpus=list(a.gpus), worker_type=a.wtype, epoch=a.epoch)
                for a in current.assignment
            ],
        ),
        jobs=job_rows,
        cost_so_far_usd=total,
        idle_cost_usd=idle,
        created_at=fleet.created_at,
        updated_at=fleet.updated_at,
        released_at=fleet.released_at,
    )


def _job_public(
    fj: FleetJob,
    job: JobRecord | None,
    fractions: Mapping[str, float],
    now: datetime,
    costs: Mapping[str, Decimal] | None,
) -> FleetJobPublic:
    from costopt.jobs.model import JobState

    done = fj.steps_done
    expected = sum(f * fj.throughput.get(t, 0.0) for t, f in fractions.items()) if fractions else None
    end = fj.finished_at or now
    elapsed = (end - fj.arrived_at).total_seconds()
    return FleetJobPublic(
        job_id=fj.job_id,
        name=job.name if job is not None else "",
        state=job.state if job is not None else JobState.QUEUED,
        status=fj.status.value,
        reason=fj.reason,
        weight=fj.weight,
        slo_s=fj.slo_s,
        gpus=fj.gpus,
        throughput=dict(fj.throughput),
        steps_total=fj.steps_total,
        steps_done=done,
        progress=done / fj.steps_total if fj.steps_total else 0.0,
        checkpoint_step=fj.checkpoint_step,
        epoch=fj.epoch,
        holder=fj.holder,
        received_s=dict(fj.received),
        owed_s=dict(fj.owed),
        owed_at=fj.owed_at,
        fractions=dict(fractions),
        expected_steps_per_s=expected,
        observed_steps_per_s=done / elapsed if elapsed > 0 else None,
        arrived_at=fj.arrived_at,
        started_at=fj.started_at,
        finished_at=fj.finished_at,
        cost_so_far_usd=None if costs is None else str(costs.get(fj.job_id, Decimal(0))),
    )


def check_active(fleet: FleetRecord) -> None:
    if fleet.state is not FleetState.ACTIVE:
        raise ApiError(
            409,
            "fleet_released",
            f"fleet {fleet.id} was released at {fleet.released_at}: create a new fleet",
        )


def member_instances(instances: Sequence[FleetInstance]) -> list[FleetInstance]:
    return [i for i in instances if i.state.member]
