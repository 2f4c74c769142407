"""Backtest one job (``costopt backtest job``) through the job service's own path over the simulated cloud.

A job of ``steps`` steps is submitted at ``start`` and run by :func:`costopt.jobs.offline.run_offline`: the
job engine, the rebalancer, the migrator, the interruption watcher and the ledger, over the simulated cloud
(its simulated agents train, checkpoint and are preempted on simulated time) until its steps are done or
``end`` comes. The policy is what the engine and the rebalancer are given:

- :class:`PlannerPlacements` (the service's :class:`~costopt.jobs.placement.Placements` contract): the
  planner (:func:`costopt.planning.single.plan_job`) over every offer priced at the time asked, under the
  objective (a deadline shrinks with the time elapsed) and with the hazards (risk-aware expected cost),
  whole-instance prices as the service bills; ``static`` ranks only the job's own offer once it runs, so a
  preempted static job relaunches there;
- the rebalancer's rule every ``rebalance_hours`` from the start: ``dynamic_migration_cost`` the migration
  decision rule (restart and overlap: the simulated cloud's boot + restore and checkpoint times),
  ``dynamic`` :data:`~costopt.jobs.offline.ALWAYS_MOVE` (moves whenever another offer is cheaper per step),
  ``static`` none.

After a preemption the watcher recovers the job on its ranked placements (the preempted offer, marked
unavailable, is tried last). The ledger bills every copy (launch to end, across price changes), the
egress of a checkpoint moved between places, and the memo charges (restart, overlap).

Units: steps, steps/s, USD per instance-hour (float prices), Decimal USD for money, tz-aware UTC times.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from costopt.domain import Cloud, Market, OfferKey, utc
from costopt.errors import CostoptError
from costopt.jobs.offline import ALWAYS_MOVE, OfflineJob, OfflineRun, run_offline
from costopt.jobs.placement import Placement
from costopt.jobs.records import JobRecord
from costopt.ledger.model import ChargeKind
from costopt.ledger.prices import KEY_COLUMNS, PriceView, offer_label
from costopt.migration.decision import MigrationRule
from costopt.planning.evaluate import OfferTable
from costopt.planning.model import (
    Assumptions,
    Candidate,
    Infeasible,
    JobSpec,
    Location,
    MinCost,
    MinCostByDeadline,
    MinTime,
    Objective,
    to_cents,
)
from costopt.planning.single import plan_job
from costopt.risk.hazard import HazardModel
from costopt.simulated import CloudFactory
from costopt.throughput.catalog import ThroughputCatalog
from costopt.throughput.model import JobType

__all__ = [
    "DEFAULT_CHECKPOINT_GB",
    "JOB_POLICIES",
    "PREEMPTION_EVENTS",
    "JobBacktest",
    "JobBacktestError",
    "PlannerPlacements",
    "run_job_backtest",
]

log = logging.getLogger(__name__)

JOB_POLICIES: tuple[str, ...] = ("static", "dynamic", "dynamic_migration_cost")
"""``static``: the planner's choice at the start, kept (relaunched on the same offer after a
preemption). ``dynamic``: rebalanced every ``rebalance_hours``, moving whenever another offer is cheaper
per step (moves taken as free). ``dynamic_migration_cost``: rebalanced with the migration decision rule."""

PREEMPTION_EVENTS: tuple[str, ...] = ("preemption", "copy_lost")
"""The job engine's events of a copy the cloud took (a preemption, or a copy found gone): what the
backtests count as preemptions."""

DEFAULT_CHECKPOINT_GB = 1.0
"""Checkpoint size (GB) of a job type the paper's table does not size (an assumption)."""


class JobBacktestError(CostoptError, ValueError):
    """A job backtest cannot run as asked (no offer at the start, bad parameters)."""


class PlannerPlacements:
    """The planner over a :class:`PriceView` as the job service's
    :class:`~costopt.jobs.placement.Placements` for one job type (module docstring).

    ``usd_per_hour`` is the whole instance's price (the ledger bills instances); ``top`` ranked
    alternatives are returned, the planner's winner first. :meth:`rate` is the simulated agents'
    throughput: the planner's steps/s of the job on the offers it ranked."""

    def __init__(
        self,
        prices: PriceView,
        catalog: ThroughputCatalog,
        *,
        job_type: JobType,
        objective: Objective,
        static: bool = False,
        gpus: int = 1,
        checkpoint_gb: float = 0.0,
        hazards: HazardModel | None = None,
        assumptions: Assumptions | None = None,
        start: datetime | None = None,
        clouds: Collection[str] | None = None,
        regions: Collection[str] | None = None,
        markets: Collection[str] | None = None,
    ) -> None:
        self.prices, self.catalog, self.job_type, self.objective = prices, catalog, job_type, objective
        self.static, self.gpus, self.checkpoint_gb = static, gpus, checkpoint_gb
        self.hazards = hazards or HazardModel()
        self.assumptions = assumptions or Assumptions()
        self.start = start
        self.filters = {"cloud": clouds, "region": regions, "market": markets}
        self.rates: dict[OfferKey, float] = {}

    def rate(self, job_type: str, gpus: int, offer: OfferKey, precision: str = "fp32") -> float | None:
        """Steps/s of the job on ``offer`` as the planner ranked it (None: never ranked; the backtest plans
        at ``fp32``, the precision is not used)."""
        return self.rates.get(offer)

    def _objective_now(self, at: datetime) -> Objective:
        o = self.objective
        if isinstance(o, MinCostByDeadline) and self.start is not None:
            left = o.deadline_hours - (at - self.start).total_seconds() / 3600.0
            return MinCostByDeadline(left, o.confidence) if left > 0 else MinTime()
        return o

    def candidates(
        self,
        remaining: float,
        at: datetime,
        *,
        exclude: Collection[OfferKey] = (),
        location: Location | None = None,
        top: int = 10,
    ) -> list[Candidate]:
        """The planner's ranked candidates for ``remaining`` steps at ``at`` (empty: none)."""
        if remaining <= 0:
            return []
        frame = self.prices.offers_at(at)
        for col, allowed in self.filters.items():
            if allowed is not None:
                frame = frame[frame[col].isin(list(allowed))]
        if exclude and len(frame):
            drop = {(k.cloud.value, k.region, k.zone, k.instance_type, k.market.value) for k in exclude}
            keys = list(zip(*[frame[c] for c in KEY_COLUMNS], strict=True))
            frame = frame[[k not in drop for k in keys]]
        frame = frame.reset_index(drop=True)
        job = JobSpec(
            self.job_type, remaining, gpu_count=self.gpus, checkpoint_gb=self.checkpoint_gb, location=location
        )
        try:
            table = OfferTable.from_frame(frame, self.hazards)
            plan = plan_job(job, self._objective_now(at), table, self.catalog, self.assumptions, top=top)
        except Infeasible as exc:
            log.info("no placement at %s: %s", at.isoformat(), exc)
            return []
        return list(plan.alternatives)

    def _placement(self, c: Candidate) -> Placement:
        key = OfferKey(Cloud(c.cloud), c.region, c.zone, c.instance_type, Market(c.market))
        self.rates[key] = c.steps_per_s
        return Placement(key, c.usd_per_hour, c.steps_per_s, c.expected_hours, c.expected_cost_usd)

    def rank(
        self,
        job: JobRecord,
        *,
        remaining_steps: float,
        at: datetime,
        exclude: Collection[OfferKey] = (),
        top: int = 10,
    ) -> Sequence[Placement]:
        if self.static and job.offer is not None:
            here = (
                None if job.offer in exclude else self.at_offer(job, job.offer, remaining_steps=remaining_steps, at=at)
            )
            return [] if here is None else [here]
        location = None if job.offer is None else Location(job.offer.cloud, job.offer.region)
        ranked = self.candidates(remaining_steps, at, exclude=exclude, location=location, top=top)
        return [self._placement(c) for c in ranked]

    def at_offer(self, job: JobRecord, offer: OfferKey, *, remaining_steps: float, at: datetime) -> Placement | None:
        sps = self.rates.get(offer)
        steps = self.prices.steps(offer, at, at + timedelta(microseconds=1))
        if sps is None or sps <= 0 or not steps:
            return None
        price = steps[-1].usd_per_hour
        hours = remaining_steps / sps / 3600.0
        return Placement(offer, price, sps, hours, Decimal(repr(round(hours * price, 6))))


def _money(value: Decimal) -> float:
    return float(to_cents(value))


@dataclass(frozen=True, eq=False)
class JobBacktest:
    """The result of :func:`run_job_backtest`: the offline run (job record, events, copies, ledger report,
    rebalancing passes), the policy, objective and seed."""

    run: OfflineRun
    job_type: str
    policy: str
    objective: str
    seed: int
    end: datetime

    @property
    def job(self) -> JobRecord:
        return self.run.jobs[0]

    @property
    def report(self) -> Any:
        """The ledger's :class:`~costopt.ledger.model.CostReport` of the job (open intervals up to the end)."""
        return self.run.costs[self.job.id]

    @property
    def total_usd(self) -> Decimal:
        return Decimal(self.report.total_usd)

    def _count(self, *kinds: str) -> int:
        return sum(1 for e in self.run.events[self.job.id] if e.kind in kinds)

    @property
    def moves(self) -> int:
        return self._count("move")

    @property
    def preemptions(self) -> int:
        return self._count(*PREEMPTION_EVENTS)

    @property
    def finished(self) -> bool:
        return self.job.state.value == "succeeded"

    @property
    def hours(self) -> float:
        """From the start to the finish (or to where the run stopped)."""
        return ((self.job.finished_at or self.run.ended_at) - self.run.started_at).total_seconds() / 3600.0

    @property
    def lost_steps(self) -> int:
        """Steps trained but lost to preemptions (the engine's ``preemption`` events)."""
        lost = 0
        for e in self.run.events[self.job.id]:
            if e.kind == "preemption" and e.detail:
                lost += int(e.detail.get("lost_steps") or 0)
        return lost

    def decisions(self) -> list[dict[str, Any]]:
        """What was decided, in time order: every rebalancing verdict (moved, stayed, failed and why) and
        the job's own moves, preemptions, recoveries and launch failures."""
        out: list[dict[str, Any]] = []
        for rep in self.run.rebalances:
            for item in rep.items:
                out.append(
                    {
                        "at": rep.at.isoformat(),
                        "event": "rebalance",
                        "action": item.outcome.value,
                        "target": None if item.to_offer is None else offer_label(item.to_offer),
                        "reason": item.reason,
                    }
                )
        for e in self.run.events[self.job.id]:
            if e.kind in ("move", "preemption", "copy_lost", "recovery", "launch_failed", "move_rolled_back"):
                to = e.detail.get("to") if isinstance(e.detail, dict) else None
                target = offer_label(OfferKey.from_doc(to)) if isinstance(to, dict) else None
                out.append(
                    {"at": e.at.isoformat(), "event": e.kind, "action": e.kind, "target": target, "reason": e.reason}
                )
        return sorted(out, key=lambda d: d["at"])

    def as_dict(self) -> dict[str, Any]:
        """JSON-able figures: money as floats rounded to the cent (``*_usd``) and exact Decimal text
        (``total_cost_usd_exact``); times ISO 8601 UTC; one entry per ledger interval and charge, and the
        decisions."""
        job, rep = self.job, self.report
        return {
            "job_id": job.id,
            "job_type": self.job_type,
            "policy": self.policy,
            "objective": self.objective,
            "seed": self.seed,
            "provider": job.provider,
            "state": job.state.value,
            "start": self.run.started_at.isoformat(),
            "end": self.end.isoformat(),
            "finished": self.finished,
            "finished_at": None if job.finished_at is None else job.finished_at.isoformat(),
            "hours": round(self.hours, 4),
            "steps_requested": job.steps_total,
            "steps_done": job.steps_done,
            "lost_steps": self.lost_steps,
            "moves": self.moves,
            "preemptions": self.preemptions,
            "launch_failures": self._count("launch_failed"),
            "total_cost_usd": _money(rep.total_usd),
            "total_cost_usd_exact": str(rep.total_usd.quantize(Decimal("0.000001"), rounding=ROUND_HALF_EVEN)),
            "instance_cost_usd": _money(Decimal(rep.instances_micro_usd).scaleb(-6)),
            "egress_cost_usd": _money(rep.memo_usd(ChargeKind.EGRESS)),
            "memo_usd": {k.value: _money(rep.memo_usd(k)) for k in (ChargeKind.RESTART, ChargeKind.OVERLAP)},
            "intervals": [
                {
                    "instance_id": ln.record.instance_id,
                    "cloud": ln.record.offer.cloud.value,
                    "region": ln.record.offer.region,
                    "zone": ln.record.offer.zone,
                    "instance_type": ln.record.offer.instance_type,
                    "market": ln.record.offer.market.value,
                    "started_at": ln.starts_at.isoformat(),
                    "ended_at": ln.ends_at.isoformat(),
                    "open": ln.open,
                    "end_reason": ln.record.end_reason,
                    "hours": round(ln.hours, 4),
                    "cost_usd": _money(ln.amount_usd),
                }
                for ln in rep.lines
            ],
            "charges": [
                {
                    "kind": c.record.kind.value,
                    "additive": c.additive,
                    "at": c.record.at.isoformat(),
                    "cost_usd": _money(c.amount_usd),
                    "note": c.record.note,
                }
                for c in rep.charges
            ],
            "decisions": self.decisions(),
        }


def run_job_backtest(
    prices: PriceView,
    catalog: ThroughputCatalog,
    cloud_factory: CloudFactory,
    *,
    job_type: str,
    steps: float,
    start: datetime,
    end: datetime,
    objective: Objective | None = None,
    policy: str = "dynamic_migration_cost",
    hazards: HazardModel | None = None,
    gpus: int = 1,
    checkpoint_gb: float | None = None,
    rebalance_hours: float = 24.0,
    clouds: Collection[str] | None = None,
    regions: Collection[str] | None = None,
    markets: Collection[str] | None = None,
    seed: int = 0,
    team: str = "backtest",
    rule: MigrationRule | None = None,
    checkpoint_sizes: Mapping[str, float] | None = None,
) -> JobBacktest:
    """Backtest one job (``costopt backtest job``): ``steps`` steps of ``job_type`` from ``start`` through
    the job service's path on the simulated cloud that ``cloud_factory`` builds on ``prices`` (seeded by
    ``seed``), under ``policy`` (:data:`JOB_POLICIES`) and ``objective`` (default min-cost), rebalanced
    every ``rebalance_hours``, stopped at ``end`` if not done (module docstring).

    The decision rule's restart and overlap are the simulated cloud's boot + restore and checkpoint times
    unless ``rule`` is given; the planner's checkpoint interval and restart are the same. ``checkpoint_gb``
    defaults to the paper's estimate for its six models (``checkpoint_sizes``, by default
    :data:`costopt.backtest.paper.PAPER_CHECKPOINT_GB`), else :data:`DEFAULT_CHECKPOINT_GB`. Raises
    :class:`JobBacktestError` (bad parameters, nothing to start on)."""
    from costopt.backtest.paper import PAPER_CHECKPOINT_GB

    if policy not in JOB_POLICIES:
        raise JobBacktestError(f"unknown policy {policy!r}; choose from {', '.join(JOB_POLICIES)}")
    start, end = utc(start), utc(end)
    if end <= start:
        raise JobBacktestError(f"the run ends ({end}) before it starts ({start})")
    if not (steps >= 1 and math.isfinite(steps)):
        raise JobBacktestError(f"steps must be >= 1, got {steps}")
    if not rebalance_hours > 0:
        raise JobBacktestError(f"rebalance_hours must be > 0, got {rebalance_hours}")
    if gpus < 1:
        raise JobBacktestError(f"gpus must be >= 1, got {gpus}")
    jt = JobType.parse(job_type)
    obj = objective if objective is not None else MinCost()
    hz = hazards or HazardModel()
    sizes = PAPER_CHECKPOINT_GB if checkpoint_sizes is None else checkpoint_sizes
    gb = checkpoint_gb if checkpoint_gb is not None else float(sizes.get(jt.name, DEFAULT_CHECKPOINT_GB))
    placements = PlannerPlacements(
        prices,
        catalog,
        job_type=jt,
        objective=obj,
        static=policy == "static",
        gpus=gpus,
        checkpoint_gb=gb,
        hazards=hz,
        start=start,
        clouds=clouds,
        regions=regions,
        markets=markets,
    )
    cloud = cloud_factory(prices, hz, start=start, seed=seed, rate=placements.rate)
    timing = cloud.timing
    placements.assumptions = Assumptions(
        checkpoint_interval_hours=timing.checkpoint_interval_hours, restart_hours=timing.restart_hours
    )
    if not placements.candidates(float(steps), start, top=1):
        raise JobBacktestError(f"no offer can run {jt.name} at {start.isoformat()} under the filters given")
    if policy == "static":
        chosen: MigrationRule | None = None
    elif policy == "dynamic":
        chosen = ALWAYS_MOVE
    else:
        chosen = rule or MigrationRule(
            restart_hours=timing.restart_hours, checkpoint_overlap_hours=timing.checkpoint_hours
        )
    spec = {"command": ["train"], "job_type": jt.name, "gpus": gpus, "checkpoint_gb": gb}
    run = run_offline(
        cloud,
        prices,
        placements,
        [OfflineJob(int(steps), spec, name=jt.name, team_id=team)],
        until=end,
        rule=chosen,
        rebalance_every=timedelta(hours=rebalance_hours),
    )
    return JobBacktest(run=run, job_type=jt.name, policy=policy, objective=obj.name, seed=seed, end=end)
