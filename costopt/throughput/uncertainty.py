"""How far an estimated throughput may be off, and what that does to a plan.

* **Intervals.** ``data/calibration/error_factors.csv`` holds, per estimator and model family, the 90th
  percentile of the cross-validated error factor in the ``new-gpus`` scheme (a model known on
  Volta/Turing-era GPUs estimated on today's: the case of every Gavel job type), computed by
  ``experiments/throughput/calibration_report.py`` (a test checks the file against a fresh
  cross-validation). An estimate ``v`` by that estimator gets the interval ``[v / f, v * f]``; a family
  without published data (RL, GAN, unknown models) gets the factor over all families.
* **Does the winner hold?** :func:`winner_sensitivity` plans again with the job's estimated cells at
  the low ends, at the high ends, and adversarially (the winner's accelerator at its low end, every
  other estimate at its high end), and says whether the winner changes.
* **Prefer measured.** :func:`prefer_measured` keeps an estimated winner only when it beats the best
  listed candidate with a measured throughput by more than ``margin`` on the objective's figure
  (expected cost, or expected hours for the ``min-time`` objectives); otherwise that candidate wins.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Literal

from costopt.planning.model import Candidate, Plan
from costopt.settings import PROJECT_ROOT
from costopt.throughput.catalog import ThroughputCatalog
from costopt.throughput.errors import InvalidThroughput, MalformedCalibrationFile
from costopt.throughput.model import JobType, ModelFamily, Throughput

DEFAULT_ERROR_FACTORS = PROJECT_ROOT / "data" / "calibration" / "error_factors.csv"
ERROR_FACTOR_COLUMNS = ("estimator", "family", "scheme", "quantile", "factor", "n_cells")
ALL_FAMILIES = "all"
INTERVAL_SCHEME = "new-gpus"
INTERVAL_QUANTILE = 0.9

Bound = Literal["low", "high"]


@lru_cache(maxsize=4)
def load_error_factors(path: Path = DEFAULT_ERROR_FACTORS) -> Mapping[tuple[str, str], float]:
    """``{(estimator, family or "all"): factor >= 1}`` from the error-factor CSV (strict)."""
    out: dict[tuple[str, str], float] = {}
    with Path(path).open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or tuple(header) != ERROR_FACTOR_COLUMNS:
            raise MalformedCalibrationFile(path, "header", f"expected columns {','.join(ERROR_FACTOR_COLUMNS)}")
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            rec = dict(zip(ERROR_FACTOR_COLUMNS, row, strict=False))
            try:
                factor = float(rec["factor"])
            except (ValueError, KeyError):
                factor = math.nan
            if not math.isfinite(factor) or factor < 1:
                raise MalformedCalibrationFile(path, f"line {line}", f"factor must be a number >= 1, got {rec}")
            out[(rec["estimator"], rec["family"])] = factor
    return out


def error_factor(estimator: str, family: ModelFamily | None, factors: Mapping[tuple[str, str], float]) -> float | None:
    """The estimator's error factor for ``family`` (its all-family factor when the family has none)."""
    return factors.get((estimator, family or ALL_FAMILIES)) or factors.get((estimator, ALL_FAMILIES))


def with_interval(value: Throughput, factor: float | None) -> Throughput:
    """``value`` (an estimate) with the interval ``[v / factor, v * factor]`` (unchanged if no factor)."""
    if factor is None or not value.is_estimate:
        return value
    v = value.steps_per_s
    return replace(value, interval=(v / factor, v * factor))


def bound_catalog(
    catalog: ThroughputCatalog,
    job_type: JobType,
    bound: Bound,
    *,
    only: Callable[[str], bool] = lambda _acc: True,
) -> ThroughputCatalog:
    """``catalog`` with ``job_type``'s estimated cells that have an interval moved to its ``bound``
    end, on the accelerators ``only`` accepts (marked estimated still, without an interval)."""
    cells = dict(catalog.cells)
    for key, cell in catalog.cells.items():
        if key.job_type != job_type or cell.interval is None or not only(key.accelerator):
            continue
        low, high = cell.interval
        cells[key] = Throughput(low if bound == "low" else high, "estimated", 0, cell.estimator)
    return ThroughputCatalog(cells, catalog.pairs, catalog.job_type_order)


def offer_label(c: Candidate) -> str:
    return f"{c.cloud}/{c.region}/{c.zone or '-'}/{c.instance_type}/{c.market}"


def _same_offer(a: Candidate, b: Candidate) -> bool:
    return offer_label(a) == offer_label(b)


@dataclass(frozen=True, slots=True)
class WinnerSensitivity:
    """Whether the plan's winner rests on an estimate, its interval, and the winner when the job's
    estimates sit at their low ends, at their high ends, and adversarially (the winner's accelerator
    low, every other high). ``changes``: any of the three differs from the plan's winner."""

    rests_on_estimate: bool
    interval: tuple[float, float] | None
    winner_at_low: str
    winner_at_high: str
    winner_adverse: str
    changes: bool


def winner_sensitivity(
    plan: Plan, catalog: ThroughputCatalog, replan: Callable[[ThroughputCatalog], Plan]
) -> WinnerSensitivity:
    """Plan again (``replan``: the same job, objective and offers on another catalog) at the ends of
    the job's estimated cells' intervals. A plan whose job has no estimated cell with an interval is
    not re-planned."""
    jt, acc, gpus = plan.job.job_type, plan.winner.accelerator, plan.job.gpu_count
    cell = catalog.get(jt, acc, gpus)
    interval = cell.interval if cell is not None else None
    has_intervals = any(k.job_type == jt and v.interval is not None for k, v in catalog.cells.items())
    label = offer_label(plan.winner)
    if not has_intervals:
        return WinnerSensitivity(plan.winner.throughput_estimated, interval, label, label, label, False)
    low = replan(bound_catalog(catalog, jt, "low")).winner
    high = replan(bound_catalog(catalog, jt, "high")).winner
    adverse_catalog = bound_catalog(bound_catalog(catalog, jt, "low", only=lambda a: a == acc), jt, "high")
    adverse = replan(adverse_catalog).winner
    changes = not all(_same_offer(w, plan.winner) for w in (low, high, adverse))
    return WinnerSensitivity(
        plan.winner.throughput_estimated,
        interval,
        offer_label(low),
        offer_label(high),
        offer_label(adverse),
        changes,
    )


def _figure(plan: Plan, c: Candidate) -> float:
    """The objective's figure to compare candidates on: expected hours for the min-time objectives,
    expected cost otherwise."""
    if plan.objective.name.startswith("min-time"):
        return c.expected_hours
    return float(c.expected_cost_usd)


def prefer_measured(plan: Plan, margin: float) -> Plan:
    """The plan, or the plan with its best listed measured candidate as winner when the estimated
    winner does not beat it by more than ``margin`` (a fraction: 0.1 = the estimate must be 10%
    better). Raises :class:`InvalidThroughput` for a negative or non-finite margin."""
    if not math.isfinite(margin) or margin < 0:
        raise InvalidThroughput(f"prefer-measured margin must be a fraction >= 0, got {margin!r}")
    if not plan.winner.throughput_estimated:
        return plan
    measured = next((c for c in plan.alternatives if not c.throughput_estimated), None)
    if measured is None:
        return plan
    best, other = _figure(plan, plan.winner), _figure(plan, measured)
    if best < other * (1 - margin):
        return plan
    ranked = (measured, *(c for c in plan.alternatives if c is not measured))
    what = "hours" if plan.objective.name.startswith("min-time") else "cost"
    reason = (
        f"{plan.reason} Preferring measured throughput: {offer_label(plan.winner)} rests on an estimate and its "
        f"expected {what} beats measured {offer_label(measured)} by less than {margin:.0%}."
    )
    return replace(plan, winner=measured, alternatives=ranked, reason=reason)


__all__ = [
    "DEFAULT_ERROR_FACTORS",
    "WinnerSensitivity",
    "bound_catalog",
    "error_factor",
    "load_error_factors",
    "offer_label",
    "prefer_measured",
    "winner_sensitivity",
    "with_interval",
]
