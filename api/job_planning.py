"""Planning managed jobs: the :class:`costopt.jobs.placement.Placements` of the service, and quotes.

A job's stored spec (the normalized ``POST /v1/jobs`` body) becomes the planner's inputs:

- ``job_type`` (a catalog name) or ``throughput`` (the user's steps/s per accelerator, on the job's GPU
  count: a one-job catalog whose cells are marked ``user``; for a submitted job, its own catalog, which
  learns from its progress and extends it to other GPUs: :func:`api.planning.own_job_catalog`)
  -> :class:`~costopt.planning.model.JobSpec`;
  an unknown ``job_type`` raises :class:`UnknownJobType` with the catalog's closest names;
- ``objective`` -> a planner objective; for a job already running, a deadline counts from submission
  (the hours left) and a budget less what the job has spent (when a ``spent`` function is given);
- ``constraints`` (clouds, regions, markets, accelerators, max USD per instance-hour) filter the offers
  frame, and so do offers marked unavailable (:mod:`costopt.migration.unavailable`) and ``exclude``.

**Billing truth**: plans here are priced whole-instance (``Assumptions.per_gpu_packing=False``, whatever
the settings say): a job on part of a larger instance pays the whole instance, which is what the ledger
bills, so a quote's ``expected_cost_usd`` is ``usd_per_hour x expected_hours`` (+ moving the checkpoint).

The inputs (catalog, hazards, assumptions) and the offers frame come from :mod:`api.planning`; the
ranking is :func:`costopt.planning.single.plan_job`'s.
"""

from __future__ import annotations

import difflib
import json
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import numpy as np

from api.planning import catalog_at, offers_at, own_job_catalog, plan_now, planner_inputs, snapshot_time
from costopt.domain import Cloud, Market, OfferKey
from costopt.errors import CostoptError
from costopt.jobs.placement import Placement
from costopt.jobs.records import JobRecord
from costopt.planning.model import (
    Candidate,
    Infeasible,
    InvalidJob,
    JobSpec,
    Location,
    MinCost,
    MinTime,
    Objective,
    Plan,
)
from costopt.settings import Settings
from costopt.throughput.catalog import ThroughputCatalog
from costopt.throughput.model import DEFAULT_PRECISION, JobType
from pricing.store import Now, PriceStore

if TYPE_CHECKING:
    import pandas as pd

    from costopt.migration.unavailable import UnavailableOffers
    from costopt.planning.evaluate import OfferTable
    from costopt.risk.hazard import HazardModel

__all__ = [
    "USER_JOB_TYPE",
    "JobInfeasible",
    "JobPlanner",
    "UnknownJobType",
    "candidate_doc",
    "close_matches",
    "objective_of",
    "offer_doc",
]

USER_JOB_TYPE = JobType("user throughput")
"""The job type of a job planned on its own throughputs (a one-job catalog)."""

MICRO = Decimal("0.000001")
TABLE_TTL_S = 30.0
"""How long (monotonic seconds) a cached offer table is reused for the same price version, price epoch of
its plan time (:meth:`JobPlanner.price_epoch`; None: live now), unavailable offers, exclusions and
constraints: bounds how late an offer turning stale by the wall clock alone (``stale_after``) is noticed
in live mode."""
TABLE_CACHE_SIZE = 64
"""Offer tables kept at most (each the whole offers frame and its table: ~1-3 MB). Entries past their
:data:`TABLE_TTL_S` are dropped at every insertion (:func:`_put`), so in a steady service the cache holds
the tables made in the last 30 s; the cap bounds a burst of distinct keys (constraints, exclusions)."""
PLAN_CACHE_SIZE = 256
"""Quotes kept at most (per job planning fields and table; each lives as long as its table's entry:
expired ones are dropped at every insertion)."""
ONE_TABLE_CACHE_SIZE = 1024
"""One-offer tables kept at most (running jobs' offers, for their ETA; each a row; expired ones are
dropped at every insertion)."""
CONSTRAINT_ORDER = ("clouds", "regions", "markets", "accelerators", "max_usd_per_hour")
_LIST_CONSTRAINTS = {"clouds": "cloud", "regions": "region", "markets": "market"}
"""The constraints that list the values allowed in an offers frame's column (constraint -> column)."""


class UnknownJobType(CostoptError, LookupError):
    """The job type is not in the throughput catalog; ``matches`` are the closest names."""

    def __init__(self, name: str, matches: Sequence[str]) -> None:
        hint = f"; did you mean {', '.join(repr(m) for m in matches)}?" if matches else ""
        super().__init__(
            f"unknown job type {name!r}{hint} (`costopt catalog list` shows every name; or give `throughput` "
            "per accelerator instead)"
        )
        self.name, self.matches = name, list(matches)


class JobInfeasible(CostoptError):
    """No offer can run the job under its objective and constraints; ``binding`` names what binds
    (``constraints.<field>``, ``deadline``, ``budget``, ``throughput``, ``offers``)."""

    def __init__(self, message: str, *, binding: str) -> None:
        super().__init__(message)
        self.binding = binding


def close_matches(name: str, names: Sequence[str], n: int = 5) -> list[str]:
    """The catalog names closest to ``name`` (case-insensitive difflib), best first."""
    by_lower: dict[str, str] = {}
    for full in names:
        by_lower.setdefault(full.lower(), full)
    hits = difflib.get_close_matches(name.lower(), list(by_lower), n=n, cutoff=0.5)
    model = name.split(" (")[0].strip().lower()
    same_model = [k for k in by_lower if k.split(" (")[0] == model and k not in hits]
    return [by_lower[k] for k in [*hits, *same_model][:n]]


PREFER_MEASURED = "prefer_measured_margin"
"""The job objective's option read by the planner itself (:func:`costopt.throughput.uncertainty.prefer_measured`),
not by the objectives registry."""


def objective_of(doc: Mapping[str, Any], *, elapsed_hours: float = 0.0, spent_usd: Decimal = Decimal(0)) -> Objective:
    """The planner objective of a job's ``objective`` document (``ObjectiveIn`` as JSON), through the
    objectives registry (:func:`costopt.planning.objectives.build_objective`). A deadline counts
    ``elapsed_hours`` already gone (past it: the fastest placement); a budget less ``spent_usd`` (all
    spent: the cheapest). Raises :class:`~costopt.planning.model.InvalidJob` naming a bad parameter."""
    from costopt.planning.objectives import build_objective

    params = {k: v for k, v in doc.items() if k not in ("name", PREFER_MEASURED) and v is not None}
    if "deadline_hours" in params and elapsed_hours > 0:
        left = float(params["deadline_hours"]) - elapsed_hours
        if left <= 0:
            return MinTime()
        params["deadline_hours"] = left
    if "budget_usd" in params and spent_usd > 0:
        rest = Decimal(str(params["budget_usd"])) - spent_usd
        if rest <= 0:
            return MinCost()
        params["budget_usd"] = rest
    return build_objective(str(doc.get("name") or "min-cost"), params)


def _put(cache: dict[Any, Any], key: Any, entry: tuple[Any, ...], size: int) -> None:
    """Store ``entry`` (its expiry, monotonic seconds, first) under ``key`` in one of the planner's caches:
    first drop the expired entries (never served again: a lookup checks the expiry), then, when ``size``
    are still held, all of them. Expired entries were kept until the cap before, so the tables of every
    price version of the last minutes stayed in memory (the soak's growth, issue 14). Call under the lock."""
    now = time.monotonic()
    for k in [k for k, e in cache.items() if e[0] <= now]:
        del cache[k]
    if len(cache) >= size:
        cache.clear()
    cache[key] = entry


def offer_doc(c: Candidate) -> dict[str, Any]:
    """The candidate's offer, with its accelerator and GPU count (JSON)."""
    return {
        "cloud": c.cloud,
        "region": c.region,
        "zone": c.zone,
        "instance_type": c.instance_type,
        "market": c.market,
        "accelerator": c.accelerator,
        "gpu_count": c.gpu_count,
    }


def _usd(value: Decimal) -> str:
    return str(value.quantize(MICRO))


def candidate_doc(c: Candidate) -> dict[str, Any]:
    """A placement as stored in a quote (money as a decimal string, to the micro-dollar)."""
    return {
        "offer": offer_doc(c),
        "usd_per_hour": c.usd_per_hour,
        "expected_hours": c.expected_hours,
        "expected_cost_usd": _usd(c.expected_cost_usd),
        "steps_per_s": c.steps_per_s,
    }


def _key(c: Candidate) -> OfferKey:
    return OfferKey(Cloud(c.cloud), c.region, c.zone, c.instance_type, Market(c.market))


def _placement(c: Candidate) -> Placement:
    return Placement(
        offer=_key(c),
        usd_per_hour=c.usd_per_hour,
        steps_per_s=c.steps_per_s,
        expected_hours=c.expected_hours,
        expected_cost_usd=c.expected_cost_usd,
    )


def _constrain(frame: pd.DataFrame, name: str, value: Any) -> pd.DataFrame:
    if value is None:
        return frame
    column = _LIST_CONSTRAINTS.get(name)
    if column is not None:
        return frame[frame[column].astype(str).isin([str(v) for v in value])]
    if name == "accelerators":
        from costopt.domain import normalize_accelerator

        wanted = {normalize_accelerator(str(v)) for v in value}
        return frame[frame["accelerator"].isin(wanted)]
    if name == "max_usd_per_hour":
        return frame[frame["usd_per_hour"] <= float(value)]
    raise ValueError(f"unknown constraint {name!r}")  # pragma: no cover - the schema is closed


def apply_constraints(frame: pd.DataFrame, constraints: Mapping[str, Any], skip: str | None = None) -> pd.DataFrame:
    """The offers of ``frame`` that satisfy every constraint (but ``skip``)."""
    for name in CONSTRAINT_ORDER:
        if name != skip:
            frame = _constrain(frame, name, constraints.get(name))
    return frame.reset_index(drop=True)


@dataclass(frozen=True, slots=True)
class _Table:
    """A cached offer table: the plan's now, the offers, their table, its cache key and expiry (monotonic)."""

    now: Now
    offers: pd.DataFrame
    table: OfferTable
    key: tuple[Any, ...]
    expires: float


@dataclass(slots=True)
class JobPlanner:
    """Plans managed jobs over the price store (see the module doc). Implements
    :class:`costopt.jobs.placement.Placements`.

    ``unavailable``: the unavailable-offers cache (None: none left out). ``spent``: the job's cost so far
    (job id, time -> Decimal USD; None: budgets are not reduced by what was spent). ``now``: the
    service's time when it is not the wall clock (the simulated cloud's), so quotes use the prices the
    job will launch at; None: "now" is the settings' clock (live, or the data's own time)."""

    store: PriceStore
    settings: Settings
    unavailable: UnavailableOffers | None = None
    spent: Callable[[str, datetime], Decimal] | None = None
    now: Callable[[], datetime] | None = None
    _tables: dict[tuple[Any, ...], tuple[float, pd.DataFrame, OfferTable]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _tables_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    _epochs: tuple[int, np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False, compare=False)
    _one_tables: dict[tuple[Any, ...], tuple[float, OfferTable]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _plans: dict[tuple[Any, ...], tuple[float, Plan, ThroughputCatalog]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    # -- inputs ----------------------------------------------------------------------------------------

    def default_at(self) -> datetime | None:
        """When a plan without ``at`` is made: the service's time (``now``), or None (the settings' clock)."""
        return self.now() if self.now is not None else None

    def catalog_for(self, spec: Mapping[str, Any], job_id: str | None = None) -> tuple[JobType, ThroughputCatalog]:
        """The job's type and the catalog to plan it on (raises :class:`UnknownJobType`). A job given by its
        own ``throughput``: with ``job_id`` (a submitted job) its own catalog, which learns from its progress
        and is then extended to other GPUs (:func:`api.planning.own_job_catalog`); without, the figures as given."""
        gpus = int(spec.get("gpus", 1))
        throughput = spec.get("throughput")
        if throughput and job_id is not None:
            return own_job_catalog(
                self.settings,
                self.store,
                job_id,
                {str(a): float(v) for a, v in throughput.items()},
                gpus,
                spec.get("precision") or DEFAULT_PRECISION,
            )
        if throughput:
            catalog = ThroughputCatalog()
            for acc, steps_per_s in throughput.items():
                catalog = catalog.with_measurement(USER_JOB_TYPE, str(acc), gpus, float(steps_per_s))
            return USER_JOB_TYPE, catalog
        name = str(spec.get("job_type") or "")
        catalog = catalog_at(self.settings, self.store, spec.get("precision") or DEFAULT_PRECISION)
        names = [jt.name for jt in catalog.job_types()]
        if name in names:
            return JobType.parse(name), catalog
        folded = {n.lower(): n for n in names}
        if name.lower() in folded:
            return JobType.parse(folded[name.lower()]), catalog
        raise UnknownJobType(name, close_matches(name, names))

    def plan(
        self,
        spec: Mapping[str, Any],
        *,
        at: datetime | None = None,
        steps: float | None = None,
        objective: Objective | None = None,
        location: Location | None = None,
        exclude: Collection[OfferKey] = (),
        top: int = 10,
        respect_unavailable: bool = True,
        only: OfferKey | None = None,
        job_id: str | None = None,
    ) -> tuple[Now, Plan]:
        """Plan the job ``spec`` (its ``steps`` unless ``steps`` is given; its objective unless
        ``objective`` is given) at ``at`` (None: now by the settings' clock), whole-instance priced.
        ``only``: price this one offer (its constraints, ``exclude`` and unavailability are not applied).
        ``job_id``: the submitted job's (see :meth:`catalog_for`). Raises :class:`UnknownJobType` or
        :class:`JobInfeasible`."""
        from costopt.planning.evaluate import OfferTable
        from costopt.planning.single import plan_job

        if at is None:
            at = self.default_at()
        job_type, catalog = self.catalog_for(spec, job_id)
        inputs = planner_inputs(self.settings, self.store)
        assumptions = replace(inputs.assumptions, per_gpu_packing=False)
        job = JobSpec(
            job_type,
            float(steps if steps is not None else spec["steps"]),
            int(spec.get("gpus", 1)),
            float(spec.get("checkpoint_gb", 0.0)) if location is not None else 0.0,
            location,
            spec.get("precision") or DEFAULT_PRECISION,
        )
        constraints: Mapping[str, Any] = spec.get("constraints") or {}
        if only is not None:  # one offer: the store filters it out of the snapshot
            now = plan_now(self.store, self.settings, at)
            table = self._one_offer_table(only, now, inputs.hazards)
            try:
                return now, plan_job(job, self._goal(spec, objective), table, catalog, assumptions, top=top)
            except Infeasible as exc:
                raise JobInfeasible(str(exc), binding=exc.binding) from exc
        found = self._cached_table(
            at, constraints, inputs.hazards, exclude=exclude, respect_unavailable=respect_unavailable
        )
        now, offers, table = found.now, found.offers, found.table

        def run(f: pd.DataFrame, obj: Objective, n: int) -> Plan:
            return plan_job(job, obj, OfferTable.from_frame(f, inputs.hazards), catalog, assumptions, top=n)

        # A new job's plan (its own objective, no location, nothing excluded: a quote) of a catalog job
        # type is a function of the cached table, the catalog (the same object: planner_inputs' until
        # reset) and the job's planning fields: identical submissions (a sweep's) share it for as long as
        # the table is cached.
        memo = None
        quote = objective is None and location is None and not exclude and respect_unavailable
        if quote and not spec.get("throughput"):
            memo = (found.key, job, json.dumps(spec.get("objective") or {}, sort_keys=True), top)
            with self._tables_lock:
                hit = self._plans.get(memo)
            if hit is not None and hit[0] > time.monotonic() and hit[2] is catalog:
                return now, hit[1]
        goal = self._goal(spec, objective)
        try:
            plan = plan_job(job, goal, table, catalog, assumptions, top=top)
        except Infeasible as exc:
            if exc.binding not in ("offers", "throughput"):
                raise JobInfeasible(str(exc), binding=exc.binding) from exc
            raise self._binding_constraint(exc, offers, constraints, run, goal, job) from exc
        margin = (spec.get("objective") or {}).get(PREFER_MEASURED)
        if margin is not None:
            from costopt.throughput.uncertainty import prefer_measured

            plan = prefer_measured(plan, float(margin))
        if memo is not None:
            with self._tables_lock:
                _put(self._plans, memo, (found.expires, plan, catalog), PLAN_CACHE_SIZE)
        return now, plan

    def _one_offer_table(self, offer: OfferKey, now: Now, hazards: HazardModel) -> OfferTable:
        """The table of ``offer`` alone in effect at ``now`` (stale: empty), cached like the whole table
        (price version and :meth:`price_epoch` of the time, :data:`TABLE_TTL_S`): a running job's ETA is
        priced on its offer at every read of the job."""
        from costopt.planning.evaluate import OfferTable
        from pricing.mirror import read_version

        version = read_version(self.store.engine)
        key = ("one offer", version, self.price_epoch(version, snapshot_time(now)), offer, id(hazards))
        with self._tables_lock:
            hit = self._one_tables.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        one = self.store.snapshot_frame(
            snapshot_time(now),
            cloud=offer.cloud,
            region=offer.region,
            zone=offer.zone,
            instance_type=offer.instance_type,
            market=offer.market,
        )
        table = OfferTable.from_frame(one, hazards)
        with self._tables_lock:
            _put(self._one_tables, key, (time.monotonic() + TABLE_TTL_S, table), ONE_TABLE_CACHE_SIZE)
        return table

    @staticmethod
    def _goal(spec: Mapping[str, Any], objective: Objective | None) -> Objective:
        """``objective``, or else the job's own (raises InvalidJob naming a bad parameter)."""
        return objective if objective is not None else objective_of(spec.get("objective") or {})

    def offer_table(
        self,
        at: datetime | None,
        constraints: Mapping[str, Any],
        hazards: HazardModel,
        *,
        exclude: Collection[OfferKey] = (),
        respect_unavailable: bool = True,
    ) -> tuple[Now, pd.DataFrame, OfferTable]:
        """(now, the offers in effect at ``at`` (None: now by the settings' clock) less the unavailable
        ones (unless not ``respect_unavailable``) and ``exclude``, their offer table under ``constraints``),
        cached (:meth:`_cached_table`)."""
        found = self._cached_table(at, constraints, hazards, exclude=exclude, respect_unavailable=respect_unavailable)
        return found.now, found.offers, found.table

    def _cached_table(
        self,
        at: datetime | None,
        constraints: Mapping[str, Any],
        hazards: HazardModel,
        *,
        exclude: Collection[OfferKey] = (),
        respect_unavailable: bool = True,
    ) -> _Table:
        """(now, the offers in effect at ``at`` (None: now by the settings' clock) less the unavailable
        ones (unless not ``respect_unavailable``) and ``exclude``, their offer table under ``constraints``).

        The pair is cached for :data:`TABLE_TTL_S` per price version, :meth:`price_epoch` of the plan time
        (not the time itself: over the simulated clock every tick is a new time, but the offers only
        change when a price point takes effect or an offer turns stale), unavailable offers, exclusions
        and constraints. The key (price version first) is read before the offers, so a cached table is
        never older than its key. A hit costs two small reads on one connection (the version, the unavailable
        offers)."""
        from costopt.planning.evaluate import OfferTable
        from pricing.mirror import read_version

        now = plan_now(self.store, self.settings, at)
        unavailable = self.unavailable if respect_unavailable else None
        with self.store.engine.connect() as conn:  # both small reads on one checkout, no transaction
            if conn.dialect.name != "sqlite":  # SQLite opens none for a read (as JobRepository.reading)
                conn.execution_options(isolation_level="AUTOCOMMIT")
            version = read_version(conn)
            gone = frozenset() if unavailable is None else unavailable.unavailable_set(at=at, conn=conn)
        key = (
            version,
            self.price_epoch(version, snapshot_time(now)),
            gone,
            frozenset(exclude),
            json.dumps(constraints, sort_keys=True, default=str),
            id(hazards),
        )
        with self._tables_lock:
            hit = self._tables.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return _Table(now, hit[1], hit[2], key, hit[0])
        _, offers = offers_at(self.store, self.settings, at, None, now=now)
        drop = gone | frozenset(exclude)  # the unavailable set read once, for the key and the frame
        if drop:
            keys = {(o.cloud.value, o.region, o.zone, o.instance_type, o.market.value) for o in drop}
            cols = ("cloud", "region", "zone", "instance_type", "market")
            rows = zip(*(offers[c].astype(str).to_numpy() for c in cols), strict=True)
            offers = offers[[tuple(r) not in keys for r in rows]].reset_index(drop=True)
        table = OfferTable.from_frame(apply_constraints(offers, constraints), hazards)
        expires = time.monotonic() + TABLE_TTL_S
        with self._tables_lock:
            _put(self._tables, key, (expires, offers, table), TABLE_CACHE_SIZE)
        return _Table(now, offers, table, key, expires)

    def price_epoch(self, version: int, t: datetime | None) -> tuple[Any, ...] | None:
        """What the store's snapshot at ``t`` depends on, at price ``version``: how many price points have
        taken effect by ``t`` and how many offers have turned stale by then (each offer is stale once
        ``t`` is past its last confirmation + ``stale_after``). Two times with the same pair have the same
        snapshot, so a table cached at one serves the other. None for a live snapshot (``t`` None: judged
        at the wall clock, bounded by the TTL); ``("at", t)`` when the store keeps no mirror of its points
        (the exact time is then the key)."""
        if t is None:
            return None
        arrays = self._epoch_arrays(version)
        if arrays is None:
            return ("at", t)
        from pricing.ingest import dt_to_ns

        t_ns = dt_to_ns(t.astimezone(UTC))
        return (int(np.searchsorted(arrays[0], t_ns, "right")), int(np.searchsorted(arrays[1], t_ns, "left")))

    def _epoch_arrays(self, version: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(every price point's valid_from, every offer's stale-from time), each sorted, in ns, at
        ``version`` (kept until the version changes); None when the mirror cannot give them at that version."""
        cached = self._epochs
        if cached is not None and cached[0] == version:
            return cached[1], cached[2]
        from pricing.mirror import read_version

        mirror = getattr(self.store, "mirror", None)
        points = mirror.points() if mirror is not None else None
        if mirror is None or points is None or points.version != version:
            return None
        confirmed = mirror.offers()["confirmed"].to_numpy(dtype=np.int64)
        if read_version(self.store.engine) != version:  # versions only grow: the offers were at it too
            return None
        stale_ns = self.store.stale_after // timedelta(microseconds=1) * 1000
        arrays = (np.sort(points.vf), np.sort(confirmed + stale_ns))
        self._epochs = (version, *arrays)
        return arrays

    def _binding_constraint(
        self,
        exc: Infeasible,
        offers: pd.DataFrame,
        constraints: Mapping[str, Any],
        run: Callable[[pd.DataFrame, Objective, int], Plan],
        goal: Objective,
        job: JobSpec,
    ) -> JobInfeasible:
        """Which constraint binds: the first whose removal alone lets the job run."""
        given = [n for n in CONSTRAINT_ORDER if constraints.get(n) is not None]
        for name in given:
            try:
                plan = run(apply_constraints(offers, constraints, skip=name), goal, 1)
            except Infeasible:
                continue
            w = plan.winner
            return JobInfeasible(
                f"no offer can run {job.job_type.name} on {job.gpu_count} GPU(s) within constraints.{name} "
                f"({constraints[name]}); without it the best is {w.cloud} {w.region} {w.instance_type} ({w.market}) "
                f"at ${w.usd_per_hour:.4f}/h: widen constraints.{name}",
                binding=f"constraints.{name}",
            )
        if given:
            return JobInfeasible(
                f"{exc} under the constraints {', '.join(given)}: no single one binds, widen several",
                binding="constraints",
            )
        return JobInfeasible(str(exc), binding=exc.binding)

    # -- quotes ----------------------------------------------------------------------------------------

    def quote(self, spec: Mapping[str, Any], *, at: datetime | None = None, candidates: int = 5) -> dict[str, Any]:
        """The quote stored with a new job: the winner, the next ``candidates`` - 1 placements, when
        (``as_of``) and why. Raises :class:`UnknownJobType` or :class:`JobInfeasible`."""
        now, plan = self.plan(spec, at=at, top=candidates)
        return quote_doc(plan, now.at)

    # -- Placements --------------------------------------------------------------------------------------

    def _live_objective(self, job: JobRecord, at: datetime) -> Objective:
        elapsed = max(0.0, (at - job.created_at).total_seconds() / 3600)
        spent = self.spent(job.id, at) if self.spent is not None else Decimal(0)
        return objective_of(job.spec.get("objective") or {}, elapsed_hours=elapsed, spent_usd=spent)

    def rank(
        self,
        job: JobRecord,
        *,
        remaining_steps: float,
        at: datetime,
        exclude: Collection[OfferKey] = (),
        top: int = 10,
    ) -> Sequence[Placement]:
        """The best ``top`` placements for the rest of ``job`` at ``at`` (see
        :meth:`costopt.jobs.placement.Placements.rank`); empty when nothing can run it."""
        if remaining_steps <= 0:
            return []
        location = Location(job.offer.cloud, job.offer.region) if job.offer is not None else None
        try:
            _, plan = self.plan(
                job.spec,
                at=at.astimezone(UTC),
                steps=remaining_steps,
                objective=self._live_objective(job, at),
                location=location,
                exclude=exclude,
                top=top,
                job_id=job.id,
            )
        except (UnknownJobType, JobInfeasible, InvalidJob):
            return []
        return [_placement(c) for c in plan.alternatives]

    def at_offer(self, job: JobRecord, offer: OfferKey, *, remaining_steps: float, at: datetime) -> Placement | None:
        """``job`` on ``offer`` at ``at`` (no move: no egress), whole-instance priced; None when the
        offer has no price then or cannot run the job."""
        if remaining_steps <= 0:
            return None
        try:
            _, plan = self.plan(
                job.spec,
                at=at.astimezone(UTC),
                steps=remaining_steps,
                objective=MinCost(),
                top=1,
                respect_unavailable=False,
                only=offer,
                job_id=job.id,
            )
        except (UnknownJobType, JobInfeasible, InvalidJob):
            return None
        return _placement(plan.winner)


def quote_doc(plan: Plan, as_of: datetime) -> dict[str, Any]:
    """A plan as the quote stored with a job (JSON; money as decimal strings)."""
    return {
        **candidate_doc(plan.winner),
        "as_of": as_of.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "reason": plan.reason,
        "per_gpu_packing": False,
        "candidates": [candidate_doc(c) for c in plan.alternatives],
    }
