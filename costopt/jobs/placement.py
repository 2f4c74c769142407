"""What the job engine and the rebalancer need from the planner: ranked places a job can run now.

The core states the need as a protocol; ``api/`` implements it over the price store, the throughput
catalog and the planner (:mod:`costopt.planning.single`), with the job's objective and constraints.

Billing contract: ``usd_per_hour`` is what the job pays on that offer, i.e. the whole instance's price
(a job on part of a larger instance pays the whole instance: the ledger bills instances), and a
quote's ``expected_cost_usd`` is priced the same way, so a quote and the ledger's bill of the same
placement at the same prices agree.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Protocol

from costopt.domain import OfferKey
from costopt.jobs.records import JobRecord


@dataclass(frozen=True, slots=True)
class Placement:
    """One place a job can run: the offer, its price (USD per instance-hour, whole instance), the
    job's throughput there (steps/s), and the planner's expectation for the job's remaining steps
    (hours and Decimal USD, preemption risk and restarts included)."""

    offer: OfferKey
    usd_per_hour: float
    steps_per_s: float
    expected_hours: float
    expected_cost_usd: Decimal


class Placements(Protocol):
    """Ranked placements of a job under its own objective and constraints."""

    def rank(
        self,
        job: JobRecord,
        *,
        remaining_steps: float,
        at: datetime,
        exclude: Collection[OfferKey] = (),
        top: int = 10,
    ) -> Sequence[Placement]:
        """The best ``top`` placements for ``remaining_steps`` of ``job`` with the prices in effect at
        ``at`` (tz-aware UTC), best first, leaving out ``exclude`` and offers marked unavailable; empty
        when nothing can run it."""
        ...

    def at_offer(self, job: JobRecord, offer: OfferKey, *, remaining_steps: float, at: datetime) -> Placement | None:
        """The job on ``offer`` (its current place) priced at ``at``; None when the offer has no price
        then or cannot run the job."""
        ...
