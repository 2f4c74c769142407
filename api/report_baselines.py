"""The service's :class:`~costopt.reports.baselines.BaselineSource`: the on-demand baseline from each
team's reference (``COSTOPT_REPORT_BASELINES``) with the job's throughput there from the planner, and the
static-spot baseline from the job's quote.

A reference naming an instance type is priced as that instance (the planner gives the job's steps/s on
it, ``JobPlanner.at_offer``); a reference naming only a cloud region takes the planner's cheapest
on-demand placement for the job there, with the prices in effect at the job's submission (the job's own
spec, its constraints replaced by that region and the on-demand market, objective min-cost). A choice
depends only on the job's submission, so it is cached per job for the life of the process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from api.job_planning import JobInfeasible, JobPlanner, UnknownJobType
from costopt.domain import Cloud, Market, OfferKey
from costopt.errors import CostoptError
from costopt.jobs.records import JobRecord
from costopt.ledger.prices import offer_label
from costopt.planning.model import InvalidJob, MinCost
from costopt.reports.baselines import BaselineChoice, static_spot_from_quote
from costopt.reports.model import BaselineKind, NoBaseline
from costopt.reports.references import ReferenceRules
from costopt.reports.standing import earliest_on_demand

__all__ = ["PlannerBaselines"]

_CACHE_SIZE = 100_000
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


class PlannerBaselines:
    """Baselines of the service's jobs (module docstring). ``team_names``: team id -> name (rules may
    name a team by either). ``quote_of``: a job's quote by id, for a job read without it (:meth:`needs_quote`
    said no) whose static-spot choice was evicted since (None: such a job has no static-spot baseline)."""

    def __init__(
        self,
        planner: JobPlanner,
        rules: ReferenceRules,
        team_names: Mapping[str, str],
        quote_of: Callable[[str], Mapping[str, Any] | None] | None = None,
    ) -> None:
        self.planner = planner
        self.quote_of = quote_of
        self.rules = rules
        self.team_names = dict(team_names)
        self._cache: dict[str, BaselineChoice | NoBaseline] = {}
        self._spot: dict[str, BaselineChoice | NoBaseline] = {}
        self._firsts: dict[tuple[Cloud, str, str | None], datetime | None] = {}
        self._lock = threading.Lock()

    def static_spot(self, job: JobRecord) -> BaselineChoice | NoBaseline:
        """From the job's quote, cached per job (the quote is the one at submission: it never changes). A
        job whose choice is cached may come without its quote (:meth:`needs_quote`)."""
        with self._lock:
            hit = self._spot.get(job.id)
        if hit is not None:
            return hit
        if job.quote is None and self.quote_of is not None:  # read without it, and evicted since: read it now
            quote = self.quote_of(job.id)
            if quote is not None:
                job = replace(job, quote=quote)
        choice = static_spot_from_quote(job)
        with self._lock:
            if len(self._spot) >= _CACHE_SIZE:
                self._spot.clear()
            self._spot[job.id] = choice
        return choice

    def needs_quote(self, job_id: str) -> bool:
        """Whether a report must read the job's quote (False: its static-spot baseline is cached; such a
        job's record may come with ``quote`` None, :func:`costopt.reports.data.load_report_data`)."""
        with self._lock:
            return job_id not in self._spot

    def on_demand(self, job: JobRecord) -> BaselineChoice | NoBaseline:
        with self._lock:
            hit = self._cache.get(job.id)
        if hit is not None:
            return hit
        choice = self._choose(job)
        with self._lock:
            if len(self._cache) >= _CACHE_SIZE:
                self._cache.clear()
            self._cache[job.id] = choice
        return choice

    def _first_on_demand(self, cloud: Cloud, region: str, instance_type: str | None) -> datetime | None:
        """When the store's on-demand prices of ``cloud`` ``region`` (that instance type, or any) start."""
        memo = (cloud, region, instance_type)
        with self._lock:
            if memo in self._firsts:
                return self._firsts[memo]
        first = earliest_on_demand(self.planner.store, cloud, region, _EPOCH, instance_type)
        with self._lock:
            self._firsts[memo] = first
        return first

    def _choose(self, job: JobRecord) -> BaselineChoice | NoBaseline:
        kind = BaselineKind.ON_DEMAND
        gpus = int(job.spec.get("gpus", 1))
        ref = self.rules.reference(job.team_id, self.team_names.get(job.team_id), gpus)
        steps = float(max(job.steps_total, 1))
        at, standing = job.created_at, ""
        first = self._first_on_demand(ref.cloud, ref.region, ref.instance_type)
        if first is not None and at < first:  # an on-demand list price is standing (costopt/reports/standing.py)
            at = first
            standing = (
                f"; the job's submission ({job.created_at.isoformat()}) precedes the store's first on-demand "
                "price there, whose list price is taken as standing"
            )
        try:
            if ref.instance_type is not None:
                offer = ref.offer()
                placed = self.planner.at_offer(job, offer, remaining_steps=steps, at=at)
                if placed is None:
                    return NoBaseline(
                        kind,
                        f"rule {ref.rule}: {offer_label(offer)} had no price at the job's "
                        f"submission ({at.isoformat()}) or cannot run it",
                    )
                return BaselineChoice(offer, placed.steps_per_s, f"rule {ref.rule}: {offer_label(offer)}{standing}")
            spec = {
                **job.spec,
                "constraints": {"clouds": [ref.cloud.value], "regions": [ref.region], "markets": ["on_demand"]},
            }
            _, plan = self.planner.plan(spec, at=at, steps=steps, objective=MinCost(), top=1, respect_unavailable=False)
        except (UnknownJobType, JobInfeasible, InvalidJob) as exc:
            return NoBaseline(kind, f"rule {ref.rule}: the planner cannot place the job there: {exc}")
        except CostoptError as exc:
            return NoBaseline(kind, f"rule {ref.rule}: {type(exc).__name__}: {exc}")
        w = plan.winner
        offer = OfferKey(Cloud(w.cloud), w.region, w.zone, w.instance_type, Market(w.market))
        rule = (
            f"rule {ref.rule}: the planner's cheapest on-demand instance for {gpus} GPU(s) there at submission "
            f"({at.isoformat()}): {offer_label(offer)} at {w.usd_per_hour:g} USD/h, {w.steps_per_s:g} steps/s{standing}"
        )
        return BaselineChoice(offer, w.steps_per_s, rule)
