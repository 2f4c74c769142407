"""What the REST layer shows of a job, derived once here: steps, ETA, cost so far, moves.

:func:`job_view` reads the job's events (moves, preemptions, recoveries as the engine recorded them),
the ledger (the cost so far, :func:`costopt.jobs.costs.job_cost`; not read for a job that never
launched: :func:`launched`) and the planner's throughput on the job's current offer
(:meth:`Placements.at_offer`) for the ETA. Times are tz-aware UTC; money is Decimal.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy.engine import Connection

from costopt.domain import OfferKey
from costopt.errors import CostoptError
from costopt.jobs.costs import job_cost
from costopt.jobs.model import JobState
from costopt.jobs.placement import Placements
from costopt.jobs.records import JobEvent, JobRecord
from costopt.ledger.book import Ledger
from costopt.ledger.model import LedgerError, micro_to_usd

log = logging.getLogger("costopt.jobs.view")

__all__ = ["MOVE_KINDS", "JobView", "MoveView", "eta", "job_view", "launched", "moves_of"]

MOVE_KINDS = ("move", "preemption", "recovery")
"""The event kinds listed as a job's moves."""

_RUNNING_STATES = frozenset({JobState.RUNNING, JobState.MIGRATING, JobState.RECOVERING})


@dataclass(frozen=True, slots=True)
class MoveView:
    """A move, a preemption or a recovery: when, why, what it cost (None: unknown), from and to where."""

    at: datetime
    kind: str
    reason: str
    cost_usd: Decimal | None
    from_offer: OfferKey | None
    to_offer: OfferKey | None


@dataclass(frozen=True, slots=True)
class JobView:
    """A job as the REST layer renders it: the record, the steps done (the furthest the agent reported),
    the expected finish (None: not running, or its throughput is unknown), the cost so far from the ledger
    (None: no ledger, or an open interval has no price) and its moves, oldest first."""

    job: JobRecord
    steps_done: int
    eta: datetime | None
    cost_so_far_usd: Decimal | None
    moves: tuple[MoveView, ...]
    exit_code: int | None


def _offer(doc: object) -> OfferKey | None:
    if not isinstance(doc, dict):
        return None
    try:
        return OfferKey.from_doc(doc)
    except (KeyError, ValueError):
        return None


def moves_of(events: Sequence[JobEvent]) -> tuple[MoveView, ...]:
    """The job's moves, preemptions and recoveries from its events, oldest first."""
    out = []
    for e in events:
        if e.kind not in MOVE_KINDS:
            continue
        d = e.detail or {}
        out.append(MoveView(e.at, e.kind, e.reason, e.cost_usd, _offer(d.get("from")), _offer(d.get("to"))))
    return tuple(out)


def launched(job: JobRecord, events: Sequence[JobEvent]) -> bool:
    """Whether the job ever left ``queued`` for ``launching`` (its events, oldest first, say so): only then
    can the ledger hold anything of it (the model's one way to a launch is ``queued -> launching``; a job
    cancelled or failed while queued never ran and costs nothing)."""
    if job.state is JobState.QUEUED:
        return False
    return any(e.kind == "state" and e.to_state == JobState.LAUNCHING.value for e in events)


def eta(job: JobRecord, placements: Placements, at: datetime) -> datetime | None:
    """When the job should finish: ``at`` + remaining steps / its throughput on its current offer (as the
    planner has it). None when the job is not running (queued, launching, finished) or the throughput
    is unknown."""
    if job.state not in _RUNNING_STATES or job.offer is None:
        return None
    remaining = max(0, job.steps_total - job.steps_done)
    try:
        p = placements.at_offer(job, job.offer, remaining_steps=float(remaining), at=at)
    except (CostoptError, ValueError, LookupError) as exc:
        log.warning("no ETA for job %s: %s", job.id, exc)
        return None
    if p is None or p.steps_per_s <= 0:
        return None
    return at + timedelta(seconds=remaining / p.steps_per_s)


def job_view(
    job: JobRecord,
    events: Sequence[JobEvent],
    *,
    ledger: Ledger | None,
    placements: Placements,
    at: datetime,
    conn: Connection | None = None,
    costs: Mapping[str, Decimal] | None = None,
) -> JobView:
    """The view of ``job`` at ``at`` (tz-aware UTC) from its ``events`` (``JobRepository.events``), the
    ledger and the planner (see :class:`JobView` for what None means). ``conn``: read the ledger on this
    connection (the request's, :meth:`JobRepository.reading`). A job that never launched costs 0 without
    a ledger read. ``costs``: the costs up to ``at`` of a page of jobs read at once (:func:`page_costs`;
    a launched job absent from it has no ledger line: 0); None: this job's read here."""
    if at.tzinfo is None:
        raise ValueError(f"at must be tz-aware UTC, got {at!r}")
    cost: Decimal | None = None
    if ledger is not None and not launched(job, events):
        cost = micro_to_usd(0)
    elif ledger is not None and costs is not None:
        cost = costs.get(job.id, micro_to_usd(0))
    elif ledger is not None:
        try:
            cost = job_cost(ledger, job.id, at, conn=conn)
        except LedgerError as exc:
            log.warning("no cost so far for job %s: %s", job.id, exc)
    return JobView(
        job=job,
        steps_done=job.steps_done,
        eta=eta(job, placements, at),
        cost_so_far_usd=cost,
        moves=moves_of(events),
        exit_code=job.exit_code,
    )
