"""Planning one job: rank every offer under the objective, explain the winner.

Ranking is vectorized over the evaluation arrays; only the top candidates become objects (with
their money in Decimal).
"""

from __future__ import annotations

from decimal import Decimal

import numpy as np

from costopt.planning.evaluate import WHY_NOT, Evaluation, OfferTable, evaluate
from costopt.planning.model import (
    Assumptions,
    Candidate,
    Infeasible,
    JobSpec,
    MinCost,
    MinCostByDeadline,
    MinTime,
    MinTimeWithinBudget,
    Objective,
    Plan,
    Weighted,
    money,
)
from costopt.throughput.catalog import ThroughputCatalog

DEFAULT_TOP = 10


def _score(ev: Evaluation, objective: Objective, q_hours: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(primary score to minimize, admissible mask) for the objective."""
    ok = ev.feasible.copy()
    cost, hours = ev.expected_cost, ev.expected_hours
    if isinstance(objective, MinCost):
        return cost, ok
    if isinstance(objective, MinTime):
        return hours, ok
    if isinstance(objective, MinCostByDeadline):
        if q_hours is None:
            raise TypeError("hours at confidence are required for a deadline objective")
        return cost, ok & (q_hours <= objective.deadline_hours)
    if isinstance(objective, MinTimeWithinBudget):
        return hours, ok & (cost <= float(objective.budget_usd))
    if isinstance(objective, Weighted):
        best_cost = np.nanmin(np.where(ok, cost, np.nan)) if ok.any() else 1.0
        best_hours = np.nanmin(np.where(ok, hours, np.nan)) if ok.any() else 1.0
        w = objective.cost_weight
        return w * cost / best_cost + (1 - w) * hours / best_hours, ok
    raise TypeError(f"unknown objective {objective!r}")  # pragma: no cover - the union is closed


def _tiebreak(ev: Evaluation, objective: Objective) -> np.ndarray:
    return ev.expected_hours if isinstance(objective, MinCost | MinCostByDeadline) else ev.expected_cost


def rank(
    ev: Evaluation, objective: Objective, assumptions: Assumptions, top: int, table_gpus: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Indices of the best ``top`` admissible offers (best first), the admissible mask, and the
    hours at confidence (deadline objective only)."""
    q_hours = (
        ev.hours_at_confidence(objective.confidence, assumptions) if isinstance(objective, MinCostByDeadline) else None
    )
    score, ok = _score(ev, objective, q_hours)
    idx = np.flatnonzero(ok)
    if len(idx) == 0:
        return idx, ok, q_hours
    # lexsort: last key is primary. Ties: the secondary figure, then offer order (deterministic).
    # Then the smaller instance (an exact fit needs no neighbours to share it).
    order = np.lexsort((idx, table_gpus[idx], _tiebreak(ev, objective)[idx], np.round(score[idx], 12)))
    return idx[order[:top]], ok, q_hours


def _candidate(table: OfferTable, ev: Evaluation, i: int, q_hours: np.ndarray | None, steps: float) -> Candidate:
    hours = float(ev.expected_hours[i])
    price = float(ev.job_price[i])
    move = money(float(ev.move_cost[i]))
    cost = money(price) * money(hours) + move
    return Candidate(
        cloud=str(table.cloud[i]),
        region=str(table.region[i]),
        zone=str(table.zone[i]),
        instance_type=str(table.instance_type[i]),
        market=str(table.market[i]),
        accelerator=str(table.accelerator[i]),
        gpu_count=float(table.gpus[i]),
        usd_per_hour=float(table.price[i]),
        job_usd_per_hour=price,
        steps_per_s=float(ev.steps_per_s[i]),
        throughput_estimated=bool(ev.estimated[i]),
        expected_hours=hours,
        deadline_hours_at_confidence=float(q_hours[i]) if q_hours is not None else float("nan"),
        expected_cost_usd=cost,
        move_cost_usd=move,
        usd_per_million_steps=float(cost / Decimal(repr(steps)) * Decimal(1_000_000)),
        preemptions_per_hour=float(ev.hazard[i]),
        risk=float(ev.risk[i]),
    )


def _explain(objective: Objective, best: Candidate, runner_up: Candidate | None) -> str:
    where = f"{best.cloud} {best.region}{'/' + best.zone if best.zone else ''} {best.instance_type} ({best.market})"
    figures = (
        f"${best.job_usd_per_hour:.4f}/h x {best.expected_hours:.2f} h = ${best.expected_cost_usd:.2f} expected"
        f" on {best.accelerator}{' (estimated throughput)' if best.throughput_estimated else ''}"
    )
    if isinstance(objective, MinTime | MinTimeWithinBudget):
        lead = "fastest"
        if runner_up is not None and runner_up.expected_hours > 0:
            gap = (
                f"; best other option ({runner_up.cloud} {runner_up.accelerator} {runner_up.market}) takes "
                f"{runner_up.expected_hours / best.expected_hours - 1:+.1%} longer"
            )
        else:
            gap = ""
    elif isinstance(objective, Weighted):
        lead = f"best weighted cost/time (cost weight {objective.cost_weight:g})"
        gap = ""
    else:
        lead = "cheapest"
        if runner_up is not None and best.expected_cost_usd > 0:
            extra = runner_up.expected_cost_usd / best.expected_cost_usd - 1
            gap = (
                f"; best other option ({runner_up.cloud} {runner_up.accelerator} {runner_up.market}) costs "
                f"{float(extra):+.1%}"
            )
        else:
            gap = ""
    if isinstance(objective, MinCostByDeadline):
        lead += f" that finishes within {objective.deadline_hours:g} h at {objective.confidence:.0%} confidence"
    if isinstance(objective, MinTimeWithinBudget):
        lead += f" within the ${objective.budget_usd} budget"
    risk = f"; spot risk {best.risk:.0%} of a preemption" if best.market == "spot" else ""
    return f"{lead}: {where}, {figures}{gap}{risk}"


def _why_infeasible(ev: Evaluation, objective: Objective, q_hours: np.ndarray | None, table: OfferTable) -> Infeasible:
    if len(table) == 0:
        return Infeasible(
            "no offer is in effect at the planning time (check `costopt prices sources`)", binding="offers"
        )
    if not ev.feasible.any():
        codes, counts = np.unique(ev.why_not[ev.why_not > 0], return_counts=True)
        parts = ", ".join(f"{n} offers: {WHY_NOT[int(c)]}" for c, n in zip(codes, counts, strict=True))
        return Infeasible(
            f"no offer can run {ev.job.job_type.name} on {ev.job.gpu_count} GPU(s) ({parts})", binding="throughput"
        )
    if isinstance(objective, MinCostByDeadline) and q_hours is not None:
        best = float(np.nanmin(np.where(ev.feasible, q_hours, np.nan)))
        return Infeasible(
            f"no placement finishes within {objective.deadline_hours:g} h at {objective.confidence:.0%} confidence; "
            f"the fastest needs {best:.1f} h (loosen the deadline or the confidence)",
            binding="deadline",
        )
    if isinstance(objective, MinTimeWithinBudget):
        best = float(np.nanmin(np.where(ev.feasible, ev.expected_cost, np.nan)))
        return Infeasible(
            f"no placement fits the ${objective.budget_usd} budget; the cheapest expected cost is ${best:.2f}",
            binding="budget",
        )
    return Infeasible("no admissible placement", binding="unknown")  # pragma: no cover


def plan_job(
    job: JobSpec,
    objective: Objective,
    table: OfferTable,
    catalog: ThroughputCatalog,
    assumptions: Assumptions | None = None,
    *,
    top: int = DEFAULT_TOP,
) -> Plan:
    """The best placement of ``job`` under ``objective`` over every offer of ``table``, with the
    ``top`` best alternatives (winner first). Raises :class:`Infeasible` naming what binds."""
    a = assumptions or Assumptions()
    ev = evaluate(job, table, catalog, a)
    best_idx, ok, q_hours = rank(ev, objective, a, max(top, 50), table.gpus)
    if len(best_idx) == 0:
        raise _why_infeasible(ev, objective, q_hours, table)
    cands = [_candidate(table, ev, int(i), q_hours, job.steps) for i in best_idx[:top]]
    # Explain against the best genuinely different option (another cloud, GPU or market), not a
    # twin zone or a larger size at the same per-GPU price.
    first = cands[0]
    kind = (table.cloud[best_idx[0]], table.accelerator[best_idx[0]], table.market[best_idx[0]])
    differs = [int(i) for i in best_idx[1:] if (table.cloud[i], table.accelerator[i], table.market[i]) != kind]
    if differs:
        other: Candidate | None = _candidate(table, ev, differs[0], q_hours, job.steps)
    else:
        other = cands[1] if len(cands) > 1 else None
    reason = _explain(objective, first, other)
    return Plan(
        job=job,
        objective=objective,
        winner=cands[0],
        alternatives=tuple(cands),
        offers_considered=len(table),
        offers_feasible=int(ok.sum()),
        reason=reason,
    )
