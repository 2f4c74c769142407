"""What a savings report holds: its query, its rows (pieces of actual cost), each job's figures and
baselines, and the sums by group.

Money is integer micro-dollars (``*_micro``) everywhere inside, as in the ledger; :func:`usd` shows it as
an exact :class:`~decimal.Decimal` (JSON: a decimal string). Times are tz-aware UTC; a period is
``[start, end)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from enum import StrEnum

from costopt.domain import OfferKey
from costopt.ledger.model import Segment, micro_to_usd
from costopt.reports.errors import ReportError

__all__ = [
    "BREAKDOWNS",
    "DIMENSIONS",
    "JOB_SORTS",
    "JOB_SORT_VALUES",
    "BaselineKind",
    "BaselineRun",
    "DayActivity",
    "Figures",
    "Group",
    "JobFigures",
    "JobPage",
    "MoveCheck",
    "NoBaseline",
    "OverBaseline",
    "OverJob",
    "Reason",
    "ReportError",
    "ReportQuery",
    "Row",
    "Saver",
    "SavingsReport",
    "rate",
    "usd",
]

DIMENSIONS: tuple[str, ...] = ("team", "job", "cloud", "region", "accelerator", "market", "day", "month")
"""What a report can be grouped by (several at once: ``("team", "month")``)."""
BREAKDOWNS: tuple[str, ...] = ("team", "cloud", "accelerator", "market", "region")
"""The groupings every report carries besides its own ``group_by`` (the page's and the PNG's charts)."""


def usd(micro: int) -> Decimal:
    """Micro-dollars as exact Decimal USD (6 decimals)."""
    return micro_to_usd(micro)


def rate(savings_micro: int, baseline_micro: int) -> Decimal | None:
    """``savings / baseline`` to 4 decimals (None: no baseline)."""
    if baseline_micro == 0:
        return None
    return (Decimal(savings_micro) / Decimal(baseline_micro)).quantize(Decimal("0.0001"))


def _utc(name: str, value: datetime) -> None:
    if value.tzinfo is None or value.utcoffset() != timedelta(0):
        raise ReportError(f"{name} must be a tz-aware UTC time, got {value!r}")


@dataclass(frozen=True, slots=True)
class ReportQuery:
    """``[start, end)`` (UTC); ``team`` None: every team (an admin's view); ``job_ids``: only these jobs;
    ``group_by``: dimensions of :data:`DIMENSIONS`; ``top``: how many top savers to list."""

    start: datetime
    end: datetime
    team: str | None = None
    group_by: tuple[str, ...] = ("team",)
    job_ids: tuple[str, ...] | None = None
    top: int = 10

    def __post_init__(self) -> None:
        _utc("from", self.start)
        _utc("to", self.end)
        if self.end <= self.start:
            raise ReportError(
                f"the period ends ({self.end.isoformat()}) before or when it starts "
                f"({self.start.isoformat()}): give to > from"
            )
        bad = [d for d in self.group_by if d not in DIMENSIONS]
        if bad or not self.group_by:
            raise ReportError(f"cannot group by {', '.join(bad) or 'nothing'}; choose from {', '.join(DIMENSIONS)}")
        if len(set(self.group_by)) != len(self.group_by):
            raise ReportError(f"group_by repeats a dimension: {', '.join(self.group_by)}")
        if self.top < 1:
            raise ReportError(f"top must be >= 1, got {self.top}")


class BaselineKind(StrEnum):
    ON_DEMAND = "on_demand"
    STATIC_SPOT = "static_spot"


@dataclass(frozen=True, slots=True)
class BaselineRun:
    """What the job's work would have cost on ``offer`` without moving: from the job's first launch
    (``starts_at``) for its first copy's boot and restore (``boot_seconds``) plus ``work_steps`` at
    ``steps_per_s``, priced from the price history over that run (``segments``). ``rule``: why this
    offer."""

    kind: BaselineKind
    offer: OfferKey
    steps_per_s: float
    rule: str
    starts_at: datetime
    ends_at: datetime
    boot_seconds: float
    work_steps: int
    share: Decimal
    segments: tuple[Segment, ...]
    amount_micro: int

    @property
    def hours(self) -> float:
        return (self.ends_at - self.starts_at).total_seconds() / 3600.0


@dataclass(frozen=True, slots=True)
class NoBaseline:
    """No baseline of this kind for the job, and why (no quote, no price in effect, unknown throughput...)."""

    kind: BaselineKind
    reason: str


@dataclass(frozen=True, slots=True)
class Row:
    """One piece of actual cost, the unit every view and export sums: an instance interval's price segment
    within one UTC day of the period (``kind="instance"``), or an additive charge (``kind="egress"``)
    dated in it. ``ref``: the ledger's ``interval_key`` or ``charge_key``. ``open``: the interval still
    runs and is priced up to the report's ``now``. ``baseline_*_micro``: this row's share of its job's
    baselines in the period (pro rata to the job's actual cost in the period; None: the job has no such
    baseline)."""

    kind: str
    job_id: str
    team: str
    ref: str
    instance_id: str | None
    provider: str | None
    offer: OfferKey | None
    accelerator: str | None
    starts_at: datetime
    ends_at: datetime
    usd_per_hour: Decimal | None
    share: Decimal
    amount_micro: int
    open: bool = False
    quantity: Decimal | None = None
    unit: str | None = None
    rate_usd: Decimal | None = None
    note: str | None = None
    baseline_on_demand_micro: int | None = None
    baseline_static_spot_micro: int | None = None

    def value(self, dimension: str) -> str:
        """The row's value of a :data:`DIMENSIONS` entry."""
        if dimension == "team":
            return self.team
        if dimension == "job":
            return self.job_id
        if dimension == "day":
            return self.starts_at.date().isoformat()
        if dimension == "month":
            return self.starts_at.strftime("%Y-%m")
        if dimension == "accelerator":
            return self.accelerator or ""
        if self.offer is None:
            return ""
        if dimension == "cloud":
            return self.offer.cloud.value
        if dimension == "region":
            return self.offer.region
        if dimension == "market":
            return self.offer.market.value
        raise ReportError(f"unknown dimension {dimension!r}")


@dataclass(frozen=True, slots=True)
class Figures:
    """Sums over rows. Savings count only rows of jobs that have that baseline (``covered_*``):
    ``savings_on_demand = baseline_on_demand - covered_on_demand_actual``."""

    actual_micro: int = 0
    baseline_on_demand_micro: int = 0
    covered_on_demand_actual_micro: int = 0
    baseline_static_spot_micro: int = 0
    covered_static_spot_actual_micro: int = 0
    rows: int = 0

    def add(self, row: Row) -> Figures:
        od = row.baseline_on_demand_micro
        st = row.baseline_static_spot_micro
        return Figures(
            self.actual_micro + row.amount_micro,
            self.baseline_on_demand_micro + (od or 0),
            self.covered_on_demand_actual_micro + (row.amount_micro if od is not None else 0),
            self.baseline_static_spot_micro + (st or 0),
            self.covered_static_spot_actual_micro + (row.amount_micro if st is not None else 0),
            self.rows + 1,
        )

    @property
    def savings_on_demand_micro(self) -> int:
        return self.baseline_on_demand_micro - self.covered_on_demand_actual_micro

    @property
    def savings_static_spot_micro(self) -> int:
        return self.baseline_static_spot_micro - self.covered_static_spot_actual_micro

    @property
    def savings_rate(self) -> Decimal | None:
        return rate(self.savings_on_demand_micro, self.baseline_on_demand_micro)

    @property
    def savings_rate_static_spot(self) -> Decimal | None:
        return rate(self.savings_static_spot_micro, self.baseline_static_spot_micro)

    @property
    def uncovered_actual_micro(self) -> int:
        """Actual cost of rows whose job has no on-demand baseline (not in the savings)."""
        return self.actual_micro - self.covered_on_demand_actual_micro


@dataclass(frozen=True, slots=True)
class Group:
    """One group of a report: its key (one value per ``group_by`` dimension) and its figures."""

    key: tuple[str, ...]
    figures: Figures


@dataclass(frozen=True, slots=True)
class MoveCheck:
    """Whether a move paid: the old offer's prices over the new copy's productive time
    (``stay_micro``) against what the move cost (the new copy, its egress and the old copy's overlap:
    ``moved_micro``). None fields: not compared (another accelerator, no price)."""

    interval_key: str
    from_offer: OfferKey
    to_offer: OfferKey
    at: datetime
    stay_micro: int | None
    moved_micro: int
    note: str

    @property
    def paid(self) -> bool | None:
        return None if self.stay_micro is None else self.stay_micro >= self.moved_micro


@dataclass(frozen=True, slots=True)
class Reason:
    """Part of why a job cost more than a baseline: ``kind`` is ``moves``, ``preemptions`` or ``prices``."""

    kind: str
    amount_micro: int
    detail: str


@dataclass(frozen=True, slots=True)
class OverBaseline:
    """A job that cost more than a baseline over its run: by how much, and why (largest part first)."""

    kind: BaselineKind
    excess_micro: int
    reasons: tuple[Reason, ...]


@dataclass(frozen=True, slots=True)
class JobFigures:
    """One job over its whole run up to the report's ``now`` (``run_*``) and within the period
    (``period_*``, the sums of its rows)."""

    job_id: str
    team: str
    name: str
    state: str
    managed: bool
    steps_done: int
    steps_total: int
    created_at: datetime | None
    first_launch: datetime | None
    last_end: datetime | None
    run_actual_micro: int
    run_egress_micro: int
    on_demand: BaselineRun | NoBaseline
    static_spot: BaselineRun | NoBaseline
    moves: int
    preemptions: int
    move_cost_micro: int
    preemption_cost_micro: int
    lost_work_micro: int
    boot_micro: int
    move_checks: tuple[MoveCheck, ...]
    over: tuple[OverBaseline, ...]
    period: Figures = field(default_factory=Figures)
    warnings: tuple[str, ...] = ()

    def baseline(self, kind: BaselineKind) -> BaselineRun | NoBaseline:
        return self.on_demand if kind is BaselineKind.ON_DEMAND else self.static_spot


def _has(j: JobFigures, kind: BaselineKind) -> bool:
    return isinstance(j.baseline(kind), BaselineRun)


JOB_SORT_VALUES: dict[str, Callable[[JobFigures], str | int | Decimal | None]] = {
    "job_id": lambda j: j.job_id,
    "name": lambda j: j.name,
    "team": lambda j: j.team,
    "state": lambda j: j.state,
    "actual_cost": lambda j: j.period.actual_micro,
    "baseline_on_demand_cost": lambda j: j.period.baseline_on_demand_micro if _has(j, BaselineKind.ON_DEMAND) else None,
    "baseline_static_spot_cost": lambda j: (
        j.period.baseline_static_spot_micro if _has(j, BaselineKind.STATIC_SPOT) else None
    ),
    "savings": lambda j: j.period.savings_on_demand_micro if _has(j, BaselineKind.ON_DEMAND) else None,
    "savings_rate": lambda j: j.period.savings_rate if _has(j, BaselineKind.ON_DEMAND) else None,
    "moves": lambda j: j.moves,
    "preemptions": lambda j: j.preemptions,
    "excess": lambda j: max(o.excess_micro for o in j.over) if j.over else None,
}
"""Each way a report's job list can be sorted, and a job's value for it (None: it has none, e.g. no such
baseline): the job's id, name, team, state; its figures in the period (``actual_cost`` ... ``savings_rate``,
as in its ``period``); its moves and preemptions over its run; ``excess``: by how much it cost more than a
baseline over its run (its largest excess)."""
JOB_SORTS: tuple[str, ...] = tuple(JOB_SORT_VALUES)
"""The keys of :data:`JOB_SORT_VALUES`, in order."""


@dataclass(frozen=True, slots=True)
class JobPage:
    """Which of a report's jobs it lists: sorted by ``sort`` (one of :data:`JOB_SORTS`; ``descending``
    flips it; jobs without a value, e.g. no baseline, come last either way; ties by job id), then
    ``offset`` jobs skipped and at most ``limit`` listed. Every job still counts in the totals."""

    sort: str = "job_id"
    descending: bool = False
    offset: int = 0
    limit: int = 100

    def __post_init__(self) -> None:
        if self.sort not in JOB_SORTS:
            raise ReportError(f"cannot sort jobs by {self.sort!r}; choose from {', '.join(JOB_SORTS)}")
        if self.offset < 0:
            raise ReportError(f"offset must be >= 0, got {self.offset}")
        if self.limit < 1:
            raise ReportError(f"limit must be >= 1, got {self.limit}")

    @classmethod
    def parse(cls, sort: str, *, offset: int = 0, limit: int = 100) -> JobPage:
        """``sort`` as the API takes it: a key of :data:`JOB_SORTS`, ``-`` first for descending."""
        key = sort.strip()
        return cls(key.removeprefix("-"), key.startswith("-"), offset, limit)

    @property
    def label(self) -> str:
        return ("-" if self.descending else "") + self.sort


@dataclass(frozen=True, slots=True)
class Saver:
    """One of a report's top savers: the job and its figures in the period."""

    job_id: str
    name: str
    period: Figures


@dataclass(frozen=True, slots=True)
class OverJob:
    """A job that cost more than a baseline over its run: which baselines, the largest excess, and the
    largest part of why (a :class:`Reason` kind; None: not explained)."""

    job_id: str
    baselines: tuple[BaselineKind, ...]
    excess_micro: int
    reason: str | None


@dataclass(frozen=True, slots=True)
class DayActivity:
    """Moves and preemptions of one UTC day of the period (from the jobs' events)."""

    day: str
    moves: int
    preemptions: int


@dataclass(frozen=True, slots=True)
class SavingsReport:
    """A report: the query, ``now`` (open intervals priced up to it), the totals, the groups, each day's
    figures, the sums by each of :data:`BREAKDOWNS`, the jobs with cost in the period (``job_count`` of them,
    over ``teams``), the top savers and the jobs that cost more than a baseline (best first), moves and
    preemptions per day, the period's memo costs, and warnings (money that could not be priced).

    ``rows``: every row, sorted by start, job and ledger key (the exports' lines); None when the report was
    folded without keeping them (the JSON report: its memory does not grow with the rows). ``jobs``: each
    listed job's figures, all of them (``page`` None) or the page asked for, in its order."""

    query: ReportQuery
    now: datetime
    rows: tuple[Row, ...] | None
    totals: Figures
    groups: tuple[Group, ...]
    days: tuple[Group, ...]
    breakdowns: dict[str, tuple[Group, ...]]
    jobs: tuple[JobFigures, ...]
    job_count: int
    teams: tuple[str, ...]
    top_savers: tuple[Saver, ...]
    over_baseline: tuple[OverJob, ...]
    activity: tuple[DayActivity, ...]
    move_cost_micro: int
    preemption_cost_micro: int
    page: JobPage | None = None
    warnings: tuple[str, ...] = ()

    def job(self, job_id: str) -> JobFigures:
        for j in self.jobs:
            if j.job_id == job_id:
                return j
        raise KeyError(job_id)
