"""Planning as a service: the inputs of the core planner built from the store and the settings.

Throughput catalog and hazard model are built once per process (they only change when files or
registered measurements change; :func:`reset` drops them).

Unavailable offers (recently preempted, or refused at launch for capacity or quota: the cache of
:mod:`costopt.migration.unavailable`) are left out of plans at the offers' frame, before the planner
sees it: pass ``unavailable=`` to :func:`offers_at` / :func:`plan_single`. The planners themselves are
unchanged (they plan on whatever offers they are given).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pandas as pd

from api.wiring import build_assumptions, build_catalog, build_hazards
from costopt.domain import Cloud, normalize_accelerator
from costopt.migration.unavailable import UnavailableOffers
from costopt.planning.evaluate import OfferTable
from costopt.planning.model import Assumptions, JobSpec, Objective, Plan, to_cents
from costopt.planning.single import plan_job
from costopt.risk.hazard import HazardModel
from costopt.settings import Settings
from costopt.throughput.catalog import ThroughputCatalog
from costopt.throughput.model import DEFAULT_PRECISION, JobType, Precision, ThroughputKey

if TYPE_CHECKING:
    from costopt.planning.collection import CollectionPlan
    from costopt.throughput.registry import Measurement
    from costopt.throughput.uncertainty import WinnerSensitivity
from pricing.store import Now, PriceStore

_lock = threading.Lock()
_cache: dict[str, object] = {}


@dataclass(frozen=True, slots=True)
class PlannerInputs:
    catalog: ThroughputCatalog
    hazards: HazardModel
    assumptions: Assumptions


def planner_inputs(settings: Settings, store: PriceStore) -> PlannerInputs:
    """Catalog (file + registered measurements + estimates), hazards and assumptions (cached)."""
    with _lock:
        cached = _cache.get("inputs")
        if isinstance(cached, PlannerInputs):
            return cached
        inputs = PlannerInputs(
            build_catalog(settings, store.engine), build_hazards(settings), build_assumptions(settings)
        )
        _cache["inputs"] = inputs
        return inputs


def catalog_at(settings: Settings, store: PriceStore, precision: Precision = DEFAULT_PRECISION) -> ThroughputCatalog:
    """The planner's catalog for jobs at ``precision`` (``fp32``: :func:`planner_inputs`' own; others
    built once per process and cached with it, dropped by :func:`reset`)."""
    if precision == DEFAULT_PRECISION:
        return planner_inputs(settings, store).catalog
    key = f"catalog:{precision}"
    with _lock:
        cached = _cache.get(key)
        if isinstance(cached, ThroughputCatalog):
            return cached
    catalog = build_catalog(settings, store.engine, precision=precision)
    with _lock:
        _cache[key] = catalog
    return catalog


OWN_CATALOGS = 1024
"""Jobs' own catalogs kept per process (:func:`own_job_catalog`; all dropped when full)."""


def own_job_catalog(
    settings: Settings, store: PriceStore, job_id: str, given: Mapping[str, float], gpus: int, precision: Precision
) -> tuple[JobType, ThroughputCatalog]:
    """The job type and catalog of a job given by its own ``throughput`` (:func:`costopt.throughput.learning.
    own_catalog`): the user's figures, the job's own measurements in their place, and (once anything is
    learnt, unless ``settings.estimate_new_accelerators`` is off) estimates for the other GPUs. Cached per
    job and precision; :func:`learn` drops the job's entry at its next measurement."""
    from costopt.throughput.estimate import load_accelerator_specs
    from costopt.throughput.learning import own_catalog
    from costopt.throughput.registry import MeasurementRegistry, own_job_type

    job_type = own_job_type(job_id)
    key = f"own:{job_type.name}:{precision}"
    with _lock:
        cached = _cache.get(key)
    if isinstance(cached, ThroughputCatalog):
        return job_type, cached
    learnt = MeasurementRegistry(store.engine).of_job_type(job_type, precision)
    specs = load_accelerator_specs() if settings.estimate_new_accelerators and learnt else None
    catalog = own_catalog(job_type, given, learnt, gpus=gpus, precision=precision, specs=specs)
    with _lock:
        if sum(1 for k in _cache if k.startswith("own:")) >= OWN_CATALOGS:
            for k in [k for k in _cache if k.startswith("own:")]:
                del _cache[k]
        _cache[key] = catalog
    return job_type, catalog


def learn(m: Measurement) -> None:
    """Fold a running job's (or a user's) new measurement into the cached catalogs of its precision, so the
    next plan, placement and rebalance read it at once. A cell that already had a value (measured or
    estimated) is updated in place (:meth:`ThroughputCatalog.with_measurement`). A job type known only from
    registrations and jobs (no file cell) gets its estimates on the other GPUs refitted: scaled with its one
    measured cell (:func:`costopt.throughput.learning.scale_estimates`, exact), or, once it is measured on
    several GPUs, by a rebuild of that catalog at its next use; a file job type's estimates stay until the
    next rebuild. A job type measured nowhere before drops that catalog, which is
    rebuilt (and the job type estimated on the other GPUs) at its next use. A job's own job type (a job given
    by its own throughput) drops that job's catalog (:func:`own_job_catalog`) instead."""
    from costopt.throughput.registry import is_own_job_type, source_precision

    precision = source_precision(m.source)
    if is_own_job_type(m.job_type):
        with _lock:
            _cache.pop(f"own:{m.job_type.name}:{precision}", None)
        return
    key_of = "inputs" if precision == DEFAULT_PRECISION else f"catalog:{precision}"
    with _lock:
        cached = _cache.get(key_of)
        catalog = cached.catalog if isinstance(cached, PlannerInputs) else cached
        if not isinstance(catalog, ThroughputCatalog):
            return
        if m.job_type not in catalog.job_types():
            _cache.pop(key_of, None)
            return
        updated = catalog.with_measurement(
            m.job_type,
            m.accelerator,
            m.gpu_count,
            m.steps_per_s,
            placement=m.placement,
            n_measurements=m.n_measurements,
            provenance=m.provenance,
        )
        mine = {k: c for k, c in updated.cells.items() if k.job_type == m.job_type}
        if any(c.is_estimate for c in mine.values()) and not any(c.provenance == "measured" for c in mine.values()):
            # known from registrations and jobs only: its estimates follow the new value at once
            from costopt.throughput.learning import scale_estimates

            key = ThroughputKey(m.job_type, normalize_accelerator(m.accelerator), m.gpu_count, m.placement)
            old, new = catalog.cells.get(key), updated.cells[key]
            measured_1gpu = {k.accelerator for k, c in mine.items() if k.gpu_count == 1 and not c.is_estimate}
            if (
                old is None
                or old.is_estimate
                or not old.can_run
                or not new.can_run
                or key.gpu_count != 1
                or key.placement != "consolidated"
                or measured_1gpu != {key.accelerator}
            ):
                _cache.pop(key_of, None)  # measured on another GPU now: refitted at the next use
                return
            updated = scale_estimates(updated, m.job_type, new.steps_per_s / old.steps_per_s)
        _cache[key_of] = replace(cached, catalog=updated) if isinstance(cached, PlannerInputs) else updated


def reset() -> None:
    """Forget the cached planner inputs (after a new measurement is registered)."""
    with _lock:
        _cache.clear()


def plan_now(store: PriceStore, settings: Settings, at: datetime | None) -> Now:
    """When a plan is made: ``at`` (a replay of the prices then), or None: now as the settings' clock
    defines it."""
    return Now(at, "replay") if at is not None else store.resolve_now(settings.clock)


def snapshot_time(now: Now) -> datetime | None:
    """The ``at`` of :meth:`PriceStore.snapshot_frame` for a plan made at ``now`` (None: live now)."""
    return None if now.mode == "live" else now.at


def offers_at(
    store: PriceStore,
    settings: Settings,
    at: datetime | None,
    clouds: list[Cloud] | None,
    *,
    unavailable: UnavailableOffers | None = None,
    now: Now | None = None,
) -> tuple[Now, pd.DataFrame]:
    """Offers in effect at ``at`` (None: now as the settings' clock defines it), optionally only
    on some clouds; stale offers are left out, and so are the offers ``unavailable`` holds (marked
    unavailable at ``at`` when given, else now by the cache's clock: a replay of old prices still
    avoids what is unavailable today). ``now``: :func:`plan_now` of ``at`` when resolved already."""
    if now is None:
        now = plan_now(store, settings, at)
    frame = store.snapshot_frame(snapshot_time(now), cloud=clouds)
    if unavailable is not None:
        frame = unavailable.drop_from(frame, at=at).reset_index(drop=True)
    return now, frame


def plan_single(
    store: PriceStore,
    settings: Settings,
    job: JobSpec,
    objective: Objective,
    *,
    at: datetime | None = None,
    clouds: list[Cloud] | None = None,
    top: int = 10,
    unavailable: UnavailableOffers | None = None,
    per_gpu_packing: bool = False,
    prefer_measured_margin: float | None = None,
) -> tuple[Now, Plan]:
    """Plan one job over every offer in effect, less those ``unavailable`` holds (raises
    costopt.planning.model.Infeasible). Priced whole-instance (what the ledger bills) unless
    ``per_gpu_packing`` (the paper's assumption: a job pays its GPU share of a larger instance).
    ``prefer_measured_margin``: see :func:`costopt.throughput.uncertainty.prefer_measured`."""
    now, plan, _ = plan_single_checked(
        store,
        settings,
        job,
        objective,
        at=at,
        clouds=clouds,
        top=top,
        unavailable=unavailable,
        per_gpu_packing=per_gpu_packing,
        prefer_measured_margin=prefer_measured_margin,
        sensitivity=False,
    )
    return now, plan


def plan_single_checked(
    store: PriceStore,
    settings: Settings,
    job: JobSpec,
    objective: Objective,
    *,
    at: datetime | None = None,
    clouds: list[Cloud] | None = None,
    top: int = 10,
    unavailable: UnavailableOffers | None = None,
    per_gpu_packing: bool = False,
    prefer_measured_margin: float | None = None,
    sensitivity: bool = True,
) -> tuple[Now, Plan, WinnerSensitivity | None]:
    """:func:`plan_single`, and (``sensitivity``) whether its winner rests on an estimate and holds at
    the ends of the estimates' intervals (:func:`costopt.throughput.uncertainty.winner_sensitivity`)."""
    from costopt.throughput.uncertainty import prefer_measured, winner_sensitivity

    inputs = planner_inputs(settings, store)
    now, frame = offers_at(store, settings, at, clouds, unavailable=unavailable)
    table = OfferTable.from_frame(frame, inputs.hazards)
    assumptions = replace(inputs.assumptions, per_gpu_packing=per_gpu_packing)
    catalog = catalog_at(settings, store, job.precision)

    def replan(cat: ThroughputCatalog) -> Plan:
        plan = plan_job(job, objective, table, cat, assumptions, top=top)
        return plan if prefer_measured_margin is None else prefer_measured(plan, prefer_measured_margin)

    plan = replan(catalog)
    return now, plan, (winner_sensitivity(plan, catalog, replan) if sensitivity else None)


def collection_plan_record(plan: CollectionPlan) -> dict[str, Any]:
    """The plan as plain JSON values (money rounded to the cent)."""
    return {
        "status": plan.status,
        "total_expected_cost_usd": float(to_cents(plan.total_expected_cost_usd)),
        "makespan_hours": round(plan.makespan_hours, 4),
        "mip_gap": plan.mip_gap,
        "solve_seconds": round(plan.solve_seconds, 3),
        "offers_considered": plan.offers_considered,
        "reason": plan.reason,
        "quotas": [
            {"quota": u.quota.name, "gpus_used": u.gpus_used, "max_gpus": u.quota.max_gpus} for u in plan.quota_use
        ],
        "groups": [
            {
                "name": g.group,
                "count": g.count,
                "cost_usd": float(to_cents(g.cost_usd)),
                "allocations": [
                    {
                        "cloud": a.cloud,
                        "region": a.region,
                        "zone": a.zone,
                        "instance_type": a.instance_type,
                        "market": a.market,
                        "accelerator": a.accelerator,
                        "count": a.count,
                        "job_usd_per_hour": a.job_usd_per_hour,
                        "expected_hours": round(a.expected_hours, 4),
                        "cost_usd": float(to_cents(a.cost_usd)),
                    }
                    for a in g.allocations
                ],
            }
            for g in plan.assignments
        ],
    }
