"""The baselines a job's actual cost is compared with, and how each is chosen and priced.

- **on-demand** (:attr:`BaselineKind.ON_DEMAND`): the job's work on the on-demand instance its team
  would pick for its GPU count in its home region. Which one is a rule per team
  (:class:`ReferenceRules`, the ``COSTOPT_REPORT_BASELINES`` setting): a fixed instance type
  (``aws/us-east-1/p3.8xlarge``), or a home region (``aws/us-east-1``) where the planner picks the
  cheapest on-demand instance for the job at its submission. The planner lives at the API edge
  (``api/report_baselines.py``), behind :class:`BaselineSource`.
- **static spot** (:attr:`BaselineKind.STATIC_SPOT`), the dynamic-pricing paper's baseline: the cheapest
  spot offer for the job's work among the placements the planner quoted at submission (the job's
  ``quote``: the winner and its alternatives), kept for the whole run, never moved
  (:func:`static_spot_from_quote`).

Both are priced the same way (:func:`price_baseline`): from the job's first launch, its first copy's
boot and restore time plus its work (the steps it did) at the baseline offer's steps/s, integrated over
the store's price history of that offer (the ledger's own :func:`~costopt.ledger.prices.price_segments`),
for the whole instance (what the service bills). Preemptions are not modelled in either baseline (the
paper's static policy has none).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol

from costopt.domain import Market, OfferKey
from costopt.jobs.records import JobRecord
from costopt.ledger.model import LedgerError
from costopt.ledger.prices import PriceSteps, offer_label, price_segments
from costopt.reports.model import BaselineKind, BaselineRun, NoBaseline
from costopt.reports.references import DEFAULT_REFERENCE, Reference, ReferenceRules

__all__ = [
    "DEFAULT_REFERENCE",
    "BaselineChoice",
    "BaselineSource",
    "QuoteBaselines",
    "Reference",
    "ReferenceRules",
    "price_baseline",
    "static_spot_from_quote",
]


@dataclass(frozen=True, slots=True)
class BaselineChoice:
    """A baseline's offer, the job's steps/s on it, and why it was chosen (``rule``)."""

    offer: OfferKey
    steps_per_s: float
    rule: str


class BaselineSource(Protocol):
    """Chooses a job's baselines (the API's uses the planner; tests give fixed ones)."""

    def on_demand(self, job: JobRecord) -> BaselineChoice | NoBaseline: ...

    def static_spot(self, job: JobRecord) -> BaselineChoice | NoBaseline: ...


# -- static spot: from the quote ------------------------------------------------------------------------------


def _candidates(quote: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    seen: list[Mapping[str, Any]] = []
    for cand in [quote, *quote.get("candidates", [])]:
        if isinstance(cand, Mapping) and isinstance(cand.get("offer"), Mapping) and cand not in seen:
            seen.append(cand)
    return seen


def static_spot_from_quote(job: JobRecord) -> BaselineChoice | NoBaseline:
    """The cheapest spot placement for the job's work (USD/h / steps/s) among the quote's winner and
    alternatives at submission; ties go to the planner's order."""
    kind = BaselineKind.STATIC_SPOT
    if not job.quote:
        return NoBaseline(kind, "the job has no quote (planned before quotes were stored)")
    best: tuple[float, int, BaselineChoice] | None = None
    for i, cand in enumerate(_candidates(job.quote)):
        try:
            offer = OfferKey.from_doc(cand["offer"])
            usd_h, sps = float(cand["usd_per_hour"]), float(cand["steps_per_s"])
        except (KeyError, ValueError, TypeError):
            continue
        if offer.market is not Market.SPOT or not (sps > 0 and math.isfinite(usd_h)):
            continue
        per_step = usd_h / sps
        if best is None or per_step < best[0]:
            rule = (
                f"cheapest spot placement of the quote at submission ({job.quote.get('as_of', '?')}): "
                f"{offer_label(offer)} at {usd_h:g} USD/h, {sps:g} steps/s"
            )
            best = (per_step, i, BaselineChoice(offer, sps, rule))
    if best is None:
        return NoBaseline(kind, "the quote at submission holds no spot placement (constraints kept the job on-demand)")
    return best[2]


class QuoteBaselines:
    """A :class:`BaselineSource` with the static-spot baseline from the quote and the on-demand baseline
    from ``on_demand`` (a callable; None: no on-demand baseline)."""

    def __init__(self, on_demand: Any = None) -> None:
        self._on_demand = on_demand

    def on_demand(self, job: JobRecord) -> BaselineChoice | NoBaseline:
        if self._on_demand is None:
            return NoBaseline(BaselineKind.ON_DEMAND, "no on-demand reference is configured")
        result: BaselineChoice | NoBaseline = self._on_demand(job)
        return result

    def static_spot(self, job: JobRecord) -> BaselineChoice | NoBaseline:
        return static_spot_from_quote(job)


# -- pricing ------------------------------------------------------------------------------------------------


def price_baseline(
    prices: PriceSteps,
    kind: BaselineKind,
    choice: BaselineChoice,
    *,
    start: datetime,
    boot_seconds: float,
    work_steps: int,
) -> BaselineRun | NoBaseline:
    """``choice`` run from ``start`` for ``boot_seconds`` plus ``work_steps`` at its steps/s, priced over
    the offer's price history (whole instance). A price not in effect at ``start`` gives a
    :class:`NoBaseline` saying so."""
    if not choice.steps_per_s > 0:
        why = f"{offer_label(choice.offer)}: no throughput for the job ({choice.steps_per_s} steps/s)"
        return NoBaseline(kind, why)
    seconds = max(0.0, boot_seconds) + max(0, work_steps) / choice.steps_per_s
    end = start + timedelta(microseconds=round(seconds * 1_000_000))
    share = Decimal(1)
    try:
        segs = price_segments(prices, choice.offer, start, end, share)
    except LedgerError as exc:
        return NoBaseline(kind, f"{choice.rule}: {exc}")
    return BaselineRun(
        kind=kind,
        offer=choice.offer,
        steps_per_s=choice.steps_per_s,
        rule=choice.rule,
        starts_at=start,
        ends_at=end,
        boot_seconds=max(0.0, boot_seconds),
        work_steps=max(0, work_steps),
        share=share,
        segments=segs,
        amount_micro=sum(s.amount_micro_usd for s in segs),
    )
