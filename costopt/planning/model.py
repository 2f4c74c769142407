"""What the planner takes and gives: jobs, objectives, assumptions, ranked placements.

Units: throughput in steps/s, durations in hours (float), prices in USD per hour (float), sums of
money in :class:`~decimal.Decimal` USD (rounded to the cent only when shown), times tz-aware UTC.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Literal

from costopt.domain import Cloud
from costopt.errors import CostoptError
from costopt.throughput.model import DEFAULT_PRECISION, PRECISIONS, JobType, Precision

CENT = Decimal("0.01")


def to_cents(value: Decimal) -> Decimal:
    """Round a sum of money to the cent (banker's rounding), for showing it."""
    return value.quantize(CENT, rounding=ROUND_HALF_EVEN)


def money(value: float) -> Decimal:
    """A float amount as the Decimal of its shortest repr (no binary noise, no rounding)."""
    return Decimal(repr(float(value)))


@dataclass(frozen=True, slots=True)
class Location:
    """Where a job's checkpoint (or data set) lives now: a cloud region."""

    cloud: Cloud
    region: str


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A training job to place.

    ``steps``: steps still to run. ``gpu_count``: GPUs it trains on, on one instance (consolidated).
    ``checkpoint_gb``: size of its checkpoint, moved when the job changes region or cloud.
    ``location``: where its checkpoint lives now (None: nowhere yet, nothing to move).
    ``precision``: ``fp32`` (PyTorch's default), ``tf32`` or ``amp``; the catalog a plan uses must be
    built at this precision (``api.planning.catalog_at``).
    """

    job_type: JobType
    steps: float
    gpu_count: int = 1
    checkpoint_gb: float = 0.0
    location: Location | None = None
    precision: Precision = DEFAULT_PRECISION

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise InvalidJob(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if not self.steps > 0:
            raise InvalidJob(f"steps must be > 0, got {self.steps}")
        if self.gpu_count not in (1, 2, 4, 8):
            raise InvalidJob(f"gpu_count must be 1, 2, 4 or 8, got {self.gpu_count}")
        if self.checkpoint_gb < 0:
            raise InvalidJob(f"checkpoint_gb must be >= 0, got {self.checkpoint_gb}")


@dataclass(frozen=True, slots=True)
class MinCost:
    """Cheapest expected cost."""

    name: Literal["min-cost"] = "min-cost"


@dataclass(frozen=True, slots=True)
class MinTime:
    """Shortest expected time."""

    name: Literal["min-time"] = "min-time"


@dataclass(frozen=True, slots=True)
class MinCostByDeadline:
    """Cheapest expected cost among placements that finish within ``deadline_hours`` with
    probability ``confidence`` (preemptions counted at that quantile)."""

    deadline_hours: float
    confidence: float = 0.95
    name: Literal["min-cost-deadline"] = "min-cost-deadline"

    def __post_init__(self) -> None:
        if not self.deadline_hours > 0:
            raise InvalidJob(f"the deadline must be in the future, got {self.deadline_hours} h")
        if not 0.5 <= self.confidence < 1:
            raise InvalidJob(f"confidence must be in [0.5, 1), got {self.confidence}")


@dataclass(frozen=True, slots=True)
class MinTimeWithinBudget:
    """Shortest expected time among placements whose expected cost stays within ``budget_usd``."""

    budget_usd: Decimal
    name: Literal["min-time-budget"] = "min-time-budget"

    def __post_init__(self) -> None:
        if not self.budget_usd > 0:
            raise InvalidJob(f"the budget must be positive, got {self.budget_usd}")


@dataclass(frozen=True, slots=True)
class Weighted:
    """Minimize ``cost_weight * cost / best_cost + (1 - cost_weight) * hours / best_hours``."""

    cost_weight: float = 0.5
    name: Literal["weighted"] = "weighted"

    def __post_init__(self) -> None:
        if not 0 <= self.cost_weight <= 1:
            raise InvalidJob(f"cost_weight must be in [0, 1], got {self.cost_weight}")


Objective = MinCost | MinTime | MinCostByDeadline | MinTimeWithinBudget | Weighted


@dataclass(frozen=True, slots=True)
class Assumptions:
    """How risk and moves are costed (documented defaults; see docs/planning.md).

    ``checkpoint_interval_hours``: a preempted job loses on average half of it (the deadline check
    counts all of it). ``restart_hours``: boot + restore after a preemption or a move, billed.
    ``per_gpu_packing``: False (the default, billing truth): a job using part of a larger instance pays
    the whole instance, as the ledger bills it; True: it pays the GPU share of its price (the
    dynamic-pricing paper's assumption that other jobs fill the rest; the paper's backtests in
    ``costopt/backtest/`` and ``experiments/`` set it explicitly).
    """

    checkpoint_interval_hours: float = 1.0
    restart_hours: float = 10.0 / 60.0
    per_gpu_packing: bool = False
    egress_usd_per_gb: EgressRates | None = None

    def __post_init__(self) -> None:
        if self.checkpoint_interval_hours <= 0 or self.restart_hours < 0:
            raise InvalidJob("checkpoint interval must be > 0 and restart time >= 0")


@dataclass(frozen=True, slots=True)
class EgressRates:
    """USD per GB to move data out of a cloud: to another region of the same cloud, or to the
    internet (another cloud). Same region is free."""

    inter_region: dict[Cloud, float] = field(default_factory=dict)
    internet: dict[Cloud, float] = field(default_factory=dict)

    def rate(self, src: Cloud, src_region: str, dst: Cloud, dst_region: str) -> float:
        if src is dst and src_region == dst_region:
            return 0.0
        if src is dst:
            return self.inter_region.get(src, 0.02)
        return self.internet.get(src, 0.09)


# 2020 list egress prices (first tier), as the issue names: AWS $0.02/GB between regions and
# $0.09/GB to the internet (aws.amazon.com/ec2/pricing/on-demand, "Data Transfer"); Azure $0.02/GB
# between regions within a continent and $0.087/GB to the internet (azure.microsoft.com pricing
# "Bandwidth"); GCP $0.01/GB between regions in the US and $0.12/GB to the internet (cloud.google.com
# "Network pricing", premium tier, first TB).
DEFAULT_EGRESS = EgressRates(
    inter_region={Cloud.AWS: 0.02, Cloud.AZURE: 0.02, Cloud.GCP: 0.01, Cloud.SIM: 0.02, Cloud.LOCAL: 0.0},
    internet={Cloud.AWS: 0.09, Cloud.AZURE: 0.087, Cloud.GCP: 0.12, Cloud.SIM: 0.09, Cloud.LOCAL: 0.0},
)


class InvalidJob(CostoptError, ValueError):
    """A job or objective that cannot be planned as given (the message says which field)."""


class Infeasible(CostoptError):
    """No placement satisfies the objective's constraints; ``binding`` names the one that binds."""

    def __init__(self, message: str, *, binding: str) -> None:
        super().__init__(message)
        self.binding = binding


@dataclass(frozen=True, slots=True)
class Candidate:
    """One placement of a job, with its expected figures.

    ``usd_per_hour`` is the offer's instance price; ``job_usd_per_hour`` what the job pays (its GPU
    share under per-GPU packing). ``expected_cost_usd`` includes preemption overhead and the move.
    ``risk`` is the probability of at least one preemption before the job ends.
    """

    cloud: str
    region: str
    zone: str
    instance_type: str
    market: str
    accelerator: str
    gpu_count: float
    usd_per_hour: float
    job_usd_per_hour: float
    steps_per_s: float
    throughput_estimated: bool
    expected_hours: float
    deadline_hours_at_confidence: float
    expected_cost_usd: Decimal
    move_cost_usd: Decimal
    usd_per_million_steps: float
    preemptions_per_hour: float
    risk: float


@dataclass(frozen=True, slots=True)
class Plan:
    """The winner, the ranked alternatives (winner first), how many offers were looked at, and why."""

    job: JobSpec
    objective: Objective
    winner: Candidate
    alternatives: tuple[Candidate, ...]
    offers_considered: int
    offers_feasible: int
    reason: str
