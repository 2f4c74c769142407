"""The savings report: each job's actual cost against its baselines, in rows every view sums.

How the figures are made (docs/ledger.md, "Reports"):

- **Actual cost** comes from the ledger only: each instance interval's price segments (stored when it
  closed; an open one priced up to ``now`` by the ledger's own rule) and the additive charges (egress).
  Within the period ``[start, end)`` a segment wholly inside keeps its stored amount and a cut one is
  re-priced for the part inside, exactly as :meth:`SqlLedger.costs` does, so the report's total for a
  period equals the ledger's. Each piece is then split over the UTC days it touches with an exact
  integer apportionment (:mod:`costopt.reports.apportion`): one :class:`Row` per segment and day, which
  every grouping, the day series and the exports sum, so they agree to the micro-dollar.
- **Baselines** are priced per job over its run (:mod:`costopt.reports.baselines`). A job's baseline in
  the period is its run baseline times the share of its run's actual cost that falls in the period
  (rounded half-even once), spread over its rows in proportion to their amounts (exact). A job's
  savings therefore fall in the days and groups where it spent, at its run's savings rate.
- **Moves and preemptions** are explained from the ledger's memo lines and the jobs' events: a move's
  cost is its egress, the old copy's overlap and the new copy's restart; a preemption's is the lost
  work (the engine's ``preemption`` event, valued at the copy's price) and the new copy's restart. They
  are already inside the actual cost (the time was billed); they are shown, never added again.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from decimal import Decimal

from costopt.domain import OfferKey
from costopt.jobs.records import JobEvent, JobRecord
from costopt.ledger.model import ChargeKind, ChargeLine, IntervalLine, LedgerError, Segment, segment_micro_usd
from costopt.ledger.model import usd_to_micro as _to_micro
from costopt.ledger.prices import PriceView, offer_label, price_segments
from costopt.reports.apportion import largest_remainder, split_by_days
from costopt.reports.baselines import BaselineChoice, BaselineSource, price_baseline
from costopt.reports.data import CopyKind, ReportData
from costopt.reports.model import (
    BREAKDOWNS,
    JOB_SORT_VALUES,
    BaselineKind,
    BaselineRun,
    DayActivity,
    Figures,
    Group,
    JobFigures,
    JobPage,
    MoveCheck,
    NoBaseline,
    OverBaseline,
    OverJob,
    Reason,
    ReportQuery,
    Row,
    Saver,
    SavingsReport,
    usd,
)
from costopt.reports.price_memo import MemoSteps

__all__ = ["ReportFold", "build_report", "ordered_jobs"]

MEMO_AHEAD = timedelta(days=3660)
"""How far past the report's time its price memo reaches (a baseline's run may end after ``now``: it runs
the job's work at the baseline's speed from the job's first launch); a range beyond is read from the view."""
SPIKE_RATIO = Decimal("1.2")
"""A price paid at least this many times the lowest price paid on the same offer by the job is called a
price spike in the reasons."""

LOSS_EVENTS = ("preemption", "copy_lost")
"""The job events whose ``cost_usd`` is work lost."""
ACTIVITY_EVENTS = ("move", "preemption")
"""The job events counted by day (``activity``). With :data:`LOSS_EVENTS`, every kind a report reads
(:data:`costopt.reports.data.EVENT_KINDS`)."""


def _half_even_ratio(amount: int, num: int, den: int) -> int:
    """``amount x num / den`` rounded half-even to an integer (den > 0)."""
    q, r = divmod(amount * num, den)
    if 2 * r > den or (2 * r == den and q % 2 == 1):
        q += 1
    return q


class _Job:
    """One job's lines, priced and classified (internal)."""

    def __init__(
        self,
        job_id: str,
        intervals: Sequence[IntervalLine],
        charges: Sequence[ChargeLine],
        data: ReportData,
        prices: PriceView,
        now: datetime,
    ) -> None:
        self.job_id = job_id
        self.record: JobRecord | None = data.jobs.get(job_id)
        self.intervals = sorted(intervals, key=lambda ln: (ln.record.started_at, ln.record.interval_key))
        self.charges = [c for c in charges if c.record.at <= now]
        self.events: Sequence[JobEvent] = data.events.get(job_id, ())
        self.prices = prices
        self.now = now
        self.warnings: list[str] = []
        self.segments: list[tuple[IntervalLine, tuple[Segment, ...]]] = []
        for ln in self.intervals:
            rec = ln.record
            if rec.ended_at is not None:
                self.segments.append((ln, ln.segments))
                continue
            segs: tuple[Segment, ...] = ()
            if now > rec.started_at:
                try:
                    segs = price_segments(prices, rec.offer, rec.started_at, now, rec.share)
                except LedgerError as exc:
                    self.warnings.append(f"{rec.interval_key}: running interval not priced: {exc}")
            self.segments.append((ln, segs))
        self.amount_of = {ln.record.interval_key: sum(s.amount_micro_usd for s in segs) for ln, segs in self.segments}
        first = self.intervals[0] if self.intervals else None
        self.first_key = first.record.interval_key if first is not None else None
        self.kinds = {ln.record.interval_key: self._kind(ln, data.copy_kinds) for ln in self.intervals}

    def _kind(self, ln: IntervalLine, copy_kinds: Mapping[str, str]) -> str:
        kind = copy_kinds.get(ln.record.interval_key, CopyKind.UNKNOWN)
        if kind == CopyKind.UNKNOWN:  # not launched by the migrator's records: the first is the start
            return CopyKind.START if ln.record.interval_key == self.first_key else CopyKind.RECOVERY
        return kind

    @property
    def team(self) -> str:
        if self.record is not None:
            return self.record.team_id
        for ln in self.intervals:
            return ln.record.team
        return self.charges[0].record.team if self.charges else ""

    def accelerator(self, offer: OfferKey) -> str | None:
        shape = self.prices.shape(offer)
        return shape[0] if shape else None

    # -- money -------------------------------------------------------------------------------------------

    @property
    def run_instances_micro(self) -> int:
        return sum(self.amount_of.values())

    @property
    def run_egress_micro(self) -> int:
        return sum(c.amount_micro_usd for c in self.charges if c.additive)

    def charge_class(self, c: ChargeLine) -> str:
        """``boot``, ``move`` or ``preemption``: what a charge (memo or egress) belongs to."""
        if c.record.kind is ChargeKind.OVERLAP:
            return "move"
        if c.record.kind is ChargeKind.LOST_WORK:
            return "preemption"
        kind = self.kinds.get(c.record.interval_key or "", CopyKind.MOVE if c.additive else CopyKind.RECOVERY)
        if kind == CopyKind.START:
            return "boot"
        return "move" if kind == CopyKind.MOVE else "preemption"

    def lost_work(self, events: Iterable[JobEvent]) -> int:
        return sum(_to_micro(e.cost_usd) for e in events if e.kind in LOSS_EVENTS and e.cost_usd is not None)

    def boot_seconds(self) -> float:
        for c in self.charges:
            if c.record.kind is ChargeKind.RESTART and c.record.interval_key == self.first_key and c.record.span:
                return (c.record.span[1] - c.record.span[0]).total_seconds()
        return 0.0

    # -- rows ----------------------------------------------------------------------------------------------

    def rows(self, query: ReportQuery) -> list[Row]:
        out: list[Row] = []
        for ln, segs in self.segments:
            rec = ln.record
            acc = self.accelerator(rec.offer)
            for s in segs:
                a, b = max(s.starts_at, query.start), min(s.ends_at, query.end)
                if b <= a:
                    continue
                whole = a == s.starts_at and b == s.ends_at
                amount = s.amount_micro_usd if whole else segment_micro_usd(a, b, s.usd_per_hour, rec.share)
                for da, db, part in split_by_days(a, b, amount):
                    out.append(
                        Row(
                            kind="instance",
                            job_id=self.job_id,
                            team=self.team,
                            ref=rec.interval_key,
                            instance_id=rec.instance_id,
                            provider=rec.provider,
                            offer=rec.offer,
                            accelerator=acc,
                            starts_at=da,
                            ends_at=db,
                            usd_per_hour=s.usd_per_hour,
                            share=rec.share,
                            amount_micro=part,
                            open=rec.ended_at is None,
                        )
                    )
        for c in self.charges:
            rec_c = c.record
            if not c.additive or not (query.start <= rec_c.at < query.end):
                continue
            out.append(
                Row(
                    kind=rec_c.kind.value,
                    job_id=self.job_id,
                    team=self.team,
                    ref=rec_c.charge_key,
                    instance_id=None,
                    provider=None,
                    offer=rec_c.offer,
                    accelerator=None,
                    starts_at=rec_c.at,
                    ends_at=rec_c.at,
                    usd_per_hour=None,
                    share=rec_c.share,
                    amount_micro=c.amount_micro_usd,
                    quantity=rec_c.quantity,
                    unit=rec_c.unit,
                    rate_usd=rec_c.rate_usd,
                    note=rec_c.note,
                )
            )
        return out

    # -- moves ---------------------------------------------------------------------------------------------

    def move_checks(self) -> list[MoveCheck]:
        out: list[MoveCheck] = []
        for i, ln in enumerate(self.intervals):
            if i == 0 or self.kinds[ln.record.interval_key] != CopyKind.MOVE:
                continue
            prev = self.intervals[i - 1]
            new, old = ln.record, prev.record
            if new.ended_at is not None and new.end_reason in ("failed_verification", "rollback"):
                continue  # a rolled-back move: the job stayed
            productive = new.started_at
            moved = self.amount_of[new.interval_key]
            for c in self.charges:
                key = c.record.interval_key
                if c.record.kind is ChargeKind.RESTART and key == new.interval_key and c.record.span:
                    productive = c.record.span[1]
                if (c.additive and key == new.interval_key) or (
                    c.record.kind is ChargeKind.OVERLAP and key == old.interval_key
                ):
                    moved += c.amount_micro_usd
            end = new.ended_at or self.now
            stay: int | None = None
            note = ""
            if self.prices.shape(old.offer) != self.prices.shape(new.offer):
                note = "another accelerator: not compared (the work would have taken another time)"
            elif end > productive:
                try:
                    segs = price_segments(self.prices, old.offer, productive, end, new.share)
                    stay = sum(s.amount_micro_usd for s in segs)
                    note = (
                        f"staying on {offer_label(old.offer)} from {productive.isoformat()} to {end.isoformat()} "
                        f"would have cost {usd(stay)} USD; the move cost {usd(moved)} USD (new copy, egress, overlap)"
                    )
                except LedgerError as exc:
                    note = f"not compared: {exc}"
            else:
                stay = 0
                note = "the new copy never progressed"
            out.append(MoveCheck(new.interval_key, old.offer, new.offer, new.started_at, stay, moved, note))
        return out


def _baseline(
    job: _Job, kind: BaselineKind, choice: BaselineChoice | NoBaseline, start: datetime, steps: int
) -> BaselineRun | NoBaseline:
    if isinstance(choice, NoBaseline):
        return choice
    return price_baseline(job.prices, kind, choice, start=start, boot_seconds=job.boot_seconds(), work_steps=steps)


def _work_steps(record: JobRecord) -> int:
    return int(record.steps_total if record.state.value == "succeeded" else record.steps_done)


def _reasons(
    job: _Job,
    excess: int,
    base: BaselineRun,
    moves: tuple[int, int],
    preempt: tuple[int, int, int],
    checks: Sequence[MoveCheck],
) -> tuple[Reason, ...]:
    out: list[Reason] = []
    n_moves, move_cost = moves
    n_pre, lost, pre_cost = preempt
    if move_cost > 0:
        unpaid = [c for c in checks if c.paid is False]
        detail = f"{n_moves} move(s) cost {usd(move_cost)} USD in egress, overlap and restarts"
        if unpaid:
            detail += "; did not pay: " + "; ".join(
                f"{offer_label(c.from_offer)} -> {offer_label(c.to_offer)} at {c.at.isoformat()} ({c.note})"
                for c in unpaid
            )
        out.append(Reason("moves", move_cost, detail))
    if pre_cost > 0:
        out.append(
            Reason(
                "preemptions",
                pre_cost,
                f"{n_pre} preemption(s): work lost since the last checkpoint {usd(lost)} USD, "
                f"recoveries' restarts {usd(pre_cost - lost)} USD",
            )
        )
    rest = excess - move_cost - pre_cost
    if rest > 0:
        paid = [(s.usd_per_hour, ln.record.offer, s.starts_at) for ln, segs in job.segments for s in segs]
        if paid:
            top, offer, at = max(paid, key=lambda p: p[0])
            low = min(p for p, o, _ in paid if o == offer)
            base_price = base.segments[0].usd_per_hour if base.segments else None
            what = "a price spike" if low > 0 and top >= SPIKE_RATIO * low else "prices above the baseline's"
            detail = (
                f"{what}: instance time cost {usd(rest)} USD more than the baseline's; the highest price paid was "
                f"{top} USD/h on {offer_label(offer)} from {at.isoformat()} (lowest on that offer {low} USD/h; "
                f"the baseline {offer_label(base.offer)} started at {base_price} USD/h)"
            )
        else:
            detail = f"instance time cost {usd(rest)} USD more than the baseline's"
        out.append(Reason("prices", rest, detail))
    out.sort(key=lambda r: -r.amount_micro)
    return tuple(out)


def _figures(rows: Iterable[Row]) -> Figures:
    f = Figures()
    for r in rows:
        f = f.add(r)
    return f


def ordered_jobs(jobs: Iterable[JobFigures], page: JobPage) -> list[JobFigures]:
    """``jobs`` in ``page``'s order (:class:`JobPage`: jobs without a value last, ties by job id)."""
    value = JOB_SORT_VALUES[page.sort]
    keyed = [(value(j), j) for j in jobs]
    present = sorted((kv for kv in keyed if kv[0] is not None), key=lambda kv: kv[1].job_id)
    present.sort(key=lambda kv: kv[0], reverse=page.descending)  # type: ignore[arg-type,return-value]  # stable: ties keep the id order
    absent = sorted((j for v, j in keyed if v is None), key=lambda j: j.job_id)
    return [j for _, j in present] + absent


class ReportFold:
    """A report folded a batch of jobs at a time (:func:`costopt.reports.data.iter_report_data`): each
    :meth:`add` prices its jobs, adds their rows to the sums and keeps only what the report lists (the
    page's jobs, the top savers, the jobs over a baseline; every row only with ``keep_rows``), so its memory
    follows a batch and the page, not the scope. Folding every job in one batch or in many gives the same
    report. ``window``: the first and last interval start of the whole scope (the price memo's window;
    None: the first batch's). ``page`` None: every job is listed (the exports)."""

    def __init__(
        self,
        query: ReportQuery,
        *,
        prices: PriceView,
        baselines: BaselineSource,
        now: datetime,
        window: tuple[datetime, datetime] | None = None,
        keep_rows: bool = True,
        page: JobPage | None = None,
    ) -> None:
        self.query, self.baselines, self.now, self.page = query, baselines, now, page
        self._view = prices
        self._prices: PriceView | None = None
        if window is not None:
            self._memo(*window)
        self._rows: list[Row] | None = [] if keep_rows else None
        self._totals = Figures()
        self._groups: dict[tuple[str, ...], Figures] = {}
        self._days: dict[tuple[str, ...], Figures] = {}
        self._by: dict[str, dict[str, Figures]] = {dim: {} for dim in BREAKDOWNS}
        self._jobs: list[JobFigures] = []
        self._savers: list[JobFigures] = []
        self._over: list[OverJob] = []
        self._teams: set[str] = set()
        self._count = 0
        self._activity: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self._moves = self._preempt = 0
        self._warnings: list[str] = []

    def _memo(self, first: datetime, last: datetime) -> None:
        # each offer's history read once for the report (baselines may run past now: MEMO_AHEAD)
        self._prices = MemoSteps(self._view, first, max(self.now, last) + MEMO_AHEAD)

    def add(self, data: ReportData) -> None:
        """Fold the jobs of ``data`` (each job's lines in one batch only: a job split over two is wrong)."""
        query, now = self.query, self.now
        if self._prices is None and data.intervals:
            starts = [ln.record.started_at for ln in data.intervals]
            self._memo(min(starts), max(starts))
        prices = self._prices or self._view
        by_job_iv: dict[str, list[IntervalLine]] = defaultdict(list)
        by_job_ch: dict[str, list[ChargeLine]] = defaultdict(list)
        for ln in data.intervals:
            by_job_iv[ln.record.job_id].append(ln)
        for c in data.charges:
            by_job_ch[c.record.job_id].append(c)
        ids = sorted(set(by_job_iv) | set(by_job_ch))
        if query.job_ids is not None:
            wanted = set(query.job_ids)
            ids = [j for j in ids if j in wanted]
        if query.team is not None:
            ids = [j for j in ids if (data.jobs[j].team_id if j in data.jobs else None) in (query.team, None)]
        for job_id in ids:
            job = _Job(job_id, by_job_iv.get(job_id, []), by_job_ch.get(job_id, []), data, prices, now)
            self._add_job(job)
            for e in data.events.get(job_id, ()):
                if query.start <= e.at < query.end and e.kind in ACTIVITY_EVENTS:
                    self._activity[e.at.date().isoformat()][0 if e.kind == "move" else 1] += 1

    def _add_job(self, job: _Job) -> None:
        query = self.query
        self._warnings.extend(job.warnings)
        for c in job.charges:
            if query.start <= c.record.at < query.end:
                cls = job.charge_class(c)
                if cls == "move":
                    self._moves += c.amount_micro_usd
                elif cls == "preemption":
                    self._preempt += c.amount_micro_usd
        self._preempt += job.lost_work(e for e in job.events if query.start <= e.at < query.end)
        figures, rows = _job_figures(job, query, self.baselines)
        if figures is None:
            return
        for r in rows:
            self._totals = self._totals.add(r)
            key = tuple(r.value(d) for d in query.group_by)
            self._groups[key] = self._groups.get(key, Figures()).add(r)
            day = (r.value("day"),)
            self._days[day] = self._days.get(day, Figures()).add(r)
            for dim, sums in self._by.items():
                k = r.value(dim)
                sums[k] = sums.get(k, Figures()).add(r)
        if self._rows is not None:
            self._rows.extend(rows)
        self._count += 1
        self._teams.add(figures.team)
        self._jobs.append(figures)
        if self.page is not None and len(self._jobs) > 2 * (self.page.offset + self.page.limit):
            self._jobs = ordered_jobs(self._jobs, self.page)[: self.page.offset + self.page.limit]
        if isinstance(figures.on_demand, BaselineRun):
            self._savers.append(figures)
            if len(self._savers) > 2 * query.top:
                self._savers = self._top_savers()
        if figures.over:
            first = figures.over[0]
            self._over.append(
                OverJob(
                    figures.job_id,
                    tuple(o.kind for o in figures.over),
                    max(o.excess_micro for o in figures.over),
                    first.reasons[0].kind if first.reasons else None,
                )
            )

    def _top_savers(self) -> list[JobFigures]:
        ranked = sorted(self._savers, key=lambda j: (-j.period.savings_on_demand_micro, j.job_id))
        return ranked[: self.query.top]

    def report(self) -> SavingsReport:
        """The report of every job folded so far."""
        rows = None
        if self._rows is not None:
            rows = tuple(sorted(self._rows, key=lambda r: (r.starts_at, r.job_id, r.ref)))
        jobs = sorted(self._jobs, key=lambda j: j.job_id)
        if self.page is not None:
            jobs = ordered_jobs(jobs, self.page)[self.page.offset : self.page.offset + self.page.limit]
        return SavingsReport(
            query=self.query,
            now=self.now,
            rows=rows,
            totals=self._totals,
            groups=tuple(Group(k, f) for k, f in sorted(self._groups.items())),
            days=tuple(Group(k, f) for k, f in sorted(self._days.items())),
            breakdowns={dim: tuple(Group((k,), f) for k, f in sorted(s.items())) for dim, s in self._by.items()},
            jobs=tuple(jobs),
            job_count=self._count,
            teams=tuple(sorted(self._teams)),
            top_savers=tuple(Saver(j.job_id, j.name, j.period) for j in self._top_savers()),
            over_baseline=tuple(sorted(self._over, key=lambda o: (-o.excess_micro, o.job_id))),
            activity=tuple(DayActivity(d, m, p) for d, (m, p) in sorted(self._activity.items())),
            move_cost_micro=self._moves,
            preemption_cost_micro=self._preempt,
            page=self.page,
            warnings=tuple(self._warnings),
        )


def _job_figures(job: _Job, query: ReportQuery, baselines: BaselineSource) -> tuple[JobFigures | None, list[Row]]:
    """A job's figures and its rows in the period, its baselines spread over them (None, []: no row)."""
    rows = job.rows(query)
    if not rows:
        return None, []
    record = job.record
    first = job.intervals[0].record.started_at if job.intervals else None
    ends = [ln.record.ended_at for ln in job.intervals]
    last_end = max(e for e in ends if e is not None) if ends and all(e is not None for e in ends) else None
    od: BaselineRun | NoBaseline
    st: BaselineRun | NoBaseline
    if record is None:
        why = "not a managed job (no submission to take a baseline from)"
        od, st = NoBaseline(BaselineKind.ON_DEMAND, why), NoBaseline(BaselineKind.STATIC_SPOT, why)
    elif first is None:
        why = "the job has no instance interval (only charges)"
        od, st = NoBaseline(BaselineKind.ON_DEMAND, why), NoBaseline(BaselineKind.STATIC_SPOT, why)
    else:
        steps = _work_steps(record)
        od = _baseline(job, BaselineKind.ON_DEMAND, baselines.on_demand(record), first, steps)
        st = _baseline(job, BaselineKind.STATIC_SPOT, baselines.static_spot(record), first, steps)
    run_actual = job.run_instances_micro + job.run_egress_micro
    move_cost = sum(c.amount_micro_usd for c in job.charges if job.charge_class(c) == "move")
    lost = job.lost_work(job.events)
    pre_cost = lost + sum(c.amount_micro_usd for c in job.charges if job.charge_class(c) == "preemption")
    boot = sum(
        c.amount_micro_usd for c in job.charges if c.record.kind is ChargeKind.RESTART and job.charge_class(c) == "boot"
    )
    n_moves = sum(1 for ln in job.intervals if ln.record.end_reason == "moved")
    n_pre = sum(1 for ln in job.intervals if ln.record.end_reason == "preempted")
    checks = job.move_checks()
    over: list[OverBaseline] = []
    for base in (od, st):
        if isinstance(base, BaselineRun) and run_actual > base.amount_micro:
            excess = run_actual - base.amount_micro
            reasons = _reasons(job, excess, base, (n_moves, move_cost), (n_pre, lost, pre_cost), checks)
            over.append(OverBaseline(base.kind, excess, reasons))
    # the job's baselines in the period, spread over its rows
    period_actual = sum(r.amount_micro for r in rows)
    weights = [r.amount_micro for r in rows]
    shares: dict[BaselineKind, list[int] | None] = {}
    for base in (od, st):
        if not isinstance(base, BaselineRun):
            shares[base.kind] = None
            continue
        if run_actual > 0:
            in_period = _half_even_ratio(base.amount_micro, period_actual, run_actual)
        else:
            in_period = base.amount_micro if first is not None and query.start <= first < query.end else 0
        shares[base.kind] = largest_remainder(in_period, weights)
    od_parts, st_parts = shares[BaselineKind.ON_DEMAND], shares[BaselineKind.STATIC_SPOT]
    rows = [
        replace(
            r,
            baseline_on_demand_micro=None if od_parts is None else od_parts[i],
            baseline_static_spot_micro=None if st_parts is None else st_parts[i],
        )
        for i, r in enumerate(rows)
    ]
    figures = JobFigures(
        job_id=job.job_id,
        team=job.team,
        name=record.name if record else "",
        state=record.state.value if record else "unmanaged",
        managed=record is not None,
        steps_done=record.steps_done if record else 0,
        steps_total=record.steps_total if record else 0,
        created_at=record.created_at if record else None,
        first_launch=first,
        last_end=last_end,
        run_actual_micro=run_actual,
        run_egress_micro=job.run_egress_micro,
        on_demand=od,
        static_spot=st,
        moves=n_moves,
        preemptions=n_pre,
        move_cost_micro=move_cost,
        preemption_cost_micro=pre_cost,
        lost_work_micro=lost,
        boot_micro=boot,
        move_checks=tuple(checks),
        over=tuple(over),
        period=_figures(rows),
        warnings=tuple(job.warnings),
    )
    return figures, rows


def build_report(
    data: ReportData | Iterable[ReportData],
    query: ReportQuery,
    *,
    prices: PriceView,
    baselines: BaselineSource,
    now: datetime,
    window: tuple[datetime, datetime] | None = None,
    keep_rows: bool = True,
    page: JobPage | None = None,
) -> SavingsReport:
    """The report of ``data`` (one batch, or batches of distinct jobs: :class:`ReportFold`) for ``query``
    (module docstring); open intervals priced up to ``now``."""
    fold = ReportFold(query, prices=prices, baselines=baselines, now=now, window=window, keep_rows=keep_rows, page=page)
    for batch in [data] if isinstance(data, ReportData) else data:
        fold.add(batch)
    return fold.report()
