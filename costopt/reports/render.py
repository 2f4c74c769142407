"""A savings report as a JSON document (the REST answer, ``--format json``, the web page's data).

Money is a decimal string of exact USD (6 decimals: micro-dollars, the ledger's unit); rates are decimal
strings to 4 decimals (None when there is no baseline); times are ISO 8601 UTC with ``Z``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from costopt.ledger.model import Segment
from costopt.reports.model import BaselineRun, Figures, JobFigures, NoBaseline, SavingsReport, usd

__all__ = ["TOTAL_KEYS", "figures_doc", "iso", "money", "report_doc"]

TOTAL_KEYS = (
    "actual_cost",
    "baseline_on_demand_cost",
    "baseline_static_spot_cost",
    "savings",
    "savings_rate",
    "savings_vs_static_spot",
    "savings_rate_vs_static_spot",
    "actual_cost_without_baseline",
)


def money(micro: int) -> str:
    return str(usd(micro))


def iso(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat().replace("+00:00", "Z")


def _rate(value: Decimal | None) -> str | None:
    return None if value is None else str(value)


def figures_doc(f: Figures) -> dict[str, Any]:
    """The figures of a group (or the totals)."""
    return {
        "actual_cost": money(f.actual_micro),
        "baseline_on_demand_cost": money(f.baseline_on_demand_micro),
        "baseline_static_spot_cost": money(f.baseline_static_spot_micro),
        "savings": money(f.savings_on_demand_micro),
        "savings_rate": _rate(f.savings_rate),
        "savings_vs_static_spot": money(f.savings_static_spot_micro),
        "savings_rate_vs_static_spot": _rate(f.savings_rate_static_spot),
        "actual_cost_without_baseline": money(f.uncovered_actual_micro),
        "lines": f.rows,
    }


def _segments(segs: tuple[Segment, ...]) -> list[dict[str, Any]]:
    return [
        {
            "from": iso(s.starts_at),
            "to": iso(s.ends_at),
            "usd_per_hour": str(s.usd_per_hour),
            "amount": money(s.amount_micro_usd),
        }
        for s in segs
    ]


def _baseline(b: BaselineRun | NoBaseline) -> dict[str, Any]:
    if isinstance(b, NoBaseline):
        return {"kind": b.kind.value, "available": False, "reason": b.reason}
    return {
        "kind": b.kind.value,
        "available": True,
        "offer": b.offer.to_doc(),
        "rule": b.rule,
        "steps_per_s": b.steps_per_s,
        "work_steps": b.work_steps,
        "boot_seconds": b.boot_seconds,
        "from": iso(b.starts_at),
        "to": iso(b.ends_at),
        "hours": round(b.hours, 6),
        "cost": money(b.amount_micro),
        "segments": _segments(b.segments),
    }


def _job(j: JobFigures, link: str) -> dict[str, Any]:
    run_od = j.on_demand.amount_micro if isinstance(j.on_demand, BaselineRun) else None
    run_st = j.static_spot.amount_micro if isinstance(j.static_spot, BaselineRun) else None
    return {
        "job_id": j.job_id,
        "name": j.name,
        "team": j.team,
        "state": j.state,
        "managed": j.managed,
        "link": f"{link}/{j.job_id}" if j.managed else None,
        "steps_done": j.steps_done,
        "steps_total": j.steps_total,
        "created_at": iso(j.created_at),
        "first_launch": iso(j.first_launch),
        "last_end": iso(j.last_end),
        "period": figures_doc(j.period),
        "run": {
            "actual_cost": money(j.run_actual_micro),
            "egress_cost": money(j.run_egress_micro),
            "baseline_on_demand_cost": None if run_od is None else money(run_od),
            "baseline_static_spot_cost": None if run_st is None else money(run_st),
            "savings": None if run_od is None else money(run_od - j.run_actual_micro),
            "savings_vs_static_spot": None if run_st is None else money(run_st - j.run_actual_micro),
            "moves": j.moves,
            "preemptions": j.preemptions,
            "move_cost": money(j.move_cost_micro),
            "preemption_cost": money(j.preemption_cost_micro),
            "lost_work_cost": money(j.lost_work_micro),
            "boot_cost": money(j.boot_micro),
        },
        "baselines": {"on_demand": _baseline(j.on_demand), "static_spot": _baseline(j.static_spot)},
        "move_checks": [
            {
                "interval_key": m.interval_key,
                "from": m.from_offer.to_doc(),
                "to": m.to_offer.to_doc(),
                "at": iso(m.at),
                "paid": m.paid,
                "stay_cost": None if m.stay_micro is None else money(m.stay_micro),
                "move_cost": money(m.moved_micro),
                "note": m.note,
            }
            for m in j.move_checks
        ],
        "over_baseline": [
            {
                "baseline": o.kind.value,
                "excess": money(o.excess_micro),
                "reason": o.reasons[0].kind if o.reasons else None,
                "reasons": [{"kind": r.kind, "amount": money(r.amount_micro), "detail": r.detail} for r in o.reasons],
            }
            for o in j.over
        ],
        "warnings": list(j.warnings),
    }


def _page(report: SavingsReport) -> dict[str, Any] | None:
    page = report.page
    if page is None:
        return None
    end = page.offset + len(report.jobs)
    return {
        "sort": page.label,
        "offset": page.offset,
        "limit": page.limit,
        "total": report.job_count,
        "next_offset": end if end < report.job_count else None,
    }


def report_doc(
    report: SavingsReport, *, team_names: Mapping[str, str] | None = None, job_link: str = "/v1/jobs"
) -> dict[str, Any]:
    """The report as JSON (see the module docstring): query, totals, groups, days, sums by
    :data:`BREAKDOWNS`, jobs (the page asked for, and ``jobs_page``: its sort, offset, limit, how many jobs
    in all and the next page's offset, None on the last), top savers, jobs over a baseline, moves and
    preemptions per day, warnings."""
    q = report.query
    names = dict(team_names or {})
    return {
        "from": iso(q.start),
        "to": iso(q.end),
        "team": q.team,
        "group_by": list(q.group_by),
        "as_of": iso(report.now),
        "currency": "USD",
        "totals": {
            **figures_doc(report.totals),
            "move_cost": money(report.move_cost_micro),
            "preemption_cost": money(report.preemption_cost_micro),
            "jobs": report.job_count,
        },
        "groups": [{"key": dict(zip(q.group_by, g.key, strict=True)), **figures_doc(g.figures)} for g in report.groups],
        "days": [{"day": g.key[0], **figures_doc(g.figures)} for g in report.days],
        "by": {
            dim: [{"key": g.key[0], **figures_doc(g.figures)} for g in groups]
            for dim, groups in report.breakdowns.items()
        },
        "activity": [{"day": a.day, "moves": a.moves, "preemptions": a.preemptions} for a in report.activity],
        "teams": {t: names.get(t, t) for t in report.teams},
        "jobs": [_job(j, job_link) for j in report.jobs],
        "jobs_page": _page(report),
        "top_savers": [
            {
                "job_id": s.job_id,
                "name": s.name,
                "savings": money(s.period.savings_on_demand_micro),
                "period": figures_doc(s.period),
            }
            for s in report.top_savers
        ],
        "over_baseline": [
            {
                "job_id": o.job_id,
                "baselines": [k.value for k in o.baselines],
                "excess": money(o.excess_micro),
                "reason": o.reason,
            }
            for o in report.over_baseline
        ],
        "warnings": list(report.warnings),
    }
