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

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING

from costopt.jobs.engine import MoveRefused
from costopt.jobs.leases import LeaseState, LeaseStore
from costopt.jobs.placement import Placement
from costopt.jobs.rebalance import MoveJob, Rebalancer, RebalanceReport
from costopt.jobs.records import JobRecord
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


IN_PROCESS_PROVIDERS = frozenset({"sim"})
"""Providers whose instances live in the process that launched them (the embedded simulated cloud)."""


def build_rebalancer(service: JobService, settings: Settings, *, in_service: bool = True) -> Rebalancer:
    """The rebalancer of ``service`` (its jobs, placements, engine and clock). ``in_service`` False (a pass
    by hand, in another process than the service's): a job on an in-process provider (the embedded
    simulated cloud, whose instances live in the service) is not moved from here: its item says so."""
    move: MoveJob = service.engine.move
    if not in_service:
        move = _outside_the_service(service, move)
    return Rebalancer(
        service.repo, service.placements, move, rule_from_settings(settings), service.clock, top=service.engine.rank_top
    )


def _outside_the_service(service: JobService, move: MoveJob) -> MoveJob:
    def guarded(
        job_id: str, placements: Sequence[Placement], *, reason: str, expected_saving_usd: Decimal
    ) -> JobRecord:
        provider = service.repo.get(job_id).provider
        if provider in IN_PROCESS_PROVIDERS:
            raise MoveRefused(
                f"job {job_id} runs on the {provider!r} provider, whose instances live in the service process: "
                "it is moved by the service's own passes (use --dry-run here to see what would move)"
            )
        return move(job_id, placements, reason=reason, expected_saving_usd=expected_saving_usd)

    return guarded


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
