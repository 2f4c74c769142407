"""The rebalancer: move running jobs to cheaper offers when the decision rule says it pays.

One pass (:meth:`Rebalancer.run_once`) looks at every ``running`` job whose team has not asked to
cancel it, each at the service clock's "now" when its turn comes (a move blocks for minutes of that clock:
after one, the next job is read again and skipped when no longer running, and priced then):

1. the job as the rule sees it (:class:`~costopt.migration.decision.RunningJob`): remaining steps
   ``steps_total - steps_done``; its current offer priced now by :meth:`Placements.at_offer`; its
   checkpoint where its copy runs (the current offer's cloud and region; the agent writes beside it)
   with the size the team gave (``spec["checkpoint_gb"]``, default 1 GB); last moved at its newest
   ``move``/``recovery`` event (else its newest finished move or recovery in ``migrations``; its first
   launch is not a move: a job that never moved has no dwell);
2. the candidates: :meth:`Placements.rank` under the job's own objective and constraints (its current
   offer left out), each as an :class:`~costopt.migration.decision.OfferQuote` at the placement's
   whole-instance ``usd_per_hour``;
3. :func:`~costopt.migration.decision.choose` (dwell time, margin, move cost): stay, with the rule's
   explanation, or move to the best candidate;
4. a winner is moved through the engine (``engine_move``, :meth:`costopt.jobs.engine.JobEngine.move`),
   given the target first and then every other candidate the rule would also move to (best net saving
   first: the migrator tries the next one when a launch fails), the rule's explanation as the reason and
   the expected *net* saving (saving over the remaining work minus the move's cost). A dry run stops
   at the proposal.

One job's failure (no quote, a planner error, a failed move) is reported with that job and never stops
the pass. Money is Decimal USD, prices float USD per instance-hour, times tz-aware UTC.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Protocol

from sqlalchemy import bindparam, func, or_, select

from costopt.db.jobs_schema import job_events
from costopt.db.migration_schema import migrations
from costopt.domain import OfferKey, utc
from costopt.fleets.model import FLEET_PROVIDER
from costopt.jobs.model import JobState
from costopt.jobs.placement import Placement, Placements
from costopt.jobs.records import JobRecord, JobRepository
from costopt.migration.decision import Action, MigrationRule, OfferQuote, RunningJob, choose, decide
from costopt.migration.records import RACES as MIGRATION_RACES
from costopt.planning.model import Location

__all__ = [
    "DEFAULT_CHECKPOINT_GB",
    "MOVE_EVENT_KINDS",
    "MoveJob",
    "Outcome",
    "RebalanceItem",
    "RebalanceReport",
    "Rebalancer",
]

log = logging.getLogger("costopt.jobs.rebalance")

DEFAULT_CHECKPOINT_GB = 1.0
"""A job's checkpoint size when its submission does not give one (GB; the REST default)."""

MOVE_EVENT_KINDS = ("move", "recovery")
"""The ``job_events`` kinds that count as the job moving (for the dwell time)."""


class MoveJob(Protocol):
    """How the rebalancer moves a job (:meth:`costopt.jobs.engine.JobEngine.move`): blocking; returns the
    job after the move (running on the new offer, or still on the old one when the move rolled back)."""

    def __call__(
        self, job_id: str, placements: Sequence[Placement], *, reason: str, expected_saving_usd: Decimal
    ) -> JobRecord: ...


class Outcome(StrEnum):
    PROPOSED = "proposed"  # the rule says move (dry run: nothing done)
    MOVED = "moved"  # moved through the engine
    STAYED = "stayed"  # the rule (or the job's situation) says stay
    FAILED = "failed"  # deciding or moving failed (``reason`` says why)


@dataclass(frozen=True, slots=True)
class RebalanceItem:
    """One running job's verdict. ``from_offer``/``to_offer``: where it runs and where it moves (or would);
    money in Decimal USD over the remaining work at the prices in effect at the pass: ``saving_usd``
    (gross), ``move_cost_usd``, ``margin_usd`` (what the net saving had to clear); None when not known
    (e.g. no price for the current offer). ``reason``: the rule's explanation, or the error."""

    job_id: str
    team_id: str
    outcome: Outcome
    reason: str
    from_offer: OfferKey | None = None
    to_offer: OfferKey | None = None
    from_usd_per_hour: float | None = None
    to_usd_per_hour: float | None = None
    saving_usd: Decimal | None = None
    move_cost_usd: Decimal | None = None
    margin_usd: Decimal | None = None

    @property
    def net_saving_usd(self) -> Decimal | None:
        """``saving_usd - move_cost_usd`` (None when either is unknown)."""
        if self.saving_usd is None or self.move_cost_usd is None:
            return None
        return self.saving_usd - self.move_cost_usd


@dataclass(frozen=True, slots=True)
class RebalanceReport:
    """A pass: when (the service clock), whether it was a dry run, and one item per running job."""

    at: datetime
    dry_run: bool
    items: tuple[RebalanceItem, ...]

    def with_outcome(self, outcome: Outcome) -> tuple[RebalanceItem, ...]:
        return tuple(i for i in self.items if i.outcome is outcome)

    @property
    def failed(self) -> tuple[RebalanceItem, ...]:
        return self.with_outcome(Outcome.FAILED)

    @property
    def expected_saving_usd(self) -> Decimal:
        """Net saving of the moves made (or proposed, in a dry run)."""
        return sum(
            (
                i.net_saving_usd
                for i in self.items
                if i.outcome in (Outcome.MOVED, Outcome.PROPOSED) and i.net_saving_usd is not None
            ),
            Decimal(0),
        )


class Rebalancer:
    """Rebalances the running jobs of ``repo`` (see the module doc). ``clock``: the service clock's
    ``now`` (tz-aware UTC); ``top``: how many ranked placements each job is weighed against."""

    def __init__(
        self,
        repo: JobRepository,
        placements: Placements,
        engine_move: MoveJob,
        rule: MigrationRule | None = None,
        clock: Callable[[], datetime] | None = None,
        *,
        top: int = 10,
    ) -> None:
        if top < 1:
            raise ValueError(f"top must be >= 1, got {top}")
        self.repo = repo
        self.placements = placements
        self.engine_move = engine_move
        self.rule = rule or MigrationRule()
        self.clock = clock or repo.now
        self.top = top

    def run_once(self, *, dry_run: bool) -> RebalanceReport:
        """One pass over every running job (see the module doc); never raises for one job's failure."""
        now = utc(self.clock())
        items: list[RebalanceItem] = []
        a_move_ran = False
        for job in self.repo.in_states([JobState.RUNNING]):
            if job.provider == FLEET_PROVIDER:  # its fleet's policy places it
                continue
            if a_move_ran:  # a move blocks for its checkpoint, launch and verification (minutes of the service
                # clock): the jobs after it are decided as they are then, at the prices then
                job = self.repo.get(job.id)
                if job.state is not JobState.RUNNING:
                    continue
            try:
                item, chosen = self._decide(job, utc(self.clock()))
            except Exception as exc:
                log.exception("rebalancer: job %s: deciding failed", job.id)
                items.append(_failed(job, f"deciding failed: {type(exc).__name__}: {exc}"))
                continue
            if item.outcome is Outcome.PROPOSED and not dry_run:
                item = self._move(job, item, chosen)
                a_move_ran = True
            items.append(item)
        report = RebalanceReport(now, dry_run, tuple(items))
        moved = report.with_outcome(Outcome.PROPOSED if dry_run else Outcome.MOVED)
        if moved or report.failed:
            log.warning(
                "rebalancer at %s: %d %s (net saving $%s), %d stayed, %d failed",
                now.isoformat(),
                len(moved),
                "proposed" if dry_run else "moved",
                report.expected_saving_usd,
                len(report.with_outcome(Outcome.STAYED)),
                len(report.failed),
            )
        return report

    # -- one job ---------------------------------------------------------------------------------------

    def _decide(self, job: JobRecord, now: datetime) -> tuple[RebalanceItem, list[Placement]]:
        """The verdict for ``job`` and, when it should move, the placements to try, target first."""
        base = RebalanceItem(job.id, job.team_id, Outcome.STAYED, "", from_offer=job.offer)
        if job.cancel_requested_at is not None:
            return replace(base, reason="stay: its team asked to cancel it"), []
        if job.offer is None:
            return replace(base, reason="stay: no placement recorded for the running job"), []
        remaining = float(max(job.steps_total - job.steps_done, 0))
        here = self.placements.at_offer(job, job.offer, remaining_steps=remaining, at=now)
        if here is None or here.steps_per_s <= 0:
            why = f"stay: its offer {job.offer} has no price at {now.isoformat()} or cannot run it"
            return replace(base, reason=why), []
        base = replace(base, from_usd_per_hour=here.usd_per_hour)
        if remaining <= 0:
            return replace(base, reason="stay: no steps left (the job is finishing)"), []
        ranked = self.placements.rank(job, remaining_steps=remaining, at=now, exclude=(job.offer,), top=self.top)
        running = RunningJob(
            remaining_steps=remaining,
            current=_quote(here),
            checkpoint_at=Location(job.offer.cloud, job.offer.region),
            checkpoint_gb=_checkpoint_gb(job),
            last_moved_at=self._last_moved_at(job.id, now),
        )
        quotes = [_quote(p) for p in ranked]
        decision = choose(running, quotes, now, self.rule)
        item = replace(
            base,
            reason=decision.explanation,
            saving_usd=decision.saving_usd if quotes else None,
            move_cost_usd=decision.move_cost_usd if quotes else None,
            margin_usd=decision.margin_usd,
        )
        if decision.action is not Action.MOVE or decision.target is None:
            return item, []
        target = next(p for p in ranked if p.offer == decision.target.key)
        others: list[tuple[Decimal, Placement]] = []
        for p, q in zip(ranked, quotes, strict=True):
            if p is target:
                continue
            alt = decide(running, q, now, self.rule)
            if alt.action is Action.MOVE:
                others.append((alt.saving_usd - alt.move_cost_usd, p))
        others.sort(key=lambda pair: pair[0], reverse=True)
        item = replace(item, outcome=Outcome.PROPOSED, to_offer=target.offer, to_usd_per_hour=target.usd_per_hour)
        return item, [target, *(p for _, p in others)]

    def _move(self, job: JobRecord, item: RebalanceItem, chosen: list[Placement]) -> RebalanceItem:
        net = item.net_saving_usd if item.net_saving_usd is not None else Decimal(0)
        try:
            after = self.engine_move(job.id, chosen, reason=item.reason, expected_saving_usd=net)
        except MIGRATION_RACES as exc:  # the job finished or another actor moved it meanwhile
            log.warning("rebalancer: job %s: not moved: %s: %s", job.id, type(exc).__name__, exc)
            return replace(item, outcome=Outcome.FAILED, reason=f"the move failed: {type(exc).__name__}: {exc}")
        except Exception as exc:
            log.exception("rebalancer: job %s: the move failed", job.id)
            return replace(item, outcome=Outcome.FAILED, reason=f"the move failed: {type(exc).__name__}: {exc}")
        if after.offer is not None and after.offer != job.offer and after.state is JobState.RUNNING:
            return replace(item, outcome=Outcome.MOVED, to_offer=after.offer, to_usd_per_hour=_price(after, chosen))
        why = after.reason or "the engine kept it where it was"
        return replace(item, outcome=Outcome.FAILED, reason=f"the move did not happen (job {after.state.value}): {why}")

    def _last_moved_at(self, job_id: str, now: datetime) -> datetime | None:
        """The newest move or recovery of the job: its newest ``move``/``recovery`` event (the engine records
        every one, on the service clock); without one, its newest finished move or recovery in
        ``migrations`` other than the first launch, unless that time is after ``now`` (the migrator's clock
        is not the service clock: over the simulated cloud it is the wall clock, years after the
        simulated now). None when it never moved."""
        with self.repo.engine.connect() as conn:
            by_event = conn.execute(_LAST_MOVE_EVENT, {"b_job_id": job_id}).scalar_one()
            if by_event is not None:
                return _as_time(by_event)
            by_migration = conn.execute(_LAST_MOVE_MIGRATION, {"b_job_id": job_id}).scalar_one()
        if by_migration is not None and _as_time(by_migration) <= now:
            return _as_time(by_migration)
        return None


_LAST_MOVE_EVENT = select(func.max(job_events.c.at)).where(
    job_events.c.job_id == bindparam("b_job_id"), or_(*(job_events.c.kind == k for k in MOVE_EVENT_KINDS))
)
_LAST_MOVE_MIGRATION = select(func.max(migrations.c.updated_at)).where(
    migrations.c.job_id == bindparam("b_job_id"), migrations.c.state == "done", migrations.c.from_epoch > 0
)
"""The reads of :meth:`Rebalancer._last_moved_at`, built once (the kinds as plain bound values, not an ``IN``
list expanded at every execution)."""


def _as_time(value: object) -> datetime:
    """A ``max()`` of a time column: a datetime on PostgreSQL, the stored ISO text on SQLite."""
    if isinstance(value, datetime):
        return utc(value)
    return utc(datetime.fromisoformat(str(value)))


def _quote(p: Placement) -> OfferQuote:
    return OfferQuote(p.offer, float(p.usd_per_hour), float(p.steps_per_s))


def _checkpoint_gb(job: JobRecord) -> float:
    value = job.spec.get("checkpoint_gb", DEFAULT_CHECKPOINT_GB)
    gb = float(value) if value is not None else DEFAULT_CHECKPOINT_GB
    if not gb >= 0:
        raise ValueError(f"job {job.id}: checkpoint_gb must be a number >= 0, got {value!r}")
    return gb


def _price(job: JobRecord, chosen: Sequence[Placement]) -> float | None:
    for p in chosen:
        if p.offer == job.offer:
            return p.usd_per_hour
    return float(job.usd_per_hour) if job.usd_per_hour is not None else None


def _failed(job: JobRecord, reason: str) -> RebalanceItem:
    return RebalanceItem(job.id, job.team_id, Outcome.FAILED, reason, from_offer=job.offer)
