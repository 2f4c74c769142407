"""Decisions finer than daily: hourly prices and decision intervals of 1 h, 6 h, 24 h, 72 h and never.

The paper decided once a day on daily prices. Here the grid has one period per hour (the price of an
hour is the price in effect at its end, the daily rule at hourly resolution), jobs start at 00:00 UTC of
the paper's start days, and a dynamic policy decides every ``k`` hours after the job's start. Each
interval is run in three modes over the same offers:

- ``free``: re-placed at every decision, moves cost nothing (the paper's ``dynamic``);
- ``rule``: the migration decision rule with its defaults (margin 5% / $1, dwell 24 h), each move paid
  (checkpoint egress, restart, overlap), as ``dynamic_migration_cost``;
- ``move_cost_only``: the rule without margin and dwell: a move is made whenever it saves more than it
  costs; this separates the real cost of moving from the rule's hysteresis.

``never`` is the static choice on the start hour. Two offer sets are swept: ``multi_cloud`` (the
paper's dynamic set: the region's six AWS types and the Azure sizes) and ``baseline`` (the region's
p3.2xlarge in every availability zone: the only place in the data where prices move within a day
enough to matter, since Azure's prices are daily and AWS's cheapest per-GPU offers sit at their floor).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

import numpy as np
import pandas as pd

from costopt.backtest.engine import BacktestResult, PlacementPolicy, mean_usd, run_backtest
from costopt.backtest.grid import BacktestError
from costopt.backtest.paper import (
    PAPER_CHECKPOINT_GB,
    PAPER_JOB_DAYS,
    PAPER_MODELS,
    PAPER_REGIONS,
    PaperInputs,
    job_groups,
    paper_jobs,
    region_setup,
)
from costopt.migration.decision import MigrationRule

__all__ = ["SWEEP_INTERVALS", "SWEEP_MODES", "IntervalCell", "IntervalSweep", "interval_sweep"]

log = logging.getLogger(__name__)

SWEEP_INTERVALS: tuple[int | None, ...] = (1, 6, 24, 72, None)
"""Decision intervals in hours; None: never (static)."""

SWEEP_MODES: Mapping[str, MigrationRule | None] = {
    "free": None,
    "rule": MigrationRule(),
    "move_cost_only": MigrationRule(margin_fraction=0.0, margin_min_usd=0.0, dwell_hours=0.0),
}


@dataclass(frozen=True, slots=True)
class IntervalCell:
    """Mean figures of one (region, offer set, model, job length, interval, mode) over the start days.

    ``interval_hours`` None is the static choice (mode ``static``). ``vs_static``: the static mean cost
    over this mean (> 1: deciding saves). ``vs_daily``: the same mode's mean at the 24 h interval over
    this mean (> 1: this interval beats daily decisions); for the static cells, the ``rule`` mode's
    daily mean over the static mean (NaN without a ``rule`` mode)."""

    region: str
    offer_set: str
    model: str
    job_days: float
    interval_hours: int | None
    mode: str
    jobs: int
    mean_cost_usd: Decimal
    vs_static: float
    vs_daily: float
    mean_moves: float
    mean_move_cost_usd: Decimal


@dataclass(frozen=True, eq=False)
class IntervalSweep:
    cells: tuple[IntervalCell, ...]
    seconds: float

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([{k: getattr(c, k) for k in IntervalCell.__slots__} for c in self.cells])


def interval_sweep(
    inputs: PaperInputs,
    *,
    regions: Sequence[str] = PAPER_REGIONS,
    models: Sequence[str] = PAPER_MODELS,
    job_days: Sequence[float] = PAPER_JOB_DAYS,
    intervals: Sequence[int | None] = SWEEP_INTERVALS,
    modes: Mapping[str, MigrationRule | None] = SWEEP_MODES,
    offer_sets: Sequence[str] = ("multi_cloud", "baseline"),
    checkpoint_gb: Mapping[str, float] = PAPER_CHECKPOINT_GB,
) -> IntervalSweep:
    """Run every (offer set, interval, mode) on the hourly grid of each region (module docstring)."""
    t0 = time.perf_counter()
    if 24 not in intervals or None not in intervals:
        raise BacktestError("the sweep compares against daily (24 h) and static (None) decisions: include both")
    cells: list[IntervalCell] = []
    for region in regions:
        setup = region_setup(inputs, region, models=models, job_days=job_days, period_hours=1.0)
        jobs, frame = paper_jobs(setup, inputs, models, job_days, checkpoint_gb)
        groups = job_groups(frame)
        for offer_set in offer_sets:
            if offer_set not in setup.policies:
                raise BacktestError(f"unknown offer set {offer_set!r}")
            allowed = setup.policies[offer_set].allowed
            runs: dict[tuple[int | None, str], BacktestResult] = {
                (None, "static"): run_backtest(setup.cube, jobs, PlacementPolicy(offer_set, allowed))
            }
            for k in intervals:
                if k is None:
                    continue
                for mode, rule in modes.items():
                    policy = PlacementPolicy(
                        f"{offer_set}/{mode}/{k}h",
                        allowed,
                        mode="free" if rule is None else "rule",
                        every_periods=int(k),
                        rule=rule,
                    )
                    runs[(k, mode)] = run_backtest(setup.cube, jobs, policy)
            for model, n, idx in groups:
                static = float(np.mean(runs[(None, "static")].cost[idx]))
                for (k, mode), sr in runs.items():
                    mean = float(np.mean(sr.cost[idx]))
                    daily = runs.get((24, "rule" if mode == "static" else mode))
                    cells.append(
                        IntervalCell(
                            region=region,
                            offer_set=offer_set,
                            model=str(model),
                            job_days=float(n),
                            interval_hours=k,
                            mode=mode,
                            jobs=len(idx),
                            mean_cost_usd=mean_usd(sr.cost[idx]),
                            vs_static=static / mean,
                            vs_daily=float(np.mean(daily.cost[idx])) / mean if daily is not None else math.nan,
                            mean_moves=float(np.mean(sr.moves[idx])),
                            mean_move_cost_usd=mean_usd(sr.move_cost[idx]),
                        )
                    )
            log.info("%s %s: %d runs of %d jobs", region, offer_set, len(runs), len(jobs))
    return IntervalSweep(cells=tuple(cells), seconds=time.perf_counter() - t0)
