"""How much of the paper's saving survives preemption: its policies rerun through the job service.

The paper's backtest (:mod:`costopt.backtest.paper`) never loses an instance. Here the same jobs (a few
models and lengths, the paper's 30 start days of a region) run under the same policies through the path
the live service runs (:func:`costopt.jobs.offline.run_offline`: the job engine, the rebalancer, the
migrator, the interruption watcher and the ledger over the simulated cloud and its simulated agents), at
the paper's daily prices (the price of a day, by the end-of-day rule, held over that UTC day). A policy is
what the engine and the rebalancer are given:

- a :class:`GridPlacements` (the job service's :class:`~costopt.jobs.placement.Placements`) over the
  region's daily grid, ranking the policy's offers as the paper's engine places (least USD per step); a
  ``static`` policy (``baseline``, ``gpu_type``, ``multi_gpu``, ``multi_cloud``, ``on_demand``) ranks only
  its start offer once the job runs, so it relaunches there after a preemption;
- the rebalancer's rule, every day: ``dynamic`` moves to the best offer whenever it is better (a rule
  that takes moves as free: no margin, no dwell, no restart, overlap or egress; the simulated cloud still
  takes their time), ``dynamic_migration_cost`` the migration decision rule (restart and overlap: the
  simulated cloud's); static policies are not rebalanced. After a preemption, the watcher recovers the
  job on its ranked placements (the preempted offer, marked unavailable, tried last).

Prices are the job's share of the instance (instance price / GPUs, the paper's per-GPU packing), and the
simulated agents train at the model's single-GPU throughput: the ledger bills the share.

Each job runs once without preemptions (hazard 0: the same machinery, so boots, hourly checkpoints and
moves are priced alike) and once per seed with preemptions drawn from the hazards (the 2020 availability
logs; see docs/planning.md for how thin they are). A policy's *saving* over the baseline is
``1 - policy cost / baseline cost`` (mean costs over the start days, and seeds); what *survives* is the
saving with preemptions over the saving without. Against on-demand (never preempted) the ratio is
reported as well.

A run is a function of what it is given: the job, the simulated cloud's arguments (prices, hazards,
start, seed, throughput), the rebalancer's rule, and the answers its placements give. Two policies of a
start day and seed whose placements answer every question of the first one's run alike (static policies
that pick the same start offer: ``multi_cloud`` and ``multi_gpu`` while Azure is not the cheaper,
``gpu_type`` and ``baseline`` where the V100 is the best single GPU) therefore run alike: the study runs the
first through the service and reuses its outcome for the second (:class:`_Trace`; ``reuse=False`` runs
every run). Likewise a policy's run with preemptions is its run without them when the seed's simulated
cloud draws nothing near that run's copies (no reclaim of a copy's offer from an hour before its launch to
an hour after its end, notice lead included; no launch failures configured:
:meth:`~costopt.simulated.SimulatedCloud.untouched`): an on-demand run, a V100 run whose offer the seed
never reclaims while it runs. Such a run would launch, train and bill exactly as the run without hazards,
so its outcome is taken from it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import numpy as np
import numpy.typing as npt
import pandas as pd
from sqlalchemy import Engine

from costopt.backtest.engine import JobBatch, PlacementPolicy, run_backtest
from costopt.backtest.grid import BacktestError
from costopt.backtest.job import PREEMPTION_EVENTS
from costopt.backtest.paper import (
    PAPER_CHECKPOINT_GB,
    PAPER_POLICIES,
    SECONDS_PER_DAY,
    PaperInputs,
    RegionSetup,
    region_setup,
)
from costopt.domain import Cloud, Market, OfferKey
from costopt.jobs.offline import ALWAYS_MOVE, OfflineJob, OfflineRun, memory_database, run_offline
from costopt.jobs.placement import Placement, Placements
from costopt.jobs.records import JobRecord
from costopt.ledger.prices import StepPrices
from costopt.migration.decision import MigrationRule
from costopt.risk.hazard import HazardModel
from costopt.simulated import CloudFactory, SimulatedCloud

__all__ = [
    "STUDY_JOB_DAYS",
    "STUDY_MODELS",
    "STUDY_POLICIES",
    "STUDY_REPORT_EVERY",
    "GridPlacements",
    "PreemptionCell",
    "PreemptionStudy",
    "grid_prices",
    "preemption_study",
    "run_policy",
]

log = logging.getLogger(__name__)

STUDY_MODELS: tuple[str, ...] = ("A3C", "ResNet-50 (batch size 128)", "Transformer (batch size 256)")
"""One model per GPU the paper's policies pick: A3C (K80), ResNet-50 (V100), Transformer (P100)."""
STUDY_JOB_DAYS: tuple[float, ...] = (1.0, 4.0, 8.0)
STUDY_POLICIES: tuple[str, ...] = (*PAPER_POLICIES, "on_demand")
NO_HAZARD = HazardModel(defaults=dict.fromkeys(Cloud, 0.0))
STUDY_REPORT_EVERY = timedelta(minutes=60)
"""The simulated agents' progress-report cadence the study's clouds are built with
(``providers.sim.SimConfig.report_every``; the cloud's default is 10 minutes). With the hourly checkpoints a
copy's steps are still logged at every checkpoint and right after a (re)start; what changes is how stale a
running job's ``steps_done`` is between them (its move events' expected savings). Every cell and every run's
cost, hours, copies and ledger lines of the 1,134-run sample came out equal at 10 and 60 minutes
(docs/backtest.md "Speed"); about 5 in 6 agent events fewer."""


def grid_prices(setup: RegionSetup) -> StepPrices:
    """The region's daily grid as step prices: each offer's per-GPU price of a day (the job's share of the
    instance, the paper's packing) held over that day."""
    grid = setup.grid
    return StepPrices.from_grid(grid.offers.frame, grid.start, grid.period_hours, setup.cube.job_usd_per_hour)


def _keys(setup: RegionSetup) -> list[OfferKey]:
    f = setup.grid.offers.frame
    return [
        OfferKey(Cloud(str(r.cloud)), str(r.region), str(r.zone), str(r.instance_type), Market(str(r.market)))
        for r in f.itertuples(index=False)
    ]


class GridPlacements:
    """A paper policy (:class:`~costopt.backtest.engine.PlacementPolicy`) for one model as the job service's
    :class:`~costopt.jobs.placement.Placements` over the region's daily grid (module docstring).

    Ranks the policy's offers priced in the period of ``at`` by USD per step (ties: the faster, then the
    first); a static policy ranks only the job's offer once it has one. For a rule policy with a current
    offer, the rank is the cost to finish there including the move (egress, restart): where the rule
    recovers a preempted job. ``usd_per_hour`` is the job's share (per-GPU price)."""

    def __init__(
        self,
        setup: RegionSetup,
        policy: PlacementPolicy,
        model: str,
        rule: MigrationRule,
        keys: Sequence[OfferKey] | None = None,
    ) -> None:
        self.policy, self.rule = policy, rule
        self.cube = setup.cube
        self.grid = setup.grid
        self.m = self.cube.models.index(model)
        self.keys = list(keys) if keys is not None else _keys(setup)
        self.col = {k: i for i, k in enumerate(self.keys)}

    def _t(self, at: datetime) -> int:
        return min(max(self.grid.period_of(at), 0), self.grid.periods - 1)

    def _placement(self, o: int, t: int, remaining: float) -> Placement:
        price = float(self.cube.job_usd_per_hour[t, o])
        sps = float(self.cube.steps_per_s[self.m, o])
        hours = remaining / sps / 3600.0 if sps > 0 else math.inf
        cost = Decimal(repr(round(hours * price, 6))) if math.isfinite(hours) else Decimal(0)
        return Placement(self.keys[o], price, sps, hours, cost)

    def at_offer(self, job: JobRecord, offer: OfferKey, *, remaining_steps: float, at: datetime) -> Placement | None:
        o = self.col.get(offer)
        if o is None:
            return None
        t = self._t(at)
        if not math.isfinite(self.cube.job_usd_per_hour[t, o]) or self.cube.steps_per_s[self.m, o] <= 0:
            return None
        return self._placement(o, t, remaining_steps)

    def rank(
        self,
        job: JobRecord,
        *,
        remaining_steps: float,
        at: datetime,
        exclude: Collection[OfferKey] = (),
        top: int = 10,
    ) -> Sequence[Placement]:
        t = self._t(at)
        if self.policy.mode == "static" and job.offer is not None:
            here = (
                None if job.offer in exclude else self.at_offer(job, job.offer, remaining_steps=remaining_steps, at=at)
            )
            return [] if here is None else [here]
        cps = self.cube.usd_per_step[t, self.m]
        mask: npt.NDArray[np.bool_] = self.policy.allowed & np.isfinite(cps) & (self.cube.steps_per_s[self.m] > 0)
        for k in exclude:
            if k in self.col:
                mask[self.col[k]] = False
        if self.policy.mode == "static" and not mask.any():
            return []
        if self.policy.mode == "rule" and job.offer is not None and job.offer in self.col:
            cur = self.col[job.offer]
            gb = float(job.spec.get("checkpoint_gb") or 0.0)
            share = self.cube.job_usd_per_hour[t]
            score = remaining_steps * cps + self.cube.egress[cur] * gb + self.rule.restart_hours * share
        else:
            score = cps
        idx = np.flatnonzero(mask)
        order = sorted(
            idx.tolist(),
            key=lambda o: (round(float(score[o]) * 1e12) / 1e12, -float(self.cube.steps_per_s[self.m, o]), o),
        )
        if self.policy.mode == "static":
            order = order[:1]
        return [self._placement(o, t, remaining_steps) for o in order[:top]]


class _Trace:
    """Placements that answer as ``inner`` and keep every question with its answer, in order: a run's
    answers, to tell whether another policy's placements would have answered that run alike
    (:meth:`answers_alike`)."""

    def __init__(self, inner: Placements) -> None:
        self.inner = inner
        self.asked: list[tuple[Callable[[Placements], object], object]] = []

    def rank(
        self,
        job: JobRecord,
        *,
        remaining_steps: float,
        at: datetime,
        exclude: Collection[OfferKey] = (),
        top: int = 10,
    ) -> Sequence[Placement]:
        excluded = tuple(exclude)

        def ask(p: Placements) -> tuple[Placement, ...]:
            return tuple(p.rank(job, remaining_steps=remaining_steps, at=at, exclude=excluded, top=top))

        answer = ask(self.inner)
        self.asked.append((ask, answer))
        return list(answer)

    def at_offer(self, job: JobRecord, offer: OfferKey, *, remaining_steps: float, at: datetime) -> Placement | None:
        def ask(p: Placements) -> Placement | None:
            return p.at_offer(job, offer, remaining_steps=remaining_steps, at=at)

        answer = ask(self.inner)
        self.asked.append((ask, answer))
        return answer

    def answers_alike(self, other: Placements) -> bool:
        """Whether ``other`` answers every question asked so far as ``inner`` did (equal placements, in
        order)."""
        return all(ask(other) == answer for ask, answer in self.asked)


def run_policy(
    cloud: SimulatedCloud,
    prices: StepPrices,
    placements: Placements,
    jobs: Sequence[OfflineJob],
    *,
    until: datetime,
    rule: MigrationRule | None,
    db: Engine | None = None,
) -> OfflineRun:
    """``jobs`` under one policy through :func:`~costopt.jobs.offline.run_offline` (daily rebalancing
    with ``rule``; None: static)."""
    return run_offline(
        cloud, prices, placements, jobs, until=until, rule=rule, rebalance_every=timedelta(days=1), db=db, reset_db=True
    )


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
    """The cells; ``runs``: the study's runs; ``reused``: how many of them took the outcome of a run their
    placements answered alike (module docstring) instead of running again; ``seconds``: wall time."""

    cells: tuple[PreemptionCell, ...]
    runs: int
    seconds: float
    reused: int = 0

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


@dataclass(frozen=True, slots=True)
class _Done:
    """A run of a start day: its rebalancing rule, its placements' questions and answers, its outcome, and
    its copies' ``(offer, launched, ended)`` (what a run with hazards must not meet a reclaim near to run
    alike)."""

    rule: MigrationRule | None
    trace: _Trace
    outcome: _Outcome
    spans: tuple[tuple[OfferKey, datetime, datetime], ...]


def _spans(run: OfflineRun) -> tuple[tuple[OfferKey, datetime, datetime], ...]:
    """Every copy of the run's job as ``(offer, launched, ended)`` (a copy still open: the run's end)."""
    (job,) = run.jobs
    return tuple((c.offer, c.started_at, c.ended_at or run.ended_at) for c in run.copies[job.id])


def _outcome(run: OfflineRun) -> _Outcome:
    (job,) = run.jobs
    events = run.events[job.id]
    end = job.finished_at or run.ended_at
    lost = sum((e.cost_usd for e in events if e.kind == "preemption" and e.cost_usd is not None), Decimal(0))
    return _Outcome(
        cost=run.costs[job.id].total_usd,
        hours=(end - run.started_at).total_seconds() / 3600.0,
        preemptions=sum(1 for e in events if e.kind in PREEMPTION_EVENTS),
        moves=sum(1 for e in events if e.kind == "move"),
        lost_usd=lost,
        finished=job.state.value == "succeeded",
    )


def _mean(values: Sequence[Decimal]) -> Decimal:
    return sum(values, Decimal(0)) / Decimal(len(values)) if values else Decimal(0)


def _ratio(a: Decimal, b: Decimal) -> float:
    return float(a / b) if b > 0 else math.nan


def _rate(
    cube_steps: npt.NDArray[np.float64], col: Mapping[OfferKey, int]
) -> Callable[[str, int, OfferKey, str], float | None]:
    """The simulated agents' throughput: the model's single-GPU steps/s on the offer (per-GPU packing), at
    ``fp32`` only (the paper's measurements; another precision is unknown: the launch says so)."""

    def rate(job_type: str, gpus: int, offer: OfferKey, precision: str = "fp32") -> float | None:
        o = col.get(offer)
        return None if o is None or precision != "fp32" else float(cube_steps[o])

    return rate


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
    reuse: bool = True,
) -> PreemptionStudy:
    """Run the study (module docstring). ``cloud_factory(prices, hazards, start=, seed=, rate=)`` builds
    the simulated cloud of one run (the study's scripts pass
    ``providers.sim.sim_factory(SimConfig(report_every=STUDY_REPORT_EVERY))``). ``start_days``: use only the first
    ``n`` of the paper's 30 (for quick runs). Every policy runs with the same seeds on the same offers
    (common random numbers: an offer's reclaims are the same whichever policy uses it). ``baseline`` and
    ``on_demand`` are always run (the ratios need them). Raises :class:`BacktestError` on an unknown policy
    or model. ``reuse``: take a run's outcome from an earlier run of the same start day and seed whose
    placements answered alike, or from the same policy's run without hazards when the seed draws no reclaim
    near its copies (module docstring); False runs every run."""
    t0 = time.perf_counter()
    unknown = [p for p in policies if p not in STUDY_POLICIES]
    if unknown:
        raise BacktestError(f"unknown policies {unknown}; choose from {list(STUDY_POLICIES)}")
    run_policies = list(dict.fromkeys(["baseline", "on_demand", *policies]))
    db = memory_database()  # one per study (per worker process), emptied before each run
    cells: list[PreemptionCell] = []
    runs = reused = 0
    for region in regions:
        setup = region_setup(inputs, region, models=models, job_days=job_days)
        days = setup.start_days if start_days is None else setup.start_days[:start_days]
        prices = grid_prices(setup)
        keys = _keys(setup)
        col = {k: i for i, k in enumerate(keys)}
        probe = cloud_factory(prices, NO_HAZARD, start=setup.grid.start, seed=0)
        timing = probe.timing
        rule = MigrationRule(restart_hours=timing.restart_hours, checkpoint_overlap_hours=timing.checkpoint_hours)
        for model in models:
            m = setup.cube.models.index(model)
            rate = _rate(setup.cube.steps_per_s[m], col)
            v100 = inputs.throughputs[model]["v100"]
            gb = float(checkpoint_gb.get(model, 0.0))
            for n in job_days:
                steps = round(v100 * n * SECONDS_PER_DAY)
                clean: dict[str, list[_Outcome]] = {p: [] for p in run_policies}
                noisy: dict[str, list[_Outcome]] = {p: [] for p in run_policies}
                spec = {"command": ["train"], "job_type": model, "gpus": 1, "checkpoint_gb": gb}
                job = OfflineJob(steps, spec, name=f"{model}/{n:g}")
                for d, day in enumerate(days):
                    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
                    # the runs of this start day per (hazards, seed): their rule, answers, outcome and copies
                    done: dict[tuple[bool, int], list[_Done]] = {}
                    for p in run_policies:
                        policy = setup.policies[p]
                        placements = GridPlacements(setup, policy, model, rule, keys)
                        p_rule = None if policy.mode == "static" else (ALWAYS_MOVE if policy.mode == "free" else rule)
                        calm: _Done | None = None  # this policy's run without hazards
                        for noisy_run, hz, seed_list, sink in (
                            (False, NO_HAZARD, [0], clean),
                            (True, hazards, list(seeds), noisy),
                        ):
                            for s in seed_list:
                                earlier = done.setdefault((noisy_run, s), [])
                                same = next(
                                    (
                                        e
                                        for e in earlier
                                        if reuse and e.rule is p_rule and e.trace.answers_alike(placements)
                                    ),
                                    None,
                                )
                                runs += 1
                                cloud = None
                                if same is None and reuse and noisy_run and calm is not None:
                                    # no reclaim near any copy of the run without hazards: this run is that run
                                    cloud = cloud_factory(prices, hz, start=start, seed=[s, d], rate=rate)
                                    if cloud.untouched(calm.spans):
                                        same = calm
                                        earlier.append(calm)
                                        cloud = None
                                if same is not None:
                                    sink[p].append(same.outcome)
                                    reused += 1
                                    if not noisy_run:
                                        calm = same
                                    continue
                                trace = _Trace(placements)
                                if cloud is None:
                                    cloud = cloud_factory(prices, hz, start=start, seed=[s, d], rate=rate)
                                run = run_policy(cloud, prices, trace, [job], until=start + horizon, rule=p_rule, db=db)
                                out = _outcome(run)
                                sink[p].append(out)
                                if reuse:
                                    entry = _Done(p_rule, trace, out, _spans(run))
                                    earlier.append(entry)
                                    if not noisy_run:
                                        calm = entry
                paper = _paper_reductions(setup, model, steps, gb, days, run_policies)
                cells.extend(_cells(region, model, n, len(days), len(seeds), clean, noisy, paper, policies))
            log.info("%s %s: %d runs so far (%d reused)", region, model, runs, reused)
    db.dispose()
    return PreemptionStudy(tuple(cells), runs, time.perf_counter() - t0, reused)


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
