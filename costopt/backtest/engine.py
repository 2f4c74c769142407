"""The backtest engine: many jobs through a price grid under one placement policy, vectorized over jobs.

Every policy runs through the same loop over periods (days or hours), so the accounting never differs
between them:

- **placement** at the job's start period: the offer with the most throughput per dollar (the least USD
  per step) among the policy's offers that have a price in that period; ties go to the faster offer,
  then to the first in the offer order;
- **decisions** (dynamic policies) every ``every_periods`` periods after the start: ``free`` moves to
  the best offer of the period at no cost; ``rule`` asks :func:`costopt.migration.decision.decide_many`
  (the live rebalancer's rule) and pays each move: egress of the checkpoint and the old instance's
  checkpoint overlap at once, and the restart hours on the new offer (billed, no progress);
- **progress and cost**: in each period the job runs on its offer, paying the period's price (its GPU
  share: instance price / GPU count, the paper's per-GPU packing) for the hours it uses, at the single-
  GPU throughput of its model there, until its steps are done (the last period is used in part).

Shared inputs are computed once (:class:`CostCube`): the job's USD/h per period and offer, and USD per
step per period, model and offer; start days and models only index into them. Units: steps, steps/s,
hours, USD (floats inside; reported sums are Decimal in the callers).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

import numpy as np
import numpy.typing as npt

from costopt.backtest.grid import BacktestError, OfferSet, PriceGrid
from costopt.migration.decision import MigrationRule, decide_many, egress_matrix
from costopt.planning.model import money

__all__ = [
    "BacktestResult",
    "CostCube",
    "JobBatch",
    "MoveLog",
    "PlacementPolicy",
    "build_cost_cube",
    "mean_usd",
    "run_backtest",
    "total_usd",
]

log = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

Mode = Literal["static", "free", "rule"]


@dataclass(frozen=True, eq=False)
class CostCube:
    """What every job and policy share on one grid.

    ``job_usd_per_hour[t, o]``: a one-GPU job's price on offer ``o`` in period ``t`` (instance price /
    GPU count; NaN before the offer's first price). ``steps_per_s[m, o]``: model ``m``'s single-GPU
    throughput on offer ``o`` (0: cannot run or unknown). ``usd_per_step[t, m, o]``: the price of one
    step (inf where it cannot run or has no price). ``egress[o, o2]``: USD/GB from ``o``'s place to
    ``o2``'s.
    """

    grid: PriceGrid
    models: tuple[str, ...]
    job_usd_per_hour: FloatArray
    steps_per_s: FloatArray
    usd_per_step: FloatArray
    egress: FloatArray

    @property
    def offers(self) -> OfferSet:
        return self.grid.offers


def build_cost_cube(
    grid: PriceGrid,
    throughputs: Mapping[str, Mapping[str, float]],
    models: Sequence[str],
    rule: MigrationRule | None = None,
) -> CostCube:
    """The shared arrays of :class:`CostCube`. ``throughputs``: model -> accelerator -> single-GPU
    steps/s (a missing accelerator: the model does not run there)."""
    offers = grid.offers
    acc = offers.column("accelerator")
    tput = np.zeros((len(models), len(offers)))
    for m, name in enumerate(models):
        if name not in throughputs:
            raise BacktestError(f"no throughput for model {name!r}")
        per = throughputs[name]
        tput[m] = [float(per.get(str(a), 0.0)) for a in acc]
    tput = np.where(np.isfinite(tput) & (tput > 0), tput, 0.0)
    share = grid.usd_per_hour / offers.gpus[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        cps = share[:, None, :] / (tput[None, :, :] * 3600.0)
    cps = np.where(np.isfinite(cps), cps, np.inf)
    r = rule or MigrationRule()
    egress = egress_matrix(
        offers.column("cloud"), offers.column("region"), offers.column("cloud"), offers.column("region"), r.egress
    )
    return CostCube(
        grid=grid,
        models=tuple(models),
        job_usd_per_hour=share,
        steps_per_s=tput,
        usd_per_step=np.ascontiguousarray(cps),
        egress=egress,
    )


@dataclass(frozen=True, eq=False)
class JobBatch:
    """``J`` jobs: ``model`` (index into the cube's models), ``steps`` to run, ``start`` period,
    ``checkpoint_gb`` moved with each move."""

    model: IntArray
    steps: FloatArray
    start: IntArray
    checkpoint_gb: FloatArray

    def __post_init__(self) -> None:
        n = len(self.model)
        if not (len(self.steps) == len(self.start) == len(self.checkpoint_gb) == n):
            raise BacktestError("job arrays must have one entry per job")
        if n and (np.any(~(self.steps > 0)) or np.any(self.checkpoint_gb < 0) or np.any(self.start < 0)):
            raise BacktestError("jobs need steps > 0, a start period >= 0 and a checkpoint size >= 0")

    def __len__(self) -> int:
        return len(self.model)


@dataclass(frozen=True, eq=False)
class PlacementPolicy:
    """A placement policy. ``allowed``: offers it may use (mask over the offer set). ``mode``:
    ``static`` (placed at the start, kept), ``free`` (re-placed every ``every_periods`` periods at no
    cost), ``rule`` (the migration decision rule every ``every_periods`` periods, moves paid)."""

    name: str
    allowed: BoolArray
    mode: Mode = "static"
    every_periods: int = 1
    rule: MigrationRule | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("static", "free", "rule"):
            raise BacktestError(f"unknown policy mode {self.mode!r}")
        if self.every_periods < 1:
            raise BacktestError(f"every_periods must be >= 1, got {self.every_periods}")


@dataclass(frozen=True, eq=False)
class MoveLog:
    """Every move a ``rule`` or ``free`` policy made (arrays of equal length). ``period``: when;
    ``hours_since_move``: since the job's previous move (inf: first move); money in USD (NaN for free
    moves, which the rule did not judge)."""

    job: IntArray
    period: IntArray
    src: IntArray
    dst: IntArray
    saving: FloatArray
    move_cost: FloatArray
    margin: FloatArray
    hours_since_move: FloatArray

    def __len__(self) -> int:
        return len(self.job)


@dataclass(frozen=True, eq=False)
class BacktestResult:
    """Per job: ``cost`` (USD, moves included), ``finish_hours`` (from the grid's start), the first and
    last offer, ``moves``, ``move_cost`` (USD: egress, overlap and restart hours), ``outlived`` (ran past
    the data's end, on the last known prices)."""

    policy: str
    cost: FloatArray
    finish_hours: FloatArray
    first_offer: IntArray
    last_offer: IntArray
    moves: IntArray
    move_cost: FloatArray
    outlived: BoolArray
    log: MoveLog


def _best(cps: FloatArray, tput: FloatArray) -> tuple[IntArray, BoolArray]:
    """Per row: the column of least USD/step (ties: the fastest, then the first), and whether any."""
    low = cps.min(axis=1)
    ok = np.isfinite(low)
    tied = cps <= low[:, None] * (1.0 + 1e-12)
    pick = np.argmax(np.where(tied, tput, -1.0), axis=1).astype(np.int64)
    return pick, ok


def run_backtest(cube: CostCube, jobs: JobBatch, policy: PlacementPolicy) -> BacktestResult:
    """Run ``jobs`` under ``policy`` through ``cube``'s grid (see the module docstring).

    Raises :class:`BacktestError` when a job cannot be placed at its start (no allowed offer with a
    price and a throughput) or is not done by the grid's last period, and when a restart does not fit
    in one period."""
    grid = cube.grid
    n_periods, n_off = grid.usd_per_hour.shape
    if policy.allowed.shape != (n_off,):
        raise BacktestError(f"policy {policy.name!r}: its offer mask does not match the {n_off} offers")
    dt = grid.period_hours
    rule = policy.rule or MigrationRule()
    if policy.mode == "rule" and rule.restart_hours >= dt:
        raise BacktestError(f"a restart of {rule.restart_hours} h does not fit in a {dt} h period")
    n = len(jobs)
    model, start, gb = jobs.model, jobs.start, jobs.checkpoint_gb
    if n and int(start.max()) >= n_periods:
        raise BacktestError("a job starts after the grid's last period")
    tput_jobs = cube.steps_per_s[model]  # (J, O)
    rem = jobs.steps.astype(np.float64).copy()
    cost = np.zeros(n)
    move_cost = np.zeros(n)
    moves = np.zeros(n, dtype=np.int64)
    cur = np.full(n, -1, dtype=np.int64)
    first = np.full(n, -1, dtype=np.int64)
    finish = np.full(n, np.nan)
    done = np.zeros(n, dtype=bool)
    lost = np.zeros(n)
    last_move = np.full(n, -np.inf)
    allowed = policy.allowed
    logs: list[tuple[IntArray, int, IntArray, IntArray, FloatArray, FloatArray, FloatArray, FloatArray]] = []
    t0 = int(start.min()) if n else n_periods
    for t in range(t0, n_periods):
        live = np.flatnonzero(~done & (start <= t))
        if live.size == 0:
            if done.all():
                break
            continue
        exists = allowed & np.isfinite(grid.usd_per_hour[t])
        cps_t = cube.usd_per_step[t]  # (M, O)
        new = live[start[live] == t]
        if new.size:
            rows = np.where(exists[None, :], cps_t[model[new]], np.inf)
            pick, ok = _best(rows, tput_jobs[new])
            if not ok.all():
                j = int(new[~ok][0])
                raise BacktestError(
                    f"policy {policy.name!r}: no allowed offer can run {cube.models[model[j]]} in period {t}"
                )
            cur[new] = pick
            first[new] = pick
        if policy.mode != "static":
            old = live[start[live] < t]
            dec = old[(t - start[old]) % policy.every_periods == 0]
            if dec.size:
                rows = np.where(exists[None, :], cps_t[model[dec]], np.inf)
                if policy.mode == "free":
                    pick, ok = _best(rows, tput_jobs[dec])
                    moved = ok & (pick != cur[dec])
                    mj = dec[moved]
                    if mj.size:
                        since = (t - last_move[mj]) * dt
                        nan = np.full(mj.size, np.nan)
                        logs.append((mj, t, cur[mj].copy(), pick[moved], nan, nan, nan, since))
                        moves[mj] += 1
                        last_move[mj] = t
                        cur[mj] = pick[moved]
                else:
                    here = cur[dec]
                    share_t = cube.job_usd_per_hour[t]
                    out = decide_many(
                        remaining_steps=rem[dec],
                        here_usd_per_hour=share_t[here],
                        here_steps_per_s=tput_jobs[dec, here],
                        cand_usd_per_hour=share_t,
                        cand_steps_per_s=tput_jobs[dec],
                        egress_usd_per_gb=cube.egress[here],
                        checkpoint_gb=gb[dec],
                        hours_since_move=(t - last_move[dec]) * dt,
                        rule=rule,
                        valid=exists,
                        current=here,
                    )
                    mv = out.move
                    mj = dec[mv]
                    if mj.size:
                        src, dst = here[mv], out.target[mv]
                        extra = gb[mj] * cube.egress[src, dst] + rule.checkpoint_overlap_hours * share_t[src]
                        cost[mj] += extra
                        move_cost[mj] += extra + rule.restart_hours * share_t[dst]
                        lost[mj] = rule.restart_hours
                        since = (t - last_move[mj]) * dt
                        logs.append((mj, t, src, dst, out.saving[mv], out.move_cost[mv], out.margin[mv], since))
                        moves[mj] += 1
                        last_move[mj] = t
                        cur[mj] = dst
        o = cur[live]
        price = cube.job_usd_per_hour[t, o]
        rate = tput_jobs[live, o] * 3600.0
        avail = dt - lost[live]
        need = rem[live] / rate
        fin = need <= avail
        used = np.where(fin, need, avail)
        cost[live] += price * (used + lost[live])
        rem[live] = np.where(fin, 0.0, rem[live] - used * rate)
        finish[live[fin]] = t * dt + lost[live[fin]] + used[fin]
        done[live[fin]] = True
        lost[live] = 0.0
    if not done.all():
        raise BacktestError(
            f"policy {policy.name!r}: {int((~done).sum())} job(s) not done by the grid's end; extend the grid"
        )
    if logs:
        log_arrays = MoveLog(
            job=np.concatenate([e[0] for e in logs]),
            period=np.concatenate([np.full(len(e[0]), e[1], dtype=np.int64) for e in logs]),
            src=np.concatenate([e[2] for e in logs]),
            dst=np.concatenate([e[3] for e in logs]),
            saving=np.concatenate([e[4] for e in logs]),
            move_cost=np.concatenate([e[5] for e in logs]),
            margin=np.concatenate([e[6] for e in logs]),
            hours_since_move=np.concatenate([e[7] for e in logs]),
        )
    else:
        empty_i, empty_f = np.zeros(0, dtype=np.int64), np.zeros(0)
        log_arrays = MoveLog(empty_i, empty_i, empty_i, empty_i, empty_f, empty_f, empty_f, empty_f)
    return BacktestResult(
        policy=policy.name,
        cost=cost,
        finish_hours=finish,
        first_offer=first,
        last_offer=cur.copy(),
        moves=moves,
        move_cost=move_cost,
        outlived=finish > grid.data_end_hours + 1e-9,
        log=log_arrays,
    )


def total_usd(values: npt.ArrayLike) -> Decimal:
    """The exact sum of float USD amounts, each taken as the Decimal of its shortest repr."""
    arr = np.asarray(values, dtype=np.float64).ravel()
    return sum((money(float(v)) for v in arr), Decimal(0))


def mean_usd(values: npt.ArrayLike) -> Decimal:
    """The mean of float USD amounts as a Decimal (:func:`total_usd` / count; 0 for none)."""
    n = np.asarray(values).size
    return total_usd(values) / Decimal(n) if n else Decimal(0)
