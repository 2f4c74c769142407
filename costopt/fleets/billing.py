"""A fleet's bill in the ledger: each instance interval split over the jobs that held its GPUs, round by
round; the GPUs nobody held stay on the fleet.

The timeline of a fleet is cut into windows: each closed round ``[started_at, ended_at)``, and the gaps
before, between and after rounds (no job runs then). For every instance, the part of each window it was
alive (``[launched_at, ended_at)``) is cut at the offer's price changes (:func:`costopt.ledger.prices.
price_segments`) and each segment's whole-instance amount (micro-dollars, the ledger's rounding) is split
over the round's leases on the instance in proportion to their GPUs, the rest to the fleet (ledger job id
= the fleet's id), by largest remainder: the parts of a segment are whole micro-dollars summing exactly to
the segment's amount. Each part is recorded as a ledger interval of its job (team = the fleet's) whose
``share`` is the part's fraction of the segment's exact cost (the GPU fraction, to within a micro-dollar),
so the ledger's own rounding gives back exactly the part: the fleet's jobs and its idle lines sum to the
bill of its instances, to the micro-dollar.

A lease is billed whole: a job that finished early in a round held its GPUs until the round's end. A round
is billed once it ended (``fleet_rounds.billed``; the current round is not billed yet); an ended instance
(drained, or lost) is billed to its end once every round that started before its end is, its time after the
last of them recorded as one more gap, and then ``fleet_instances.billed_to`` is set to its end: both marks
are in the database, so a restart neither forgets an instance's last stretch nor looks for it again.
Recording is idempotent per interval key (``fleet:<fleet>:<instance>:<window>:s<segment>:<job>``), so a
pass cut short (a crash between the lines and their mark) and repeated records nothing twice.

A cloud instance launched for a fleet instance but never recorded on it (a launch cut short, found by its
tags and terminated by the round executor) is billed whole, from its launch to its end on the cloud, as the
fleet's idle time (:meth:`FleetBilling.stray`: one interval of the whole instance, keyed by the cloud
instance, recorded open before it is terminated and closed at its end, the first end recorded staying).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Context, Decimal

from costopt.fleets.model import FleetInstance, FleetRecord, RoundRecord
from costopt.fleets.store import FleetRepository
from costopt.ledger.book import Ledger
from costopt.ledger.model import IntervalRecord, LedgerError
from costopt.ledger.prices import PriceSteps, price_segments
from costopt.ledger.sql import SqlLedger

log = logging.getLogger("costopt.fleets")

__all__ = ["FleetBilling", "split_micro"]

_EXACT = Context(prec=60)
_US_PER_HOUR = Decimal(3_600_000_000)
_US = timedelta(microseconds=1)


def split_micro(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` micro-dollars split in proportion to ``weights`` (>= 0, not all 0) by largest remainder:
    whole numbers summing exactly to ``total``; ties go to the earlier weight."""
    w = sum(weights)
    if w <= 0:
        raise ValueError("weights must not all be 0")
    base = [total * x // w for x in weights]
    rest = total - sum(base)
    order = sorted(range(len(weights)), key=lambda i: (-(total * weights[i] % w), i))
    for i in order[:rest]:
        base[i] += 1
    return base


@dataclass(slots=True)
class FleetBilling:
    """Bills fleets into ``ledger`` (its prices are ``prices``); call it with a fleet and now (the round
    executor does, after each boundary). It keeps nothing in memory: what is billed is in the database
    (``fleet_rounds.billed``, ``fleet_instances.billed_to``) and the ledger, so a fresh object (a restart,
    another replica) goes on where the last one stopped."""

    repo: FleetRepository
    ledger: Ledger
    prices: PriceSteps

    def __call__(self, fleet: FleetRecord, now: datetime) -> int:
        """Record what ended since the last call; returns the number of lines written or confirmed."""
        first = self.repo.first_unbilled(fleet.id)
        every = self.repo.instances(fleet.id)
        instances = [i for i in every if i.launched_at is not None]
        ends = [i for i in every if i.ended_at is not None and not i.billed_to_end]
        if first is None and not ends:
            return 0
        rounds = self._rounds(fleet, first, ends)
        lines = 0
        billed: set[int] = set()
        for k, rnd in enumerate(rounds):
            if rnd.billed or rnd.ended_at is None:
                continue
            prev = rounds[k - 1].ended_at if k else None
            try:
                for inst in instances:
                    gap_start = prev if prev is not None else inst.launched_at
                    assert gap_start is not None
                    lines += self._window(fleet, inst, f"g{rnd.round - 1}", gap_start, rnd.started_at, {})
                    held = {a.job_id: len(a.gpus) for a in rnd.assignment if a.instance == inst.id}
                    lines += self._window(fleet, inst, f"r{rnd.round}", rnd.started_at, rnd.ended_at, held)
            except LedgerError as exc:
                log.error("fleet %s: round %d cannot be billed yet: %s", fleet.id, rnd.round, exc)
                return lines
            self.repo.mark_billed(fleet.id, rnd.round)
            billed.add(rnd.round)
        lines += self._ends(fleet, ends, rounds, billed)
        return lines

    def stray(
        self,
        fleet: FleetRecord,
        inst: FleetInstance,
        cloud_instance_id: str,
        started_at: datetime,
        ended_at: datetime | None,
    ) -> bool:
        """Record the life of a cloud instance launched for ``inst`` that the fleet never tracked (a launch
        cut short, :attr:`FleetInstance.launch_unresolved`, found by its tags by the round executor) as the
        fleet's idle time (no job held it): one ledger interval of the whole instance (ledger job = the
        fleet), key ``fleet:<fleet>:<instance>:x<hash of the cloud id>:<fleet>``, from ``started_at`` (its
        launch) to ``ended_at`` (None: open, while it is being terminated). Idempotent: the first end
        recorded stays (a later call, with another end, changes nothing). Returns True when the stored
        interval is closed (billed to its end). Raises :class:`~costopt.ledger.model.LedgerError` when it
        cannot be recorded."""
        window = "x" + hashlib.sha256(cloud_instance_id.encode()).hexdigest()[:16]
        record = IntervalRecord(
            interval_key=f"fleet:{fleet.id}:{inst.id}:{window}:{fleet.id}",
            job_id=fleet.id,
            instance_id=cloud_instance_id,
            offer=inst.offer,
            started_at=started_at,
            ended_at=None,
            team=fleet.team_id,
            provider=inst.provider,
        )
        stored = self.ledger.record_interval(record)
        if stored.record.ended_at is not None or ended_at is None:
            return stored.record.ended_at is not None
        closed = replace(record, ended_at=max(ended_at, started_at), end_reason="idle")
        return self.ledger.record_interval(closed).record.ended_at is not None

    def open_strays(self, fleet: FleetRecord, inst: FleetInstance) -> list[tuple[str, datetime]]:
        """``(cloud instance id, start)`` of the bills :meth:`stray` opened for ``inst`` and did not close
        (a pass that died between opening one and closing it): the executor closes them even when the
        provider no longer lists the instance. Reads the fleet's own lines not ended by now (on the SQL
        ledger: only those, by the job's index; the fleet's other lines are all closed), else all of them."""
        prefix = f"fleet:{fleet.id}:{inst.id}:x"
        now = self.repo.now()
        if isinstance(self.ledger, SqlLedger):  # its intervals overlapping [now, ...): the open ones among them
            records = [line.record for line in self.ledger.intervals(job_id=fleet.id, start=now)]
        else:
            records = [line.record for line in self.ledger.costs(job_id=fleet.id, as_of=now).lines]
        found: dict[str, datetime] = {}
        for rec in records:
            if rec.ended_at is None and rec.interval_key.startswith(prefix):
                found[rec.instance_id] = rec.started_at
        return sorted(found.items())

    def _rounds(self, fleet: FleetRecord, first: int | None, ends: Sequence[FleetInstance]) -> list[RoundRecord]:
        """The rounds a call looks at: those to bill and the one before them (its end starts the gap);
        for the ``ends``, also the last round that started before each end. Every round before ``first``
        is billed, so the rounds from ``first - 1`` on suffice when the first of them started before the
        earliest end (an instance waiting for the round in force to end reads two rounds a pass, not the
        fleet's whole history); else (every round billed, or the ends all before ``first - 1``) all."""
        since = 0 if first is None else max(first - 1, 0)
        rounds = self.repo.rounds(fleet.id, since=since)
        if ends and since > 0:
            earliest = min(i.ended_at for i in ends if i.ended_at is not None)
            if not rounds or rounds[0].started_at >= earliest:
                rounds = self.repo.rounds(fleet.id)
        return rounds

    def _ends(
        self,
        fleet: FleetRecord,
        instances: Sequence[FleetInstance],
        rounds: Sequence[RoundRecord],
        billed_now: Set[int],
    ) -> int:
        """Ended instances not yet billed to their end: once every round that started before the end ended
        and is billed, their time after the last of those rounds (when it ended before their end; else that
        round's window billed them to it; with no such round: their whole life) is recorded, then their
        ``billed_to`` is written (after the lines: a crash in between records nothing twice at the next
        call, the keys are the same). An instance never launched has nothing to bill."""
        lines = 0
        for inst in instances:
            end = inst.ended_at
            if end is None:
                continue
            if inst.launched_at is not None:
                started = [r for r in rounds if r.started_at < end]
                if any(r.ended_at is None or not (r.billed or r.round in billed_now) for r in started):
                    continue  # a round it may have taken part in is not billed yet: its window comes first
                last = started[-1] if started else None
                if last is None or (last.ended_at is not None and last.ended_at <= end):
                    start = last.ended_at if last is not None and last.ended_at is not None else inst.launched_at
                    try:
                        lines += self._window(fleet, inst, f"g{last.round if last else 0}", start, end, {})
                    except LedgerError as exc:
                        log.error(
                            "fleet %s: instance %s's last interval cannot be billed yet: %s", fleet.id, inst.id, exc
                        )
                        continue
            self.repo.mark_billed_to(inst.id, end)
        return lines

    def _window(
        self,
        fleet: FleetRecord,
        inst: FleetInstance,
        window: str,
        start: datetime,
        end: datetime,
        held: Mapping[str, int],
    ) -> int:
        """Record ``[start, end)`` of ``inst`` (clipped to its life) split over ``held`` (job -> GPUs)."""
        assert inst.launched_at is not None
        a = max(start, inst.launched_at)
        b = min(end, inst.ended_at) if inst.ended_at is not None else end
        if b <= a:
            return 0
        parts = [(job, n) for job, n in sorted(held.items()) if n > 0]
        idle = inst.gpus - sum(n for _, n in parts)
        if idle > 0:
            parts.append((fleet.id, idle))
        lines = 0
        for s, seg in enumerate(price_segments(self.prices, inst.offer, a, b)):
            micros = (seg.ends_at - seg.starts_at) // _US
            exact = _EXACT.divide(_EXACT.multiply(Decimal(micros), seg.usd_per_hour), _US_PER_HOUR)  # USD
            whole = seg.amount_micro_usd
            amounts = split_micro(whole, [n for _, n in parts])
            for (job, _), amount in zip(parts, amounts, strict=True):
                if amount <= 0:
                    continue
                if amount == whole or exact == 0:
                    share = Decimal(1)
                else:
                    share = min(Decimal(1), _EXACT.divide(Decimal(amount).scaleb(-6), exact))
                self.ledger.record_interval(
                    IntervalRecord(
                        interval_key=f"fleet:{fleet.id}:{inst.id}:{window}:s{s}:{job}",
                        job_id=job,
                        instance_id=inst.instance_id or inst.id,
                        offer=inst.offer,
                        started_at=seg.starts_at,
                        ended_at=seg.ends_at,
                        share=share,
                        team=fleet.team_id,
                        provider=inst.provider,
                        end_reason="round" if window.startswith("r") else "idle",
                    )
                )
                lines += 1
        return lines
