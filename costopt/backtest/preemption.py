"""How much of the paper's saving survives preemption: its policies rerun on the simulated cloud.

The paper's backtest (:mod:`costopt.backtest.paper`) never loses an instance. Here the same jobs (a few
models and lengths, the paper's 30 start days of a region) run under the same policies through the job
runner of :mod:`costopt.backtest.job`: on the simulated cloud, billed by the ledger, at the paper's
daily prices (the price of a day, by the end-of-day rule, held over that UTC day), each policy placing
as the paper's engine does (least USD per step among its offers, per-GPU prices):

- ``static`` policies (``baseline``, ``gpu_type``, ``multi_gpu``, ``multi_cloud``, ``on_demand``) keep
  their start-day offer and relaunch it after a preemption;
- ``dynamic`` re-places every day on the best offer (deciding as if moves were free; the simulated cloud
  still takes their boot, restore and checkpoint time) and recovers on the best other offer;
- ``dynamic_migration_cost`` asks the migration decision rule every day (its restart and overlap are the
  simulated cloud's) and, after a preemption, the rule's choice for a preempted job.

Each job runs once without preemptions (hazard 0: the same machinery, so boots, hourly checkpoints and
moves are priced alike) and once per seed with preemptions drawn from the hazards (the 2020 availability
logs; see docs/planning.md for how thin they are), losing the work since the last checkpoint (one every
hour of training by default). A policy's *saving* over the baseline is ``1 - policy cost / baseline
cost`` (mean costs over the start days, and seeds); what *survives* is the saving with preemptions over
the saving without. Against on-demand (never preempted) the ratio is reported as well.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import numpy as np
import numpy.typing as npt
import pandas as pd

from costopt.backtest.engine import JobBatch, PlacementPolicy, run_backtest
from costopt.backtest.grid import BacktestError
from costopt.backtest.job import (
    CloudFactory,
    JobRun,
    JobRunResult,
    JobState,
    Placement,
    Verdict,
    run_job,
)
from costopt.backtest.paper import (
    PAPER_CHECKPOINT_GB,
    PAPER_POLICIES,
    SECONDS_PER_DAY,
    PaperInputs,
    RegionSetup,
    region_setup,
)
from costopt.domain import Cloud, Market, OfferKey
from costopt.ledger.book import MemoryLedger
from costopt.ledger.model import ChargeKind
from costopt.ledger.prices import StepPrices
from costopt.migration.decision import MigrationRule, decide_many
from costopt.risk.hazard import HazardModel

__all__ = [
    "STUDY_JOB_DAYS",
    "STUDY_MODELS",
    "STUDY_POLICIES",
    "GridPlacer",
    "PreemptionCell",
    "PreemptionStudy",
    "grid_prices",
    "preemption_study",
]

log = logging.getLogger(__name__)

STUDY_MODELS: tuple[str, ...] = ("A3C", "ResNet-50 (batch size 128)", "Transformer (batch size 256)")
"""One model per GPU the paper's policies pick: A3C (K80), ResNet-50 (V100), Transformer (P100)."""
STUDY_JOB_DAYS: tuple[float, ...] = (1.0, 4.0, 8.0)
STUDY_POLICIES: tuple[str, ...] = (*PAPER_POLICIES, "on_demand")
NO_HAZARD = HazardModel(defaults=dict.fromkeys(Cloud, 0.0))


def grid_prices(setup: RegionSetup) -> StepPrices:
    """The region's daily grid as step prices (each offer's price of a day held over that day)."""
    grid = setup.grid
    return StepPrices.from_grid(grid.offers.frame, grid.start, grid.period_hours, grid.usd_per_hour)


def _keys(setup: RegionSetup) -> list[OfferKey]:
    f = setup.grid.offers.frame
    return [
        OfferKey(Cloud(str(r.cloud)), str(r.region), str(r.zone), str(r.instance_type), Market(str(r.market)))
        for r in f.itertuples(index=False)
    ]


class GridPlacer:
    """A paper policy (:class:`costopt.backtest.engine.PlacementPolicy`) as a :class:`~costopt.backtest.job.Placer`
    for one model, deciding on the region's cost cube like the engine does (module docstring)."""

    def __init__(
        self,
        setup: RegionSetup,
        policy: PlacementPolicy,
        model: str,
        rule: MigrationRule,
        keys: Sequence[OfferKey] | None = None,
    ) -> None:
        self.setup, self.policy, self.rule = setup, policy, rule
        self.cube = setup.cube
        self.grid = setup.grid
        self.m = self.cube.models.index(model)
        self.keys = list(keys) if keys is not None else _keys(setup)
        self.col = {k: i for i, k in enumerate(self.keys)}
        self.gpus = self.grid.offers.gpus

    @property
    def rebalance_every(self) -> timedelta | None:
        if self.policy.mode == "static":
            return None
        return timedelta(hours=self.grid.period_hours * self.policy.every_periods)

    @property
    def wants_spent(self) -> bool:
        return False

    def _t(self, now: datetime) -> int:
        return min(max(self.grid.period_of(now), 0), self.grid.periods - 1)

    def _mask(self, t: int, exclude: Collection[OfferKey]) -> npt.NDArray[np.bool_]:
        mask: npt.NDArray[np.bool_] = self.policy.allowed & np.isfinite(self.grid.usd_per_hour[t])
        for k in exclude:
            if k in self.col:
                mask[self.col[k]] = False
        return mask

    def _placement(self, o: int, t: int) -> Placement:
        return Placement(
            self.keys[o],
            float(self.gpus[o]),
            float(self.cube.steps_per_s[self.m, o]),
            float(self.cube.job_usd_per_hour[t, o]),
        )

    def _best(self, t: int, mask: npt.NDArray[np.bool_]) -> int | None:
        """Least USD per step (ties: the fastest, then the first), as the engine places."""
        cps = np.where(mask, self.cube.usd_per_step[t, self.m], np.inf)
        low = float(cps.min()) if len(cps) else math.inf
        if not math.isfinite(low):
            return None
        tied = cps <= low * (1.0 + 1e-12)
        return int(np.argmax(np.where(tied, self.cube.steps_per_s[self.m], -1.0)))

    def place(self, state: JobState, exclude: Collection[OfferKey]) -> Placement | None:
        t = self._t(state.now)
        avoid = set(exclude) if self.policy.mode == "static" else set(exclude) | set(state.avoid)
        o = self._best(t, self._mask(t, avoid))
        return None if o is None else self._placement(o, t)

    def _rule(self, state: JobState, mask: npt.NDArray[np.bool_], preempted: bool) -> int | None:
        if state.current is None:  # pragma: no cover - only asked for a running (or preempted) job
            return None
        t = self._t(state.now)
        cur = self.col[state.current.key]
        share = self.cube.job_usd_per_hour[t]
        since = math.inf if state.last_moved_at is None else (state.now - state.last_moved_at).total_seconds() / 3600
        out = decide_many(
            remaining_steps=[state.remaining_steps],
            here_usd_per_hour=[share[cur]],
            here_steps_per_s=[self.cube.steps_per_s[self.m, cur]],
            cand_usd_per_hour=share,
            cand_steps_per_s=self.cube.steps_per_s[self.m],
            egress_usd_per_gb=self.cube.egress[cur],
            checkpoint_gb=[state.checkpoint_gb],
            hours_since_move=[since],
            rule=self.rule,
            valid=mask,
            current=[cur],
            preempted=[preempted],
        )
        return int(out.target[0]) if bool(out.move[0]) else None

    def recover(self, state: JobState, exclude: Collection[OfferKey]) -> Placement | None:
        t = self._t(state.now)
        if self.policy.mode == "static" or state.current is None:
            if state.current is not None:
                return None if state.current.key in exclude else self._placement(self.col[state.current.key], t)
            return self.place(state, exclude)
        mask = self._mask(t, set(exclude) | set(state.avoid))
        o = self._best(t, mask) if self.policy.mode == "free" else self._rule(state, mask, preempted=True)
        return None if o is None else self._placement(o, t)

    def rebalance(self, state: JobState) -> Verdict:
        if self.policy.mode == "static" or state.current is None:
            return Verdict(None, "static", "a static policy keeps its offer")
        t = self._t(state.now)
        mask = self._mask(t, state.avoid)
        if self.policy.mode == "free":
            o = self._best(t, mask)
            if o is None or self.keys[o] == state.current.key:
                return Verdict(None, "best", "the current offer is still the best")
            return Verdict(self._placement(o, t), "better", "a better offer today (moves taken as free)")
        o = self._rule(state, mask, preempted=False)
        if o is None:
            return Verdict(None, "rule", "the rule stays")
        return Verdict(self._placement(o, t), "saves_enough", "the rule moves")


@dataclass(frozen=True, slots=True)
class PreemptionCell:
    """One (region, model, job length, policy) over the start days (and seeds).

    ``*_clean``: without preemptions. Mean costs in Decimal USD. ``reduction``: baseline mean cost over
    this policy's (> 1: cheaper). ``survives``: the saving over the baseline with preemptions divided by the
    saving without (NaN for the baseline, or when there is no saving to keep). ``vs_on_demand``: the
    on-demand policy's mean cost over this one's. ``lost_work_share``: the lost work's value over the
    cost. ``paper_reduction``: the paper's engine on the same jobs (no preemption, no boot or checkpoint
    time, free moves for ``dynamic``). ``unfinished``: runs not done by their horizon.
    """

    region: str
    model: str
    job_days: float
    policy: str
    start_days: int
    seeds: int
    mean_cost_usd_clean: Decimal
    mean_cost_usd: Decimal
    reduction_clean: float
    reduction: float
    survives: float
    vs_on_demand_clean: float
    vs_on_demand: float
    mean_preemptions: float
    mean_moves: float
    lost_work_share: float
    mean_hours_clean: float
    mean_hours: float
    paper_reduction: float
    unfinished: int


@dataclass(frozen=True, eq=False)
class PreemptionStudy:
    cells: tuple[PreemptionCell, ...]
    runs: int
    seconds: float

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([{k: getattr(c, k) for k in PreemptionCell.__slots__} for c in self.cells])


@dataclass(frozen=True, slots=True)
class _Outcome:
    cost: Decimal
    hours: float
    preemptions: int
    moves: int
    lost_usd: Decimal
    finished: bool


def _outcome(r: JobRunResult) -> _Outcome:
    return _Outcome(r.total_usd, r.hours, r.preemptions, r.moves, r.report.memo_usd(ChargeKind.LOST_WORK), r.finished)


def _mean(values: Sequence[Decimal]) -> Decimal:
    return sum(values, Decimal(0)) / Decimal(len(values)) if values else Decimal(0)


def _ratio(a: Decimal, b: Decimal) -> float:
    return float(a / b) if b > 0 else math.nan


def preemption_study(
    inputs: PaperInputs,
    cloud_factory: CloudFactory,
    hazards: HazardModel,
    *,
    regions: Sequence[str] = ("us-east-1",),
    models: Sequence[str] = STUDY_MODELS,
    job_days: Sequence[float] = STUDY_JOB_DAYS,
    policies: Sequence[str] = STUDY_POLICIES,
    seeds: Sequence[int] = (0, 1, 2, 3, 4),
    start_days: int | None = None,
    checkpoint_gb: Mapping[str, float] = PAPER_CHECKPOINT_GB,
    horizon: timedelta = timedelta(days=60),
) -> PreemptionStudy:
    """Run the study (module docstring). ``start_days``: use only the first ``n`` of the paper's 30 (for
    quick runs). Every policy runs with the same seeds on the same offers (common random numbers: an
    offer's reclaims are the same whichever policy uses it). ``baseline`` and ``on_demand`` are always run
    (the ratios need them). Raises :class:`BacktestError` on an unknown policy or model."""
    t0 = time.perf_counter()
    unknown = [p for p in policies if p not in STUDY_POLICIES]
    if unknown:
        raise BacktestError(f"unknown policies {unknown}; choose from {list(STUDY_POLICIES)}")
    run_policies = list(dict.fromkeys(["baseline", "on_demand", *policies]))
    cells: list[PreemptionCell] = []
    runs = 0
    for region in regions:
        setup = region_setup(inputs, region, models=models, job_days=job_days)
        days = setup.start_days if start_days is None else setup.start_days[:start_days]
        prices = grid_prices(setup)
        keys = _keys(setup)
        probe = cloud_factory(prices, NO_HAZARD, start=setup.grid.start, seed=0)
        timing = probe.timing
        rule = MigrationRule(restart_hours=timing.restart_hours, checkpoint_overlap_hours=timing.checkpoint_hours)
        for model in models:
            v100 = inputs.throughputs[model]["v100"]
            gb = float(checkpoint_gb.get(model, 0.0))
            for n in job_days:
                steps = v100 * n * SECONDS_PER_DAY
                clean: dict[str, list[_Outcome]] = {p: [] for p in run_policies}
                noisy: dict[str, list[_Outcome]] = {p: [] for p in run_policies}
                for d, day in enumerate(days):
                    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
                    job = JobRun(f"{model}/{n}/{day}", steps, start, start + horizon, checkpoint_gb=gb)
                    for p in run_policies:
                        placer = GridPlacer(setup, setup.policies[p], model, rule, keys)
                        for hz, seed_list, sink in ((NO_HAZARD, [0], clean), (hazards, list(seeds), noisy)):
                            for s in seed_list:
                                cloud = cloud_factory(prices, hz, start=start, seed=[s, d])
                                sink[p].append(_outcome(run_job(cloud, MemoryLedger(prices), placer, job)))
                                runs += 1
                paper = _paper_reductions(setup, model, steps, gb, days, run_policies)
                cells.extend(_cells(region, model, n, len(days), len(seeds), clean, noisy, paper, policies))
            log.info("%s %s: %d runs so far", region, model, runs)
    return PreemptionStudy(tuple(cells), runs, time.perf_counter() - t0)


def _paper_reductions(
    setup: RegionSetup, model: str, steps: float, gb: float, days: Sequence[date], policies: Sequence[str]
) -> dict[str, float]:
    """The paper engine's cost reduction (baseline mean / policy mean) on the same jobs."""
    grid = setup.grid
    m = setup.cube.models.index(model)
    starts = [grid.period_of(datetime(d.year, d.month, d.day, tzinfo=UTC)) for d in days]
    jobs = JobBatch(
        model=np.full(len(starts), m, dtype=np.int64),
        steps=np.full(len(starts), steps),
        start=np.array(starts, dtype=np.int64),
        checkpoint_gb=np.full(len(starts), gb),
    )
    means = {p: float(np.mean(run_backtest(setup.cube, jobs, setup.policies[p]).cost)) for p in policies}
    return {p: means["baseline"] / v if v > 0 else math.nan for p, v in means.items()}


def _cells(
    region: str,
    model: str,
    n: float,
    n_days: int,
    n_seeds: int,
    clean: Mapping[str, list[_Outcome]],
    noisy: Mapping[str, list[_Outcome]],
    paper: Mapping[str, float],
    policies: Sequence[str],
) -> list[PreemptionCell]:
    def mean_cost(out: list[_Outcome]) -> Decimal:
        return _mean([o.cost for o in out])

    base0, base1 = mean_cost(clean["baseline"]), mean_cost(noisy["baseline"])
    od0, od1 = mean_cost(clean["on_demand"]), mean_cost(noisy["on_demand"])
    out: list[PreemptionCell] = []
    for p in policies:
        c0, c1 = mean_cost(clean[p]), mean_cost(noisy[p])
        r0, r1 = _ratio(base0, c0), _ratio(base1, c1)
        s0, s1 = 1 - 1 / r0, 1 - 1 / r1
        survives = s1 / s0 if p != "baseline" and s0 > 1e-9 else math.nan
        lost = _mean([o.lost_usd for o in noisy[p]])
        out.append(
            PreemptionCell(
                region=region,
                model=model,
                job_days=float(n),
                policy=p,
                start_days=n_days,
                seeds=n_seeds,
                mean_cost_usd_clean=c0,
                mean_cost_usd=c1,
                reduction_clean=r0,
                reduction=r1,
                survives=survives,
                vs_on_demand_clean=_ratio(od0, c0),
                vs_on_demand=_ratio(od1, c1),
                mean_preemptions=float(np.mean([o.preemptions for o in noisy[p]])),
                mean_moves=float(np.mean([o.moves for o in noisy[p]])),
                lost_work_share=float(lost / c1) if c1 > 0 else math.nan,
                mean_hours_clean=float(np.mean([o.hours for o in clean[p]])),
                mean_hours=float(np.mean([o.hours for o in noisy[p]])),
                paper_reduction=paper[p],
                unfinished=sum(1 for o in (*clean[p], *noisy[p]) if not o.finished),
            )
        )
    return out
