"""The rebalancer as the service and ``costopt rebalance --once`` build and run it.

- :func:`rule_from_settings`: the decision rule with the service's margin and dwell
  (``COSTOPT_REBALANCE_MARGIN_FRACTION``, ``COSTOPT_REBALANCE_MARGIN_MIN_USD``, ``COSTOPT_REBALANCE_DWELL``);
- :func:`build_rebalancer`: a :class:`~costopt.jobs.rebalance.Rebalancer` over the job service's repository,
  placements and engine (moves through :meth:`JobEngine.move`), on the service clock;
- :func:`run_pass_by_hand`: one pass under the ``rebalance`` lease without a tick (the scheduled passes
  keep their ticks): when the service runs its pass at that moment, nothing is done and the holder is
  returned instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from costopt.jobs.leases import LeaseState, LeaseStore
from costopt.jobs.rebalance import Rebalancer, RebalanceReport
from costopt.migration.decision import MigrationRule
from costopt.settings import Settings

if TYPE_CHECKING:
    from api.service import JobService

REBALANCE_LEASE = "rebalance"
"""The lease of every rebalancer pass (the job id of the scheduled rebalancer too)."""


def rule_from_settings(settings: Settings) -> MigrationRule:
    """The decision rule with the settings' margin and dwell (the rest: the rule's documented defaults)."""
    return MigrationRule(
        margin_fraction=settings.rebalance_margin_fraction,
        margin_min_usd=settings.rebalance_margin_min_usd,
        dwell_hours=settings.rebalance_dwell.total_seconds() / 3600.0,
    )


def build_rebalancer(service: JobService, settings: Settings) -> Rebalancer:
    """The rebalancer of ``service`` (its jobs, placements, engine and clock)."""
    return Rebalancer(
        service.repo,
        service.placements,
        service.engine.move,
        rule_from_settings(settings),
        service.clock,
        top=service.engine.rank_top,
    )


@dataclass(frozen=True, slots=True)
class PassByHand:
    """A pass run by hand: its ``report``, or (``report`` None) the lease ``busy`` with the pass being
    run now by someone else (the service)."""

    report: RebalanceReport | None
    busy: LeaseState | None = None


def run_pass_by_hand(rebalancer: Rebalancer, leases: LeaseStore, settings: Settings, *, dry_run: bool) -> PassByHand:
    """One pass under the ``rebalance`` lease (held ``COSTOPT_SCHEDULER_LEASE_TTL`` at a time, renewed while
    the pass runs); when another owner holds it, nothing is done."""
    with leases.hold(REBALANCE_LEASE, settings.scheduler_lease_ttl) as won:
        if won:
            return PassByHand(rebalancer.run_once(dry_run=dry_run))
    return PassByHand(None, leases.holder(REBALANCE_LEASE) or leases.get(REBALANCE_LEASE))
